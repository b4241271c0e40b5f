/*
** test_work.c: work items (work.c, ums-binding.h). An item starts exactly
** once, on the scheduler that takes it, in no task: its own scheduler
** when that one is free; another when its own is stuck in a task
** (named items after the grace, placed ones at once); not another while
** its own is merely on its way to it (the grace); its own even while its
** tasks keep yielding (the starvation bound). A cancelled item never
** starts; a refusing scheduler passes its items on, and when every
** scheduler refuses, the items hear so; items left at the shutdown hear
** that. Bad input is refused with UMS_EINVAL.
*/
#include "test-util.h"
#include "ums-binding.h"

#include <stdatomic.h>

#define MS UMS_NSEC_PER_MSEC

static ums_runtime_t *rt;

/* An item that records where and how it started. */
typedef struct item {
  ums_work_t w;
  _Atomic int starts;      /* calls of start */
  _Atomic int sched;       /* its sched argument */
  _Atomic int64_t at;      /* ums_now() then */
  _Atomic int in_task;     /* ums_self() was not 0 */
  _Atomic int on_thread;   /* ums_current_sched() agreed with sched */
} item_t;

/* Schedulers that refuse (bit per index). */
static _Atomic unsigned refusing;

static int item_start(ums_work_t *w, int sched) {
  item_t *it = (item_t *)w;
  if (sched >= 0 && (atomic_load(&refusing) >> sched) & 1)
    return UMS_WORK_REFUSE;
  atomic_store(&it->sched, sched);
  atomic_store(&it->at, ums_now());
  atomic_store(&it->in_task, ums_self() != 0);
  atomic_store(&it->on_thread, sched < 0 || ums_current_sched() == sched);
  atomic_fetch_add(&it->starts, 1);
  return 0;
}

static void item_init(item_t *it) {
  memset(it, 0, sizeof *it);
  it->w.start = item_start;
  atomic_store(&it->sched, -100);
}

static void started_once_on(item_t *it, int sched) {
  WAIT_UNTIL(atomic_load(&it->starts) > 0, 10000);
  CHECK_EQ(atomic_load(&it->starts), 1);
  CHECK_EQ(atomic_load(&it->sched), sched);
  CHECK_EQ(atomic_load(&it->in_task), 0);
  CHECK_EQ(atomic_load(&it->on_thread), 1);
}

/* An item queued (at `queued`) for scheduler sched, which was free: it
** starts there, unless that scheduler's thread got no CPU for
** UMS_WORK_STUCK_NS (a crowded machine), when another may take it. */
static void started_at_home(item_t *it, int sched, int64_t queued) {
  WAIT_UNTIL(atomic_load(&it->starts) > 0, 10000);
  CHECK_EQ(atomic_load(&it->starts), 1);
  if (atomic_load(&it->sched) != sched) {
    printf("   started on %d, %.1f ms after it was queued for %d\n",
           atomic_load(&it->sched), (double)(atomic_load(&it->at) - queued) / 1e6,
           sched);
    CHECK_GE(atomic_load(&it->at) - queued, UMS_WORK_STUCK_NS);
  }
  started_once_on(it, atomic_load(&it->sched));
}

/* A task that computes without yielding until *stop (or a time limit). */
static _Atomic int stop_spin;
static _Atomic int spinning;
static void *spin_fn(void *arg) {
  int64_t until = ums_now() + (int64_t)(uintptr_t)arg * MS;
  atomic_store(&spinning, 1);
  while (!atomic_load(&stop_spin) && ums_now() < until) {
  }
  atomic_store(&spinning, 0);
  return NULL;
}

#define spawn_on(sched, fn, arg) tu_spawn_named(rt, sched, NULL, fn, arg)
#define join_ok(t) tu_join_ok(rt, t)

static ums_task_t start_spinner(int sched, int ms) {
  atomic_store(&stop_spin, 0);
  ums_task_t t = spawn_on(sched, spin_fn, (void *)(uintptr_t)ms);
  WAIT_UNTIL(atomic_load(&spinning), 10000);
  return t;
}

static void stop_spinner(ums_task_t t) {
  atomic_store(&stop_spin, 1);
  join_ok(t);
}

static void test_bad_input(void) {
  rt = tu_runtime_new(2);
  item_t it;
  item_init(&it);
  CHECK_EQ(ums_work_queue(NULL, &it.w, 0), UMS_EINVAL);
  CHECK_EQ(ums_work_queue(rt, NULL, 0), UMS_EINVAL);
  CHECK_EQ(ums_work_queue(rt, &it.w, 2), UMS_EINVAL);
  CHECK_EQ(ums_work_queue(rt, &it.w, -2), UMS_EINVAL);
  it.w.start = NULL;
  CHECK_EQ(ums_work_queue(rt, &it.w, 0), UMS_EINVAL);
  CHECK(!ums_work_cancel(rt, &it.w));  /* never queued */
  tu_runtime_shutdown(rt);
  CHECK_EQ(atomic_load(&it.starts), 0);
}

/* Free schedulers start their own items; placed items go somewhere. */
static void test_named_and_placed(void) {
  rt = tu_runtime_new(2);
  item_t a, b, c;
  item_init(&a);
  item_init(&b);
  item_init(&c);
  int64_t queued = ums_now();
  CHECK_RC(ums_work_queue(rt, &a.w, 1), 0);
  started_at_home(&a, 1, queued);
  queued = ums_now();
  CHECK_RC(ums_work_queue(rt, &b.w, 0), 0);
  started_at_home(&b, 0, queued);
  CHECK_RC(ums_work_queue(rt, &c.w, UMS_ANY_SCHED), 0);
  WAIT_UNTIL(atomic_load(&c.starts) > 0, 10000);
  started_once_on(&c, atomic_load(&c.sched));
  CHECK(!ums_work_cancel(rt, &a.w));  /* started: too late */
  tu_runtime_shutdown(rt);
}

/* Tasks that sleep until stop_sleep. */
static _Atomic int stop_sleep;
static void *sleep_fn(void *arg) {
  (void)arg;
  while (!atomic_load(&stop_sleep)) CHECK_RC(ums_sleep(MS), 0);
  return NULL;
}

/* Scheduler 0 stuck in a task that never yields: its named items start on
** scheduler 1 once the grace is over; a placed one at once. */
static void test_steal_from_stuck(void) {
  rt = tu_runtime_new(2);
  ums_task_t spin = start_spinner(0, 20000);
  enum { N = 4 };
  item_t named[N];
  int64_t queued = ums_now();
  for (int i = 0; i < N; i++) {
    item_init(&named[i]);
    CHECK_RC(ums_work_queue(rt, &named[i].w, 0), 0);
  }
  for (int i = 0; i < N; i++) {
    started_once_on(&named[i], 1);
    CHECK_GE(atomic_load(&named[i].at) - queued, UMS_WORK_GRACE_NS);
  }
  CHECK_EQ(atomic_load(&spinning), 1);  /* stolen, not started after */
  /* Placed on the stuck scheduler (scheduler 1 holds more tasks), taken by
  ** scheduler 1. */
  enum { NSLEEP = 3 };
  ums_task_t sleepers[NSLEEP];
  atomic_store(&stop_sleep, 0);
  for (int i = 0; i < NSLEEP; i++) sleepers[i] = spawn_on(1, sleep_fn, NULL);
  item_t placed;
  item_init(&placed);
  CHECK_EQ(ums_runtime_place(rt, -1, NULL), 0);
  CHECK_RC(ums_work_queue(rt, &placed.w, UMS_ANY_SCHED), 0);
  started_once_on(&placed, 1);
  CHECK_EQ(atomic_load(&spinning), 1);
  stop_spinner(spin);
  atomic_store(&stop_sleep, 1);
  for (int i = 0; i < NSLEEP; i++) join_ok(sleepers[i]);
  tu_runtime_shutdown(rt);
}

/* A task of scheduler 0 queues items for scheduler 0 and then waits:
** scheduler 1, free all along, leaves them to scheduler 0, which starts
** them at its next idle moment, well within the grace. */
typedef struct round {
  item_t items[3];
} round_t;

static void *queue_then_wait(void *arg) {
  round_t *r = arg;
  for (int i = 0; i < 3; i++) CHECK_RC(ums_work_queue(rt, &r->items[i].w, 0), 0);
  CHECK_RC(ums_sleep(2 * MS), 0);
  return NULL;
}

static void test_grace(void) {
  rt = tu_runtime_new(2);
  int local = 0;
  enum { ROUNDS = 20 };
  for (int k = 0; k < ROUNDS; k++) {
    round_t r;
    for (int i = 0; i < 3; i++) item_init(&r.items[i]);
    join_ok(spawn_on(0, queue_then_wait, &r));
    bool all = true;
    for (int i = 0; i < 3; i++) {
      WAIT_UNTIL(atomic_load(&r.items[i].starts) > 0, 10000);
      CHECK_EQ(atomic_load(&r.items[i].starts), 1);
      all = all && atomic_load(&r.items[i].sched) == 0;
    }
    local += all;
  }
  printf("   %d of %d rounds started where they were queued\n", local,
         ROUNDS);
  /* Without the grace scheduler 1, woken by each queueing, takes them
  ** while the task is still running. A loaded machine can delay
  ** scheduler 0 past the grace now and then. */
  CHECK_GE(local, ROUNDS * 3 / 4);
  tu_runtime_shutdown(rt);
}

/* One scheduler whose tasks keep yielding: its item starts all the same,
** within the starvation bound. */
static _Atomic int stop_yield;
static void *yield_fn(void *arg) {
  (void)arg;
  int64_t until = ums_now() + 20 * UMS_NSEC_PER_SEC;
  while (!atomic_load(&stop_yield) && ums_now() < until)
    CHECK_RC(ums_yield(), 0);
  return NULL;
}

static void test_starvation(void) {
  rt = tu_runtime_new(1);
  atomic_store(&stop_yield, 0);
  ums_task_t y1 = spawn_on(0, yield_fn, NULL);
  ums_task_t y2 = spawn_on(0, yield_fn, NULL);
  item_t it;
  item_init(&it);
  int64_t queued = ums_now();
  CHECK_RC(ums_work_queue(rt, &it.w, 0), 0);
  started_once_on(&it, 0);
  int64_t waited = atomic_load(&it.at) - queued;
  printf("   started after %.0f ms among yielding tasks\n", (double)waited / 1e6);
  CHECK_GE(waited, UMS_WORK_STARVE_NS / 2);
  atomic_store(&stop_yield, 1);
  join_ok(y1);
  join_ok(y2);
  tu_runtime_shutdown(rt);
}

/* Cancel: an item its scheduler has not taken is taken back and never
** starts. Items left when the shutdown begins hear UMS_WORK_ENDED, and
** items queued after it began are refused. The task below queues an item
** for its own scheduler and then never yields until a queue is refused,
** so nothing takes the item before the shutdown. */
static item_t ended, probe;
static _Atomic int probes;
static void *queue_then_spin(void *arg) {
  (void)arg;
  CHECK_RC(ums_work_queue(rt, &ended.w, 0), 0);
  for (;;) {
    int rc = ums_work_queue(rt, &probe.w, UMS_ANY_SCHED);
    if (rc == UMS_ESHUTDOWN) break;
    CHECK_RC(rc, 0);
    CHECK(ums_work_cancel(rt, &probe.w));  /* nothing ran: still queued */
    CHECK(!ums_work_cancel(rt, &probe.w));
    atomic_fetch_add(&probes, 1);
  }
  return NULL;
}

static void test_cancel_and_end(void) {
  rt = tu_runtime_new(1);
  item_init(&ended);
  item_init(&probe);
  atomic_store(&probes, 0);
  (void)spawn_on(0, queue_then_spin, NULL);
  WAIT_UNTIL(atomic_load(&probes) > 0, 10000);
  tu_runtime_shutdown(rt);
  CHECK_EQ(atomic_load(&probe.starts), 0);
  CHECK_EQ(atomic_load(&ended.starts), 1);
  CHECK_EQ(atomic_load(&ended.sched), UMS_WORK_ENDED);
  CHECK_EQ(atomic_load(&ended.on_thread), 1);
}

/* Refusal: scheduler 1 refuses, so its item and everything after start on
** scheduler 0; when both refuse, the items hear UMS_WORK_REFUSED. */
static void test_refuse(void) {
  rt = tu_runtime_new(2);
  atomic_store(&refusing, 2u);
  item_t a, b, c;
  item_init(&a);
  item_init(&b);
  item_init(&c);
  CHECK_RC(ums_work_queue(rt, &a.w, 1), 0);
  started_once_on(&a, 0);
  CHECK_RC(ums_work_queue(rt, &b.w, 1), 0);
  started_once_on(&b, 0);
  atomic_store(&refusing, 3u);
  CHECK_RC(ums_work_queue(rt, &c.w, UMS_ANY_SCHED), 0);
  WAIT_UNTIL(atomic_load(&c.starts) > 0, 10000);
  CHECK_EQ(atomic_load(&c.starts), 1);
  CHECK_EQ(atomic_load(&c.sched), UMS_WORK_REFUSED);
  item_t d;
  item_init(&d);
  CHECK_RC(ums_work_queue(rt, &d.w, 0), 0);
  CHECK_EQ(atomic_load(&d.starts), 1);  /* at once, on this thread */
  CHECK_EQ(atomic_load(&d.sched), UMS_WORK_REFUSED);
  atomic_store(&refusing, 0u);
  tu_runtime_shutdown(rt);
}

/* Many items from many threads at once: each starts exactly once. */
enum { NTHREADS = 3, PER_THREAD = 2000 };
static item_t many[NTHREADS][PER_THREAD];
static void *host_queue(void *arg) {
  item_t *its = arg;
  for (int i = 0; i < PER_THREAD; i++) {
    item_init(&its[i]);
    CHECK_RC(ums_work_queue(rt, &its[i].w, i % 3 == 0 ? UMS_ANY_SCHED : i % 2),
             0);
    if (i % 7 == 0) (void)ums_work_cancel(rt, &its[i].w);
  }
  return NULL;
}

static void test_many(void) {
  rt = tu_runtime_new(2);
  pthread_t th[NTHREADS];
  for (int k = 0; k < NTHREADS; k++)
    CHECK_EQ(pthread_create(&th[k], NULL, host_queue, many[k]), 0);
  for (int k = 0; k < NTHREADS; k++) pthread_join(th[k], NULL);
  tu_runtime_shutdown(rt);
  int per[3] = {0, 0, 0}, cancelled = 0;
  for (int k = 0; k < NTHREADS; k++)
    for (int i = 0; i < PER_THREAD; i++) {
      int n = atomic_load(&many[k][i].starts);
      CHECK(n <= 1);
      if (n == 0) {
        CHECK(i % 7 == 0);
        cancelled++;
        continue;
      }
      int s = atomic_load(&many[k][i].sched);
      CHECK(s == 0 || s == 1 || s == UMS_WORK_ENDED);
      per[s >= 0 ? s : 2]++;
      CHECK_EQ(atomic_load(&many[k][i].on_thread), 1);
    }
  printf("   started on 0: %d, on 1: %d, at the end: %d, cancelled before: "
         "%d\n", per[0], per[1], per[2], cancelled);
}

int main(void) {
  RUN(test_bad_input);
  RUN(test_named_and_placed);
  RUN(test_steal_from_stuck);
  RUN(test_grace);
  RUN(test_starvation);
  RUN(test_cancel_and_end);
  RUN(test_refuse);
  RUN(test_many);
  return 0;
}
