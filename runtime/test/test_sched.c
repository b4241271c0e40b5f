/*
** test_sched.c: the schedulers as seen through ums_runtime_stats: the
** counters, the idle wait, wake-ups that cross schedulers through the
** completion list, the idle worker pool and its trimming, and stack reuse
** over many short tasks.
*/
#include "test-util.h"
#include "internal.h" /* UMS__URGENT_STREAK */

#include <stdatomic.h>

#define PTR(n) ((void *)(uintptr_t)(n))

static ums_runtime_t *rt;

static ums_task_t spawn_on(int sched, ums_task_fn fn, void *arg) {
  ums_spawn_opts_t o = {.sched = sched};
  ums_task_t t = 0;
  CHECK_RC(ums_task_spawn(rt, &o, fn, arg, &t), 0);
  return t;
}

static void join_ok(ums_task_t t) {
  int status = 1;
  CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, NULL, &status), 0);
  CHECK_RC(status, 0);
}

/* An event plus a count of the tasks that reached it; see gate_wait_fn. */
typedef struct gate {
  ums_event_t *ev;
  int64_t deadline; /* of each wait; 0 means UMS_FOREVER */
  atomic_int started;
} gate_t;

/* Counts itself, then waits. Once every task has counted itself, its
** scheduler can be idle only if they have all parked: a scheduler clears
** its idle flag before it runs anything. */
static void *gate_wait_fn(void *arg) {
  gate_t *g = arg;
  atomic_fetch_add(&g->started, 1);
  return PTR(ums_event_wait(g->ev, g->deadline ? g->deadline : UMS_FOREVER));
}

static void *nothing_fn(void *arg) { return arg; }

/* ====================================================================== */
/* Counters                                                                */
/* ====================================================================== */

static void *yield_n_fn(void *arg) {
  for (int i = 0; i < (int)(uintptr_t)arg; i++) CHECK_RC(ums_yield(), 0);
  return NULL;
}

static void *two_yielders_fn(void *arg) {
  ums_task_t a = spawn_on(ums_current_sched(), yield_n_fn, arg);
  ums_task_t b = spawn_on(ums_current_sched(), yield_n_fn, arg);
  join_ok(a);
  join_ok(b);
  return NULL;
}

static void *sleep_20ms_fn(void *arg) {
  CHECK_RC(ums_sleep(tu_ms(20)), 0);
  return arg;
}

static void test_counters(void) {
  rt = tu_runtime_new(2);
  ums_sched_stats_t rows[4];
  CHECK_EQ(ums_runtime_stats(rt, rows, 4), 2);
  CHECK_EQ(ums_runtime_stats(rt, NULL, 0), 2);
  CHECK_RC(ums_runtime_stats(NULL, rows, 4), UMS_EINVAL);
  CHECK_EQ(rows[0].id, 0);
  CHECK_EQ(rows[1].id, 1);
  CHECK_EQ(rows[0].tasks + rows[1].tasks, 0);
  /* n smaller than the schedulers: only n rows are written. */
  memset(rows, 0x5a, sizeof rows);
  CHECK_EQ(ums_runtime_stats(rt, rows, 1), 2);
  CHECK_EQ(rows[0].id, 0);
  CHECK_EQ(rows[1].id, 0x5a5a5a5a);

  /* tasks_spawned counts where tasks started. */
  ums_sched_stats_t b0 = tu_stats(rt, 0), b1 = tu_stats(rt, 1);
  ums_task_t ts[7];
  for (int i = 0; i < 7; i++) ts[i] = spawn_on(1, nothing_fn, NULL);
  for (int i = 0; i < 7; i++) join_ok(ts[i]);
  CHECK_EQ(tu_stats(rt, 1).tasks_spawned - b1.tasks_spawned, 7);
  CHECK_EQ(tu_stats(rt, 0).tasks_spawned - b0.tasks_spawned, 0);

  /* Two tasks yielding to each other: every yield is counted and is a
  ** fiber switch. */
  b0 = tu_stats(rt, 0);
  join_ok(spawn_on(0, two_yielders_fn, PTR(100)));
  ums_sched_stats_t a0 = tu_stats(rt, 0);
  CHECK_EQ(a0.yields - b0.yields, 200);
  CHECK_GE(a0.context_switches - b0.context_switches, 200);
  CHECK_EQ(a0.tasks_spawned - b0.tasks_spawned, 3);

  /* A scheduler with nothing to run but a sleeper waits idle. */
  WAIT_UNTIL(tu_stats(rt, 1).idle, 5000);
  b1 = tu_stats(rt, 1);
  join_ok(spawn_on(1, sleep_20ms_fn, NULL));
  CHECK_GE(tu_stats(rt, 1).idle_waits - b1.idle_waits, 1);
  WAIT_UNTIL(tu_stats(rt, 1).idle, 5000);
  CHECK_EQ(tu_stats(rt, 1).tasks, 0);
  CHECK_EQ(tu_stats(rt, 1).runnable, 0);
  tu_runtime_shutdown(rt);
}

/* The gauges while tasks are parked, and the pool after they end. */
static void test_gauges_and_pool(void) {
  rt = tu_runtime_new(1);
  gate_t g = {.ev = ums_event_new(1, 0),
              .deadline = ums_deadline(3600 * UMS_NSEC_PER_SEC)};
  ums_task_t ts[5];
  for (int i = 0; i < 5; i++) ts[i] = spawn_on(0, gate_wait_fn, &g);
  WAIT_UNTIL(atomic_load(&g.started) == 5 && tu_stats(rt, 0).idle, 5000);
  ums_sched_stats_t st = tu_stats(rt, 0);
  CHECK_EQ(st.tasks, 5);
  CHECK_EQ(st.runnable, 0);
  CHECK_EQ(st.pending, 0);
  CHECK_EQ(st.timers, 5); /* each wait has a deadline */
  CHECK_EQ(st.workers_active, 5);
  CHECK_EQ(st.workers_idle, 0);

  CHECK_RC(ums_event_set(g.ev), 0);
  for (int i = 0; i < 5; i++) join_ok(ts[i]);
  WAIT_UNTIL(tu_stats(rt, 0).tasks == 0 && tu_stats(rt, 0).idle, 5000);
  st = tu_stats(rt, 0);
  CHECK_EQ(st.timers, 0);
  /* No task is left, so no worker carries one: all five are idle. */
  CHECK_EQ(st.workers_active + st.workers_idle, 5);
  CHECK_EQ(st.workers_active, 0);
  CHECK_EQ(st.workers_idle, 5);
  CHECK_RC(ums_event_delete(g.ev), 0);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Cross-scheduler wake-ups                                                */
/* ====================================================================== */

typedef struct cross {
  ums_event_t *e1, *e2;
  atomic_int phase;
  int rc1, rc2;
  int sched1, sched2;
} cross_t;

static void *cross_waiter_fn(void *arg) {
  cross_t *c = arg;
  atomic_store(&c->phase, 1);
  c->rc1 = ums_event_wait(c->e1, UMS_FOREVER);
  c->sched1 = ums_current_sched();
  atomic_store(&c->phase, 2);
  c->rc2 = ums_event_wait(c->e2, UMS_FOREVER);
  c->sched2 = ums_current_sched();
  return NULL;
}

static void *set_event_fn(void *arg) { return PTR(ums_event_set(arg)); }

static void *set_event_thread(void *arg) {
  CHECK_RC(ums_event_set(arg), 0);
  return NULL;
}

static void test_cross_sched_wake(void) {
  rt = tu_runtime_new(2);
  /* Auto reset, so a wake-up that got lost could not hide behind a
  ** still-set event. */
  cross_t c = {.e1 = ums_event_new(0, 0), .e2 = ums_event_new(0, 0)};
  ums_task_t w = spawn_on(0, cross_waiter_fn, &c);

  /* A task on scheduler 1 wakes a task parked on scheduler 0. */
  WAIT_UNTIL(atomic_load(&c.phase) == 1 && tu_stats(rt, 0).idle, 5000);
  uint64_t idle_waits = tu_stats(rt, 0).idle_waits;
  ums_task_t s = spawn_on(1, set_event_fn, c.e1);
  int status = 1;
  void *res = PTR(1);
  CHECK_RC(ums_task_join(rt, s, UMS_FOREVER, &res, &status), 0);
  CHECK_PTR_EQ(res, PTR(0));

  /* A host thread wakes it again. */
  WAIT_UNTIL(atomic_load(&c.phase) == 2 && tu_stats(rt, 0).idle, 5000);
  CHECK_GT(tu_stats(rt, 0).idle_waits, idle_waits);
  pthread_t th;
  CHECK_EQ(pthread_create(&th, NULL, set_event_thread, c.e2), 0);
  CHECK_EQ(pthread_join(th, NULL), 0);
  join_ok(w);
  CHECK_RC(c.rc1, 0);
  CHECK_RC(c.rc2, 0);
  /* It kept its scheduler. */
  CHECK_EQ(c.sched1, 0);
  CHECK_EQ(c.sched2, 0);
  CHECK_RC(ums_event_delete(c.e1), 0);
  CHECK_RC(ums_event_delete(c.e2), 0);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Worker trimming                                                         */
/* ====================================================================== */

#define TRIM_TASKS 20

/* Runs TRIM_TASKS tasks at once on scheduler 0 so that as many workers
** exist, then lets them all end. Returns when it let them go. */
static int64_t run_wide(void) {
  gate_t g = {.ev = ums_event_new(1, 0)};
  ums_task_t ts[TRIM_TASKS];
  for (int i = 0; i < TRIM_TASKS; i++) ts[i] = spawn_on(0, gate_wait_fn, &g);
  WAIT_UNTIL(atomic_load(&g.started) == TRIM_TASKS && tu_stats(rt, 0).idle,
             5000);
  CHECK_EQ(tu_stats(rt, 0).workers_active, TRIM_TASKS);
  int64_t released = ums_now();
  CHECK_RC(ums_event_set(g.ev), 0);
  for (int i = 0; i < TRIM_TASKS; i++) join_ok(ts[i]);
  WAIT_UNTIL(tu_stats(rt, 0).tasks == 0, 5000);
  CHECK_RC(ums_event_delete(g.ev), 0);
  return released;
}

static uint64_t workers_all(void) {
  ums_sched_stats_t st = tu_stats(rt, 0);
  return st.workers_active + st.workers_idle;
}

static void test_worker_trim(void) {
  /* Trimmed down to the one kept. */
  ums_config_t cfg = {.schedulers = 1,
                      .worker_idle_timeout = tu_ms(50),
                      .idle_workers_kept = 1};
  rt = tu_runtime_new_cfg(&cfg);
  int64_t released = run_wide();
  WAIT_UNTIL(tu_stats(rt, 0).workers_idle <= 1, 3000);
  /* Not before a whole idle timeout has passed. */
  CHECK_GE(tu_elapsed_ms(released), 45);
  WAIT_UNTIL(workers_all() <= 2, 3000);
  /* The runtime still runs tasks afterwards. */
  join_ok(spawn_on(0, nothing_fn, NULL));
  tu_runtime_shutdown(rt);

  /* Trimmed down to the default 16 kept, and no further. */
  cfg.idle_workers_kept = 0;
  rt = tu_runtime_new_cfg(&cfg);
  run_wide();
  WAIT_UNTIL(tu_stats(rt, 0).workers_idle <= 16, 3000);
  usleep(300 * 1000); /* several idle timeouts */
  CHECK_EQ(tu_stats(rt, 0).workers_idle, 16);
  tu_runtime_shutdown(rt);

  /* A negative timeout never trims. */
  cfg.worker_idle_timeout = -1;
  cfg.idle_workers_kept = 1;
  rt = tu_runtime_new_cfg(&cfg);
  run_wide();
  usleep(300 * 1000);
  CHECK_GE(tu_stats(rt, 0).workers_idle, TRIM_TASKS - 1);
  CHECK_EQ(workers_all(), TRIM_TASKS);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Stack reuse                                                             */
/* ====================================================================== */

/* TSan builds start every task on a fresh TSan fiber (about 0.6 ms each
** here), so they run fewer. */
#if defined(__SANITIZE_THREAD__)
#define REUSE_IN_TASK 2000
#else
#define REUSE_IN_TASK 10000
#endif
#define REUSE_FROM_HOST 1000

static void *sequential_spawner_fn(void *arg) {
  for (int i = 0; i < REUSE_IN_TASK; i++) {
    ums_task_t t = spawn_on(ums_current_sched(), nothing_fn, PTR(i));
    void *res = NULL;
    CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, &res, NULL), 0);
    CHECK_PTR_EQ(res, PTR(i));
  }
  return arg;
}

static void test_stack_reuse(void) {
  rt = tu_runtime_new(1);
  uint64_t spawned = tu_stats(rt, 0).tasks_spawned;
  /* From a task: the finished child's worker goes back to the pool and
  ** the next child takes it. */
  join_ok(spawn_on(0, sequential_spawner_fn, NULL));
  WAIT_UNTIL(tu_stats(rt, 0).tasks == 0, 5000);
  CHECK_LE(workers_all(), 3);
  /* From the host: each task runs on the worker the last one freed. */
  for (int i = 0; i < REUSE_FROM_HOST; i++) {
    ums_task_t t = spawn_on(0, nothing_fn, PTR(i));
    void *res = NULL;
    CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, &res, NULL), 0);
    CHECK_PTR_EQ(res, PTR(i));
  }
  WAIT_UNTIL(tu_stats(rt, 0).tasks == 0, 5000);
  CHECK_LE(workers_all(), 3);
  CHECK_EQ(tu_stats(rt, 0).tasks_spawned - spawned,
           1 + REUSE_IN_TASK + REUSE_FROM_HOST);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Timer-woken tasks go first, bounded                                      */
/* ====================================================================== */

#define URGENT_BACKLOG 1000
static int urgent_order;       /* next position handed out */
static int sleeper_position;   /* where the timer-woken task ran */

static void *record_fn(void *arg) {
  (void)arg;
  urgent_order++;
  return NULL;
}

static void *sleeper_fn(void *arg) {
  (void)arg;
  CHECK_RC(ums_sleep(tu_ms(2)), 0);
  sleeper_position = urgent_order++;
  return NULL;
}

static void *backlog_fn(void *arg) {
  /* The sleeper parks first; then, without yielding, we wait past its
  ** deadline and queue a backlog of tasks that have not started. At the
  ** next pass the sleeper's timer fires: it must run before the backlog
  ** (within the bounded streak), not after 1,000 tasks. */
  ums_task_t s = spawn_on(0, sleeper_fn, NULL);
  CHECK_RC(ums_yield(), 0);
  int64_t until = ums_now() + tu_ms(5);
  while (ums_now() < until) {
  }
  static ums_task_t backlog[URGENT_BACKLOG];
  for (int i = 0; i < URGENT_BACKLOG; i++)
    backlog[i] = spawn_on(0, record_fn, NULL);
  for (int i = 0; i < URGENT_BACKLOG; i++) join_ok(backlog[i]);
  join_ok(s);
  return arg;
}

static void test_timer_woken_first(void) {
  rt = tu_runtime_new(1);
  urgent_order = 0;
  sleeper_position = -1;
  join_ok(spawn_on(0, backlog_fn, NULL));
  CHECK_GE(sleeper_position, 0);
  CHECK_LT(sleeper_position, UMS__URGENT_STREAK);
  tu_runtime_shutdown(rt);
}

int main(void) {
  RUN(test_counters);
  RUN(test_timer_woken_first);
  RUN(test_gauges_and_pool);
  RUN(test_cross_sched_wake);
  RUN(test_worker_trim);
  RUN(test_stack_reuse);
  return 0;
}
