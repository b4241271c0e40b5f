/*
** sync-util.h: the small toolkit shared by test_sync.c, test_chan.c and
** the stress_* programs: checks that print where and what failed, and the
** runtime set-up and teardown every test uses.
**
** A failed check ends the whole process with status 1 at once, from
** whichever thread or task it ran on: a half-failed synchronisation test
** tends to hang rather than fail, so carrying on would only hide the first
** symptom behind a ctest timeout.
*/
#ifndef UMS_TEST_SYNC_UTIL_H
#define UMS_TEST_SYNC_UTIL_H

#include "ums.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SU_UNUSED __attribute__((unused))

static SU_UNUSED void su_fail(const char *file, int line, const char *what) {
  fprintf(stderr, "%s:%d: %s\n", file, line, what);
  fflush(stderr);
  exit(1);
}

/* ums codes are small negative numbers; print their names beside them. */
static SU_UNUSED const char *su_name(long long v) {
  return (v < 0 && v >= -200) ? ums_err_name((int)v) : "";
}

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) su_fail(__FILE__, __LINE__, "CHECK(" #cond ") failed");       \
  } while (0)

#define CHECK_EQ(a, b)                                                         \
  do {                                                                         \
    long long a_ = (long long)(a), b_ = (long long)(b);                        \
    if (a_ != b_) {                                                            \
      fprintf(stderr, "%s:%d: CHECK_EQ(%s, %s) failed: %lld %s != %lld %s\n",  \
              __FILE__, __LINE__, #a, #b, a_, su_name(a_), b_, su_name(b_));   \
      fflush(stderr);                                                          \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define CHECK_OK(expr) CHECK_EQ((expr), 0)

#define MS (UMS_NSEC_PER_MSEC)
#define US (UMS_NSEC_PER_USEC)

/* ---------------------------------------------------------------------- */
/* Runtime set-up and teardown                                             */
/* ---------------------------------------------------------------------- */

static SU_UNUSED ums_runtime_t *su_runtime(int nsched, size_t stack_size) {
  ums_config_t cfg = {0};
  int err = 1;
  cfg.schedulers = nsched;
  cfg.stack_size = stack_size;
  ums_runtime_t *rt = ums_runtime_new(&cfg, &err);
  CHECK(rt != NULL);
  CHECK_EQ(err, 0);
  CHECK_EQ(ums_runtime_schedulers(rt), nsched);
  return rt;
}

/* Habit 8: a test ends by proving the runtime closed cleanly. Every task
** must have ended on its own (a finished task leaves its scheduler's count
** a moment after its joiner wakes, hence the bounded poll), so shutdown
** finds nothing to cancel and returns 0 rather than UMS_ETIMEDOUT. Leaks
** of what the runtime owns are LeakSanitizer's part in the ASan build. */
static SU_UNUSED void su_teardown(ums_runtime_t *rt) {
  int n = ums_runtime_schedulers(rt);
  ums_sched_stats_t rows[64];
  CHECK(n > 0 && n <= 64);
  int64_t give_up = ums_deadline(10 * UMS_NSEC_PER_SEC);
  for (;;) {
    uint64_t live = 0;
    CHECK_EQ(ums_runtime_stats(rt, rows, n), n);
    for (int i = 0; i < n; i++) live += rows[i].tasks + rows[i].pending;
    if (live == 0) break;
    if (ums_now() > give_up) {
      fprintf(stderr, "teardown: %llu tasks still live\n",
              (unsigned long long)live);
      exit(1);
    }
    ums_sleep(UMS_NSEC_PER_MSEC);
  }
  CHECK_OK(ums_runtime_shutdown(rt, ums_deadline(10 * UMS_NSEC_PER_SEC)));
}

static SU_UNUSED ums_task_t su_spawn(ums_runtime_t *rt, int sched,
                                     ums_task_fn fn, void *arg) {
  ums_spawn_opts_t o = {0};
  ums_task_t t = 0;
  o.sched = sched;
  CHECK_OK(ums_task_spawn(rt, &o, fn, arg, &t));
  CHECK(t != 0);
  return t;
}

/* su_spawn for a step task. */
static SU_UNUSED ums_task_t su_spawn_step(ums_runtime_t *rt, int sched,
                                          ums_step_fn fn, void *arg) {
  ums_spawn_opts_t o = {0};
  ums_task_t t = 0;
  o.sched = sched;
  CHECK_OK(ums_task_spawn_step(rt, &o, fn, arg, &t));
  CHECK(t != 0);
  return t;
}

/* Joins t and returns its result; its status must be 0. The bound turns
** a task stuck on a lost wake-up into a failure at the join's line rather
** than a ctest timeout. */
#define su_join(rt, t)                                                     \
  su_join_at(__FILE__, __LINE__, (rt), (t),                                \
             ums_deadline(60 * UMS_NSEC_PER_SEC))
static SU_UNUSED void *su_join_at(const char *file, int line, ums_runtime_t *rt,
                                  ums_task_t t, int64_t deadline) {
  void *res = NULL;
  int status = -1;
  int r = ums_task_join(rt, t, deadline, &res, &status);
  if (r != 0) {
    fprintf(stderr, "%s:%d: join: %s\n", file, line, ums_err_name(r));
    fflush(stderr);
    exit(1);
  }
  CHECK_EQ(status, 0);
  return res;
}

/* Lets every runnable task of the caller's scheduler run. On one scheduler
** a task that was made runnable before this call has run until it parked
** or ended by the time this returns; tasks woken from other threads may
** need more, hence several rounds. */
static SU_UNUSED void su_settle(void) {
  for (int i = 0; i < 8; i++) CHECK_OK(ums_yield());
}

/* Polls until *flag reaches want (bounded), yielding or sleeping. */
static SU_UNUSED void su_await(_Atomic int *flag, int want) {
  int64_t give_up = ums_deadline(20 * UMS_NSEC_PER_SEC);
  while (atomic_load(flag) < want) {
    if (ums_now() > give_up) su_fail(__FILE__, __LINE__, "su_await: stuck");
    ums_sleep(50 * US); /* parks a task, sleeps a host thread */
  }
}

/* Waits until scheduler `sched` sits in its idle wait. Once a task placed
** there has announced that it is about to wait, seeing that scheduler idle
** proves the task is parked: it cannot go idle while the task runs. */
static SU_UNUSED void su_await_idle(ums_runtime_t *rt, int sched) {
  ums_sched_stats_t rows[64];
  int n = ums_runtime_schedulers(rt);
  int64_t give_up = ums_deadline(20 * UMS_NSEC_PER_SEC);
  for (;;) {
    CHECK_EQ(ums_runtime_stats(rt, rows, n), n);
    if (rows[sched].idle && rows[sched].runnable == 0) return;
    if (ums_now() > give_up) su_fail(__FILE__, __LINE__, "not idle");
    ums_sleep(100 * US);
  }
}

/* A watchdog for sections whose failure mode may be a hang (a spin on the
** lock of a freed object): past the bound it names the section and ends
** the process with status 1. The bound is on the time without progress:
** a section that reports each round done (su_watchdog_progress) is stuck
** only once no round has ended for that long, however slowly a loaded
** machine runs the rounds; one that reports nothing is bounded as a whole.
** Either bound catches only a hang, so it is generous. */
#include <pthread.h>
#include <unistd.h>

static struct {
  pthread_t thread;
  _Atomic int armed;
  const char *what;
  int64_t period;            /* [const while armed] the bound, ns */
  _Atomic int64_t deadline;  /* [atomic] stuck past this */
} su_wd;

static SU_UNUSED void *su_watchdog_main(void *unused) {
  while (atomic_load(&su_wd.armed)) {
    if (ums_now() > atomic_load(&su_wd.deadline)) {
      fprintf(stderr, "watchdog: %s: stuck\n", su_wd.what);
      fflush(stderr);
      _exit(1);
    }
    usleep(10000);
  }
  return NULL;
}

static SU_UNUSED void su_watchdog_start(const char *what, int seconds) {
  su_wd.what = what;
  su_wd.period = (int64_t)seconds * UMS_NSEC_PER_SEC;
  atomic_store(&su_wd.deadline, ums_deadline(su_wd.period));
  atomic_store(&su_wd.armed, 1);
  CHECK_OK(pthread_create(&su_wd.thread, NULL, su_watchdog_main, NULL));
}

/* The section moved on: it is stuck only a whole bound from now. */
static SU_UNUSED void su_watchdog_progress(void) {
  atomic_store(&su_wd.deadline, ums_deadline(su_wd.period));
}

/* Whether a race-hunting loop goes on to round i: up to max rounds, or
** fewer on a machine too loaded to run them before `until` (a real-time
** deadline), but never fewer than a tenth of max. The rounds are the
** effort spent hunting a race, not an assertion: a race fails whichever
** round it happens in, and a hang is the watchdog's. */
static SU_UNUSED bool su_more_rounds(int i, int max, int64_t until) {
  return i < max && (i < max / 10 || ums_now() <= until);
}

/* su_join for a section under the watchdog, which reports progress as
** it goes: no deadline of its own, since the watchdog is the hang guard
** and a loaded machine may take longer than any fixed bound to finish
** the section's work. */
#define su_join_watched(rt, t)                                             \
  su_join_at(__FILE__, __LINE__, (rt), (t), UMS_FOREVER)

static SU_UNUSED void su_watchdog_stop(void) {
  atomic_store(&su_wd.armed, 0);
  CHECK_OK(pthread_join(su_wd.thread, NULL));
}

#endif /* UMS_TEST_SYNC_UTIL_H */
