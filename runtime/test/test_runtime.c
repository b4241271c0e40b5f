/*
** test_runtime.c: the runtime's life cycle: configuration and its
** defaults, shutdown (from a task, with a deadline that cancels, with
** spawns racing it, with tasks never joined), error names and messages,
** and many create/shutdown cycles in a row.
**
** Tasks cancelled by a shutdown report into static memory that the test
** owns, because the runtime is gone by the time the test looks.
*/
#include "test-util.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdatomic.h>

#define PTR(n) ((void *)(uintptr_t)(n))

static ums_runtime_t *rt;

static ums_task_t spawn_on(int sched, ums_task_fn fn, void *arg) {
  ums_spawn_opts_t o = {.sched = sched};
  ums_task_t t = 0;
  CHECK_RC(ums_task_spawn(rt, &o, fn, arg, &t), 0);
  return t;
}

static void *nothing_fn(void *arg) { return arg; }

/* ====================================================================== */
/* Configuration                                                           */
/* ====================================================================== */

static void expect_einval(ums_config_t cfg) {
  int err = 0;
  CHECK(ums_runtime_new(&cfg, &err) == NULL);
  CHECK_RC(err, UMS_EINVAL);
  /* err may be NULL. */
  CHECK(ums_runtime_new(&cfg, NULL) == NULL);
}

static void test_config_validation(void) {
  int threads = tu_thread_baseline();
  expect_einval((ums_config_t){.schedulers = -1});
  expect_einval((ums_config_t){.schedulers = INT_MIN});
  expect_einval((ums_config_t){.schedulers = 1000000});
  expect_einval((ums_config_t){.max_workers = -1});
  expect_einval((ums_config_t){.idle_workers_kept = -1});
  expect_einval((ums_config_t){.stack_size = 1});
  expect_einval((ums_config_t){.stack_size = 4096});
  expect_einval((ums_config_t){.stack_size = 16 * 1024});
  expect_einval((ums_config_t){.stack_size = UMS_STACK_SIZE_MIN - 1});
  expect_einval((ums_config_t){.stack_size = (size_t)1 << 40});
  expect_einval((ums_config_t){.stack_size = SIZE_MAX});
  expect_einval((ums_config_t){.io_backend = -1});
  expect_einval((ums_config_t){.io_backend = UMS_IO_POOL + 1});
  expect_einval((ums_config_t){.io_pool_threads = -1});
  /* No thread was left behind by any of them. */
  CHECK_EQ(tu_thread_count(), threads);
}

static int cpu_count(void) {
  cpu_set_t set;
  CHECK_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  return CPU_COUNT(&set);
}

static void check_defaults(ums_runtime_t *r) {
  ums_config_t c;
  memset(&c, 0x5a, sizeof c);
  ums_runtime_config(r, &c);
  CHECK_EQ(c.schedulers, cpu_count());
  CHECK_EQ(c.max_workers, 0);
  CHECK_EQ(c.stack_size, 256 * 1024);
  CHECK_EQ(c.worker_idle_timeout, 10 * UMS_NSEC_PER_SEC);
  CHECK_EQ(c.idle_workers_kept, 16);
  CHECK_EQ(c.io_pool_threads, 64);
  /* The backend in force, never AUTO. */
  CHECK(c.io_backend == UMS_IO_URING || c.io_backend == UMS_IO_POOL);
  CHECK_EQ(ums_runtime_schedulers(r), cpu_count());
  CHECK_EQ(ums_runtime_stats(r, NULL, 0), cpu_count());
}

static void test_config_defaults(void) {
  /* cfg NULL. */
  int err = 1;
  tu_thread_baseline();
  rt = ums_runtime_new(NULL, &err);
  CHECK(rt != NULL);
  CHECK_RC(err, 0);
  tu_live_runtimes++;
  check_defaults(rt);
  /* Every scheduler runs tasks. */
  for (int s = 0; s < ums_runtime_schedulers(rt); s++) {
    ums_task_t t = spawn_on(s, nothing_fn, PTR(s));
    void *res = NULL;
    CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, &res, NULL), 0);
    CHECK_PTR_EQ(res, PTR(s));
  }
  tu_runtime_shutdown(rt);

  /* A zeroed configuration means the same. */
  ums_config_t zero = {0};
  rt = tu_runtime_new_cfg(&zero);
  check_defaults(rt);
  tu_runtime_shutdown(rt);

  /* What is set is kept as given. */
  ums_config_t cfg = {.schedulers = 3,
                      .max_workers = 7,
                      .stack_size = 64 * 1024,
                      .worker_idle_timeout = tu_ms(123),
                      .idle_workers_kept = 4};
  rt = tu_runtime_new_cfg(&cfg);
  ums_config_t c;
  ums_runtime_config(rt, &c);
  CHECK_EQ(c.schedulers, 3);
  CHECK_EQ(c.max_workers, 7);
  CHECK_EQ(c.stack_size, 64 * 1024);
  CHECK_EQ(c.worker_idle_timeout, tu_ms(123));
  CHECK_EQ(c.idle_workers_kept, 4);
  CHECK_EQ(ums_runtime_schedulers(rt), 3);
  tu_runtime_shutdown(rt);

  /* A negative idle timeout (never trim) is valid and kept. */
  cfg = (ums_config_t){.schedulers = 1, .worker_idle_timeout = -1};
  rt = tu_runtime_new_cfg(&cfg);
  ums_runtime_config(rt, &c);
  CHECK_EQ(c.worker_idle_timeout, -1);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Shutdown                                                                */
/* ====================================================================== */

static void *shutdown_self_fn(void *arg) {
  (void)arg;
  int r1 = ums_runtime_shutdown(ums_current_runtime(), UMS_FOREVER);
  int r2 = ums_runtime_shutdown(ums_current_runtime(), ums_now());
  if (r1 != r2) return PTR(1);
  /* Still accepting work. */
  ums_task_t t;
  CHECK_RC(ums_task_spawn(ums_current_runtime(), NULL, nothing_fn, PTR(9), &t),
           0);
  void *res = NULL;
  CHECK_RC(ums_task_join(ums_current_runtime(), t, UMS_FOREVER, &res, NULL), 0);
  CHECK_PTR_EQ(res, PTR(9));
  return PTR(r1);
}

static void test_shutdown_from_task(void) {
  rt = tu_runtime_new(2);
  for (int s = 0; s < 2; s++) {
    ums_task_t t = spawn_on(s, shutdown_self_fn, NULL);
    void *res = NULL;
    CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, &res, NULL), 0);
    CHECK_EQ((int)(intptr_t)res, UMS_EDEADLK);
  }
  /* The runtime still works from outside too. */
  ums_task_t t = spawn_on(UMS_ANY_SCHED, nothing_fn, PTR(3));
  void *res = NULL;
  CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, &res, NULL), 0);
  CHECK_PTR_EQ(res, PTR(3));
  tu_runtime_shutdown(rt);
}

/* What each task left running at the deadline saw. Indexed by a slot the
** test hands out. */
#define DL_TASKS 16

enum dl_kind { DL_SLEEP, DL_EVENT, DL_JOIN, DL_YIELD, DL_SPAWN };

typedef struct dl_report {
  enum dl_kind kind;
  int wait_rc;  /* what the interrupted wait returned */
  int again_rc; /* the next wait */
  int spawn_rc; /* DL_SPAWN: spawning after the cancel */
  int done;
} dl_report_t;

static dl_report_t dl[DL_TASKS];
static atomic_int dl_started;
static ums_event_t *dl_event;
static ums_task_t dl_join_target;

static void *deadline_fn(void *arg) {
  dl_report_t *r = arg;
  atomic_fetch_add(&dl_started, 1);
  switch (r->kind) {
  case DL_SLEEP:
  case DL_SPAWN:
    r->wait_rc = ums_sleep_until(UMS_FOREVER);
    break;
  case DL_EVENT:
    r->wait_rc = ums_event_wait(dl_event, UMS_FOREVER);
    break;
  case DL_JOIN:
    r->wait_rc = ums_task_join(ums_current_runtime(), dl_join_target,
                               UMS_FOREVER, NULL, NULL);
    break;
  case DL_YIELD:
    /* Busy, but at a wait point every round. */
    while ((r->wait_rc = ums_yield()) == 0) {
    }
    break;
  }
  r->again_rc = ums_sleep(tu_ms(1));
  if (r->kind == DL_SPAWN)
    r->spawn_rc =
        ums_task_spawn(ums_current_runtime(), NULL, nothing_fn, NULL, NULL);
  r->done = 1;
  return NULL;
}

static void test_shutdown_deadline_cancels(void) {
  int threads = tu_thread_baseline();
  rt = tu_runtime_new(2);
  tu_live_runtimes--; /* shut down by hand below: it must time out */
  dl_event = ums_event_new(1, 0);
  memset(dl, 0, sizeof dl);
  atomic_store(&dl_started, 0);
  static const enum dl_kind kinds[DL_TASKS] = {
      DL_SLEEP, DL_SLEEP, DL_SLEEP, DL_SLEEP, DL_EVENT, DL_EVENT,
      DL_EVENT, DL_JOIN,  DL_SLEEP, DL_YIELD, DL_SPAWN, DL_SPAWN,
      DL_SLEEP, DL_EVENT, DL_SLEEP, DL_SLEEP};
  for (int i = 0; i < DL_TASKS; i++) {
    dl[i].kind = kinds[i];
    dl[i].spawn_rc = 1;
  }
  /* Slot 0 sleeps forever and is what the joiners join. */
  dl_join_target = spawn_on(0, deadline_fn, &dl[0]);
  for (int i = 1; i < DL_TASKS; i++) {
    if (i >= DL_TASKS - 2) {
      /* Two of them detached. */
      ums_spawn_opts_t o = {.sched = i % 2, .detached = 1};
      CHECK_RC(ums_task_spawn(rt, &o, deadline_fn, &dl[i], NULL), 0);
    } else {
      spawn_on(i % 2, deadline_fn, &dl[i]);
    }
  }
  WAIT_UNTIL(atomic_load(&dl_started) == DL_TASKS, 5000);

  int64_t start = ums_now();
  CHECK_RC(ums_runtime_shutdown(rt, ums_deadline(tu_ms(50))), UMS_ETIMEDOUT);
  CHECK_GE(tu_elapsed_ms(start), 50);
  CHECK_LT(tu_elapsed_ms(start), 5000);

  for (int i = 0; i < DL_TASKS; i++) {
    CHECK_EQ(dl[i].done, 1);
    if (dl[i].kind == DL_SPAWN) CHECK_RC(dl[i].spawn_rc, UMS_ESHUTDOWN);
    /* A joiner may see its target end (cancelled first) before its own
    ** cancel arrives; then its join succeeds, and the shutdown, which
    ** cancels the tasks one after another, may reach it only after its
    ** next 1 ms sleep has ended too. */
    if (dl[i].kind == DL_JOIN && dl[i].wait_rc == 0) {
      CHECK(dl[i].again_rc == 0 || dl[i].again_rc == UMS_ECANCELED);
      continue;
    }
    CHECK_RC(dl[i].again_rc, UMS_ECANCELED);
    CHECK_RC(dl[i].wait_rc, UMS_ECANCELED);
  }
  CHECK_RC(ums_event_delete(dl_event), 0);
  CHECK_THREADS(threads);
}

/* At the deadline, a task still waiting for a worker (max_workers) is
** cancelled and never runs, even when the worker frees up while the
** shutdown is still cancelling the others. Scheduler 0's running task has
** the lowest slot and keeps yielding, so it ends the moment its cancel
** flag is set, and scheduler 0 then starts its pending tasks, which have
** the highest slots, with many of scheduler 1's in between. Scheduler 0
** gets a CPU of its own and the rest share another, so that it really
** runs while the shutdown is still working through the other slots. */
#define PEND_MID 20000
#define PEND_ROUNDS 3

static atomic_int pending_ran;

static void *pending_fn(void *arg) {
  atomic_fetch_add(&pending_ran, 1);
  return arg;
}

typedef struct yielder {
  int cpu; /* to pin the scheduler thread to, or -1 */
  int rc;
} yielder_t;

static void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  CHECK_EQ(sched_setaffinity(0, sizeof set, &set), 0);
}

static void *yield_forever_fn(void *arg) {
  yielder_t *y = arg;
  if (y->cpu >= 0) pin_to(y->cpu);
  while ((y->rc = ums_yield()) == 0) {
  }
  return NULL;
}

static void test_shutdown_deadline_pending(void) {
  int threads = tu_thread_baseline();
  cpu_set_t allowed;
  CHECK_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int cpu[2] = {-1, -1};
  for (int c = 0, k = 0; c < CPU_SETSIZE && k < 2; c++)
    if (CPU_ISSET(c, &allowed)) cpu[k++] = c;
  if (cpu[1] >= 0) pin_to(cpu[1]);

  int ran = 0;
  for (int round = 0; round < PEND_ROUNDS; round++) {
    ums_config_t cfg = {.schedulers = 2, .max_workers = 1};
    rt = tu_runtime_new_cfg(&cfg);
    tu_live_runtimes--; /* shut down by hand below: it must time out */
    static yielder_t y[2];
    y[0] = (yielder_t){cpu[1] >= 0 ? cpu[0] : -1, 1};
    y[1] = (yielder_t){cpu[1], 1};
    atomic_store(&pending_ran, 0);
    spawn_on(0, yield_forever_fn, &y[0]);
    spawn_on(1, yield_forever_fn, &y[1]);
    for (int i = 0; i < PEND_MID; i++) spawn_on(1, pending_fn, NULL);
    for (int i = 0; i < 3; i++) spawn_on(0, pending_fn, NULL);
    WAIT_UNTIL(tu_stats(rt, 0).pending == 3 &&
                   tu_stats(rt, 1).pending == PEND_MID,
               5000);
    CHECK_RC(ums_runtime_shutdown(rt, ums_deadline(tu_ms(20))), UMS_ETIMEDOUT);
    CHECK_RC(y[0].rc, UMS_ECANCELED);
    CHECK_RC(y[1].rc, UMS_ECANCELED);
    ran += atomic_load(&pending_ran);
    CHECK_THREADS(threads);
  }
  CHECK_EQ(sched_setaffinity(0, sizeof allowed, &allowed), 0);
  if (ran)
    tu_fail(__FILE__, __LINE__,
            "%d tasks that were still waiting for a worker at the shutdown "
            "deadline ran (over %d rounds)",
            ran, PEND_ROUNDS);
}

/* Spawns race the start of a shutdown: a task and a host thread spawn
** every millisecond until they are refused. */
typedef struct late {
  int sleep_rc;
  int spawns_ok;
  int spawn_rc;
} late_t;

static void *late_spawner_fn(void *arg) {
  late_t *l = arg;
  do {
    if ((l->sleep_rc = ums_sleep(tu_ms(1))) != 0) break;
    l->spawn_rc =
        ums_task_spawn(ums_current_runtime(), NULL, nothing_fn, NULL, NULL);
    if (l->spawn_rc == 0) l->spawns_ok++;
  } while (l->spawn_rc == 0);
  return NULL;
}

static atomic_int host_spawner_done, host_spawns_ok;
static int host_spawn_last_rc;

static void *host_spawner_thread(void *arg) {
  ums_runtime_t *r = arg;
  int rc;
  while ((rc = ums_task_spawn(r, NULL, nothing_fn, NULL, NULL)) == 0) {
    atomic_fetch_add(&host_spawns_ok, 1);
    usleep(100);
  }
  host_spawn_last_rc = rc;
  /* From here on this thread does not touch the runtime. */
  atomic_store(&host_spawner_done, 1);
  return NULL;
}

static void *wait_host_spawner_fn(void *arg) {
  while (!atomic_load(&host_spawner_done)) ums_sleep(tu_ms(1));
  return arg;
}

static void test_spawn_after_shutdown_started(void) {
  static late_t late;
  late = (late_t){1, 0, 1};
  atomic_store(&host_spawner_done, 0);
  atomic_store(&host_spawns_ok, 0);
  host_spawn_last_rc = 0;
  rt = tu_runtime_new(2);
  spawn_on(0, late_spawner_fn, &late);
  spawn_on(1, wait_host_spawner_fn, NULL);
  pthread_t th;
  CHECK_EQ(pthread_create(&th, NULL, host_spawner_thread, rt), 0);
  WAIT_UNTIL(atomic_load(&host_spawns_ok) >= 10, 5000);
  /* Every task ends in time: the shutdown is graceful. */
  tu_runtime_shutdown(rt);
  CHECK_EQ(pthread_join(th, NULL), 0);
  CHECK_RC(late.sleep_rc, 0);
  CHECK_RC(late.spawn_rc, UMS_ESHUTDOWN);
  CHECK_GE(atomic_load(&host_spawns_ok), 10);
  CHECK_RC(host_spawn_last_rc, UMS_ESHUTDOWN);
}

/* Joinable tasks nobody joined are released by the shutdown (the ASan
** build checks that nothing leaks). */
static void *sleep_ms_fn(void *arg) {
  CHECK_RC(ums_sleep(tu_ms((int64_t)(uintptr_t)arg)), 0);
  return arg;
}

static void test_shutdown_unjoined(void) {
  rt = tu_runtime_new(2);
  ums_task_t keep[10];
  for (int i = 0; i < 200; i++) {
    ums_task_t t =
        spawn_on(i % 2, i % 3 ? nothing_fn : sleep_ms_fn, PTR(i % 7));
    if (i < 10) keep[i] = t;
  }
  ums_spawn_opts_t o = {.sched = UMS_ANY_SCHED, .detached = 1};
  for (int i = 0; i < 50; i++)
    CHECK_RC(ums_task_spawn(rt, &o, sleep_ms_fn, PTR(i % 5), NULL), 0);
  /* Some joined, some detached, the rest left alone. */
  for (int i = 0; i < 5; i++)
    CHECK_RC(ums_task_join(rt, keep[i], UMS_FOREVER, NULL, NULL), 0);
  for (int i = 5; i < 10; i++) CHECK_RC(ums_task_detach(rt, keep[i]), 0);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Errors                                                                  */
/* ====================================================================== */

static void test_error_names(void) {
  static const struct {
    int code, value, errno_value;
    const char *name, *text;
  } known[] = {
#define ROW(name, value, text) {UMS_##name, value, -name, "UMS_" #name, text},
      UMS_ERRNO_MAP(ROW)
#undef ROW
  };
  size_t n = sizeof known / sizeof known[0];
  CHECK_EQ(n, 34);
  for (size_t i = 0; i < n; i++) {
    CHECK_EQ(known[i].code, known[i].value);
    CHECK_LT(known[i].code, 0);
    /* Negative errno where one fits: they all have one. */
    CHECK_EQ(known[i].code, known[i].errno_value);
    CHECK_STR_EQ(ums_err_name(known[i].code), known[i].name);
    CHECK_STR_EQ(ums_strerror(known[i].code), known[i].text);
    for (size_t k = 0; k < i; k++) {
      CHECK_NE(known[i].code, known[k].code);
      CHECK(strcmp(ums_strerror(known[i].code), ums_strerror(known[k].code)));
    }
  }
  CHECK_EQ(UMS_ECLOSED, UMS_EPIPE);
  CHECK_STR_EQ(ums_err_name(UMS_ECLOSED), "UMS_EPIPE");

  /* Unknown codes: a name that says so and a message that is none of the
  ** known ones. */
  static const int unknown[] = {1,       22,      -25,     -9999,  12345,
                                INT_MIN, INT_MAX, -EMLINK, -ECHILD};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    const char *msg = ums_strerror(unknown[i]);
    CHECK(msg != NULL);
    CHECK(msg[0] != '\0');
    for (size_t k = 0; k < n; k++) CHECK(strcmp(msg, known[k].text));
    CHECK_STR_EQ(ums_err_name(unknown[i]), "UMS_E?");
  }
  /* A negative errno outside the map (file I/O passes the kernel's
  ** through) reads as the C library says. */
  CHECK_STR_EQ(ums_strerror(-EMLINK), strerror(EMLINK));
  CHECK_STR_EQ(ums_strerror(-9999), "unknown error");
  /* 0 is success, not an error; both calls still answer. */
  CHECK(ums_strerror(0) != NULL);
  CHECK(ums_err_name(0) != NULL);
}

/* ====================================================================== */
/* Cycles                                                                  */
/* ====================================================================== */

static void test_create_shutdown_cycles(void) {
  int threads = tu_thread_baseline();
  for (int i = 0; i < 100; i++) {
    rt = tu_runtime_new(2);
    ums_task_t t = spawn_on(i % 2, nothing_fn, PTR(i));
    void *res = NULL;
    CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, &res, NULL), 0);
    CHECK_PTR_EQ(res, PTR(i));
    tu_runtime_shutdown(rt);
  }
  /* Some cycles with nothing run at all, and with tasks left running
  ** briefly. */
  for (int i = 0; i < 20; i++) {
    rt = tu_runtime_new(1 + i % 3);
    if (i % 2) spawn_on(UMS_ANY_SCHED, sleep_ms_fn, PTR(2));
    tu_runtime_shutdown(rt);
  }
  CHECK_EQ(tu_thread_count(), threads);
}

/* ====================================================================== */
/* Running on the caller's thread                                          */
/* ====================================================================== */

static pthread_t caller_thread;
static _Atomic int caller_steps;
static _Atomic int caller_spin_stop;
static _Atomic int caller_slept;

/* Runs on the thread that made the runtime, never while it is away. */
static void *on_caller_fn(void *arg) {
  CHECK(pthread_equal(pthread_self(), caller_thread));
  /* Not from inside a task: it is running already. */
  CHECK_RC(ums_runtime_run(ums_current_runtime(), UMS_FOREVER),
           UMS_EDEADLK);
  atomic_fetch_add(&caller_steps, 1);
  CHECK_RC(ums_yield(), 0);
  atomic_fetch_add(&caller_steps, 1);
  return arg;
}

static void *pause_fn(void *arg) {
  ums_runtime_pause(ums_current_runtime());
  return arg;
}

/* Keeps the scheduler busy (never idle) until told to stop. */
static void *yield_loop_fn(void *arg) {
  while (!atomic_load(&caller_spin_stop)) CHECK_RC(ums_yield(), 0);
  return arg;
}

static void *sleep_then_mark_fn(void *arg) {
  CHECK_RC(ums_sleep(20 * UMS_NSEC_PER_MSEC), 0);
  atomic_store(&caller_slept, 1);
  return arg;
}

static void *run_elsewhere(void *arg) {
  static int rc;
  rc = ums_runtime_run(arg, ums_deadline(0));
  return &rc;
}

static void test_run_on_caller(void) {
  int threads = tu_thread_baseline();
  expect_einval((ums_config_t){.schedulers = 2, .run_on_caller = 1});
  caller_thread = pthread_self();
  ums_config_t cfg = {.run_on_caller = 1};
  int err = -1;
  rt = ums_runtime_new(&cfg, &err);
  CHECK(rt != NULL);
  CHECK_RC(err, 0);
  CHECK_EQ(ums_runtime_schedulers(rt), 1);
  /* Its scheduler has no thread of its own: the monitor alone started. */
  CHECK_EQ(tu_thread_count(), threads + 1);
  ums_task_t t = spawn_on(0, on_caller_fn, PTR(7));
  /* Nothing runs the task while this thread does something else. */
  usleep(20000);
  CHECK_EQ(atomic_load(&caller_steps), 0);
  /* Only the thread that made it may run it. */
  pthread_t th;
  CHECK_RC(pthread_create(&th, NULL, run_elsewhere, rt), 0);
  void *rc = NULL;
  CHECK_RC(pthread_join(th, &rc), 0);
  CHECK_RC(*(int *)rc, UMS_EPERM);
  /* A task's pause returns at the next pass: the first task has run up
  ** to its yield. */
  spawn_on(0, pause_fn, NULL);
  CHECK_RC(ums_runtime_run(rt, UMS_FOREVER), 0);
  CHECK_EQ(atomic_load(&caller_steps), 1);
  /* A deadline ends a run whose tasks never let the scheduler idle. */
  spawn_on(0, yield_loop_fn, NULL);
  CHECK_RC(ums_runtime_run(rt, ums_deadline(20 * UMS_NSEC_PER_MSEC)),
           UMS_ETIMEDOUT);
  CHECK_EQ(atomic_load(&caller_steps), 2);
  atomic_store(&caller_spin_stop, 1);
  /* And one that idles. */
  CHECK_RC(ums_runtime_run(rt, ums_deadline(20 * UMS_NSEC_PER_MSEC)),
           UMS_ETIMEDOUT);
  /* The first task has ended: its join does not wait. */
  void *res = NULL;
  CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, &res, NULL), 0);
  CHECK_PTR_EQ(res, PTR(7));
  /* A pause asked for while it is away makes the next run return at
  ** once. */
  ums_runtime_pause(rt);
  CHECK_RC(ums_runtime_run(rt, UMS_FOREVER), 0);
  /* The shutdown runs the scheduler until the tasks left have ended. */
  spawn_on(0, sleep_then_mark_fn, NULL);
  CHECK_RC(ums_runtime_shutdown(rt, UMS_FOREVER), 0);
  CHECK_EQ(atomic_load(&caller_slept), 1);
  CHECK_EQ(tu_thread_count(), threads);
  /* A runtime with a thread per scheduler has nothing to run here. */
  rt = tu_runtime_new(1);
  CHECK_RC(ums_runtime_run(rt, UMS_FOREVER), UMS_EINVAL);
  ums_runtime_pause(rt);
  tu_runtime_shutdown(rt);
  CHECK_EQ(tu_thread_count(), threads);
}

/* ====================================================================== */
/* The heap between runtimes                                               */
/* ====================================================================== */

/* A host that starts a runtime per test keeps small objects of its own
** alive between them (a Lua heap the collector has not swept yet). A
** block that each runtime takes from the heap with an alignment and
** gives back is split by such objects in between (glibc's memalign
** carves it out of a larger free block and frees the rest), so every
** runtime would add fragments to the heap that each malloc and free then
** walks. The runtime is linked into this program, so its calls to
** aligned_alloc come here and are counted. */
static atomic_int big_aligned;

void *aligned_alloc(size_t align, size_t n) {
  if (n >= 1024) atomic_fetch_add(&big_aligned, 1);
  void *p = NULL;
  if (align < sizeof(void *)) align = sizeof(void *);
  return posix_memalign(&p, align, n) == 0 ? p : NULL;
}

static void test_heap_not_split(void) {
  ums_config_t cfg = {.run_on_caller = 1, .keep_threads = 2};
  for (int i = 0; i < 20; i++) {
    int before = atomic_load(&big_aligned);
    rt = ums_runtime_new(&cfg, NULL);
    CHECK(rt != NULL);
    spawn_on(0, nothing_fn, NULL);
    CHECK_RC(ums_runtime_shutdown(rt, UMS_FOREVER), 0);
    int after = atomic_load(&big_aligned);
    CHECK_EQ(after, before);
  }
}

int main(void) {
  RUN(test_config_validation);
  RUN(test_config_defaults);
  RUN(test_shutdown_from_task);
  RUN(test_shutdown_deadline_cancels);
  RUN(test_shutdown_deadline_pending);
  RUN(test_spawn_after_shutdown_started);
  RUN(test_shutdown_unjoined);
  RUN(test_error_names);
  RUN(test_create_shutdown_cycles);
  RUN(test_run_on_caller);
  RUN(test_heap_not_split);
  return 0;
}
