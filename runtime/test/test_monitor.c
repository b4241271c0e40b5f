/*
** test_monitor.c: the scheduler monitor (monitor.c). A scheduler stuck in
** one task, in a blocking call or in a loop that never yields, is reported
** exactly once per stall, with the task, within twice the threshold, and
** counted in the scheduler's stalls; a scheduler that is merely idle, or
** busy with tasks that do yield, is never reported; the monitor sleeps
** while every scheduler is idle and wakes when one gets busy; with no
** stall detection and no stats there is no monitor thread at all, unless
** a binding asks for looks of its own (ums_runtime_watch), which the same
** thread makes, only while a scheduler is busy.
**
** Time bounds are generous except the one the issue asks for (the report
** within twice the threshold), which uses a threshold long enough (0.4 s)
** for a noisy VM to keep it.
*/
#include "test-util.h"
#include "internal.h" /* rt->monitor.asleep */

#include <stdatomic.h>

#define PTR(n) ((void *)(uintptr_t)(n))
#define MS UMS_NSEC_PER_MSEC
#define THRESHOLD (400 * MS)

static ums_runtime_t *rt;

/* What the on_stall callback saw. Written on the monitor thread. */
typedef struct reports {
  atomic_int n;
  _Atomic int64_t at;       /* ums_now() at the last report */
  _Atomic int sched;
  _Atomic ums_task_t task;
  _Atomic int64_t stalled_ns;
  _Atomic uint64_t seq;
  char name[32];            /* written before n is incremented */
} reports_t;

static reports_t rep;

static void on_stall(const ums_stall_t *st, void *arg) {
  CHECK_PTR_EQ(arg, &rep);
  atomic_store(&rep.at, ums_now());
  atomic_store(&rep.sched, st->sched);
  atomic_store(&rep.task, st->task);
  atomic_store(&rep.stalled_ns, st->stalled_ns);
  atomic_store(&rep.seq, st->seq);
  memcpy(rep.name, st->name, sizeof rep.name);
  atomic_fetch_add(&rep.n, 1); /* publishes name (seq_cst) */
}

static ums_runtime_t *monitored(int nsched, int64_t threshold) {
  memset(&rep, 0, sizeof rep);
  ums_config_t cfg = {.schedulers = nsched,
                      .stall_threshold = threshold,
                      .on_stall = on_stall,
                      .on_stall_arg = &rep};
  return tu_runtime_new_cfg(&cfg);
}

static ums_task_t spawn_named(int sched, const char *name, ums_task_fn fn,
                              void *arg) {
  ums_spawn_opts_t o = {.sched = sched, .name = name};
  ums_task_t t = 0;
  CHECK_RC(ums_task_spawn(rt, &o, fn, arg, &t), 0);
  return t;
}

static void join_ok(ums_task_t t) {
  CHECK_RC(ums_task_join(rt, t, ums_deadline(30 * UMS_NSEC_PER_SEC), NULL,
                         NULL),
           0);
}

/* Blocks its scheduler's thread in a system call (what a careless C call
** does), recording when it began. */
static _Atomic int64_t stall_began;
static void *block_fn(void *arg) {
  atomic_store(&stall_began, ums_now());
  usleep((useconds_t)(uintptr_t)arg * 1000);
  return NULL;
}

/* Spins without yielding. */
static void *spin_fn(void *arg) {
  atomic_store(&stall_began, ums_now());
  int64_t until = ums_now() + (int64_t)(uintptr_t)arg * MS;
  while (ums_now() < until) {
  }
  return NULL;
}

static void test_blocking_call(void) {
  rt = monitored(2, THRESHOLD);
  int64_t spawned = ums_now();
  ums_task_t t = spawn_named(1, "blocker", block_fn, PTR(1200));
  WAIT_UNTIL(atomic_load(&rep.n) > 0, 10000);
  int64_t delay = atomic_load(&rep.at) - atomic_load(&stall_began);
  printf("   reported %.0f ms after the stall began (threshold %.0f ms)\n",
         (double)delay / 1e6, (double)THRESHOLD / 1e6);
  /* The monitor counts the stall from the scheduler's switch into the
  ** task, which comes after the spawn but before the task stores
  ** stall_began (60 ms before under TSan on a crowded machine): never
  ** early is checked from the spawn, within twice the threshold from the
  ** latest instant the stall can have begun. */
  CHECK_GE(atomic_load(&rep.at) - spawned, THRESHOLD);
  CHECK_LE(delay, 2 * THRESHOLD);
  CHECK_EQ(atomic_load(&rep.sched), 1);
  CHECK_EQ(atomic_load(&rep.task), t);
  CHECK_STR_EQ(rep.name, "blocker");
  CHECK_GE(atomic_load(&rep.stalled_ns), THRESHOLD);
  CHECK_EQ(atomic_load(&rep.seq), 1);
  CHECK_EQ(tu_stats(rt, 1).stalls, 1);
  CHECK_EQ(tu_stats(rt, 0).stalls, 0);
  join_ok(t);
  /* Once per stall: the rest of the 1.2 s brought no second report. */
  CHECK_EQ(atomic_load(&rep.n), 1);

  /* A second stall is a new report. */
  t = spawn_named(1, "spinner", spin_fn, PTR(800));
  WAIT_UNTIL(atomic_load(&rep.n) > 1, 10000);
  CHECK_EQ(atomic_load(&rep.task), t);
  CHECK_STR_EQ(rep.name, "spinner");
  CHECK_EQ(atomic_load(&rep.seq), 2);
  join_ok(t);
  CHECK_EQ(atomic_load(&rep.n), 2);
  CHECK_EQ(tu_stats(rt, 1).stalls, 2);
  tu_runtime_shutdown(rt);
}

static void *yield_for_fn(void *arg) {
  int64_t until = ums_now() + (int64_t)(uintptr_t)arg * MS;
  while (ums_now() < until) CHECK_RC(ums_yield(), 0);
  return NULL;
}

static void *sleep_loop_fn(void *arg) {
  int64_t until = ums_now() + (int64_t)(uintptr_t)arg * MS;
  while (ums_now() < until) CHECK_RC(ums_sleep(MS), 0);
  return NULL;
}

static void test_no_false_reports(void) {
  rt = monitored(2, 150 * MS);
  /* Idle for 4 thresholds, then busy for as long with tasks that yield or
  ** sleep. */
  usleep(600 * 1000);
  ums_task_t a = spawn_named(0, "yielder", yield_for_fn, PTR(600));
  ums_task_t b = spawn_named(0, "yielder2", yield_for_fn, PTR(600));
  ums_task_t c = spawn_named(1, "sleeper", sleep_loop_fn, PTR(600));
  join_ok(a);
  join_ok(b);
  join_ok(c);
  usleep(300 * 1000);
  CHECK_EQ(atomic_load(&rep.n), 0);
  CHECK_EQ(tu_stats_sum(rt, stalls), 0);
  tu_runtime_shutdown(rt);
}

static void test_monitor_sleeps_when_idle(void) {
  rt = monitored(2, THRESHOLD);
  /* Every scheduler idle: the monitor goes to sleep. */
  WAIT_UNTIL(atomic_load(&rt->monitor.asleep), 5000);
  /* A busy scheduler wakes it, and it stays awake while one is busy. */
  ums_task_t t = spawn_named(0, "busy", yield_for_fn, PTR(300));
  WAIT_UNTIL(!atomic_load(&rt->monitor.asleep), 5000);
  usleep(100 * 1000);
  CHECK(!atomic_load(&rt->monitor.asleep));
  join_ok(t);
  WAIT_UNTIL(atomic_load(&rt->monitor.asleep), 5000);
  /* And it still catches a stall after sleeping. */
  t = spawn_named(1, "blocker", block_fn, PTR(700));
  WAIT_UNTIL(atomic_load(&rep.n) == 1, 10000);
  join_ok(t);
  tu_runtime_shutdown(rt);
}

static void test_off(void) {
  int base = tu_thread_baseline();
  /* No stall detection and no stats: no monitor thread. */
  ums_config_t cfg = {.schedulers = 2, .stall_threshold = -1,
                      .stats = UMS_STATS_OFF};
  rt = tu_runtime_new_cfg(&cfg);
  CHECK_EQ(tu_thread_count(), base + 2);
  ums_config_t c;
  ums_runtime_config(rt, &c);
  CHECK_EQ(c.stall_threshold, -1);
  tu_runtime_shutdown(rt);
  /* Defaults: a 1 s threshold, and a monitor. */
  rt = tu_runtime_new(2);
  ums_runtime_config(rt, &c);
  CHECK_EQ(c.stall_threshold, UMS_NSEC_PER_SEC);
  CHECK_EQ(c.stats, UMS_STATS_ON);
  CHECK_EQ(tu_thread_count(), base + 3);
  tu_runtime_shutdown(rt);
}

/* A binding's looks (ums_runtime_watch). Counted on the monitor thread. */
static atomic_int looks;
static _Atomic(void *) look_arg;
static void look(void *arg, int64_t now) {
  (void)now;
  atomic_store(&look_arg, arg);
  atomic_fetch_add(&looks, 1);
}

static void test_watch(void) {
  int base = tu_thread_baseline();
  /* A runtime that needs no monitor of its own gets one for the looks:
  ** one thread, the same one that would report stalls. */
  ums_config_t cfg = {.schedulers = 2, .stall_threshold = -1,
                      .stats = UMS_STATS_OFF};
  rt = tu_runtime_new_cfg(&cfg);
  CHECK_EQ(tu_thread_count(), base + 2);
  atomic_store(&looks, 0);
  CHECK_RC(ums_runtime_watch(rt, look, &looks, 0), 0);
  CHECK_EQ(tu_thread_count(), base + 3);
  /* Period 0: none, busy or not. */
  ums_task_t t = spawn_named(0, "spinner", spin_fn, PTR(100));
  join_ok(t);
  CHECK_EQ(atomic_load(&looks), 0);
  /* A period: looks while a scheduler is busy. */
  ums_runtime_watch_period(rt, 1 * MS);
  t = spawn_named(1, "spinner", spin_fn, PTR(300));
  WAIT_UNTIL(atomic_load(&looks) >= 5, 10000);
  join_ok(t);
  CHECK_PTR_EQ(atomic_load(&look_arg), (void *)&looks);
  /* Every scheduler idle: the monitor sleeps and looks no more (a tenth
  ** of a second without a look, at a period of 1 ms). */
  WAIT_UNTIL(atomic_load(&rt->monitor.asleep), 5000);
  int n, tries = 0;
  do {
    n = atomic_load(&looks);
    usleep(100 * 1000);
  } while (atomic_load(&looks) != n && ++tries < 50);
  CHECK(tries < 50);
  /* And looks again once one is busy. */
  t = spawn_named(0, "spinner", spin_fn, PTR(300));
  WAIT_UNTIL(atomic_load(&looks) >= n + 5, 10000);
  join_ok(t);
  tu_runtime_shutdown(rt);
  /* With its own monitor (the defaults), no second thread. */
  rt = tu_runtime_new(2);
  CHECK_RC(ums_runtime_watch(rt, look, &looks, 1 * MS), 0);
  CHECK_EQ(tu_thread_count(), base + 3);
  tu_runtime_shutdown(rt);
}

/* The default report is a line on stderr; this only proves it runs. */
static void test_default_report(void) {
  ums_config_t cfg = {.schedulers = 1, .stall_threshold = 100 * MS};
  rt = tu_runtime_new_cfg(&cfg);
  /* The block lasts 15 thresholds: on a crowded machine the monitor's
  ** own thread may wait hundreds of milliseconds for a CPU, and it must
  ** still look while the block lasts. At least one report: this proves
  ** the default reporter runs, not how often. */
  ums_task_t t = spawn_named(0, "quiet-blocker", block_fn, PTR(1500));
  WAIT_UNTIL(tu_stats(rt, 0).stalls >= 1, 10000);
  join_ok(t);
  tu_runtime_shutdown(rt);
}

int main(void) {
  RUN(test_off);
  RUN(test_blocking_call);
  RUN(test_no_false_reports);
  RUN(test_monitor_sleeps_when_idle);
  RUN(test_watch);
  RUN(test_default_report);
  return 0;
}
