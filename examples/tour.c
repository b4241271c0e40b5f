/*
** tour.c: a short walk through the ums C API.
**
** Starts a runtime with two schedulers and runs one "tour" task that shows,
** in turn: spawning and joining tasks, sleeping, a channel ping-pong
** between tasks on different schedulers, a mutex, a join with a timeout,
** and cancelling a waiting task. The main thread then prints the
** per-scheduler counters and shuts the runtime down.
**
** Uses only the public header, ums.h. Run it as build/examples/example_tour.
*/
#include "ums.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Every call below is expected to succeed; a failure ends the tour. */
#define CHECK(expr)                                                            \
  do {                                                                         \
    int rc_ = (expr);                                                          \
    if (rc_ != 0) {                                                            \
      fprintf(stderr, "tour: %s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, \
              #expr, ums_err_name(rc_), ums_strerror(rc_));                    \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static double ms_since(int64_t t0) {
  return (double)(ums_now() - t0) / (double)UMS_NSEC_PER_MSEC;
}

static ums_task_t spawn_on(int sched, const char *name, ums_task_fn fn,
                           void *arg) {
  ums_spawn_opts_t opts = {.sched = sched, .name = name};
  ums_task_t t;
  CHECK(ums_task_spawn(ums_current_runtime(), &opts, fn, arg, &t));
  return t;
}

static void *join(ums_task_t t) {
  void *result;
  CHECK(ums_task_join(ums_current_runtime(), t, UMS_FOREVER, &result, NULL));
  return result;
}

/* ---------------------------------------------------------------------- */
/* 1. spawn and join                                                       */
/* ---------------------------------------------------------------------- */

static void *square(void *arg) {
  intptr_t n = (intptr_t)arg;
  printf("  square(%" PRIdPTR ") runs on scheduler %d\n", n,
         ums_current_sched());
  return (void *)(n * n);
}

static void tour_spawn(void) {
  printf("1. spawn and join: one task per scheduler, results by join\n");
  intptr_t ra = (intptr_t)join(spawn_on(0, "square-3", square, (void *)3));
  intptr_t rb = (intptr_t)join(spawn_on(1, "square-4", square, (void *)4));
  printf("  joined: 3*3 = %" PRIdPTR ", 4*4 = %" PRIdPTR "\n\n", ra, rb);
}

/* ---------------------------------------------------------------------- */
/* 2. sleep                                                                */
/* ---------------------------------------------------------------------- */

static int64_t sleep_t0;

static void *sleeper(void *arg) {
  intptr_t ms = (intptr_t)arg;
  CHECK(ums_sleep(ms * UMS_NSEC_PER_MSEC));
  printf("  the %2" PRIdPTR " ms sleeper woke at %5.1f ms\n", ms,
         ms_since(sleep_t0));
  return NULL;
}

static void tour_sleep(void) {
  printf("2. sleep: three tasks sleep 30, 10 and 20 ms on one scheduler;\n"
         "   sleeping parks only the task, so they overlap\n");
  sleep_t0 = ums_now();
  ums_task_t t[3];
  t[0] = spawn_on(0, "sleep-30", sleeper, (void *)30);
  t[1] = spawn_on(0, "sleep-10", sleeper, (void *)10);
  t[2] = spawn_on(0, "sleep-20", sleeper, (void *)20);
  for (int i = 0; i < 3; i++) join(t[i]);
  printf("  all three done after %.1f ms (not 60)\n\n", ms_since(sleep_t0));
}

/* ---------------------------------------------------------------------- */
/* 3. channel ping-pong across schedulers                                  */
/* ---------------------------------------------------------------------- */

typedef struct pingpong {
  ums_chan_t *ping, *pong; /* unbuffered channels of int */
} pingpong_t;

static void *pong_task(void *arg) {
  pingpong_t *pp = arg;
  int n, rc;
  /* Receives until the other side closes the channel. */
  while ((rc = ums_chan_recv(pp->ping, &n, UMS_FOREVER)) == 0) {
    printf("  pong on scheduler %d got %d, replies %d\n", ums_current_sched(),
           n, n + 1);
    n++;
    CHECK(ums_chan_send(pp->pong, &n, UMS_FOREVER));
  }
  printf("  pong gets %s (%s) and ends\n", ums_err_name(rc), ums_strerror(rc));
  return NULL;
}

static void tour_channels(void) {
  printf("3. channels: ping on scheduler 0, pong on scheduler 1, passing an\n"
         "   int through unbuffered channels\n");
  pingpong_t pp = {ums_chan_new(sizeof(int), 0), ums_chan_new(sizeof(int), 0)};
  if (!pp.ping || !pp.pong) CHECK(UMS_ENOMEM);
  ums_task_t pong = spawn_on(1, "pong", pong_task, &pp);
  /* The tour task itself runs on scheduler 0 and plays ping. */
  int n = 1;
  printf("  ping on scheduler %d sends %d\n", ums_current_sched(), n);
  for (int round = 1; round <= 3; round++) {
    CHECK(ums_chan_send(pp.ping, &n, UMS_FOREVER));
    CHECK(ums_chan_recv(pp.pong, &n, UMS_FOREVER));
    if (round < 3) {
      printf("  ping on scheduler %d got %d, sends %d\n", ums_current_sched(),
             n, n + 1);
      n++;
    } else {
      printf("  ping on scheduler %d got %d, closes the channel\n",
             ums_current_sched(), n);
    }
  }
  CHECK(ums_chan_close(pp.ping));
  join(pong);
  CHECK(ums_chan_delete(pp.ping));
  CHECK(ums_chan_delete(pp.pong));
  printf("\n");
}

/* ---------------------------------------------------------------------- */
/* 4. mutex                                                                */
/* ---------------------------------------------------------------------- */

#define MUTEX_TASKS 4
#define MUTEX_ROUNDS 250

typedef struct counter {
  ums_mutex_t *lock;
  long value; /* guarded by lock */
} counter_t;

static void *incrementer(void *arg) {
  counter_t *c = arg;
  for (int i = 0; i < MUTEX_ROUNDS; i++) {
    CHECK(ums_mutex_lock(c->lock, UMS_FOREVER));
    long v = c->value;
    /* Yielding inside the critical section invites the other tasks in:
    ** without the mutex, increments would be lost here. */
    CHECK(ums_yield());
    c->value = v + 1;
    CHECK(ums_mutex_unlock(c->lock));
  }
  return NULL;
}

static void tour_mutex(void) {
  printf("4. mutex: %d tasks on both schedulers each add 1 to a shared\n"
         "   counter %d times, yielding while they hold the lock\n",
         MUTEX_TASKS, MUTEX_ROUNDS);
  counter_t c = {ums_mutex_new(), 0};
  if (!c.lock) CHECK(UMS_ENOMEM);
  ums_task_t t[MUTEX_TASKS];
  for (int i = 0; i < MUTEX_TASKS; i++)
    t[i] = spawn_on(i % 2, "incrementer", incrementer, &c);
  for (int i = 0; i < MUTEX_TASKS; i++) join(t[i]);
  CHECK(ums_mutex_delete(c.lock));
  printf("  counter = %ld (expected %d)\n\n", c.value,
         MUTEX_TASKS * MUTEX_ROUNDS);
  if (c.value != MUTEX_TASKS * MUTEX_ROUNDS) exit(1);
}

/* ---------------------------------------------------------------------- */
/* 5. join with a timeout                                                  */
/* ---------------------------------------------------------------------- */

static void *slowpoke(void *arg) {
  CHECK(ums_sleep(100 * UMS_NSEC_PER_MSEC));
  return "finished after 100 ms";
}

static void tour_join_timeout(void) {
  printf("5. join with a timeout: a task that needs 100 ms, joined with a\n"
         "   20 ms deadline, then without one\n");
  ums_runtime_t *rt = ums_current_runtime();
  int64_t t0 = ums_now();
  ums_task_t t = spawn_on(UMS_ANY_SCHED, "slowpoke", slowpoke, NULL);
  void *result = NULL;
  int rc =
      ums_task_join(rt, t, ums_deadline(20 * UMS_NSEC_PER_MSEC), &result, NULL);
  printf("  join with deadline: %s after %.1f ms; the task keeps running\n",
         ums_err_name(rc), ms_since(t0));
  if (rc != UMS_ETIMEDOUT) exit(1);
  CHECK(ums_task_join(rt, t, UMS_FOREVER, &result, NULL));
  printf("  join without deadline: \"%s\" at %.1f ms\n\n", (char *)result,
         ms_since(t0));
}

/* ---------------------------------------------------------------------- */
/* 6. cancel                                                               */
/* ---------------------------------------------------------------------- */

static void *waits_forever(void *arg) {
  ums_chan_t *ch = arg;
  int n;
  /* Nobody ever sends: only a cancellation ends this wait. */
  int rc = ums_chan_recv(ch, &n, UMS_FOREVER);
  return (void *)(intptr_t)rc;
}

static void tour_cancel(void) {
  printf("6. cancel: a task waits forever on an empty channel; cancelling\n"
         "   it ends the wait\n");
  ums_runtime_t *rt = ums_current_runtime();
  ums_chan_t *ch = ums_chan_new(sizeof(int), 0);
  if (!ch) CHECK(UMS_ENOMEM);
  ums_task_t t = spawn_on(1, "waits-forever", waits_forever, ch);
  CHECK(ums_sleep(10 * UMS_NSEC_PER_MSEC));
  int64_t t0 = ums_now();
  CHECK(ums_task_cancel(rt, t));
  void *result;
  int status;
  CHECK(ums_task_join(rt, t, UMS_FOREVER, &result, &status));
  int rc = (int)(intptr_t)result;
  printf("  its ums_chan_recv returned %s, %.2f ms after the cancel\n\n",
         ums_err_name(rc), ms_since(t0));
  if (rc != UMS_ECANCELED) exit(1);
  CHECK(ums_chan_delete(ch));
}

/* ---------------------------------------------------------------------- */
/* The tour task and main                                                  */
/* ---------------------------------------------------------------------- */

static void *tour(void *arg) {
  tour_spawn();
  tour_sleep();
  tour_channels();
  tour_mutex();
  tour_join_timeout();
  tour_cancel();
  return NULL;
}

static void print_stats(ums_runtime_t *rt) {
  ums_sched_stats_t rows[8];
  int n = ums_runtime_stats(rt, rows, 8);
  if (n > 8) n = 8;
  printf("7. counters (ums_runtime_stats), one row per scheduler:\n");
  printf("  %5s %9s %7s %10s %8s %6s %8s %7s %7s\n", "sched", "switches",
         "yields", "idle-waits", "spawned", "tasks", "runnable", "workers",
         "(idle)");
  for (int i = 0; i < n; i++) {
    const ums_sched_stats_t *r = &rows[i];
    printf("  %5d %9" PRIu64 " %7" PRIu64 " %10" PRIu64 " %8" PRIu64
           " %6" PRIu64 " %8" PRIu64 " %7" PRIu64 " %7" PRIu64 "\n",
           r->id, r->context_switches, r->yields, r->idle_waits,
           r->tasks_spawned, r->tasks, r->runnable, r->workers_active,
           r->workers_idle);
  }
  printf("\n");
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);

  /* Two schedulers whatever the machine, so the cross-scheduler parts of
  ** the tour always have somewhere to go. */
  ums_config_t cfg = {.schedulers = 2};
  int err = 0;
  ums_runtime_t *rt = ums_runtime_new(&cfg, &err);
  if (!rt) {
    fprintf(stderr, "tour: ums_runtime_new: %s\n", ums_strerror(err));
    return 1;
  }
  printf("ums %d.%d.%d tour: a runtime with %d schedulers\n\n",
         UMS_VERSION_MAJOR, UMS_VERSION_MINOR, UMS_VERSION_PATCH,
         ums_runtime_schedulers(rt));

  /* The tour runs as a task on scheduler 0; the main thread is a host
  ** thread, and joining from it blocks this OS thread only. */
  ums_spawn_opts_t opts = {.sched = 0, .name = "tour"};
  ums_task_t t;
  CHECK(ums_task_spawn(rt, &opts, tour, NULL, &t));
  CHECK(ums_task_join(rt, t, UMS_FOREVER, NULL, NULL));

  print_stats(rt);

  int rc = ums_runtime_shutdown(rt, ums_deadline(UMS_NSEC_PER_SEC));
  if (rc != 0) {
    fprintf(stderr, "tour: shutdown: %s\n", ums_err_name(rc));
    return 1;
  }
  printf("runtime shut down cleanly\n");
  return 0;
}
