/*
** test_stats.c: the observability readers beyond waits (ums.h,
** "Observability"): the scheduler rows (task switches, the running task
** and its name, quantum expiries, the load factor), the hidden pools, the
** task list (states, names, spawners, what they wait on, sampled CPU
** time), one task's info through its life, and renaming.
**
** Time bounds are generous: CPU time is sampled every 10 ms by the
** monitor, on a VM that may lose the CPU for tens of milliseconds.
*/
#include "test-util.h"

#include <stdatomic.h>
#include <time.h>

#define PTR(n) ((void *)(uintptr_t)(n))
#define MS UMS_NSEC_PER_MSEC

static ums_runtime_t *rt;

/* ====================================================================== */
/* Scheduler rows                                                          */
/* ====================================================================== */

/* Spawns two yielders on its own scheduler and joins them: both are queued
** before either runs, so every yield switches to the other (spawned from
** the host thread, the first could be done before the second arrives). */
static void *two_yielders_fn(void *arg) {
  ums_spawn_opts_t o = {.sched = ums_current_sched(), .name = "yielder"};
  ums_task_t t[2];
  for (int i = 0; i < 2; i++)
    CHECK_RC(ums_task_spawn(rt, &o, tu_yield_n, arg, &t[i]), 0);
  for (int i = 0; i < 2; i++)
    CHECK_RC(ums_task_join(rt, t[i], UMS_FOREVER, NULL, NULL), 0);
  return NULL;
}

static void *expire_fn(void *arg) {
  for (int i = 0; i < (int)(uintptr_t)arg; i++) ums_quantum_expired();
  return NULL;
}

static void test_sched_rows(void) {
  rt = tu_runtime_new(2);
  ums_sched_stats_t b = tu_stats(rt, 0);
  CHECK_EQ(b.hidden, 0);
  tu_join_ok(rt, tu_spawn_named(rt, 0, "driver", two_yielders_fn, PTR(100)));
  ums_sched_stats_t a = tu_stats(rt, 0);
  /* Every yield is a task switch (C tasks: a fiber switch too). */
  CHECK_GE(a.context_switches - b.context_switches, 200);
  CHECK_GE(a.fiber_switches - b.fiber_switches, 200);
  CHECK_EQ(a.yields - b.yields, 200);

  tu_join_ok(rt, tu_spawn_named(rt, 1, "exp", expire_fn, PTR(3)));
  CHECK_EQ(tu_stats(rt, 1).quantum_expiries, 3);
  CHECK_EQ(tu_stats(rt, 0).quantum_expiries, 0);
  ums_quantum_expired(); /* outside a task: nothing */
  CHECK_EQ(tu_stats(rt, 1).quantum_expiries, 3);

  /* The running task, by id and name, while it runs. */
  ums_task_t s = tu_spawn_named(rt, 1, "spinner", tu_spin_ms, PTR(300));
  WAIT_UNTIL(tu_stats(rt, 1).running == s, 5000);
  ums_sched_stats_t r = tu_stats(rt, 1);
  CHECK_STR_EQ(r.running_name, "spinner");
  CHECK_EQ(r.idle, 0);
  CHECK_EQ(r.tasks, 1);
  CHECK_EQ(r.load_factor, 1);
  tu_join_ok(rt, s);
  /* Idle: nothing is running. */
  WAIT_UNTIL(tu_stats(rt, 1).idle, 5000);
  r = tu_stats(rt, 1);
  CHECK_EQ(r.running, 0);
  CHECK_STR_EQ(r.running_name, "");
  CHECK_EQ(r.load_factor, 0);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Hidden pools                                                            */
/* ====================================================================== */

static void noop(void *arg) { (void)arg; }

static void *preempt_n_fn(void *arg) {
  for (int i = 0; i < (int)(uintptr_t)arg; i++)
    CHECK_RC(ums_preempt(noop, NULL, NULL, UMS_FOREVER), 0);
  return NULL;
}

static void test_pools(void) {
  ums_config_t cfg = {.schedulers = 1, .io_backend = UMS_IO_POOL};
  rt = tu_runtime_new_cfg(&cfg);
  ums_pool_stats_t p[3];
  memset(p, 0x5a, sizeof p);
  CHECK_EQ(ums_runtime_pool_stats(rt, p, 2), 2);
  CHECK_STR_EQ(p[0].name, "preemptive");
  CHECK_STR_EQ(p[1].name, "io");
  CHECK_EQ(p[0].completed, 0);
  CHECK_EQ(p[0].queued, 0);
  tu_join_ok(rt, tu_spawn_named(rt, 0, "calls", preempt_n_fn, PTR(20)));
  /* The pool thread counts a call completed after its unpark (pool.c),
  ** so the task may be joined a moment before: wait for it, bounded. */
  int64_t until = ums_deadline(tu_ms(5000));
  do {
    memset(p, 0x5a, sizeof p);
    CHECK_EQ(ums_runtime_pool_stats(rt, p, 1), 2);
  } while (p[0].completed < 20 && ums_now() < until);
  CHECK_EQ(p[0].completed, 20);
  CHECK_GE(p[0].threads, 1);
  CHECK_EQ(p[0].active + p[0].idle, p[0].threads);
  /* Only the first row was written. */
  CHECK_EQ(p[1].queued, 0x5a5a5a5a5a5a5a5aull);
  CHECK_EQ(ums_runtime_pool_stats(rt, NULL, 0), 2);
  CHECK_RC(ums_runtime_pool_stats(rt, NULL, 1), UMS_EINVAL);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Tasks                                                                   */
/* ====================================================================== */

/* Written by the parent task, read by the test's thread: atomics. */
typedef struct family {
  _Atomic ums_task_t parent;
  _Atomic ums_task_t kids[4];
  ums_event_t *go;
} family_t;

static void *kid_fn(void *arg) {
  return PTR(ums_event_wait(((family_t *)arg)->go, UMS_FOREVER));
}

static void *parent_fn(void *arg) {
  family_t *f = arg;
  atomic_store(&f->parent, ums_self());
  for (int i = 0; i < 4; i++) {
    char name[16];
    snprintf(name, sizeof name, "kid%d", i);
    ums_spawn_opts_t o = {.sched = i % 2, .name = name};
    ums_task_t k;
    CHECK_RC(ums_task_spawn(rt, &o, kid_fn, f, &k), 0);
    atomic_store(&f->kids[i], k);
  }
  for (int i = 0; i < 4; i++)
    CHECK_RC(ums_task_join(rt, f->kids[i], UMS_FOREVER, NULL, NULL), 0);
  return NULL;
}

typedef struct seen {
  family_t *f;
  int kids, parent, total;
} seen_t;

static int visit(const ums_task_info_t *info, void *arg) {
  seen_t *s = arg;
  s->total++;
  for (int i = 0; i < 4; i++) {
    if (info->id != s->f->kids[i]) continue;
    char name[16];
    snprintf(name, sizeof name, "kid%d", i);
    CHECK_STR_EQ(info->name, name);
    CHECK_EQ(info->spawner, s->f->parent);
    CHECK_EQ(info->sched, i % 2);
    CHECK_EQ(info->state, UMS_TASK_SUSPENDED);
    CHECK_EQ(info->wait_type, UMS_WAIT_EVENT);
    CHECK_PTR_EQ(info->wait_object, s->f->go);
    CHECK_GE(info->wait_ns, 0);
    s->kids++;
  }
  if (info->id == s->f->parent) {
    CHECK_STR_EQ(info->name, "parent");
    CHECK_EQ(info->spawner, 0); /* spawned by this host thread */
    CHECK_EQ(info->state, UMS_TASK_SUSPENDED);
    CHECK_EQ(info->wait_type, UMS_WAIT_JOIN);
    CHECK_EQ(info->blocker, s->f->kids[0]);
    s->parent++;
  }
  return 0;
}

static int stop_at_once(const ums_task_info_t *info, void *arg) {
  (void)info;
  (*(int *)arg)++;
  return 1;
}

static void test_task_list(void) {
  rt = tu_runtime_new(2);
  family_t f = {.go = ums_event_new(1, 0)};
  ums_task_t p = tu_spawn_named(rt, 0, "parent", parent_fn, &f);
  /* Every kid parked on the event. */
  WAIT_UNTIL(atomic_load(&f.kids[3]) != 0, 5000);
  seen_t s = {.f = &f};
  int64_t until = ums_deadline(5 * UMS_NSEC_PER_SEC);
  for (;;) {
    s.kids = s.parent = s.total = 0;
    /* Not all parked yet: look again. */
    ums_task_info_t info;
    bool parked = true;
    for (int i = 0; i < 4; i++) {
      CHECK_RC(ums_task_info(rt, f.kids[i], &info), 0);
      parked = parked && info.state == UMS_TASK_SUSPENDED;
    }
    CHECK_RC(ums_task_info(rt, p, &info), 0);
    parked = parked && info.wait_type == UMS_WAIT_JOIN;
    if (parked) break;
    CHECK_LT(ums_now(), until);
    usleep(1000);
  }
  CHECK_EQ(ums_runtime_tasks(rt, visit, &s), 5);
  CHECK_EQ(s.kids, 4);
  CHECK_EQ(s.parent, 1);
  CHECK_EQ(s.total, 5);
  int calls = 0;
  CHECK_EQ(ums_runtime_tasks(rt, stop_at_once, &calls), 1);
  CHECK_EQ(calls, 1);
  CHECK_RC(ums_runtime_tasks(rt, NULL, NULL), UMS_EINVAL);

  /* Renaming, seen by the next look. */
  CHECK_RC(ums_task_set_name(rt, f.kids[2], "renamed"), 0);
  ums_task_info_t info;
  CHECK_RC(ums_task_info(rt, f.kids[2], &info), 0);
  CHECK_STR_EQ(info.name, "renamed");
  CHECK_RC(ums_task_set_name(rt, f.kids[2],
                             "a name far longer than thirty-one bytes"),
           0);
  CHECK_RC(ums_task_info(rt, f.kids[2], &info), 0);
  CHECK_EQ(strlen(info.name), 31);
  CHECK_RC(ums_task_set_name(rt, f.kids[2], NULL), 0);
  CHECK_RC(ums_task_info(rt, f.kids[2], &info), 0);
  CHECK_STR_EQ(info.name, "");

  CHECK_RC(ums_event_set(f.go), 0);
  tu_join_ok(rt, p);
  /* The kids were joined by the parent: gone. */
  CHECK_RC(ums_task_info(rt, f.kids[0], &info), UMS_ESRCH);
  CHECK_RC(ums_task_set_name(rt, f.kids[0], "x"), UMS_ESRCH);
  tu_runtime_shutdown(rt);
  ums_event_delete(f.go);
}

static void test_task_life(void) {
  ums_config_t cfg = {.schedulers = 1, .max_workers = 1};
  rt = tu_runtime_new_cfg(&cfg);
  ums_task_info_t info;
  ums_task_t a = tu_spawn_named(rt, 0, "a", tu_sleep_ms, PTR(200));
  WAIT_UNTIL(ums_task_info(rt, a, &info) == 0 &&
                 info.wait_type == UMS_WAIT_SLEEP,
             5000);
  CHECK_EQ(info.state, UMS_TASK_SUSPENDED);
  /* a keeps the one worker while it sleeps: b waits for it. */
  ums_task_t b = tu_spawn_named(rt, 0, "b", tu_spin_ms, PTR(100));
  WAIT_UNTIL(ums_task_info(rt, b, &info) == 0 &&
                 info.wait_type == UMS_WAIT_PENDING_WORKER,
             5000);
  CHECK_EQ(info.state, UMS_TASK_PENDING);
  /* b runs once a is done; joinable, a is done until joined. */
  WAIT_UNTIL(ums_task_info(rt, b, &info) == 0 &&
                 info.state == UMS_TASK_RUNNING,
             5000);
  CHECK_EQ(info.wait_type, UMS_WAIT_NONE);
  CHECK_RC(ums_task_info(rt, a, &info), 0);
  CHECK_EQ(info.state, UMS_TASK_DONE);
  CHECK_EQ(info.wait_type, UMS_WAIT_NONE);
  tu_join_ok(rt, a);
  CHECK_RC(ums_task_info(rt, a, &info), UMS_ESRCH);
  tu_join_ok(rt, b);
  CHECK_RC(ums_task_info(rt, 0, &info), UMS_ESRCH);
  CHECK_RC(ums_task_info(rt, a, NULL), UMS_EINVAL);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* CPU time, sampled                                                       */
/* ====================================================================== */

/* Spins until its own thread has used arg ms of CPU: on a shared machine
** wall time says little about the CPU a task got. */
static void *cpu_spin_fn(void *arg) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  int64_t start = (int64_t)ts.tv_sec * UMS_NSEC_PER_SEC + ts.tv_nsec;
  int64_t want = (int64_t)(uintptr_t)arg * MS;
  for (;;) {
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    if ((int64_t)ts.tv_sec * UMS_NSEC_PER_SEC + ts.tv_nsec - start >= want)
      return NULL;
  }
}

static void test_cpu_time(void) {
  rt = tu_runtime_new(2);
  ums_task_t sp = tu_spawn_named(rt, 0, "spinner", cpu_spin_fn, PTR(300));
  ums_task_t sl = tu_spawn_named(rt, 1, "sleeper", tu_sleep_ms, PTR(300));
  /* Joinable, they stay visible when done. */
  ums_task_info_t a, b;
  WAIT_UNTIL(ums_task_info(rt, sp, &a) == 0 && a.state == UMS_TASK_DONE,
             30000);
  WAIT_UNTIL(ums_task_info(rt, sl, &b) == 0 && b.state == UMS_TASK_DONE,
             30000);
  printf("   spinner %.0f ms, sleeper %.0f ms of CPU\n",
         (double)a.cpu_ns / 1e6, (double)b.cpu_ns / 1e6);
  /* 300 ms of CPU, give or take the ticks at either end (which are late
  ** when the machine is crowded). */
  CHECK_GE(a.cpu_ns, 100 * MS);
  CHECK_LE(a.cpu_ns, 600 * MS);
  CHECK_LE(b.cpu_ns, 50 * MS);
  tu_join_ok(rt, sp);
  tu_join_ok(rt, sl);
  tu_runtime_shutdown(rt);
}

int main(void) {
  RUN(test_sched_rows);
  RUN(test_pools);
  RUN(test_task_list);
  RUN(test_task_life);
  RUN(test_cpu_time);
  return 0;
}
