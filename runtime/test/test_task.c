/*
** test_task.c: the task life cycle through the public API: spawning and
** placement, joining and its errors, detaching, ums_exit, the current-task
** calls, cancellation, recycled handles, max_workers admission, yield
** fairness and sleep ordering.
**
** Tasks report what they saw into memory the test owns; the test reads it
** after joining them (a join orders the task's writes before its return)
** or, while they run, through atomics.
*/
#include "internal.h"
#include "test-util.h"

#include <stdatomic.h>

#define PTR(n) ((void *)(uintptr_t)(n))
#define NUM(p) ((intptr_t)(uintptr_t)(p))

static ums_runtime_t *rt;

static ums_spawn_opts_t on_sched(int sched) {
  ums_spawn_opts_t o = {.sched = sched};
  return o;
}

static ums_task_t spawn_on(int sched, ums_task_fn fn, void *arg) {
  ums_spawn_opts_t o = on_sched(sched);
  ums_task_t t = 0;
  CHECK_RC(ums_task_spawn(rt, &o, fn, arg, &t), 0);
  CHECK_NE(t, 0);
  return t;
}

static ums_task_t spawn_any(ums_task_fn fn, void *arg) {
  return spawn_on(UMS_ANY_SCHED, fn, arg);
}

static void join_expect(ums_task_t t, void *want_result, int want_status) {
  void *result = PTR(0xdead);
  int status = 12345;
  CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, &result, &status), 0);
  CHECK_PTR_EQ(result, want_result);
  CHECK_RC(status, want_status);
}

/* A task that waits on the event in arg and returns what the wait
** returned (as a pointer-sized int). */
static void *wait_event_fn(void *arg) {
  return PTR(ums_event_wait(arg, UMS_FOREVER));
}

static void *return_arg_plus_one(void *arg) { return (char *)arg + 1; }

/* An event to wait on plus a count of the tasks that reached the wait.
** Once a task has counted itself, its scheduler is idle only if the task
** has parked: the scheduler clears its idle flag before it runs anything. */
typedef struct gate {
  ums_event_t *ev;
  atomic_int started;
} gate_t;

static void *gate_wait_fn(void *arg) {
  gate_t *g = arg;
  atomic_fetch_add(&g->started, 1);
  return PTR(ums_event_wait(g->ev, UMS_FOREVER));
}

/* The internal view of a handle, for the few facts the API cannot show
** (is somebody joining it?). The memory is type-stable. */
static bool someone_joining(ums_task_t id) {
  ums__task_t *t = ums__task_lookup(rt, id);
  CHECK(t != NULL);
  ums__lock(&t->lock);
  bool j = t->joining;
  ums__unlock(&t->lock);
  return j;
}

/* ====================================================================== */
/* Spawn and join                                                          */
/* ====================================================================== */

static void test_spawn_join_result(void) {
  static char base[8];
  rt = tu_runtime_new(2);
  ums_task_t t = spawn_any(return_arg_plus_one, base);
  join_expect(t, base + 1, 0);

  /* result and status may be NULL. */
  t = spawn_any(return_arg_plus_one, base);
  CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, NULL, NULL), 0);

  /* Handles are never 0 and never repeat while the runtime lives. */
  ums_task_t a = spawn_any(return_arg_plus_one, base);
  ums_task_t b = spawn_any(return_arg_plus_one, base);
  CHECK_NE(a, b);
  CHECK_NE(a, t);
  CHECK_NE(b, t);
  join_expect(a, base + 1, 0);
  join_expect(b, base + 1, 0);

  /* Argument errors. */
  ums_task_t out = 77;
  CHECK_RC(ums_task_spawn(rt, NULL, NULL, NULL, &out), UMS_EINVAL);
  CHECK_RC(ums_task_spawn(NULL, NULL, return_arg_plus_one, NULL, &out),
           UMS_EINVAL);
  CHECK_EQ(out, 77);
  /* A handle out of nowhere. */
  CHECK_RC(ums_task_join(rt, 0, UMS_FOREVER, NULL, NULL), UMS_ESRCH);
  CHECK_RC(
      ums_task_join(rt, ((uint64_t)7 << 32) | 5000000, UMS_FOREVER, NULL, NULL),
      UMS_ESRCH);
  CHECK_RC(ums_task_cancel(rt, 0), UMS_ESRCH);
  CHECK_RC(ums_task_detach(rt, 0), UMS_ESRCH);
  /* No output handle: the task is still spawned (released at shutdown). */
  CHECK_RC(ums_task_spawn(rt, NULL, return_arg_plus_one, base, NULL), 0);
  tu_runtime_shutdown(rt);
}

/* Joining with a deadline that passes: UMS_ETIMEDOUT, and the task is
** still joinable, by a host thread and by a task. */
static ums_task_t timed_target;
static int timed_join_rc;
static int64_t timed_join_ms;

static void *timed_joiner_fn(void *arg) {
  int64_t start = ums_now();
  timed_join_rc =
      ums_task_join(rt, timed_target, ums_deadline(tu_ms(20)), NULL, NULL);
  timed_join_ms = tu_elapsed_ms(start);
  return NULL;
}

static void test_join_timeout_stays_joinable(void) {
  rt = tu_runtime_new(2);
  ums_event_t *ev = ums_event_new(1, 0);
  CHECK(ev != NULL);
  timed_target = spawn_on(0, wait_event_fn, ev);

  /* From the host thread. */
  int64_t start = ums_now();
  CHECK_RC(ums_task_join(rt, timed_target, ums_deadline(tu_ms(20)), NULL, NULL),
           UMS_ETIMEDOUT);
  CHECK_GE(tu_elapsed_ms(start), 20);
  CHECK_LT(tu_elapsed_ms(start), 2000);
  /* A deadline already in the past times out at once. */
  CHECK_RC(ums_task_join(rt, timed_target, ums_now() - 1, NULL, NULL),
           UMS_ETIMEDOUT);
  CHECK(!someone_joining(timed_target));

  /* From a task on the other scheduler. */
  ums_task_t j = spawn_on(1, timed_joiner_fn, NULL);
  join_expect(j, NULL, 0);
  CHECK_RC(timed_join_rc, UMS_ETIMEDOUT);
  CHECK_GE(timed_join_ms, 20);
  CHECK_LT(timed_join_ms, 2000);
  CHECK(!someone_joining(timed_target));

  /* From a task on the target's own scheduler. */
  j = spawn_on(0, timed_joiner_fn, NULL);
  join_expect(j, NULL, 0);
  CHECK_RC(timed_join_rc, UMS_ETIMEDOUT);

  /* Still joinable, with its real result. */
  CHECK_RC(ums_event_set(ev), 0);
  join_expect(timed_target, PTR(0), 0);
  CHECK_RC(ums_event_delete(ev), 0);
  tu_runtime_shutdown(rt);
}

static void test_join_twice_and_detach(void) {
  rt = tu_runtime_new(2);
  ums_task_t t = spawn_any(return_arg_plus_one, NULL);
  join_expect(t, PTR(1), 0);
  CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, NULL, NULL), UMS_ESRCH);
  CHECK_RC(ums_task_detach(rt, t), UMS_ESRCH);

  /* Detach a running task, then join: no such (joinable) task. */
  ums_event_t *ev = ums_event_new(1, 0);
  t = spawn_any(wait_event_fn, ev);
  CHECK_RC(ums_task_detach(rt, t), 0);
  CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, NULL, NULL), UMS_ESRCH);
  CHECK_RC(ums_task_detach(rt, t), UMS_ESRCH);
  CHECK_RC(ums_event_set(ev), 0);
  /* The detached task ends on its own and is released. */
  WAIT_UNTIL(tu_stats_sum(rt, tasks) == 0, 5000);
  CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, NULL, NULL), UMS_ESRCH);

  /* Detach a finished task: released at once. */
  t = spawn_any(return_arg_plus_one, NULL);
  WAIT_UNTIL(tu_stats_sum(rt, tasks) == 0, 5000);
  CHECK_RC(ums_task_detach(rt, t), 0);
  CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, NULL, NULL), UMS_ESRCH);

  /* Spawned detached: never joinable. */
  ums_spawn_opts_t o = {.sched = UMS_ANY_SCHED, .detached = 1};
  CHECK_RC(ums_task_spawn(rt, &o, wait_event_fn, ev, &t), 0);
  CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, NULL, NULL), UMS_ESRCH);
  WAIT_UNTIL(tu_stats_sum(rt, tasks) == 0, 5000);
  CHECK_RC(ums_event_delete(ev), 0);
  tu_runtime_shutdown(rt);
}

static void *join_self_fn(void *arg) {
  (void)arg;
  return PTR(ums_task_join(rt, ums_self(), UMS_FOREVER, NULL, NULL));
}

static void test_join_self(void) {
  rt = tu_runtime_new(1);
  ums_task_t t = spawn_any(join_self_fn, NULL);
  /* It returned EDEADLK instead of hanging, and is still joinable. */
  join_expect(t, PTR(UMS_EDEADLK), 0);
  tu_runtime_shutdown(rt);
}

/* Two joiners at once: the second gets UMS_EBUSY, the first the result. */
static ums_task_t busy_target;
static int busy_rc;
static void *busy_result;

static void *busy_joiner_fn(void *arg) {
  (void)arg;
  busy_rc = ums_task_join(rt, busy_target, UMS_FOREVER, &busy_result, NULL);
  return NULL;
}

static void *busy_joiner_thread(void *arg) { return busy_joiner_fn(arg); }

static void *second_joiner_fn(void *arg) {
  (void)arg;
  return PTR(ums_task_join(rt, busy_target, UMS_FOREVER, NULL, NULL));
}

static void concurrent_joiners(bool first_is_task) {
  ums_event_t *ev = ums_event_new(1, 0);
  busy_target = spawn_on(0, wait_event_fn, ev);
  busy_rc = 1;
  busy_result = NULL;
  ums_task_t first = 0;
  pthread_t th;
  if (first_is_task)
    first = spawn_on(1, busy_joiner_fn, NULL);
  else
    CHECK_EQ(pthread_create(&th, NULL, busy_joiner_thread, NULL), 0);
  WAIT_UNTIL(someone_joining(busy_target), 5000);

  /* A host thread and a task both find it busy, and at once. */
  int64_t start = ums_now();
  CHECK_RC(ums_task_join(rt, busy_target, UMS_FOREVER, NULL, NULL), UMS_EBUSY);
  CHECK_LT(tu_elapsed_ms(start), 2000);
  ums_task_t second = spawn_on(0, second_joiner_fn, NULL);
  join_expect(second, PTR(UMS_EBUSY), 0);
  CHECK(someone_joining(busy_target));

  CHECK_RC(ums_event_set(ev), 0);
  if (first_is_task)
    join_expect(first, NULL, 0);
  else
    CHECK_EQ(pthread_join(th, NULL), 0);
  CHECK_RC(busy_rc, 0);
  CHECK_PTR_EQ(busy_result, PTR(0));
  /* The first joiner took the handle. */
  CHECK_RC(ums_task_join(rt, busy_target, UMS_FOREVER, NULL, NULL), UMS_ESRCH);
  CHECK_RC(ums_event_delete(ev), 0);
}

static void test_concurrent_joiners(void) {
  rt = tu_runtime_new(2);
  concurrent_joiners(true);
  concurrent_joiners(false);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* ums_exit and the current-task calls                                     */
/* ====================================================================== */

static atomic_int after_exit;

static void exit_level2(int status) { ums_exit(PTR(0x77), status); }

static int exit_level1(int status) {
  exit_level2(status);
  atomic_store(&after_exit, 1);
  return 1;
}

static void *exit_fn(void *arg) {
  /* Park once first, so ums_exit runs on a resumed fiber. */
  if (NUM(arg) & 1) CHECK_RC(ums_sleep(tu_ms(1)), 0);
  exit_level1((int)NUM(arg));
  atomic_store(&after_exit, 2);
  return PTR(0x99);
}

static void test_exit_nested(void) {
  rt = tu_runtime_new(1);
  for (int i = 0; i < 4; i++) {
    ums_task_t t = spawn_any(exit_fn, PTR(40 + i));
    join_expect(t, PTR(0x77), 40 + i);
  }
  CHECK_EQ(atomic_load(&after_exit), 0);
  /* The worker that unwound still runs ordinary tasks. */
  for (int i = 0; i < 4; i++) {
    ums_task_t t = spawn_any(return_arg_plus_one, PTR(i));
    join_expect(t, PTR(i + 1), 0);
  }
  tu_runtime_shutdown(rt);
}

typedef struct identity {
  ums_task_t self, self_after;
  ums_runtime_t *rt;
  int sched, sched_after;
  int cancelled;
} identity_t;

static void *identity_fn(void *arg) {
  identity_t *id = arg;
  id->self = ums_self();
  id->rt = ums_current_runtime();
  id->sched = ums_current_sched();
  id->cancelled = ums_cancelled();
  CHECK_RC(ums_yield(), 0);
  CHECK_RC(ums_sleep(tu_ms(1)), 0);
  id->self_after = ums_self();
  id->sched_after = ums_current_sched();
  return NULL;
}

static void *host_identity_thread(void *arg) {
  identity_t *id = arg;
  id->self = ums_self();
  id->rt = ums_current_runtime();
  id->sched = ums_current_sched();
  id->cancelled = ums_cancelled();
  return NULL;
}

static void test_identity(void) {
  /* Outside any runtime. */
  CHECK_EQ(ums_self(), 0);
  CHECK(ums_current_runtime() == NULL);
  CHECK_EQ(ums_current_sched(), -1);
  CHECK_EQ(ums_cancelled(), 0);
  CHECK_RC(ums_yield(), 0);

  rt = tu_runtime_new(3);
  /* The main thread is still outside with a runtime running. */
  CHECK_EQ(ums_self(), 0);
  CHECK(ums_current_runtime() == NULL);
  CHECK_EQ(ums_current_sched(), -1);

  identity_t host = {.self = 1, .sched = 5};
  pthread_t th;
  CHECK_EQ(pthread_create(&th, NULL, host_identity_thread, &host), 0);
  CHECK_EQ(pthread_join(th, NULL), 0);
  CHECK_EQ(host.self, 0);
  CHECK(host.rt == NULL);
  CHECK_EQ(host.sched, -1);
  CHECK_EQ(host.cancelled, 0);

  for (int s = 0; s < 3; s++) {
    identity_t id = {0};
    ums_task_t t = spawn_on(s, identity_fn, &id);
    join_expect(t, NULL, 0);
    CHECK_EQ(id.self, t);
    CHECK_EQ(id.self_after, t);
    CHECK_PTR_EQ(id.rt, rt);
    CHECK_EQ(id.sched, s);
    CHECK_EQ(id.sched_after, s);
    CHECK_EQ(id.cancelled, 0);
  }
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Placement                                                               */
/* ====================================================================== */

static void test_spawn_on_chosen_sched(void) {
  rt = tu_runtime_new(4);
  identity_t ids[4][3];
  ums_task_t ts[4][3];
  memset(ids, 0, sizeof ids);
  uint64_t spawned[4];
  for (int s = 0; s < 4; s++) spawned[s] = tu_stats(rt, s).tasks_spawned;
  for (int s = 0; s < 4; s++)
    for (int k = 0; k < 3; k++) ts[s][k] = spawn_on(s, identity_fn, &ids[s][k]);
  for (int s = 0; s < 4; s++)
    for (int k = 0; k < 3; k++) {
      join_expect(ts[s][k], NULL, 0);
      CHECK_EQ(ids[s][k].sched, s);
      CHECK_EQ(ids[s][k].sched_after, s);
    }
  for (int s = 0; s < 4; s++)
    CHECK_EQ(tu_stats(rt, s).tasks_spawned - spawned[s], 3);

  /* Bad indices. */
  ums_task_t out = 5;
  ums_spawn_opts_t o = on_sched(4);
  CHECK_RC(ums_task_spawn(rt, &o, return_arg_plus_one, NULL, &out), UMS_EINVAL);
  o = on_sched(-2);
  CHECK_RC(ums_task_spawn(rt, &o, return_arg_plus_one, NULL, &out), UMS_EINVAL);
  CHECK_EQ(out, 5);
  tu_runtime_shutdown(rt);
}

/* Parked tasks placed with UMS_ANY_SCHED spread evenly: the least-loaded
** scheduler gets each new one. */
#define SPREAD_N 40

static ums_event_t *spread_ev;
static atomic_int spread_started;

static void *spread_fn(void *arg) {
  *(int *)arg = ums_current_sched();
  atomic_fetch_add(&spread_started, 1);
  CHECK_RC(ums_event_wait(spread_ev, UMS_FOREVER), 0);
  return NULL;
}

static int spread_from_task_where[8];
static ums_task_t spread_from_task_handles[8];

static void *spread_spawner_fn(void *arg) {
  (void)arg;
  for (int i = 0; i < 8; i++)
    CHECK_RC(ums_task_spawn(rt, NULL, spread_fn, &spread_from_task_where[i],
                            &spread_from_task_handles[i]),
             0);
  return NULL;
}

static void test_any_sched_spreads(void) {
  rt = tu_runtime_new(4);
  spread_ev = ums_event_new(1, 0);
  atomic_store(&spread_started, 0);
  int where[SPREAD_N];
  ums_task_t ts[SPREAD_N];
  for (int i = 0; i < SPREAD_N; i++) {
    where[i] = -1;
    ts[i] = spawn_any(spread_fn, &where[i]);
  }
  WAIT_UNTIL(atomic_load(&spread_started) == SPREAD_N, 5000);
  int count[4] = {0};
  for (int i = 0; i < SPREAD_N; i++) {
    CHECK_GE(where[i], 0);
    CHECK_LT(where[i], 4);
    count[where[i]]++;
  }
  for (int s = 0; s < 4; s++) {
    CHECK_EQ(count[s], SPREAD_N / 4);
    CHECK_EQ(tu_stats(rt, s).tasks, SPREAD_N / 4);
  }

  /* From a task: the 8 new ones go 2 to each scheduler (the spawner has
  ** ended by the time they are counted). */
  ums_task_t sp = spawn_on(2, spread_spawner_fn, NULL);
  join_expect(sp, NULL, 0);
  WAIT_UNTIL(atomic_load(&spread_started) == SPREAD_N + 8, 5000);
  int count2[4] = {0};
  for (int i = 0; i < 8; i++) count2[spread_from_task_where[i]]++;
  for (int s = 0; s < 4; s++) {
    CHECK_EQ(count2[s], 2);
    WAIT_UNTIL(tu_stats(rt, s).tasks == SPREAD_N / 4 + 2, 5000);
  }

  CHECK_RC(ums_event_set(spread_ev), 0);
  for (int i = 0; i < SPREAD_N; i++) join_expect(ts[i], NULL, 0);
  for (int i = 0; i < 8; i++) join_expect(spread_from_task_handles[i], NULL, 0);
  CHECK_RC(ums_event_delete(spread_ev), 0);
  tu_runtime_shutdown(rt);
}

/* ums_runtime_place is the rule UMS_ANY_SCHED spawns follow, with a
** binding's own work per scheduler added (extra) and schedulers it must
** not use skipped. Loads here: 2, 0, 1, 0 parked tasks. */
static void test_place(void) {
  rt = tu_runtime_new(4);
  spread_ev = ums_event_new(1, 0);
  atomic_store(&spread_started, 0);
  static const int on[3] = {0, 0, 2};
  int where[4];
  ums_task_t ts[4];
  for (int i = 0; i < 3; i++) ts[i] = spawn_on(on[i], spread_fn, &where[i]);
  WAIT_UNTIL(atomic_load(&spread_started) == 3, 5000);
  for (int s = 0; s < 4; s++)
    WAIT_UNTIL(tu_stats(rt, s).tasks == (s == 0 ? 2u : s == 2 ? 1u : 0u),
               5000);

  /* The fewest tasks; ties to here, else to the lowest index. */
  CHECK_EQ(ums_runtime_place(rt, -1, NULL), 1);
  CHECK_EQ(ums_runtime_place(rt, 0, NULL), 1);
  CHECK_EQ(ums_runtime_place(rt, 3, NULL), 3);
  CHECK_EQ(ums_runtime_place(rt, 2, NULL), 1);
  /* Extra work counts as tasks; a skipped scheduler never wins, not even
  ** as here. */
  int64_t extra[4] = {0, 5, 0, 0};
  CHECK_EQ(ums_runtime_place(rt, -1, extra), 3);
  extra[3] = 2;
  CHECK_EQ(ums_runtime_place(rt, -1, extra), 2);
  CHECK_EQ(ums_runtime_place(rt, 0, extra), 2);
  extra[3] = UMS_PLACE_SKIP;
  CHECK_EQ(ums_runtime_place(rt, 3, extra), 2);
  extra[0] = -2;
  CHECK_EQ(ums_runtime_place(rt, -1, extra), 0);
  for (int s = 0; s < 4; s++) extra[s] = UMS_PLACE_SKIP;
  CHECK_EQ(ums_runtime_place(rt, 1, extra), -1);
  /* Bad arguments. */
  CHECK_EQ(ums_runtime_place(rt, 4, NULL), -1);
  CHECK_EQ(ums_runtime_place(rt, -2, NULL), -1);
  CHECK_EQ(ums_runtime_place(NULL, -1, NULL), -1);

  /* A spawn from outside the runtime goes where the rule says. */
  int expect = ums_runtime_place(rt, -1, NULL);
  ts[3] = spawn_any(spread_fn, &where[3]);
  WAIT_UNTIL(atomic_load(&spread_started) == 4, 5000);
  CHECK_EQ(where[3], expect);

  CHECK_RC(ums_event_set(spread_ev), 0);
  for (int i = 0; i < 4; i++) join_expect(ts[i], NULL, 0);
  CHECK_RC(ums_event_delete(spread_ev), 0);
  tu_runtime_shutdown(rt);
}

/* Spawning from tasks and from several host threads at once. */
#define HOST_SPAWNERS 4
#define PER_SPAWNER 200

static atomic_long spawn_sum;

static void *add_fn(void *arg) {
  atomic_fetch_add(&spawn_sum, (long)NUM(arg));
  return arg;
}

static void *host_spawner_thread(void *arg) {
  int base = (int)NUM(arg) * 1000;
  ums_task_t ts[PER_SPAWNER];
  for (int i = 0; i < PER_SPAWNER; i++)
    CHECK_RC(ums_task_spawn(rt, NULL, add_fn, PTR(base + i), &ts[i]), 0);
  for (int i = 0; i < PER_SPAWNER; i++) {
    void *res;
    CHECK_RC(ums_task_join(rt, ts[i], UMS_FOREVER, &res, NULL), 0);
    CHECK_PTR_EQ(res, PTR(base + i));
  }
  return NULL;
}

static void *task_spawner_fn(void *arg) {
  int n = (int)NUM(arg);
  ums_task_t ts[64];
  for (int i = 0; i < n; i++) {
    ums_spawn_opts_t o = on_sched(i % 3);
    CHECK_RC(ums_task_spawn(rt, &o, add_fn, PTR(1), &ts[i]), 0);
  }
  for (int i = 0; i < n; i++) {
    void *res;
    CHECK_RC(ums_task_join(rt, ts[i], UMS_FOREVER, &res, NULL), 0);
    CHECK_PTR_EQ(res, PTR(1));
  }
  return PTR(n);
}

static void test_spawn_from_task_and_hosts(void) {
  rt = tu_runtime_new(3);
  atomic_store(&spawn_sum, 0);
  pthread_t th[HOST_SPAWNERS];
  for (int i = 0; i < HOST_SPAWNERS; i++)
    CHECK_EQ(pthread_create(&th[i], NULL, host_spawner_thread, PTR(i)), 0);
  ums_task_t sp[3];
  for (int s = 0; s < 3; s++) sp[s] = spawn_on(s, task_spawner_fn, PTR(64));
  for (int i = 0; i < HOST_SPAWNERS; i++)
    CHECK_EQ(pthread_join(th[i], NULL), 0);
  for (int s = 0; s < 3; s++) join_expect(sp[s], PTR(64), 0);
  long want = 3 * 64;
  for (int i = 0; i < HOST_SPAWNERS; i++)
    for (int k = 0; k < PER_SPAWNER; k++) want += i * 1000 + k;
  CHECK_EQ(atomic_load(&spawn_sum), want);
  tu_runtime_shutdown(rt);
}

/* Tasks a scheduler's thread spawns onto its own scheduler share one
** unit of the runtime's live count and are counted in its load with
** plain stores (task.c: live_add, ntasks_own): the load still adds up
** with other threads' spawns, and shutdown still waits for such tasks
** after the task that spawned them has ended. */
#define OWN_CHILDREN 5
#define HOST_ONES 3

static gate_t own_gate, host_gate;
static ums_event_t *own_parent_go;

static void *own_parent_fn(void *arg) {
  (void)arg;
  for (int i = 0; i < OWN_CHILDREN; i++) {
    ums_spawn_opts_t o = {.sched = ums_current_sched(), .detached = 1};
    CHECK_RC(ums_task_spawn(rt, &o, gate_wait_fn, &own_gate, NULL), 0);
  }
  CHECK_RC(ums_event_wait(own_parent_go, UMS_FOREVER), 0);
  return PTR(7);
}

static atomic_int own_shutdown_rc = -1;

static void *own_shutdown_thread(void *arg) {
  (void)arg;
  atomic_store(&own_shutdown_rc,
               ums_runtime_shutdown(rt, ums_deadline(200 * UMS_NSEC_PER_MSEC)));
  return NULL;
}

static void test_own_spawns_counted(void) {
  rt = tu_runtime_new(2);
  own_gate.ev = ums_event_new(1, 0);
  atomic_store(&own_gate.started, 0);
  host_gate.ev = ums_event_new(1, 0);
  atomic_store(&host_gate.started, 0);
  own_parent_go = ums_event_new(1, 0);
  ums_task_t parent = spawn_on(0, own_parent_fn, NULL);
  ums_task_t host_ones[HOST_ONES];
  for (int i = 0; i < HOST_ONES; i++)
    host_ones[i] = spawn_on(0, gate_wait_fn, &host_gate);
  WAIT_UNTIL(atomic_load(&own_gate.started) == OWN_CHILDREN &&
                 atomic_load(&host_gate.started) == HOST_ONES,
             5000);
  /* The parent, its children and the host's tasks, all on scheduler 0. */
  CHECK_EQ(tu_stats(rt, 0).tasks, 1 + OWN_CHILDREN + HOST_ONES);
  CHECK_EQ(tu_stats(rt, 1).tasks, 0);
  CHECK_RC(ums_event_set(host_gate.ev), 0);
  for (int i = 0; i < HOST_ONES; i++) join_expect(host_ones[i], PTR(0), 0);
  CHECK_RC(ums_event_set(own_parent_go), 0);
  join_expect(parent, PTR(7), 0);
  /* The count drops just after the joiner is woken. */
  WAIT_UNTIL(tu_stats(rt, 0).tasks == OWN_CHILDREN, 5000);
  /* Every task the host spawned has ended; only their shared unit of
  ** `live` counts the parent's children, which never end by themselves:
  ** shutdown must find them there, give up at its deadline and cancel
  ** them. (Counted nowhere, they would leave `live` at zero and the
  ** shutdown would wait for them forever.) */
  pthread_t th;
  CHECK_EQ(pthread_create(&th, NULL, own_shutdown_thread, NULL), 0);
  WAIT_UNTIL(atomic_load(&own_shutdown_rc) != -1, 5000);
  CHECK_RC(atomic_load(&own_shutdown_rc), UMS_ETIMEDOUT);
  CHECK_EQ(pthread_join(th, NULL), 0);
  CHECK_RC(ums_event_delete(own_gate.ev), 0);
  CHECK_RC(ums_event_delete(host_gate.ev), 0);
  CHECK_RC(ums_event_delete(own_parent_go), 0);
  /* Shut down by hand: what tu_runtime_shutdown counts. */
  tu_live_runtimes--;
  WAIT_UNTIL(tu_thread_count() == tu_thread_baseline(), 5000);
}

/* ums_task_spawn_step_here (ums-binding.h): from a task of the chosen
** scheduler it takes the short path, anywhere else the general spawn;
** either way the task is detached, runs on the chosen scheduler and
** counts as its spawner's child. */
#define HERE_TASKS 4

static atomic_int here_sched[HERE_TASKS];
static atomic_int here_ran;

static int here_step(void *arg) {
  atomic_store(&here_sched[NUM(arg)], ums_current_sched());
  atomic_fetch_add(&here_ran, 1);
  return UMS_STEP_DONE;
}

typedef struct here_report {
  int rc[HERE_TASKS], bad_sched, no_step;
  ums_task_t id[HERE_TASKS], spawner[HERE_TASKS], self;
  bool own[HERE_TASKS];
  int64_t load_before, load_after;
} here_report_t;

/* Records what the runtime keeps of spawned task i while it is pending
** (it cannot start before its spawner, on the same thread, waits). */
static void here_record(here_report_t *r, int i) {
  ums__task_t *t = ums__task_lookup(rt, r->id[i]);
  CHECK(t != NULL);
  r->spawner[i] = t->spawner;
  r->own[i] = t->live_own;
}

static void *here_spawner_fn(void *arg) {
  here_report_t *r = arg;
  r->self = ums_self();
  r->load_before = tu_stats(rt, 1).tasks;
  /* On its own scheduler (1): the short path, twice. */
  for (int i = 0; i < 2; i++) {
    r->rc[i] = ums_task_spawn_step_here(rt, 1, here_step, PTR(i), &r->id[i]);
    here_record(r, i);
  }
  r->load_after = tu_stats(rt, 1).tasks;
  /* Onto the other scheduler: the general spawn. */
  r->rc[2] = ums_task_spawn_step_here(rt, 0, here_step, PTR(2), &r->id[2]);
  r->bad_sched = ums_task_spawn_step_here(rt, 2, here_step, PTR(0), NULL);
  r->no_step = ums_task_spawn_step_here(rt, 1, NULL, NULL, NULL);
  return NULL;
}

static void test_spawn_step_here(void) {
  rt = tu_runtime_new(2);
  atomic_store(&here_ran, 0);
  for (int i = 0; i < HERE_TASKS; i++) atomic_store(&here_sched[i], -1);
  here_report_t r;
  memset(&r, 0, sizeof r);
  join_expect(spawn_on(1, here_spawner_fn, &r), NULL, 0);
  /* From the host thread: the general spawn. */
  r.rc[3] = ums_task_spawn_step_here(rt, 1, here_step, PTR(3), &r.id[3]);
  WAIT_UNTIL(atomic_load(&here_ran) == HERE_TASKS, 5000);
  for (int i = 0; i < HERE_TASKS; i++) {
    CHECK_RC(r.rc[i], 0);
    CHECK_NE(r.id[i], 0);
    CHECK_EQ(atomic_load(&here_sched[i]), i == 2 ? 0 : 1);
    /* Detached: nobody can join it, during or after its run. */
    CHECK_RC(ums_task_join(rt, r.id[i], UMS_FOREVER, NULL, NULL),
             UMS_ESRCH);
  }
  CHECK_NE(r.id[0], r.id[1]);
  for (int i = 0; i < 2; i++) {
    CHECK_EQ(r.spawner[i], r.self);
    CHECK(r.own[i]);
  }
  CHECK_EQ(r.load_after, r.load_before + 2);
  CHECK_RC(r.bad_sched, UMS_EINVAL);
  CHECK_RC(r.no_step, UMS_EINVAL);
  WAIT_UNTIL(tu_stats(rt, 1).tasks == 0 && tu_stats(rt, 0).tasks == 0, 5000);
  tu_runtime_shutdown(rt);
}

/* A detached task that ends holds the only reference to itself, and
** ums__task_finish retires its handle on the spot (task.c): the handle
** then reaches nothing. */
static void test_detached_end_retires_handle(void) {
  rt = tu_runtime_new(1);
  ums_spawn_opts_t o = {.sched = 0, .detached = 1};
  ums_task_t t = 0;
  CHECK_RC(ums_task_spawn(rt, &o, return_arg_plus_one, NULL, &t), 0);
  CHECK_NE(t, 0);
  WAIT_UNTIL(ums__task_lookup(rt, t) == NULL, 5000);
  CHECK_RC(ums_task_cancel(rt, t), UMS_ESRCH);
  CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, NULL, NULL), UMS_ESRCH);
  CHECK_EQ(tu_stats(rt, 0).tasks, 0);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Cancellation                                                            */
/* ====================================================================== */

/* What a cancelled task saw at each later wait point. */
typedef struct cancel_report {
  atomic_int started;
  int sleep_forever;
  int cancelled_flag;
  int sleep_again, sleep_zero, sleep_until_past, yield, event_wait,
      event_wait_timeout, join;
  int64_t sleep_again_ms;
} cancel_report_t;

static cancel_report_t crep;
static ums_event_t *never_set;
static ums_task_t long_runner;

static void *sleeper_fn(void *arg) {
  cancel_report_t *r = arg;
  atomic_store(&r->started, 1);
  r->sleep_forever = ums_sleep_until(UMS_FOREVER);
  r->cancelled_flag = ums_cancelled();
  /* Sticky: every wait from now on fails the same way, at once. */
  int64_t start = ums_now();
  r->sleep_again = ums_sleep(tu_ms(200));
  r->sleep_again_ms = tu_elapsed_ms(start);
  r->sleep_zero = ums_sleep(0);
  r->sleep_until_past = ums_sleep_until(ums_now() - 1);
  r->yield = ums_yield();
  /* Deadlines far beyond "at once", so that a broken cancel fails here
  ** instead of hanging the test. */
  r->event_wait = ums_event_wait(never_set, ums_deadline(tu_ms(1000)));
  r->event_wait_timeout = ums_event_wait(never_set, ums_deadline(tu_ms(5)));
  r->join =
      ums_task_join(rt, long_runner, ums_deadline(tu_ms(1000)), NULL, NULL);
  return PTR(0x5);
}

static void check_cancel_report(const cancel_report_t *r) {
  CHECK_RC(r->sleep_forever, UMS_ECANCELED);
  CHECK_EQ(r->cancelled_flag, 1);
  CHECK_RC(r->sleep_again, UMS_ECANCELED);
  CHECK_LT(r->sleep_again_ms, 150);
  CHECK_RC(r->sleep_zero, UMS_ECANCELED);
  CHECK_RC(r->sleep_until_past, UMS_ECANCELED);
  CHECK_RC(r->yield, UMS_ECANCELED);
  CHECK_RC(r->event_wait, UMS_ECANCELED);
  CHECK_RC(r->event_wait_timeout, UMS_ECANCELED);
  CHECK_RC(r->join, UMS_ECANCELED);
}

/* A task that cancels another on its own scheduler (the local path). */
static void *local_canceller_fn(void *arg) {
  return PTR(ums_task_cancel(rt, *(ums_task_t *)arg));
}

static void test_cancel_sleeping(void) {
  rt = tu_runtime_new(2);
  never_set = ums_event_new(1, 0);
  ums_event_t *release = ums_event_new(1, 0);
  long_runner = spawn_on(0, wait_event_fn, release);

  /* Cancelled from the host thread while parked in a sleep. */
  memset(&crep, 0, sizeof crep);
  ums_task_t t = spawn_on(1, sleeper_fn, &crep);
  WAIT_UNTIL(atomic_load(&crep.started) && tu_stats(rt, 1).idle, 5000);
  CHECK_RC(ums_task_cancel(rt, t), 0);
  join_expect(t, PTR(0x5), 0);
  check_cancel_report(&crep);

  /* Cancelled by a task on its own scheduler. */
  memset(&crep, 0, sizeof crep);
  t = spawn_on(1, sleeper_fn, &crep);
  WAIT_UNTIL(atomic_load(&crep.started) && tu_stats(rt, 1).idle, 5000);
  ums_task_t c = spawn_on(1, local_canceller_fn, &t);
  join_expect(c, PTR(0), 0);
  join_expect(t, PTR(0x5), 0);
  check_cancel_report(&crep);

  /* Cancelled by a task on another scheduler. */
  memset(&crep, 0, sizeof crep);
  t = spawn_on(1, sleeper_fn, &crep);
  WAIT_UNTIL(atomic_load(&crep.started) && tu_stats(rt, 1).idle, 5000);
  c = spawn_on(0, local_canceller_fn, &t);
  join_expect(c, PTR(0), 0);
  join_expect(t, PTR(0x5), 0);
  check_cancel_report(&crep);

  /* Cancelling a finished, not yet joined task is harmless. */
  t = spawn_on(1, return_arg_plus_one, NULL);
  WAIT_UNTIL(tu_stats(rt, 1).tasks == 0, 5000);
  CHECK_RC(ums_task_cancel(rt, t), 0);
  join_expect(t, PTR(1), 0);

  /* The long runner was never touched. */
  CHECK_RC(ums_event_set(release), 0);
  join_expect(long_runner, PTR(0), 0);
  CHECK_RC(ums_event_delete(never_set), 0);
  CHECK_RC(ums_event_delete(release), 0);
  tu_runtime_shutdown(rt);
}

/* A cancelled waiter is unlinked from what it waited on: the event can be
** deleted, and a cancelled joiner leaves the target joinable. */
static void test_cancel_unlinks_waiter(void) {
  rt = tu_runtime_new(2);
  gate_t g = {.ev = ums_event_new(0, 0)};
  ums_task_t w = spawn_on(1, gate_wait_fn, &g);
  WAIT_UNTIL(atomic_load(&g.started) == 1 && tu_stats(rt, 1).idle, 5000);
  CHECK_RC(ums_event_delete(g.ev), UMS_EBUSY);
  CHECK_RC(ums_task_cancel(rt, w), 0);
  join_expect(w, PTR(UMS_ECANCELED), 0);
  CHECK_RC(ums_event_delete(g.ev), 0);

  ums_event_t *release = ums_event_new(1, 0);
  busy_target = spawn_on(0, wait_event_fn, release);
  busy_rc = 1;
  ums_task_t j = spawn_on(1, busy_joiner_fn, NULL);
  WAIT_UNTIL(someone_joining(busy_target), 5000);
  CHECK_RC(ums_task_cancel(rt, j), 0);
  join_expect(j, NULL, 0);
  CHECK_RC(busy_rc, UMS_ECANCELED);
  CHECK(!someone_joining(busy_target));
  CHECK_RC(ums_event_set(release), 0);
  join_expect(busy_target, PTR(0), 0);
  CHECK_RC(ums_event_delete(release), 0);
  tu_runtime_shutdown(rt);
}

/* A task cancelled before it started never runs; its status says so. */
static atomic_int never_ran;

static void *must_not_run_fn(void *arg) {
  (void)arg;
  atomic_store(&never_ran, 1);
  return PTR(0xbad);
}

static void *cancel_unstarted_fn(void *arg) {
  (void)arg;
  /* Same scheduler: the child is queued behind us and cannot start until
  ** we park. */
  ums_task_t child = spawn_on(ums_current_sched(), must_not_run_fn, NULL);
  CHECK_RC(ums_task_cancel(rt, child), 0);
  void *res = PTR(1);
  int status = 0;
  CHECK_RC(ums_task_join(rt, child, UMS_FOREVER, &res, &status), 0);
  CHECK_PTR_EQ(res, NULL);
  return PTR(status);
}

static void test_cancel_not_started(void) {
  /* A pending spawn (beyond max_workers) cancelled from the host. */
  ums_config_t cfg = {.schedulers = 1, .max_workers = 1};
  rt = tu_runtime_new_cfg(&cfg);
  atomic_store(&never_ran, 0);
  ums_event_t *ev = ums_event_new(1, 0);
  ums_task_t a = spawn_any(wait_event_fn, ev);
  WAIT_UNTIL(tu_stats(rt, 0).workers_active == 1 && tu_stats(rt, 0).idle, 5000);
  ums_task_t b = spawn_any(must_not_run_fn, NULL);
  WAIT_UNTIL(tu_stats(rt, 0).pending == 1, 5000);
  CHECK_RC(ums_task_cancel(rt, b), 0);
  WAIT_UNTIL(tu_stats(rt, 0).pending == 0, 5000);
  join_expect(b, NULL, UMS_ECANCELED);
  WAIT_UNTIL(tu_stats(rt, 0).tasks == 1, 5000);
  CHECK_RC(ums_event_set(ev), 0);
  join_expect(a, PTR(0), 0);
  CHECK_EQ(atomic_load(&never_ran), 0);
  CHECK_RC(ums_event_delete(ev), 0);
  tu_runtime_shutdown(rt);

  /* A queued, not yet started task cancelled by a task. */
  rt = tu_runtime_new(2);
  ums_task_t t = spawn_on(1, cancel_unstarted_fn, NULL);
  join_expect(t, PTR(UMS_ECANCELED), 0);
  CHECK_EQ(atomic_load(&never_ran), 0);
  tu_runtime_shutdown(rt);
}

/* A cancel that reaches a spawn before its scheduler has admitted it,
** where admission then finds no free worker (max_workers): the task must
** still end at once, not wait in the pending queue for a worker that may
** never come. The scheduler is kept busy (a task spinning without a wait
** point) so that the spawn and the cancel are both queued before it
** looks at either. */
static atomic_int spin_started, spin_release;

static void *spin_then_wait_fn(void *arg) {
  atomic_store(&spin_started, 1);
  while (!atomic_load(&spin_release)) {
  }
  return PTR(ums_event_wait(arg, UMS_FOREVER));
}

static void test_cancel_before_admission(void) {
  ums_config_t cfg = {.schedulers = 1, .max_workers = 1};
  rt = tu_runtime_new_cfg(&cfg);
  atomic_store(&never_ran, 0);
  atomic_store(&spin_started, 0);
  atomic_store(&spin_release, 0);
  ums_event_t *ev = ums_event_new(1, 0);
  ums_task_t a = spawn_any(spin_then_wait_fn, ev);
  WAIT_UNTIL(atomic_load(&spin_started), 5000);
  ums_task_t b = spawn_any(must_not_run_fn, NULL);
  CHECK_RC(ums_task_cancel(rt, b), 0);
  atomic_store(&spin_release, 1);

  void *res = PTR(1);
  int status = 0;
  int rc = ums_task_join(rt, b, ums_deadline(tu_ms(1000)), &res, &status);
  int pending = (int)tu_stats(rt, 0).pending;
  CHECK_RC(ums_event_set(ev), 0);
  join_expect(a, PTR(0), 0);
  if (rc == UMS_ETIMEDOUT)
    tu_fail(__FILE__, __LINE__,
            "a task cancelled before admission is "
            "still waiting for a worker a second later (pending = %d)",
            pending);
  CHECK_RC(rc, 0);
  CHECK_RC(status, UMS_ECANCELED);
  CHECK_PTR_EQ(res, NULL);
  CHECK_EQ(atomic_load(&never_ran), 0);
  CHECK_RC(ums_event_delete(ev), 0);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Recycled handles                                                        */
/* ====================================================================== */

typedef struct victim {
  int wait_rc;
  int cancelled;
} victim_t;

static atomic_int victims_started;

static void *victim_fn(void *arg) {
  victim_t *v = arg;
  atomic_fetch_add(&victims_started, 1);
  v->wait_rc = ums_event_wait(spread_ev, UMS_FOREVER);
  v->cancelled = ums_cancelled();
  return PTR(0x42);
}

#define RECYCLE_MAX 3000

static void test_recycled_handle(void) {
  rt = tu_runtime_new(1);
  ums_task_t old = spawn_any(return_arg_plus_one, NULL);
  /* Let the task end and drop its own reference, so that our join
  ** releases the slot. */
  ums__task_t *raw = ums__task_lookup(rt, old);
  CHECK(raw != NULL);
  WAIT_UNTIL(atomic_load(&raw->refs) == 1, 5000);
  join_expect(old, PTR(1), 0);

  /* Spawn until a new task lands in the old slot. */
  spread_ev = ums_event_new(1, 0);
  static ums_task_t ts[RECYCLE_MAX];
  static victim_t vs[RECYCLE_MAX];
  memset(vs, 0, sizeof vs);
  atomic_store(&victims_started, 0);
  int n = 0, reused = -1;
  while (n < RECYCLE_MAX && reused < 0) {
    ts[n] = spawn_any(victim_fn, &vs[n]);
    if (ums__id_slot(ts[n]) == ums__id_slot(old)) reused = n;
    n++;
  }
  CHECK_GE(reused, 0);
  CHECK_NE(ts[reused], old);
  /* Let it start and park, so the old handle meets a live task. */
  WAIT_UNTIL(atomic_load(&victims_started) == n && tu_stats(rt, 0).idle, 5000);

  /* The old handle reaches nothing, and does not block. */
  int64_t start = ums_now();
  CHECK_RC(ums_task_join(rt, old, UMS_FOREVER, NULL, NULL), UMS_ESRCH);
  CHECK_RC(ums_task_cancel(rt, old), UMS_ESRCH);
  CHECK_RC(ums_task_detach(rt, old), UMS_ESRCH);
  CHECK_LT(tu_elapsed_ms(start), 2000);

  /* The new task is unaffected: not cancelled, not detached. */
  CHECK_RC(ums_event_set(spread_ev), 0);
  for (int i = 0; i < n; i++) {
    join_expect(ts[i], PTR(0x42), 0);
    CHECK_RC(vs[i].wait_rc, 0);
    CHECK_EQ(vs[i].cancelled, 0);
  }
  CHECK_RC(ums_event_delete(spread_ev), 0);
  tu_runtime_shutdown(rt);
}

/* The spawner publishes a recycled record's new id without its lock
** (task.c, task_spawn_impl). A host thread keeps using the ids of tasks
** that have ended (their records retired and soon recycled by the next
** batch, which runs meanwhile) and lists the live tasks: every call on a
** stale id must miss, no live task may be cancelled or renamed by one,
** and under TSan the lister's reads of fresh records must be ordered
** after their initialisation. */
#define RR_BATCH 8
#ifdef TU_TSAN
#define RR_ROUNDS 300
#else
#define RR_ROUNDS 3000
#endif

static _Atomic uint64_t rr_stale[RR_BATCH];
static atomic_int rr_ended[RR_BATCH];
static atomic_int rr_stop, rr_cancelled, rr_renamed, rr_hits, rr_listed;

static void *rr_child(void *arg) {
  int i = (int)NUM(arg);
  /* Live across a pass, so the host meets it in its recycled slot. */
  ums_yield();
  ums_yield();
  if (ums_cancelled()) atomic_fetch_add(&rr_cancelled, 1);
  ums_task_info_t info;
  if (ums_task_info(rt, ums_self(), &info) == 0 && info.name[0])
    atomic_fetch_add(&rr_renamed, 1);
  atomic_store(&rr_ended[i], 1);
  return NULL;
}

static void *rr_spawner(void *arg) {
  (void)arg;
  ums_task_t ids[RR_BATCH];
  ums_spawn_opts_t o = {.sched = 0, .detached = 1};
  for (int round = 0; round < RR_ROUNDS; round++) {
    for (int i = 0; i < RR_BATCH; i++) {
      atomic_store(&rr_ended[i], 0);
      CHECK_RC(ums_task_spawn(rt, &o, rr_child, PTR(i), &ids[i]), 0);
    }
    /* One scheduler: a child seen ended here has also been finished and
    ** its record retired (nothing runs between its return and that). */
    for (int i = 0; i < RR_BATCH; i++) {
      while (!atomic_load(&rr_ended[i])) ums_yield();
      atomic_store(&rr_stale[i], ids[i]);
    }
  }
  return NULL;
}

static int rr_visit(const ums_task_info_t *info, void *arg) {
  (void)arg;
  if (info->id) atomic_fetch_add(&rr_listed, 1);
  return 0;
}

static void *rr_host(void *arg) {
  (void)arg;
  while (!atomic_load(&rr_stop)) {
    for (int i = 0; i < RR_BATCH; i++) {
      ums_task_t id = atomic_load(&rr_stale[i]);
      if (!id) continue;
      ums_task_info_t info;
      if (ums_task_cancel(rt, id) != UMS_ESRCH) atomic_fetch_add(&rr_hits, 1);
      if (ums_task_set_name(rt, id, "stale") != UMS_ESRCH)
        atomic_fetch_add(&rr_hits, 1);
      if (ums_task_info(rt, id, &info) != UMS_ESRCH)
        atomic_fetch_add(&rr_hits, 1);
      if (ums_task_detach(rt, id) != UMS_ESRCH) atomic_fetch_add(&rr_hits, 1);
    }
    ums_runtime_tasks(rt, rr_visit, NULL);
  }
  return NULL;
}

static void test_recycled_race(void) {
  rt = tu_runtime_new(1);
  memset(rr_stale, 0, sizeof rr_stale);
  atomic_store(&rr_stop, 0);
  pthread_t host;
  CHECK_EQ(pthread_create(&host, NULL, rr_host, NULL), 0);
  ums_task_t sp = spawn_on(0, rr_spawner, NULL);
  join_expect(sp, NULL, 0);
  atomic_store(&rr_stop, 1);
  CHECK_EQ(pthread_join(host, NULL), 0);
  CHECK_EQ(atomic_load(&rr_hits), 0);
  CHECK_EQ(atomic_load(&rr_cancelled), 0);
  CHECK_EQ(atomic_load(&rr_renamed), 0);
  CHECK_GT(atomic_load(&rr_listed), 0);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* max_workers                                                             */
/* ====================================================================== */

#define MW_TASKS 10

static ums_event_t *mw_go;
static atomic_int mw_started, mw_running, mw_max_running;
static int mw_order[MW_TASKS];

static void *mw_fn(void *arg) {
  int me = (int)NUM(arg);
  mw_order[atomic_fetch_add(&mw_started, 1)] = me;
  int now = atomic_fetch_add(&mw_running, 1) + 1;
  int max = atomic_load(&mw_max_running);
  while (now > max &&
         !atomic_compare_exchange_weak(&mw_max_running, &max, now)) {
  }
  CHECK_RC(ums_event_wait(mw_go, UMS_FOREVER), 0);
  atomic_fetch_sub(&mw_running, 1);
  return arg;
}

static void test_max_workers_fifo(void) {
  ums_config_t cfg = {.schedulers = 1, .max_workers = 2};
  rt = tu_runtime_new_cfg(&cfg);
  /* Auto reset: each set lets exactly one task finish. */
  mw_go = ums_event_new(0, 0);
  atomic_store(&mw_started, 0);
  atomic_store(&mw_running, 0);
  atomic_store(&mw_max_running, 0);
  ums_task_t ts[MW_TASKS];
  for (int i = 0; i < MW_TASKS; i++) ts[i] = spawn_any(mw_fn, PTR(i));

  WAIT_UNTIL(atomic_load(&mw_started) == 2 && tu_stats(rt, 0).pending == 8,
             5000);
  ums_sched_stats_t st = tu_stats(rt, 0);
  CHECK_EQ(st.tasks, MW_TASKS);
  CHECK_EQ(st.workers_active, 2);
  CHECK_EQ(st.pending, MW_TASKS - 2);
  CHECK_EQ(atomic_load(&mw_running), 2);

  for (int k = 1; k <= MW_TASKS - 2; k++) {
    CHECK_RC(ums_event_set(mw_go), 0);
    WAIT_UNTIL(atomic_load(&mw_started) == 2 + k, 5000);
    WAIT_UNTIL(tu_stats(rt, 0).pending == (uint64_t)(MW_TASKS - 2 - k), 5000);
    CHECK_LE(atomic_load(&mw_running), 2);
  }
  for (int k = 0; k < 2; k++) CHECK_RC(ums_event_set(mw_go), 0);
  for (int i = 0; i < MW_TASKS; i++) join_expect(ts[i], PTR(i), 0);
  CHECK_EQ(atomic_load(&mw_max_running), 2);
  for (int i = 0; i < MW_TASKS; i++) CHECK_EQ(mw_order[i], i);
  CHECK_EQ(tu_stats(rt, 0).pending, 0);
  CHECK_RC(ums_event_delete(mw_go), 0);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Yield and sleep                                                         */
/* ====================================================================== */

#define YIELD_ROUNDS 5

static int ylog[3 * YIELD_ROUNDS];
static int ylog_n;

/* How the yielders let the others run: ums_yield, a sleep of no time,
** or a sleep shorter than a switch, whose timer is due when it is armed.
** Each must go to the back of the run queue as a yield does. */
enum { BY_YIELD, BY_SLEEP_ZERO, BY_SLEEP_NS };
static int yhow;

static void *yielder_fn(void *arg) {
  for (int i = 0; i < YIELD_ROUNDS; i++) {
    ylog[ylog_n++] = (int)NUM(arg);
    CHECK_RC(yhow == BY_YIELD        ? ums_yield()
             : yhow == BY_SLEEP_ZERO ? ums_sleep(0)
                                     : ums_sleep(1),
             0);
  }
  return NULL;
}

/* Spawns the children on its own scheduler so that all three are queued
** before the first runs. */
static void *yield_parent_fn(void *arg) {
  (void)arg;
  ums_task_t c[3];
  for (int i = 0; i < 3; i++)
    c[i] = spawn_on(ums_current_sched(), yielder_fn, PTR(i));
  for (int i = 0; i < 3; i++) join_expect(c[i], NULL, 0);
  return NULL;
}

static void yield_round_robin(int how) {
  rt = tu_runtime_new(1);
  ylog_n = 0;
  yhow = how;
  uint64_t yields = tu_stats(rt, 0).yields;
  join_expect(spawn_any(yield_parent_fn, NULL), NULL, 0);
  CHECK_EQ(ylog_n, 3 * YIELD_ROUNDS);
  for (int i = 0; i < 3 * YIELD_ROUNDS; i++) CHECK_EQ(ylog[i], i % 3);
  /* A sleep of some time is a wait, not a yield. */
  if (how != BY_SLEEP_NS)
    CHECK_EQ(tu_stats(rt, 0).yields - yields, 3 * YIELD_ROUNDS);
  tu_runtime_shutdown(rt);
}

static void test_yield_round_robin(void) { yield_round_robin(BY_YIELD); }
static void test_sleep_zero_round_robin(void) {
  yield_round_robin(BY_SLEEP_ZERO);
}
static void test_sleep_due_round_robin(void) {
  yield_round_robin(BY_SLEEP_NS);
}

static int wake_order[3];
static int wake_n;
static int64_t slept_ms[3];

/* The sleeps end at 100, 200 and 300 ms after one base the parent takes
** before it spawns them: the order is the deadlines' even if a loaded
** machine (TSan at load 15 did) holds the scheduler thread for more than
** 10 ms between two of the children's starts. */
static int64_t sleep_base;

static void *sleeper_ms_fn(void *arg) {
  int ms = (int)NUM(arg);
  CHECK_RC(ums_sleep_until(sleep_base + tu_ms(ms * 10)), 0);
  slept_ms[ms / 10 - 1] = tu_elapsed_ms(sleep_base);
  wake_order[wake_n++] = ms;
  return NULL;
}

static void *sleep_parent_fn(void *arg) {
  (void)arg;
  static const int ms[3] = {30, 10, 20};
  sleep_base = ums_now();
  ums_task_t c[3];
  for (int i = 0; i < 3; i++)
    c[i] = spawn_on(ums_current_sched(), sleeper_ms_fn, PTR(ms[i]));
  for (int i = 0; i < 3; i++) join_expect(c[i], NULL, 0);
  return NULL;
}

static void test_sleep_order(void) {
  rt = tu_runtime_new(1);
  wake_n = 0;
  join_expect(spawn_any(sleep_parent_fn, NULL), NULL, 0);
  CHECK_EQ(wake_n, 3);
  CHECK_EQ(wake_order[0], 10);
  CHECK_EQ(wake_order[1], 20);
  CHECK_EQ(wake_order[2], 30);
  for (int i = 0; i < 3; i++) {
    CHECK_GE(slept_ms[i], (i + 1) * 100);
    CHECK_LT(slept_ms[i], 5000);
  }
  tu_runtime_shutdown(rt);
}

static void *sleep_then_return(void *arg) {
  CHECK_RC(ums_sleep(tu_ms(20)), 0);
  return arg;
}

static void test_host_join_and_sleep(void) {
  /* A host sleep needs no runtime. */
  int64_t start = ums_now();
  CHECK_RC(ums_sleep(tu_ms(10)), 0);
  CHECK_GE(tu_elapsed_ms(start), 10);
  CHECK_LT(tu_elapsed_ms(start), 2000);
  start = ums_now();
  CHECK_RC(ums_sleep_until(ums_now() - 1), 0);
  CHECK_RC(ums_sleep(-5), 0);
  CHECK_LT(tu_elapsed_ms(start), 2000);

  rt = tu_runtime_new(2);
  start = ums_now();
  CHECK_RC(ums_sleep(tu_ms(10)), 0);
  CHECK_GE(tu_elapsed_ms(start), 10);
  CHECK_LT(tu_elapsed_ms(start), 2000);

  /* The host thread blocks in the join until the task ends. */
  start = ums_now();
  ums_task_t t = spawn_any(sleep_then_return, PTR(0x31));
  join_expect(t, PTR(0x31), 0);
  CHECK_GE(tu_elapsed_ms(start), 20);
  CHECK_LT(tu_elapsed_ms(start), 2000);
  tu_runtime_shutdown(rt);
}

/* A join releases the handle: afterwards it names no task for join,
** detach and cancel alike. The check runs many times because the
** scheduler drops the task's own reference a moment after it wakes the
** joiner, and the answer must not depend on that moment. */
static void *sleep_1ms_fn(void *arg) {
  CHECK_RC(ums_sleep(tu_ms(1)), 0);
  return arg;
}

static void test_join_releases_handle(void) {
  rt = tu_runtime_new(2);
  int cancel_ok = 0;
  for (int i = 0; i < 200; i++) {
    ums_task_t t = spawn_any(sleep_1ms_fn, PTR(i));
    join_expect(t, PTR(i), 0);
    CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, NULL, NULL), UMS_ESRCH);
    CHECK_RC(ums_task_detach(rt, t), UMS_ESRCH);
    if (ums_task_cancel(rt, t) == 0) cancel_ok++;
  }
  if (cancel_ok)
    tu_fail(__FILE__, __LINE__,
            "ums_task_cancel on a joined handle returned "
            "0 instead of UMS_ESRCH in %d of 200 tries",
            cancel_ok);
  tu_runtime_shutdown(rt);
}

/* Records freed past a scheduler's local cap go to the shared list in
** batches: none may be lost on the way (a lost record is never reused,
** so every wave would take fresh ones and the table would grow), and
** both lists must still hand out sound records. Each wave spawns more
** detached step tasks at once than the local cap, from a task on the
** same scheduler, so that all are live before any ends. */
#define RECYCLE_WAVE 5000
#define RECYCLE_WAVES 8

static atomic_int recycle_done;

static int recycle_step(void *arg) {
  (void)arg;
  atomic_fetch_add(&recycle_done, 1);
  return UMS_STEP_DONE;
}

static void *recycle_waves_fn(void *arg) {
  uint32_t *slots = arg;
  ums_spawn_opts_t o = {.sched = 0, .detached = 1};
  for (int w = 0; w < RECYCLE_WAVES; w++) {
    atomic_store(&recycle_done, 0);
    for (int i = 0; i < RECYCLE_WAVE; i++)
      CHECK_RC(ums_task_spawn_step(rt, &o, recycle_step, NULL, NULL), 0);
    while (atomic_load(&recycle_done) < RECYCLE_WAVE) ums_yield();
    /* The last ended task's record is freed after its step returns. */
    ums_yield();
    slots[w] = atomic_load_explicit(&rt->nslots, memory_order_acquire);
  }
  return NULL;
}

static void test_freed_records_reused(void) {
  rt = tu_runtime_new(1);
  uint32_t slots[RECYCLE_WAVES];
  ums_task_t t = spawn_on(0, recycle_waves_fn, slots);
  join_expect(t, NULL, 0);
  CHECK_GE(slots[0], RECYCLE_WAVE);
  for (int w = 1; w < RECYCLE_WAVES; w++) CHECK_EQ(slots[w], slots[0]);
  tu_runtime_shutdown(rt);
}

int main(void) {
  RUN(test_spawn_join_result);
  RUN(test_join_timeout_stays_joinable);
  RUN(test_join_twice_and_detach);
  RUN(test_join_releases_handle);
  RUN(test_join_self);
  RUN(test_concurrent_joiners);
  RUN(test_exit_nested);
  RUN(test_identity);
  RUN(test_spawn_on_chosen_sched);
  RUN(test_any_sched_spreads);
  RUN(test_place);
  RUN(test_spawn_from_task_and_hosts);
  RUN(test_own_spawns_counted);
  RUN(test_spawn_step_here);
  RUN(test_detached_end_retires_handle);
  RUN(test_cancel_sleeping);
  RUN(test_cancel_unlinks_waiter);
  RUN(test_cancel_not_started);
  RUN(test_cancel_before_admission);
  RUN(test_recycled_handle);
  RUN(test_recycled_race);
  RUN(test_max_workers_fifo);
  RUN(test_yield_round_robin);
  RUN(test_sleep_zero_round_robin);
  RUN(test_sleep_due_round_robin);
  RUN(test_sleep_order);
  RUN(test_host_join_and_sleep);
  RUN(test_freed_records_reused);
  return 0;
}
