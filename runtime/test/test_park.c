/*
** test_park.c: step tasks and parking (the "Step tasks and parking"
** section of ums.h): stepping and results, round-robin with C tasks,
** ums_park_begin / ums_unpark from every kind of party and at every moment
** (before the step returned, after, never: the deadline), stale and bad
** tokens, cancellation at every point of a park, blocking calls inside a
** step (the worker stays bound while the scheduler runs on), the misuse
** guards and the protocol violations that abort (in a child process), a
** stress of park/unpark rounds, the race of an unpark against the deadline,
** the races of an unpark from the task's own scheduler against the
** deadline, another thread's unpark and a cancel (also for local parks,
** UMS_PARK_LOCAL, which end without a lock; and their tokens' rules),
** and shutdown with step tasks parked forever.
**
** A step task cancelled before it started is stepped once (ums.h: its
** binding must get the chance to let go of what it holds), unlike a C
** task, which never runs; test_cancel_before_start holds it to that.
**
** The last five tests show runtime bugs found while writing these (see
** each one's comment); they come last so that every other test reports.
**
** Steps report what they saw into memory the test owns. The host reads it
** after joining the task (a join orders the task's writes before its
** return), after the runtime is shut down, or through atomics while the
** task runs. A step's own state is touched by that step only: a step task
** always runs on its scheduler's thread.
**
** Usage: test_park [test name...]; no name runs them all. The child modes
** (--child MODE) are the processes the abort tests start.
*/
#include "test-util.h"
#include "ums-binding.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/wait.h>

#ifdef TU_TSAN
#define STRESS_TASKS 300
#define RACE_ITERS 4000
#define PARKED_STEPS 300
#else
#define STRESS_TASKS 10000
#define RACE_ITERS 10000
#define PARKED_STEPS 1000
#endif
#define STRESS_ROUNDS 10

#define PTR(n) ((void *)(intptr_t)(n))

/* Ten seconds: bounds a hang, never measures speed. */
#define LONG_MS 10000

static ums_runtime_t *rt;

/* ====================================================================== */
/* Helpers                                                                 */
/* ====================================================================== */

static ums_task_t spawn_step_on(int sched, ums_step_fn fn, void *arg) {
  ums_spawn_opts_t o = {.sched = sched};
  ums_task_t t = 0;
  CHECK_RC(ums_task_spawn_step(rt, &o, fn, arg, &t), 0);
  CHECK_NE(t, 0);
  return t;
}

static ums_task_t spawn_c_on(int sched, ums_task_fn fn, void *arg) {
  ums_spawn_opts_t o = {.sched = sched};
  ums_task_t t = 0;
  CHECK_RC(ums_task_spawn(rt, &o, fn, arg, &t), 0);
  CHECK_NE(t, 0);
  return t;
}

/* Joins with a deadline, so that a lost wake-up fails instead of hanging. */
#define JOIN_EXPECT(t, want_result, want_status)                               \
  do {                                                                         \
    void *res_ = PTR(0xdead);                                                  \
    int st_ = 12345;                                                           \
    CHECK_RC(                                                                  \
        ums_task_join(rt, (t), ums_deadline(tu_ms(LONG_MS)), &res_, &st_), 0); \
    CHECK_PTR_EQ(res_, (want_result));                                         \
    CHECK_RC(st_, (want_status));                                              \
  } while (0)

/* A busy wait that holds the OS thread (and so, in a task, the whole
** scheduler); bounded. */
#define SPIN_UNTIL(cond, ms)                                                   \
  do {                                                                         \
    int64_t until_ = ums_deadline(tu_ms(ms));                                  \
    while (!(cond)) {                                                          \
      if (ums_now() > until_)                                                  \
        tu_fail(__FILE__, __LINE__, "timed out spinning for %s", #cond);       \
      sched_yield();                                                           \
    }                                                                          \
  } while (0)

/* A wait inside a C task that lets the other tasks of its scheduler run. */
#define TASK_WAIT_UNTIL(cond, ms)                                              \
  do {                                                                         \
    int64_t until_ = ums_deadline(tu_ms(ms));                                  \
    while (!(cond)) {                                                          \
      if (ums_now() > until_)                                                  \
        tu_fail(__FILE__, __LINE__, "timed out yielding for %s", #cond);       \
      CHECK_RC(ums_yield(), 0);                                                \
    }                                                                          \
  } while (0)

static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s ? *s : 0x9e3779b97f4a7c15u;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

static void spin_ns(int64_t ns) {
  int64_t until = ums_now() + ns;
  while (ums_now() < until) {
  }
}

/* Every scheduler of rt is in its idle wait: each task it holds has
** parked (a scheduler leaves the idle state before it runs anything). */
static bool all_idle(void) {
  int n = ums_runtime_schedulers(rt);
  for (int i = 0; i < n; i++)
    if (!tu_stats(rt, i).idle) return false;
  return true;
}

/* A token handed from a task to whoever ends the park. */
typedef struct tokbox {
  _Atomic uint64_t task, seq;
  atomic_int ready;
} tokbox_t;

static void tok_put(tokbox_t *b, ums_park_token_t t) {
  atomic_store_explicit(&b->task, t.task, memory_order_relaxed);
  atomic_store_explicit(&b->seq, t.seq, memory_order_relaxed);
  atomic_store_explicit(&b->ready, 1, memory_order_release);
}

static ums_park_token_t tok_get(tokbox_t *b) {
  CHECK(atomic_load_explicit(&b->ready, memory_order_acquire));
  ums_park_token_t t = {atomic_load_explicit(&b->task, memory_order_relaxed),
                        atomic_load_explicit(&b->seq, memory_order_relaxed)};
  return t;
}

/* ====================================================================== */
/* Stepping: results, round-robin, step and C tasks together               */
/* ====================================================================== */

typedef struct yielder {
  int yields; /* UMS_STEP_YIELD this many times, then DONE */
  int calls;
  void *result;
  int status;
  ums_task_t self;
  int sched;
  ums_runtime_t *cur_rt;
} yielder_t;

static int yielder_step(void *arg) {
  yielder_t *y = arg;
  y->calls++;
  CHECK_LE(y->calls, y->yields + 1);
  if (y->calls == 1) {
    y->self = ums_self();
    y->sched = ums_current_sched();
    y->cur_rt = ums_current_runtime();
    /* A result set early and not set again is what the joiner sees. */
    ums_step_set_result(PTR(-1), -2);
  }
  CHECK_EQ(ums_self(), y->self);
  CHECK_EQ(ums_current_sched(), y->sched);
  CHECK(!ums_cancelled());
  if (y->calls <= y->yields) return UMS_STEP_YIELD;
  if (y->result || y->status) ums_step_set_result(y->result, y->status);
  return UMS_STEP_DONE;
}

static int done_at_once_step(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
  return UMS_STEP_DONE;
}

static void test_step_yield_done(void) {
  static char obj[4];
  rt = tu_runtime_new(2);

  /* N yields, then DONE with a result and a status. */
  yielder_t y = {.yields = 25, .result = obj + 1, .status = 7};
  ums_task_t t = spawn_step_on(1, yielder_step, &y);
  JOIN_EXPECT(t, obj + 1, 7);
  CHECK_EQ(y.calls, 26);
  CHECK_EQ(y.self, t);
  CHECK_EQ(y.sched, 1);
  CHECK_PTR_EQ(y.cur_rt, rt);

  /* The result set in the first step stays when the last sets none. */
  yielder_t y2 = {.yields = 3};
  t = spawn_step_on(0, yielder_step, &y2);
  JOIN_EXPECT(t, PTR(-1), -2);
  CHECK_EQ(y2.calls, 4);

  /* DONE at the first step without a result: NULL and 0. */
  atomic_int once = 0;
  t = spawn_step_on(UMS_ANY_SCHED, done_at_once_step, &once);
  JOIN_EXPECT(t, NULL, 0);
  CHECK_EQ(atomic_load(&once), 1);

  /* Detached step tasks run and are released. */
  ums_spawn_opts_t o = {.sched = UMS_ANY_SCHED, .detached = 1, .name = "d"};
  atomic_int ran = 0;
  for (int i = 0; i < 10; i++)
    CHECK_RC(ums_task_spawn_step(rt, &o, done_at_once_step, &ran, NULL), 0);
  WAIT_UNTIL(atomic_load(&ran) == 10 && tu_stats_sum(rt, tasks) == 0, 5000);

  /* Outside a task, ums_step_set_result does nothing (and does not
  ** crash). */
  ums_step_set_result(PTR(1), 1);
  tu_runtime_shutdown(rt);
}

/* Each entry says which task ran; only the one scheduler thread writes. */
typedef struct rr_log {
  int n;
  int who[1024];
} rr_log_t;

typedef struct rr_step_arg {
  rr_log_t *log;
  int id;
  int rounds; /* records this many times, then ends */
  int done;
} rr_arg_t;

static int rr_step(void *arg) {
  rr_arg_t *a = arg;
  CHECK_LT(a->log->n, 1024);
  a->log->who[a->log->n++] = a->id;
  if (++a->done < a->rounds) return UMS_STEP_YIELD;
  ums_step_set_result(PTR(100 + a->id), a->id);
  return UMS_STEP_DONE;
}

static void *rr_c_fn(void *arg) {
  rr_arg_t *a = arg;
  for (;;) {
    CHECK_LT(a->log->n, 1024);
    a->log->who[a->log->n++] = a->id;
    if (++a->done == a->rounds) break;
    CHECK_RC(ums_yield(), 0);
  }
  return PTR(200 + a->id);
}

/* Spawns the tasks of args[] (steps where is_step[i]) on the driver's own
** scheduler, so none runs before all are queued, then joins them. */
typedef struct rr_driver {
  rr_arg_t *args;
  const int *is_step;
  int n;
} rr_driver_t;

static void *rr_driver_fn(void *arg) {
  rr_driver_t *d = arg;
  ums_task_t t[8];
  CHECK_LE(d->n, 8);
  for (int i = 0; i < d->n; i++) {
    ums_spawn_opts_t o = {.sched = ums_current_sched()};
    if (d->is_step[i])
      CHECK_RC(ums_task_spawn_step(rt, &o, rr_step, &d->args[i], &t[i]), 0);
    else
      CHECK_RC(ums_task_spawn(rt, &o, rr_c_fn, &d->args[i], &t[i]), 0);
  }
  for (int i = 0; i < d->n; i++) {
    if (d->is_step[i])
      JOIN_EXPECT(t[i], PTR(100 + d->args[i].id), d->args[i].id);
    else
      JOIN_EXPECT(t[i], PTR(200 + d->args[i].id), 0);
  }
  return PTR(1);
}

static void run_rr(const int *is_step, int n, int rounds) {
  static rr_log_t log;
  rr_arg_t args[8];
  memset(&log, 0, sizeof log);
  for (int i = 0; i < n; i++)
    args[i] = (rr_arg_t){.log = &log, .id = i, .rounds = rounds};
  rr_driver_t d = {args, is_step, n};
  ums_task_t drv = spawn_c_on(0, rr_driver_fn, &d);
  JOIN_EXPECT(drv, PTR(1), 0);
  /* Strict round-robin: 0 1 ... n-1, rounds times. */
  CHECK_EQ(log.n, n * rounds);
  for (int k = 0; k < log.n; k++)
    if (log.who[k] != k % n)
      tu_fail(__FILE__, __LINE__, "entry %d ran task %d, expected %d", k,
              log.who[k], k % n);
}

static void test_step_round_robin(void) {
  rt = tu_runtime_new(1);
  /* Two step tasks alternate. */
  static const int two_steps[] = {1, 1};
  run_rr(two_steps, 2, 50);
  /* Steps and C tasks share one run queue, in FIFO order. */
  static const int mixed[] = {1, 0, 1, 0};
  run_rr(mixed, 4, 30);
  static const int mixed2[] = {0, 1, 1, 0, 1};
  run_rr(mixed2, 5, 20);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Parking: the general parker                                             */
/* ====================================================================== */

#define MAXR 8

enum {
  BY_OTHER,       /* someone else unparks, whenever it gets the token */
  BY_SELF,        /* the step unparks itself before it returns PARK */
  BY_OTHER_EARLY, /* someone else unparks, and the step waits for that
                     before it returns PARK (the other party must be a
                     host thread or on another scheduler) */
};

typedef struct parker {
  int rounds;
  int how;
  int outcome0;          /* round r ends with outcome0 + r */
  int64_t timeout[MAXR]; /* per round: ns from now; < 0: forever */
  ums_sem_t *notify;     /* released once per token, or NULL */
  ums_park_token_t toks[MAXR];
  atomic_int published; /* tokens published so far */
  atomic_int calls;
  int round;         /* step only */
  int results[MAXR]; /* step only */
  int early;         /* rounds that ended before the return */
} parker_t;

static void parker_init(parker_t *p, int rounds, int how, int outcome0,
                        int64_t timeout, ums_sem_t *notify) {
  memset(p, 0, sizeof *p);
  CHECK_LE(rounds, MAXR);
  p->rounds = rounds;
  p->how = how;
  p->outcome0 = outcome0;
  p->notify = notify;
  for (int i = 0; i < MAXR; i++) p->timeout[i] = timeout;
}

static int parker_step(void *arg) {
  parker_t *p = arg;
  int calls = atomic_fetch_add(&p->calls, 1) + 1;
  /* Stepped exactly once per park: never while a park is pending. */
  CHECK_LE(calls, p->rounds + 1);
  CHECK_EQ(calls, p->round + 1);
  if (p->round > 0) {
    int res = ums_park_result();
    CHECK_NE(res, UMS_EBUSY);
    p->results[p->round - 1] = res;
  }
  if (p->round == p->rounds) {
    ums_step_set_result(PTR(p->rounds), 0);
    return UMS_STEP_DONE;
  }
  int r = p->round;
  ums_park_token_t tok = {0, 0};
  int64_t dl = p->timeout[r] < 0 ? UMS_FOREVER : ums_deadline(p->timeout[r]);
  CHECK_RC(ums_park_begin(dl, &tok), 0);
  CHECK_EQ(tok.task, ums_self());
  if (r > 0) CHECK_NE(tok.seq, p->toks[r - 1].seq);
  CHECK_RC(ums_park_result(), UMS_EBUSY);
  p->toks[r] = tok;
  p->round++;
  atomic_store_explicit(&p->published, p->round, memory_order_release);
  if (p->notify) CHECK_RC(ums_sem_release(p->notify, 1), 0);
  if (p->how == BY_SELF) {
    CHECK_RC(ums_unpark(ums_current_runtime(), tok, p->outcome0 + r), 0);
    /* Exactly one end per park. */
    CHECK_RC(ums_unpark(ums_current_runtime(), tok, 1), UMS_ESRCH);
    CHECK_RC(ums_park_result(), p->outcome0 + r);
  } else if (p->how == BY_OTHER_EARLY) {
    SPIN_UNTIL(ums_park_result() != UMS_EBUSY, LONG_MS);
    CHECK_RC(ums_park_result(), p->outcome0 + r);
  }
  if (ums_park_result() != UMS_EBUSY) p->early++;
  return UMS_STEP_PARK;
}

/* A C task that unparks each round of p as its token arrives. */
static void *unparker_fn(void *arg) {
  parker_t *p = arg;
  for (int r = 0; r < p->rounds; r++) {
    CHECK_RC(ums_sem_acquire(p->notify, ums_deadline(tu_ms(LONG_MS))), 0);
    CHECK_GE(atomic_load_explicit(&p->published, memory_order_acquire), r + 1);
    CHECK_RC(ums_unpark(rt, p->toks[r], p->outcome0 + r), 0);
    CHECK_RC(ums_unpark(rt, p->toks[r], p->outcome0 + r), UMS_ESRCH);
  }
  return PTR(p->rounds);
}

/* The host thread as the unparker. */
static void host_unpark_all(parker_t *p) {
  for (int r = 0; r < p->rounds; r++) {
    WAIT_UNTIL(atomic_load_explicit(&p->published, memory_order_acquire) > r,
               LONG_MS);
    CHECK_RC(ums_unpark(rt, p->toks[r], p->outcome0 + r), 0);
    CHECK_RC(ums_unpark(rt, p->toks[r], p->outcome0 + r), UMS_ESRCH);
  }
}

static void check_parker(parker_t *p) {
  CHECK_EQ(atomic_load(&p->calls), p->rounds + 1);
  for (int r = 0; r < p->rounds; r++) CHECK_RC(p->results[r], p->outcome0 + r);
}

/* Runs p (its step on step_sched) against an unparker C task on
** unparker_sched, or against the host thread when unparker_sched < 0. */
static void run_parker(parker_t *p, int step_sched, int unparker_sched,
                       bool unparker_first) {
  ums_task_t u = 0, s = 0;
  if (unparker_sched >= 0 && unparker_first)
    u = spawn_c_on(unparker_sched, unparker_fn, p);
  s = spawn_step_on(step_sched, parker_step, p);
  if (unparker_sched >= 0 && !unparker_first)
    u = spawn_c_on(unparker_sched, unparker_fn, p);
  if (unparker_sched < 0 && p->how != BY_SELF) host_unpark_all(p);
  JOIN_EXPECT(s, PTR(p->rounds), 0);
  if (u) JOIN_EXPECT(u, PTR(p->rounds), 0);
  check_parker(p);
}

static void test_unpark_parties(void) {
  rt = tu_runtime_new(2);
  ums_sem_t *sem = ums_sem_new(0);
  CHECK(sem != NULL);
  parker_t p;

  /* A C task on the same scheduler (it can only run once the step has
  ** returned, so every unpark comes after the return). */
  for (int first = 0; first < 2; first++) {
    parker_init(&p, 4, BY_OTHER, 42, -1, sem);
    run_parker(&p, 0, 0, first);
    CHECK_EQ(p.early, 0);
  }
  /* ... with deadlines that do not pass. */
  parker_init(&p, 4, BY_OTHER, 42, 10 * UMS_NSEC_PER_SEC, sem);
  run_parker(&p, 1, 1, true);

  /* A C task on the other scheduler. */
  for (int first = 0; first < 2; first++) {
    parker_init(&p, 4, BY_OTHER, 42, -1, sem);
    run_parker(&p, 0, 1, first);
  }
  parker_init(&p, 4, BY_OTHER, 42, 10 * UMS_NSEC_PER_SEC, sem);
  run_parker(&p, 1, 0, false);

  /* A host thread. */
  parker_init(&p, 3, BY_OTHER, 42, -1, NULL);
  run_parker(&p, 1, -1, false);
  parker_init(&p, 3, BY_OTHER, 0, 10 * UMS_NSEC_PER_SEC, NULL);
  run_parker(&p, 0, -1, false);

  /* Unparked before the step returned: by the step itself, by the host,
  ** by a C task on the other scheduler. Each is stepped exactly once more
  ** per park (parker_step checks its call count at every call, and the
  ** next park being pending catches a second queueing). */
  parker_init(&p, 5, BY_SELF, 42, -1, NULL);
  run_parker(&p, 0, -1, false);
  CHECK_EQ(p.early, 5);
  parker_init(&p, 3, BY_SELF, 42, 10 * UMS_NSEC_PER_SEC, NULL);
  run_parker(&p, 1, -1, false);
  parker_init(&p, 3, BY_OTHER_EARLY, 42, -1, NULL);
  run_parker(&p, 0, -1, false);
  CHECK_EQ(p.early, 3);
  parker_init(&p, 4, BY_OTHER_EARLY, 42, 10 * UMS_NSEC_PER_SEC, sem);
  run_parker(&p, 0, 1, true);
  CHECK_EQ(p.early, 4);
  parker_init(&p, 4, BY_OTHER_EARLY, 42, -1, sem);
  run_parker(&p, 1, 0, false);
  CHECK_EQ(p.early, 4);

  /* Extreme outcomes are delivered as they are. */
  parker_init(&p, 2, BY_OTHER, INT32_MAX - 1, -1, NULL);
  run_parker(&p, 0, -1, false);

  CHECK_RC(ums_sem_delete(sem), 0);
  tu_runtime_shutdown(rt);
}

/* A park with a deadline that an unpark ended leaves no timer armed: the
** step's next park is forever, and the scheduler idles with no timer. */
static void test_unpark_disarms_timer(void) {
  rt = tu_runtime_new(2);
  parker_t p;
  parker_init(&p, 3, BY_OTHER, 42, 3600 * UMS_NSEC_PER_SEC, NULL);
  p.timeout[2] = -1;
  ums_task_t s = spawn_step_on(1, parker_step, &p);
  for (int r = 0; r < 2; r++) {
    WAIT_UNTIL(atomic_load_explicit(&p.published, memory_order_acquire) > r &&
                   tu_stats(rt, 1).idle && tu_stats(rt, 1).timers == 1,
               LONG_MS);
    CHECK_RC(ums_unpark(rt, p.toks[r], 42 + r), 0);
  }
  WAIT_UNTIL(atomic_load_explicit(&p.published, memory_order_acquire) == 3 &&
                 tu_stats(rt, 1).idle && tu_stats(rt, 1).timers == 0,
             LONG_MS);
  CHECK_RC(ums_unpark(rt, p.toks[2], 44), 0);
  JOIN_EXPECT(s, PTR(3), 0);
  check_parker(&p);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Deadlines                                                               */
/* ====================================================================== */

typedef struct timeout_step {
  int calls;
  int phase;
  int64_t deadline;
  int64_t woke_at;
  ums_park_token_t tok; /* the step writes it before timed_out */
  int res1, res2, self_unpark_rc;
  atomic_int timed_out;    /* the step saw the timeout */
  atomic_int host_checked; /* the host tried its late unpark */
  int yields;
} timeout_step_t;

static int timeout_step(void *arg) {
  timeout_step_t *s = arg;
  s->calls++;
  switch (s->phase) {
  case 0:
    s->deadline = ums_deadline(tu_ms(20));
    CHECK_RC(ums_park_begin(s->deadline, &s->tok), 0);
    s->phase = 1;
    return UMS_STEP_PARK;
  case 1:
    s->woke_at = ums_now();
    s->res1 = ums_park_result();
    /* The park has ended: its token is spent although it is still the
    ** task's current one. */
    s->self_unpark_rc = ums_unpark(ums_current_runtime(), s->tok, 5);
    atomic_store(&s->timed_out, 1);
    s->phase = 2;
    /* fall through */
  case 2:
    if (!atomic_load(&s->host_checked)) {
      s->yields++;
      return UMS_STEP_YIELD;
    }
    /* The late unparks changed nothing. */
    CHECK_RC(ums_park_result(), UMS_ETIMEDOUT);
    /* A deadline already past times out at the next pass. */
    CHECK_RC(ums_park_begin(ums_now() - 1, &s->tok), 0);
    s->phase = 3;
    return UMS_STEP_PARK;
  default:
    s->res2 = ums_park_result();
    ums_step_set_result(PTR(9), 0);
    return UMS_STEP_DONE;
  }
}

static void *c_timeout_fn(void *arg) {
  int64_t dl = ums_deadline(tu_ms(20));
  ums_park_token_t tok;
  CHECK_RC(ums_park_begin(dl, &tok), 0);
  CHECK_RC(ums_park_wait(), UMS_ETIMEDOUT);
  CHECK_GE(ums_now(), dl);
  CHECK_LT(ums_now() - dl, tu_ms(5000));
  CHECK_RC(ums_park_result(), UMS_ETIMEDOUT);
  CHECK_RC(ums_unpark(rt, tok, 1), UMS_ESRCH);
  CHECK_RC(ums_park_result(), UMS_ETIMEDOUT);
  return PTR(3);
}

static void test_park_deadline(void) {
  rt = tu_runtime_new(2);
  for (int sched = 0; sched < 2; sched++) {
    timeout_step_t s;
    memset(&s, 0, sizeof s);
    ums_task_t t = spawn_step_on(sched, timeout_step, &s);
    WAIT_UNTIL(atomic_load(&s.timed_out), LONG_MS);
    /* The task is alive and stepping; the token it timed out with is
    ** spent. */
    CHECK_EQ(s.tok.task, t);
    CHECK_RC(ums_unpark(rt, s.tok, 5), UMS_ESRCH);
    atomic_store(&s.host_checked, 1);
    JOIN_EXPECT(t, PTR(9), 0);
    CHECK_RC(s.res1, UMS_ETIMEDOUT);
    CHECK_GE(s.woke_at, s.deadline);
    CHECK_LT(s.woke_at - s.deadline, tu_ms(5000));
    CHECK_RC(s.self_unpark_rc, UMS_ESRCH);
    CHECK_RC(s.res2, UMS_ETIMEDOUT);
    CHECK_EQ(s.calls, 3 + s.yields);
  }

  /* The late unpark from another thread, with the real token. */
  parker_t p;
  parker_init(&p, 2, BY_OTHER, 0, tu_ms(10), NULL);
  p.timeout[1] = -1;
  ums_task_t t = spawn_step_on(0, parker_step, &p);
  WAIT_UNTIL(atomic_load_explicit(&p.published, memory_order_acquire) == 2,
             LONG_MS);
  /* Round 0 timed out, so its token is spent (and stale by now). */
  CHECK_RC(ums_unpark(rt, p.toks[0], 1), UMS_ESRCH);
  CHECK_RC(ums_unpark(rt, p.toks[1], 1), 0);
  JOIN_EXPECT(t, PTR(2), 0);
  CHECK_RC(p.results[0], UMS_ETIMEDOUT);
  CHECK_RC(p.results[1], 1);

  /* The same from a C task with ums_park_wait. */
  t = spawn_c_on(1, c_timeout_fn, NULL);
  JOIN_EXPECT(t, PTR(3), 0);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Bad tokens                                                              */
/* ====================================================================== */

typedef struct stale_step {
  int calls;
  tokbox_t box;
  ums_park_token_t tok1, tok2;
  int res1, res2;
} stale_step_t;

static int stale_step(void *arg) {
  stale_step_t *s = arg;
  ums_runtime_t *r = ums_current_runtime();
  s->calls++;
  if (s->calls == 1) {
    CHECK_RC(ums_park_begin(UMS_FOREVER, &s->tok1), 0);
    CHECK_RC(ums_unpark(r, s->tok1, 1), 0);
    return UMS_STEP_PARK;
  }
  if (s->calls == 2) {
    s->res1 = ums_park_result();
    CHECK_RC(ums_park_begin(UMS_FOREVER, &s->tok2), 0);
    CHECK_EQ(s->tok2.task, s->tok1.task);
    CHECK_NE(s->tok2.seq, s->tok1.seq);
    /* The older park's token does not reach the new park. */
    CHECK_RC(ums_unpark(r, s->tok1, 9), UMS_ESRCH);
    /* Neither does a forged future one, another generation, nor task 0. */
    ums_park_token_t f = s->tok2;
    f.seq++;
    CHECK_RC(ums_unpark(r, f, 9), UMS_ESRCH);
    f = s->tok2;
    f.task += (uint64_t)1 << 32;
    CHECK_RC(ums_unpark(r, f, 9), UMS_ESRCH);
    f = s->tok2;
    f.task = 0;
    CHECK_RC(ums_unpark(r, f, 9), UMS_ESRCH);
    /* A negative outcome is refused and changes nothing. */
    CHECK_RC(ums_unpark(r, s->tok2, -1), UMS_EINVAL);
    CHECK_RC(ums_park_result(), UMS_EBUSY);
    tok_put(&s->box, s->tok2);
    return UMS_STEP_PARK;
  }
  s->res2 = ums_park_result();
  ums_step_set_result(PTR(s->calls), 0);
  return UMS_STEP_DONE;
}

static void test_stale_and_bad_tokens(void) {
  rt = tu_runtime_new(2);
  stale_step_t s;
  memset(&s, 0, sizeof s);
  ums_task_t t = spawn_step_on(1, stale_step, &s);
  WAIT_UNTIL(atomic_load_explicit(&s.box.ready, memory_order_acquire), LONG_MS);
  ums_park_token_t tok2 = tok_get(&s.box);
  /* The first token is stale (the step wrote tok1 before publishing). */
  CHECK_RC(ums_unpark(rt, s.tok1, 9), UMS_ESRCH);
  ums_park_token_t f = tok2;
  f.seq--;
  CHECK_RC(ums_unpark(rt, f, 9), UMS_ESRCH);
  /* Negative outcomes: refused, the park stays pending. */
  CHECK_RC(ums_unpark(rt, tok2, -1), UMS_EINVAL);
  CHECK_RC(ums_unpark(rt, tok2, UMS_ETIMEDOUT), UMS_EINVAL);
  CHECK_RC(ums_unpark(rt, tok2, UMS_ECANCELED), UMS_EINVAL);
  CHECK_RC(ums_unpark(rt, tok2, INT32_MIN), UMS_EINVAL);
  CHECK_RC(ums_unpark(NULL, tok2, 1), UMS_EINVAL);
  usleep(5000);
  CHECK_RC(ums_unpark(rt, tok2, 42), 0);
  JOIN_EXPECT(t, PTR(3), 0);
  CHECK_RC(s.res1, 1);
  CHECK_RC(s.res2, 42);
  CHECK_RC(ums_unpark(rt, tok2, 42), UMS_ESRCH);

  /* Token of a finished task: before the join (still joinable), after
  ** it, and after its slot has been recycled many times. */
  parker_t p;
  parker_init(&p, 1, BY_OTHER, 7, -1, NULL);
  t = spawn_step_on(0, parker_step, &p);
  host_unpark_all(&p);
  WAIT_UNTIL(tu_stats_sum(rt, tasks) == 0, LONG_MS);
  CHECK_RC(ums_unpark(rt, p.toks[0], 8), UMS_ESRCH);
  JOIN_EXPECT(t, PTR(1), 0);
  check_parker(&p);
  CHECK_RC(ums_unpark(rt, p.toks[0], 8), UMS_ESRCH);
  atomic_int ran = 0;
  for (int i = 0; i < 3000; i++) {
    ums_task_t x;
    CHECK_RC(ums_task_spawn_step(rt, NULL, done_at_once_step, &ran, &x), 0);
    CHECK_RC(ums_task_join(rt, x, ums_deadline(tu_ms(LONG_MS)), NULL, NULL), 0);
  }
  CHECK_EQ(atomic_load(&ran), 3000);
  CHECK_RC(ums_unpark(rt, p.toks[0], 8), UMS_ESRCH);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* ums_park_wait from C tasks                                              */
/* ====================================================================== */

typedef struct c_parker {
  tokbox_t box;
  int rc, res;
} c_parker_t;

static void *c_park_wait_fn(void *arg) {
  c_parker_t *c = arg;
  ums_park_token_t tok;
  CHECK_RC(ums_park_begin(UMS_FOREVER, &tok), 0);
  CHECK_EQ(tok.task, ums_self());
  CHECK_RC(ums_park_result(), UMS_EBUSY);
  tok_put(&c->box, tok);
  c->rc = ums_park_wait();
  c->res = ums_park_result();
  /* Nothing pending any more: waits work again. */
  CHECK_RC(ums_yield(), 0);
  CHECK_RC(ums_sleep(tu_ms(1)), 0);
  return PTR(c->rc);
}

static void test_c_task_park_wait(void) {
  rt = tu_runtime_new(2);
  for (int sched = 0; sched < 2; sched++) {
    c_parker_t c;
    memset(&c, 0, sizeof c);
    ums_task_t t = spawn_c_on(sched, c_park_wait_fn, &c);
    /* Unpark once the task is inside ums_park_wait (its scheduler idles
    ** only then). */
    WAIT_UNTIL(atomic_load_explicit(&c.box.ready, memory_order_acquire) &&
                   all_idle(),
               LONG_MS);
    CHECK_RC(ums_unpark(rt, tok_get(&c.box), 42), 0);
    CHECK_RC(ums_unpark(rt, tok_get(&c.box), 42), UMS_ESRCH);
    JOIN_EXPECT(t, PTR(42), 0);
    CHECK_RC(c.rc, 42);
    CHECK_RC(c.res, 42);
  }
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Cancellation                                                            */
/* ====================================================================== */

typedef struct cancel_victim {
  int calls;
  tokbox_t box;
  ums_sem_t *notify;
  int res;
} cancel_victim_t;

static int cancel_victim_step(void *arg) {
  cancel_victim_t *v = arg;
  v->calls++;
  if (v->calls == 1) {
    ums_park_token_t tok;
    CHECK_RC(ums_park_begin(UMS_FOREVER, &tok), 0);
    tok_put(&v->box, tok);
    if (v->notify) CHECK_RC(ums_sem_release(v->notify, 1), 0);
    return UMS_STEP_PARK;
  }
  CHECK_EQ(v->calls, 2);
  v->res = ums_park_result();
  CHECK(ums_cancelled());
  /* Every wait after the cancel is refused, a new park too; the refused
  ** park leaves the last outcome and the token alone. */
  ums_park_token_t tok2 = {111, 222};
  CHECK_RC(ums_park_begin(UMS_FOREVER, &tok2), UMS_ECANCELED);
  CHECK_EQ(tok2.task, 111);
  CHECK_EQ(tok2.seq, 222);
  CHECK_RC(ums_park_result(), UMS_ECANCELED);
  CHECK_RC(ums_yield(), UMS_ECANCELED);
  CHECK_RC(ums_sleep(tu_ms(1)), UMS_ECANCELED);
  /* The cancelled park's token is spent. */
  CHECK_RC(ums_unpark(ums_current_runtime(), tok_get(&v->box), 1), UMS_ESRCH);
  ums_step_set_result(PTR(v->res), v->res);
  return UMS_STEP_DONE;
}

typedef struct canceller {
  ums_sem_t *notify;
  ums_task_t victim;
} canceller_t;

static void *canceller_fn(void *arg) {
  canceller_t *c = arg;
  CHECK_RC(ums_sem_acquire(c->notify, ums_deadline(tu_ms(LONG_MS))), 0);
  CHECK_RC(ums_task_cancel(rt, c->victim), 0);
  return PTR(1);
}

static void test_cancel_parked_step(void) {
  rt = tu_runtime_new(2);
  ums_sem_t *sem = ums_sem_new(0);
  CHECK(sem != NULL);
  /* Cancelled by the host, by a C task on the same scheduler, by one on
  ** the other scheduler. */
  for (int who = 0; who < 3; who++) {
    cancel_victim_t v;
    memset(&v, 0, sizeof v);
    v.notify = who ? sem : NULL;
    ums_task_t t = spawn_step_on(0, cancel_victim_step, &v);
    ums_task_t c = 0;
    canceller_t cc = {sem, t};
    if (who == 0) {
      WAIT_UNTIL(atomic_load_explicit(&v.box.ready, memory_order_acquire) &&
                     all_idle(),
                 LONG_MS);
      CHECK_RC(ums_task_cancel(rt, t), 0);
    } else {
      c = spawn_c_on(who == 1 ? 0 : 1, canceller_fn, &cc);
    }
    JOIN_EXPECT(t, PTR(UMS_ECANCELED), UMS_ECANCELED);
    if (c) JOIN_EXPECT(c, PTR(1), 0);
    CHECK_EQ(v.calls, 2);
    CHECK_RC(v.res, UMS_ECANCELED);
    /* Joined: the handle is gone. */
    CHECK_RC(ums_task_cancel(rt, t), UMS_ESRCH);
    CHECK_RC(ums_unpark(rt, tok_get(&v.box), 1), UMS_ESRCH);
  }
  /* Cancelling a finished, still joinable step task is harmless. */
  atomic_int ran = 0;
  ums_task_t t = spawn_step_on(1, done_at_once_step, &ran);
  WAIT_UNTIL(atomic_load(&ran) == 1 && tu_stats_sum(rt, tasks) == 0, LONG_MS);
  CHECK_RC(ums_task_cancel(rt, t), 0);
  JOIN_EXPECT(t, NULL, 0);
  CHECK_RC(ums_sem_delete(sem), 0);
  tu_runtime_shutdown(rt);
}

typedef struct self_cancel {
  int calls;
  int mode; /* 0: self; 1: another thread while stepping;
               2: like 1 with a deadline */
  atomic_int in_step;
  atomic_int cancel_sent;
  int pending_after_cancel;
  int res;
} self_cancel_t;

static int self_cancel_step(void *arg) {
  self_cancel_t *s = arg;
  s->calls++;
  if (s->calls == 1) {
    ums_park_token_t tok;
    int64_t dl = s->mode == 2 ? ums_deadline(tu_ms(LONG_MS)) : UMS_FOREVER;
    CHECK_RC(ums_park_begin(dl, &tok), 0);
    if (s->mode == 0) {
      CHECK_RC(ums_task_cancel(ums_current_runtime(), ums_self()), 0);
    } else {
      atomic_store(&s->in_step, 1);
      SPIN_UNTIL(atomic_load(&s->cancel_sent), LONG_MS);
    }
    CHECK(ums_cancelled());
    /* The cancel does not end the park while the step runs ... */
    s->pending_after_cancel = ums_park_result();
    return UMS_STEP_PARK;
  }
  /* ... it ends it as the step returns. */
  CHECK_EQ(s->calls, 2);
  s->res = ums_park_result();
  ums_step_set_result(PTR(s->res), 0);
  return UMS_STEP_DONE;
}

/* Cancelled while runnable (between steps): the next ums_park_begin is
** refused. */
typedef struct cancel_runnable {
  int calls;
  atomic_int started;
  atomic_int cancelled_by_host;
  int begin_rc;
  ums_park_token_t tok;
} cancel_runnable_t;

static int cancel_runnable_step(void *arg) {
  cancel_runnable_t *c = arg;
  c->calls++;
  atomic_store(&c->started, 1);
  if (!atomic_load(&c->cancelled_by_host)) return UMS_STEP_YIELD;
  CHECK(ums_cancelled());
  c->tok = (ums_park_token_t){111, 222};
  c->begin_rc = ums_park_begin(ums_deadline(tu_ms(LONG_MS)), &c->tok);
  /* No park began, so DONE is legal here. */
  ums_step_set_result(PTR(5), c->begin_rc);
  return UMS_STEP_DONE;
}

static void test_cancel_while_stepping(void) {
  rt = tu_runtime_new(2);
  for (int mode = 0; mode < 3; mode++) {
    self_cancel_t s;
    memset(&s, 0, sizeof s);
    s.mode = mode;
    ums_task_t t = spawn_step_on(mode == 2 ? 1 : 0, self_cancel_step, &s);
    if (mode > 0) {
      WAIT_UNTIL(atomic_load(&s.in_step), LONG_MS);
      CHECK_RC(ums_task_cancel(rt, t), 0);
      atomic_store(&s.cancel_sent, 1);
    }
    JOIN_EXPECT(t, PTR(UMS_ECANCELED), 0);
    CHECK_EQ(s.calls, 2);
    CHECK_RC(s.pending_after_cancel, UMS_EBUSY);
    CHECK_RC(s.res, UMS_ECANCELED);
  }

  cancel_runnable_t c;
  memset(&c, 0, sizeof c);
  ums_task_t t = spawn_step_on(1, cancel_runnable_step, &c);
  WAIT_UNTIL(atomic_load(&c.started), LONG_MS);
  CHECK_RC(ums_task_cancel(rt, t), 0);
  atomic_store(&c.cancelled_by_host, 1);
  JOIN_EXPECT(t, PTR(5), UMS_ECANCELED);
  CHECK_RC(c.begin_rc, UMS_ECANCELED);
  CHECK_EQ(c.tok.task, 111);
  CHECK_EQ(c.tok.seq, 222);
  tu_runtime_shutdown(rt);
}

/* Cancelled before it starts. Unlike a C task (never run), a step task
** is still stepped exactly once, with ums_cancelled() true, so that its
** binding can let go of what it holds; it ends at once with the status it
** chooses. */
typedef struct first_step {
  atomic_int calls;
  int cancelled_seen;
  int begin_rc;
  int yield_rc;
  ums_park_token_t tok;
} first_step_t;

static int cancelled_first_step(void *arg) {
  first_step_t *f = arg;
  int calls = atomic_fetch_add(&f->calls, 1) + 1;
  CHECK_EQ(calls, 1);
  f->cancelled_seen = ums_cancelled();
  f->tok = (ums_park_token_t){111, 222};
  f->begin_rc = ums_park_begin(UMS_FOREVER, &f->tok);
  f->yield_rc = ums_yield();
  ums_step_set_result(PTR(calls), UMS_ECANCELED);
  return UMS_STEP_DONE;
}

static void check_first_step(first_step_t *f) {
  CHECK_EQ(atomic_load(&f->calls), 1);
  CHECK_EQ(f->cancelled_seen, 1);
  CHECK_RC(f->begin_rc, UMS_ECANCELED);
  CHECK_RC(f->yield_rc, UMS_ECANCELED);
  CHECK_EQ(f->tok.task, 111);
  CHECK_EQ(f->tok.seq, 222);
}

static void *cancel_before_start_driver(void *arg) {
  ums_spawn_opts_t o = {.sched = ums_current_sched()};
  ums_task_t t;
  CHECK_RC(ums_task_spawn_step(rt, &o, cancelled_first_step, arg, &t), 0);
  CHECK_RC(ums_task_cancel(rt, t), 0);
  JOIN_EXPECT(t, PTR(1), UMS_ECANCELED);
  return PTR(1);
}

static void *event_wait_fn(void *arg) {
  return PTR(ums_event_wait(arg, ums_deadline(tu_ms(LONG_MS))));
}

typedef struct hog {
  atomic_int running;
  atomic_int release;
} hog_t;

static void *hog_fn(void *arg) {
  hog_t *h = arg;
  atomic_store(&h->running, 1);
  SPIN_UNTIL(atomic_load(&h->release), LONG_MS);
  return PTR(2);
}

static void test_cancel_before_start(void) {
  first_step_t f;
  /* Queued to run on the driver's own scheduler, cancelled by the driver
  ** before its first step. */
  rt = tu_runtime_new(1);
  memset(&f, 0, sizeof f);
  ums_task_t d = spawn_c_on(0, cancel_before_start_driver, &f);
  JOIN_EXPECT(d, PTR(1), 0);
  check_first_step(&f);
  tu_runtime_shutdown(rt);

  /* Spawned by the host while its scheduler is busy, cancelled before the
  ** scheduler even admitted it. */
  rt = tu_runtime_new(1);
  hog_t h;
  memset(&h, 0, sizeof h);
  memset(&f, 0, sizeof f);
  ums_task_t hog = spawn_c_on(0, hog_fn, &h);
  WAIT_UNTIL(atomic_load(&h.running), LONG_MS);
  ums_task_t t = spawn_step_on(0, cancelled_first_step, &f);
  CHECK_RC(ums_task_cancel(rt, t), 0);
  atomic_store(&h.release, 1);
  JOIN_EXPECT(t, PTR(1), UMS_ECANCELED);
  JOIN_EXPECT(hog, PTR(2), 0);
  check_first_step(&f);
  tu_runtime_shutdown(rt);

  /* Waiting for a worker slot (max_workers) when cancelled: stepped at
  ** once, past max_workers, while the slot is still taken. */
  ums_config_t cfg = {.schedulers = 1, .max_workers = 1};
  rt = tu_runtime_new_cfg(&cfg);
  memset(&f, 0, sizeof f);
  ums_event_t *ev = ums_event_new(1, 0);
  CHECK(ev != NULL);
  ums_task_t holder = spawn_c_on(0, event_wait_fn, ev);
  WAIT_UNTIL(tu_stats(rt, 0).workers_active == 1 && all_idle(), LONG_MS);
  t = spawn_step_on(0, cancelled_first_step, &f);
  WAIT_UNTIL(tu_stats(rt, 0).pending == 1, LONG_MS);
  CHECK_EQ(atomic_load(&f.calls), 0);
  CHECK_RC(ums_task_cancel(rt, t), 0);
  JOIN_EXPECT(t, PTR(1), UMS_ECANCELED);
  check_first_step(&f);
  /* The slot accounting is intact: one more spawn still waits for it. */
  WAIT_UNTIL(tu_stats(rt, 0).pending == 0 && all_idle(), LONG_MS);
  atomic_int ran = 0;
  t = spawn_step_on(0, done_at_once_step, &ran);
  WAIT_UNTIL(tu_stats(rt, 0).pending == 1, LONG_MS);
  usleep(5000);
  CHECK_EQ(atomic_load(&ran), 0);
  CHECK_EQ(tu_stats(rt, 0).workers_active, 1);
  CHECK_RC(ums_event_set(ev), 0);
  JOIN_EXPECT(holder, PTR(0), 0);
  JOIN_EXPECT(t, NULL, 0);
  CHECK_EQ(atomic_load(&ran), 1);
  CHECK_RC(ums_event_delete(ev), 0);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Blocking calls inside a step                                            */
/* ====================================================================== */

enum { BLK_PARK_WAIT, BLK_PARK_WAIT_TIMEOUT, BLK_SLEEP, BLK_SEM };

typedef struct blockctx {
  int kind;
  ums_sem_t *sem;
  atomic_int ticks;    /* progress of the ticker step */
  atomic_int stop;     /* the ticker's signal to end */
  atomic_int blocking; /* the blocker is about to block */
  int ticks_at_block;  /* written before `blocking` */
  tokbox_t box;
  int calls;
  int rc, res;
  int ticks_during;
  int64_t t0, t1, deadline;
  int helper_sched;
} blockctx_t;

static int ticker_step(void *arg) {
  blockctx_t *b = arg;
  atomic_fetch_add(&b->ticks, 1);
  CHECK_EQ(ums_current_sched(), 0);
  return atomic_load(&b->stop) ? UMS_STEP_DONE : UMS_STEP_YIELD;
}

static int blocker_step(void *arg) {
  blockctx_t *b = arg;
  /* Block only once the ticker is in the run queue. */
  if (b->calls == 0 && atomic_load(&b->ticks) == 0) return UMS_STEP_YIELD;
  b->calls++;
  if (b->calls == 1) {
    ums_park_token_t tok;
    b->ticks_at_block = atomic_load(&b->ticks);
    b->t0 = ums_now();
    switch (b->kind) {
    case BLK_PARK_WAIT:
      CHECK_RC(ums_park_begin(UMS_FOREVER, &tok), 0);
      tok_put(&b->box, tok);
      atomic_store(&b->blocking, 1);
      b->rc = ums_park_wait();
      b->res = ums_park_result();
      break;
    case BLK_PARK_WAIT_TIMEOUT:
      b->deadline = ums_deadline(tu_ms(30));
      CHECK_RC(ums_park_begin(b->deadline, &tok), 0);
      atomic_store(&b->blocking, 1);
      b->rc = ums_park_wait();
      b->res = ums_park_result();
      break;
    case BLK_SLEEP:
      atomic_store(&b->blocking, 1);
      b->rc = ums_sleep(tu_ms(30));
      break;
    case BLK_SEM:
      atomic_store(&b->blocking, 1);
      b->rc = ums_sem_acquire(b->sem, ums_deadline(tu_ms(LONG_MS)));
      break;
    }
    b->t1 = ums_now();
    b->ticks_during = atomic_load(&b->ticks) - b->ticks_at_block;
    /* Back to ordinary stepping. */
    return UMS_STEP_YIELD;
  }
  CHECK_EQ(b->calls, 2);
  atomic_store(&b->stop, 1);
  ums_step_set_result(PTR(77), 0);
  return UMS_STEP_DONE;
}

/* A C task on the blocker's scheduler: once the ticker has made progress
** while the blocker is blocked, it ends the blocker's wait. */
static void *releaser_fn(void *arg) {
  blockctx_t *b = arg;
  CHECK_EQ(ums_current_sched(), 0);
  TASK_WAIT_UNTIL(atomic_load(&b->blocking), LONG_MS);
  TASK_WAIT_UNTIL(atomic_load(&b->ticks) >= b->ticks_at_block + 100, LONG_MS);
  if (b->kind == BLK_PARK_WAIT)
    CHECK_RC(ums_unpark(rt, tok_get(&b->box), 42), 0);
  else
    CHECK_RC(ums_sem_release(b->sem, 1), 0);
  return PTR(1);
}

static void test_blocking_in_step(void) {
  rt = tu_runtime_new(1);
  for (int kind = BLK_PARK_WAIT; kind <= BLK_SEM; kind++) {
    blockctx_t b;
    memset(&b, 0, sizeof b);
    b.kind = kind;
    b.sem = ums_sem_new(0);
    CHECK(b.sem != NULL);
    ums_task_t blocker = spawn_step_on(0, blocker_step, &b);
    ums_task_t ticker = spawn_step_on(0, ticker_step, &b);
    ums_task_t rel = 0;
    if (kind == BLK_PARK_WAIT || kind == BLK_SEM)
      rel = spawn_c_on(0, releaser_fn, &b);
    JOIN_EXPECT(blocker, PTR(77), 0);
    JOIN_EXPECT(ticker, NULL, 0);
    if (rel) JOIN_EXPECT(rel, PTR(1), 0);
    CHECK_EQ(b.calls, 2);
    switch (kind) {
    case BLK_PARK_WAIT:
      CHECK_RC(b.rc, 42);
      CHECK_RC(b.res, 42);
      CHECK_GE(b.ticks_during, 100);
      break;
    case BLK_PARK_WAIT_TIMEOUT:
      CHECK_RC(b.rc, UMS_ETIMEDOUT);
      CHECK_RC(b.res, UMS_ETIMEDOUT);
      CHECK_GE(b.t1, b.deadline);
      CHECK_GT(b.ticks_during, 0);
      break;
    case BLK_SLEEP:
      CHECK_RC(b.rc, 0);
      CHECK_GE(b.t1 - b.t0, tu_ms(30));
      CHECK_GT(b.ticks_during, 0);
      break;
    case BLK_SEM:
      CHECK_RC(b.rc, 0);
      CHECK_GE(b.ticks_during, 100);
      break;
    }
    CHECK_RC(ums_sem_delete(b.sem), 0);
  }
  tu_runtime_shutdown(rt);
}

/* Steps blocked inside a step each hold a worker; steps parked by
** returning UMS_STEP_PARK hold none. */
typedef struct sem_blocker {
  ums_sem_t *sem;
  atomic_int *entered;
  int rc;
  int calls;
} sem_blocker_t;

static int sem_blocker_step(void *arg) {
  sem_blocker_t *s = arg;
  s->calls++;
  atomic_fetch_add(s->entered, 1);
  s->rc = ums_sem_acquire(s->sem, ums_deadline(tu_ms(LONG_MS)));
  ums_step_set_result(PTR(s->rc == 0 ? 1 : 0), 0);
  return UMS_STEP_DONE;
}

static void test_step_workers(void) {
  rt = tu_runtime_new(2);
  enum { NB = 16 };
  ums_sem_t *sem = ums_sem_new(0);
  atomic_int entered = 0;
  sem_blocker_t sb[NB];
  ums_task_t tb[NB];
  for (int i = 0; i < NB; i++) {
    sb[i] = (sem_blocker_t){.sem = sem, .entered = &entered};
    tb[i] = spawn_step_on(i % 2, sem_blocker_step, &sb[i]);
  }
  WAIT_UNTIL(atomic_load(&entered) == NB && all_idle(), LONG_MS);
  CHECK_EQ(tu_stats_sum(rt, workers_active), NB);
  CHECK_RC(ums_sem_release(sem, NB), 0);
  for (int i = 0; i < NB; i++) {
    JOIN_EXPECT(tb[i], PTR(1), 0);
    CHECK_EQ(sb[i].calls, 1);
  }
  CHECK_RC(ums_sem_delete(sem), 0);
  tu_runtime_shutdown(rt);

  rt = tu_runtime_new(2);
  static parker_t ps[PARKED_STEPS];
  static ums_task_t tp[PARKED_STEPS];
  for (int i = 0; i < PARKED_STEPS; i++) {
    parker_init(&ps[i], 1, BY_OTHER, i, -1, NULL);
    tp[i] = spawn_step_on(UMS_ANY_SCHED, parker_step, &ps[i]);
  }
  for (int i = 0; i < PARKED_STEPS; i++)
    WAIT_UNTIL(atomic_load_explicit(&ps[i].published, memory_order_acquire),
               LONG_MS);
  WAIT_UNTIL(all_idle(), LONG_MS);
  CHECK_EQ(tu_stats_sum(rt, tasks), PARKED_STEPS);
  CHECK_EQ(tu_stats_sum(rt, workers_active), 0);
  /* A stackless park: the schedulers got by with a few workers. */
  CHECK_LE(tu_stats_sum(rt, workers_idle), 8);
  for (int i = PARKED_STEPS; i-- > 0;)
    CHECK_RC(ums_unpark(rt, ps[i].toks[0], i), 0);
  for (int i = 0; i < PARKED_STEPS; i++) {
    JOIN_EXPECT(tp[i], PTR(1), 0);
    check_parker(&ps[i]);
  }
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Misuse                                                                  */
/* ====================================================================== */

typedef struct misuse {
  ums_sem_t *empty, *full;
  ums_event_t *ev;
  ums_chan_t *ch;
  ums_mutex_t *held;
  int calls;
  int step; /* run as a step (else a C task) */
  int res;
} misuse_t;

/* The waits that would park are refused while a park is pending; calls
** that complete at once still work. */
static void misuse_checks(misuse_t *m, ums_park_token_t *tok) {
  CHECK_RC(ums_yield(), UMS_EBUSY);
  ums_park_token_t tok2 = {111, 222};
  CHECK_RC(ums_park_begin(UMS_FOREVER, &tok2), UMS_EBUSY);
  CHECK_EQ(tok2.task, 111);
  CHECK_EQ(tok2.seq, 222);
  CHECK_RC(ums_sem_acquire(m->empty, UMS_FOREVER), UMS_EBUSY);
  CHECK_RC(ums_sem_acquire(m->empty, ums_deadline(tu_ms(1))), UMS_EBUSY);
  CHECK_RC(ums_sleep(tu_ms(1)), UMS_EBUSY);
  CHECK_RC(ums_event_wait(m->ev, UMS_FOREVER), UMS_EBUSY);
  int x = 0;
  CHECK_RC(ums_chan_recv(m->ch, &x, UMS_FOREVER), UMS_EBUSY);
  CHECK_RC(ums_mutex_lock(m->held, UMS_FOREVER), UMS_EBUSY);
  CHECK_RC(ums_sem_acquire(m->full, UMS_FOREVER), 0);
  CHECK_RC(ums_sem_tryacquire(m->empty), UMS_EAGAIN);
  /* Still the same park, still pending. */
  CHECK_RC(ums_park_result(), UMS_EBUSY);
  CHECK_EQ(tok->task, ums_self());
}

static int misuse_step(void *arg) {
  misuse_t *m = arg;
  m->calls++;
  if (m->calls == 1) {
    /* No park begun: nothing to wait for. */
    CHECK_LT(ums_park_wait(), 0);
    ums_park_token_t tok;
    CHECK_RC(ums_park_begin(UMS_FOREVER, &tok), 0);
    misuse_checks(m, &tok);
    CHECK_RC(ums_unpark(ums_current_runtime(), tok, 42), 0);
    return UMS_STEP_PARK;
  }
  CHECK_EQ(m->calls, 2);
  m->res = ums_park_result();
  /* The park is over: waits work again (inside a step they bind the
  ** worker). */
  CHECK_RC(ums_yield(), 0);
  CHECK_RC(ums_sleep(tu_ms(1)), 0);
  ums_step_set_result(PTR(m->res), 0);
  return UMS_STEP_DONE;
}

static void *misuse_c_fn(void *arg) {
  misuse_t *m = arg;
  CHECK_LT(ums_park_wait(), 0);
  ums_park_token_t tok;
  int64_t dl = ums_deadline(tu_ms(20));
  CHECK_RC(ums_park_begin(dl, &tok), 0);
  misuse_checks(m, &tok);
  m->res = ums_park_wait();
  CHECK_GE(ums_now(), dl);
  CHECK_RC(ums_yield(), 0);
  CHECK_RC(ums_sleep(tu_ms(1)), 0);
  return PTR(m->res);
}

static void test_misuse_guards(void) {
  rt = tu_runtime_new(2);
  misuse_t m;
  memset(&m, 0, sizeof m);
  m.empty = ums_sem_new(0);
  m.full = ums_sem_new(2);
  m.ev = ums_event_new(1, 0);
  m.ch = ums_chan_new(sizeof(int), 1);
  m.held = ums_mutex_new();
  CHECK(m.empty && m.full && m.ev && m.ch && m.held);
  CHECK_RC(ums_mutex_lock(m.held, UMS_FOREVER), 0); /* held by the host */

  ums_task_t t = spawn_step_on(0, misuse_step, &m);
  JOIN_EXPECT(t, PTR(42), 0);
  CHECK_EQ(m.calls, 2);
  t = spawn_c_on(1, misuse_c_fn, &m);
  JOIN_EXPECT(t, PTR(UMS_ETIMEDOUT), 0);
  CHECK_EQ(ums_sem_value(m.full), 0);

  /* The refused waits left nothing queued behind. */
  CHECK_RC(ums_mutex_unlock(m.held), 0);
  CHECK_RC(ums_mutex_delete(m.held), 0);
  CHECK_RC(ums_sem_delete(m.empty), 0);
  CHECK_RC(ums_sem_delete(m.full), 0);
  CHECK_RC(ums_event_delete(m.ev), 0);
  CHECK_RC(ums_chan_delete(m.ch), 0);

  /* Outside a task. */
  ums_park_token_t tok = {111, 222};
  CHECK_RC(ums_park_begin(UMS_FOREVER, &tok), UMS_EPERM);
  CHECK_RC(ums_park_begin(ums_deadline(tu_ms(1)), &tok), UMS_EPERM);
  CHECK_EQ(tok.task, 111);
  CHECK_EQ(tok.seq, 222);
  CHECK_RC(ums_park_result(), UMS_EPERM);
  CHECK_LT(ums_park_wait(), 0);

  /* Spawning. (A joiner can return before the ended task is uncounted.) */
  WAIT_UNTIL(tu_stats_sum(rt, tasks) == 0, LONG_MS);
  ums_task_t out = 77;
  CHECK_RC(ums_task_spawn_step(rt, NULL, NULL, NULL, &out), UMS_EINVAL);
  CHECK_RC(ums_task_spawn_step(NULL, NULL, done_at_once_step, NULL, &out),
           UMS_EINVAL);
  ums_spawn_opts_t bad = {.sched = 2};
  CHECK_RC(ums_task_spawn_step(rt, &bad, done_at_once_step, NULL, &out),
           UMS_EINVAL);
  bad.sched = -2;
  CHECK_RC(ums_task_spawn_step(rt, &bad, done_at_once_step, NULL, &out),
           UMS_EINVAL);
  CHECK_EQ(out, 77);
  CHECK_EQ(tu_stats_sum(rt, tasks), 0);

  /* ums_unpark's own argument checks. */
  CHECK_RC(ums_unpark(rt, (ums_park_token_t){0, 0}, 1), UMS_ESRCH);
  CHECK_RC(
      ums_unpark(rt, (ums_park_token_t){((uint64_t)3 << 32) | 9999999, 1}, 1),
      UMS_ESRCH);
  tu_runtime_shutdown(rt);
}

/* ---------------------------------------------------------------------- */
/* Protocol violations, in a child process                                 */
/* ---------------------------------------------------------------------- */

static int child_mode_step(void *arg) {
  const char *mode = arg;
  ums_park_token_t tok;
  if (strcmp(mode, "done-pending") == 0) {
    CHECK_RC(ums_park_begin(UMS_FOREVER, &tok), 0);
    return UMS_STEP_DONE;
  }
  if (strcmp(mode, "yield-pending") == 0) {
    CHECK_RC(ums_park_begin(UMS_FOREVER, &tok), 0);
    return UMS_STEP_YIELD;
  }
  if (strcmp(mode, "park-unbegun") == 0) return UMS_STEP_PARK;
  if (strcmp(mode, "bad-value") == 0) return 7;
  if (strcmp(mode, "exit-in-step") == 0) ums_exit(PTR(1), 0);
  tu_fail(__FILE__, __LINE__, "unknown child mode %s", mode);
}

/* A C task that ends with a park begun and never waited for. */
static atomic_int c_ends_parked_runs;
static ums_park_token_t c_ends_parked_tok;

static void *c_ends_parked_fn(void *arg) {
  atomic_fetch_add(&c_ends_parked_runs, 1);
  CHECK_RC(ums_park_begin(UMS_FOREVER, &c_ends_parked_tok), 0);
  return PTR(5);
}

static int child_main(const char *mode) {
  alarm(30); /* a hang dies of SIGALRM, which the parent reports */
  ums_runtime_t *crt = ums_runtime_new(&(ums_config_t){.schedulers = 1}, NULL);
  CHECK(crt != NULL);
  rt = crt;
  ums_task_t t;
  if (strcmp(mode, "c-ends-parked") == 0) {
    CHECK_RC(ums_task_spawn(crt, NULL, c_ends_parked_fn, NULL, &t), 0);
    WAIT_UNTIL(tu_stats_sum(crt, tasks) == 0, LONG_MS);
    /* Still joinable, so its handle is live; its park must not be. */
    int rc = ums_unpark(crt, c_ends_parked_tok, 1);
    if (rc != UMS_ESRCH) {
      fprintf(stderr, "unpark of a finished C task's park returned %d (%s)\n",
              rc, ums_err_name(rc));
      _exit(3);
    }
    usleep(20000);
    CHECK_EQ(atomic_load(&c_ends_parked_runs), 1);
    void *res = NULL;
    CHECK_RC(ums_task_join(crt, t, ums_deadline(tu_ms(LONG_MS)), &res, NULL),
             0);
    CHECK_PTR_EQ(res, PTR(5));
    CHECK_RC(ums_runtime_shutdown(crt, ums_deadline(tu_ms(LONG_MS))), 0);
    return 0;
  }
  ums_spawn_opts_t o = {.sched = 0, .name = "victim"};
  CHECK_RC(ums_task_spawn_step(crt, &o, child_mode_step, (void *)mode, &t), 0);
  ums_task_join(crt, t, ums_deadline(tu_ms(LONG_MS)), NULL, NULL);
  fprintf(stderr, "child %s: the step task ended without an abort\n", mode);
  _exit(4);
}

/* Runs `test_park --child mode` with its stderr captured. Returns the wait
** status; *err gets the stderr text. */
static int run_child(const char *mode, char *err, size_t errsz) {
  int pfd[2];
  CHECK_EQ(pipe(pfd), 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  CHECK_GE(pid, 0);
  if (pid == 0) {
    dup2(pfd[1], 2);
    close(pfd[0]);
    close(pfd[1]);
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    execl("/proc/self/exe", "test_park", "--child", mode, (char *)NULL);
    _exit(127);
  }
  close(pfd[1]);
  size_t n = 0;
  for (;;) {
    char scratch[512];
    char *dst = n + 1 < errsz ? err + n : scratch;
    size_t room = n + 1 < errsz ? errsz - 1 - n : sizeof scratch;
    ssize_t k = read(pfd[0], dst, room);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    if (dst != scratch) n += (size_t)k;
  }
  err[n] = '\0';
  close(pfd[0]);
  int st = 0;
  CHECK_EQ(waitpid(pid, &st, 0), pid);
  return st;
}

static void expect_abort(const char *mode, const char *what) {
  char err[8192];
  int st = run_child(mode, err, sizeof err);
  if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGABRT)
    tu_fail(__FILE__, __LINE__,
            "child %s: expected death by SIGABRT, got %s %d; stderr:\n%s", mode,
            WIFSIGNALED(st) ? "signal" : "exit status",
            WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st), err);
  if (what && (!strstr(err, "step task") || !strstr(err, "victim") ||
               !strstr(err, what)))
    tu_fail(__FILE__, __LINE__,
            "child %s: stderr does not name the violation (\"%s\"):\n%s", mode,
            what, err);
}

static void test_misuse_aborts(void) {
  expect_abort("done-pending", "UMS_STEP_DONE with a park begun");
  expect_abort("yield-pending", "UMS_STEP_YIELD with a park begun");
  expect_abort("park-unbegun", "UMS_STEP_PARK without ums_park_begin");
  expect_abort("bad-value", "unknown UMS_STEP_* value");
}

/* ====================================================================== */
/* Stress: park/unpark rounds with partner C tasks                         */
/* ====================================================================== */

typedef struct stress_msg {
  ums_park_token_t tok;
  int outcome;
  int expect_rc;
} stress_msg_t;

typedef struct stress_pair {
  ums_chan_t *ch; /* step -> partner, one message per round */
  int id;
  /* The step's own. */
  uint64_t rng;
  int round;
  int calls;
  int self_rounds, early, late;
  /* The partner's own. */
  uint64_t prng;
  int unparked, spent;
} stress_pair_t;

static atomic_long stress_rounds_done;

static int stress_outcome(int id, int round) { return id * 16 + round; }

static int stress_step(void *arg) {
  stress_pair_t *p = arg;
  p->calls++;
  CHECK_LE(p->calls, STRESS_ROUNDS + 1);
  CHECK_EQ(p->calls, p->round + 1);
  if (p->round > 0) {
    CHECK_RC(ums_park_result(), stress_outcome(p->id, p->round - 1));
    atomic_fetch_add_explicit(&stress_rounds_done, 1, memory_order_relaxed);
  }
  if (p->round == STRESS_ROUNDS) {
    ums_step_set_result(PTR(p->id), 0);
    return UMS_STEP_DONE;
  }
  uint64_t x = rng_next(&p->rng);
  /* A quarter of the parks carry a deadline that never comes. */
  int64_t dl =
      (x & 3) == 0 ? ums_deadline(3600 * UMS_NSEC_PER_SEC) : UMS_FOREVER;
  ums_park_token_t tok;
  CHECK_RC(ums_park_begin(dl, &tok), 0);
  CHECK_EQ(tok.task, ums_self());
  stress_msg_t m = {tok, stress_outcome(p->id, p->round), 0};
  int mode = (int)((x >> 2) % 3);
  if (mode == 0) {
    /* Unparked by the step itself; the partner's unpark comes too late. */
    CHECK_RC(ums_unpark(ums_current_runtime(), tok, m.outcome), 0);
    m.expect_rc = UMS_ESRCH;
    p->self_rounds++;
  }
  CHECK_RC(ums_chan_try_send(p->ch, &m), 0);
  if (mode == 2) {
    /* Give a partner on the other scheduler a chance to come first. */
    int64_t until = ums_now() + 5000;
    while (ums_park_result() == UMS_EBUSY && ums_now() < until) {
    }
  }
  if (ums_park_result() == UMS_EBUSY)
    p->late++;
  else
    p->early++;
  p->round++;
  return UMS_STEP_PARK;
}

static void *stress_partner_fn(void *arg) {
  stress_pair_t *p = arg;
  for (int r = 0; r < STRESS_ROUNDS; r++) {
    stress_msg_t m;
    CHECK_RC(ums_chan_recv(p->ch, &m, ums_deadline(tu_ms(30000))), 0);
    CHECK_EQ(m.outcome, stress_outcome(p->id, r));
    uint64_t x = rng_next(&p->prng);
    for (int i = (int)(x % 4); i > 0; i--) CHECK_RC(ums_yield(), 0);
    CHECK_RC(ums_unpark(rt, m.tok, m.outcome), m.expect_rc);
    if (m.expect_rc == 0)
      p->unparked++;
    else
      p->spent++;
  }
  return PTR(p->id);
}

static void test_stress_park_rounds(void) {
  ums_config_t cfg = {.schedulers = 2, .stack_size = 64 * 1024};
  rt = tu_runtime_new_cfg(&cfg);
  static stress_pair_t pairs[STRESS_TASKS];
  static ums_task_t steps[STRESS_TASKS], partners[STRESS_TASKS];
  atomic_store(&stress_rounds_done, 0);
  uint64_t seed = 12345;
  for (int i = 0; i < STRESS_TASKS; i++) {
    stress_pair_t *p = &pairs[i];
    memset(p, 0, sizeof *p);
    p->id = i;
    p->rng = (uint64_t)i * 2654435761u + 1;
    p->prng = (uint64_t)i * 40503u + 7;
    p->ch = ums_chan_new(sizeof(stress_msg_t), STRESS_ROUNDS);
    CHECK(p->ch != NULL);
    uint64_t x = rng_next(&seed);
    int step_sched = i % 2;
    int partner_sched = (int)(x & 1);
    if (x & 2) {
      steps[i] = spawn_step_on(step_sched, stress_step, p);
      partners[i] = spawn_c_on(partner_sched, stress_partner_fn, p);
    } else {
      partners[i] = spawn_c_on(partner_sched, stress_partner_fn, p);
      steps[i] = spawn_step_on(step_sched, stress_step, p);
    }
  }
  long self_rounds = 0, early = 0, late = 0, unparked = 0, spent = 0;
  for (int i = 0; i < STRESS_TASKS; i++) {
    stress_pair_t *p = &pairs[i];
    void *res = NULL;
    int st = 1;
    CHECK_RC(ums_task_join(rt, steps[i], ums_deadline(tu_ms(60000)), &res, &st),
             0);
    CHECK_PTR_EQ(res, PTR(i));
    CHECK_RC(st, 0);
    CHECK_RC(
        ums_task_join(rt, partners[i], ums_deadline(tu_ms(60000)), &res, &st),
        0);
    CHECK_PTR_EQ(res, PTR(i));
    CHECK_RC(st, 0);
    CHECK_EQ(p->calls, STRESS_ROUNDS + 1);
    CHECK_EQ(p->early + p->late, STRESS_ROUNDS);
    CHECK_EQ(p->unparked + p->spent, STRESS_ROUNDS);
    CHECK_EQ(p->spent, p->self_rounds);
    CHECK_RC(ums_chan_delete(p->ch), 0);
    self_rounds += p->self_rounds;
    early += p->early;
    late += p->late;
    unparked += p->unparked;
    spent += p->spent;
  }
  CHECK_EQ(atomic_load(&stress_rounds_done),
           (long)STRESS_TASKS * STRESS_ROUNDS);
  printf("   %d step tasks x %d rounds: %ld unparked by the step itself, "
         "%ld by the partner; %ld ended before the step returned, %ld after\n",
         STRESS_TASKS, STRESS_ROUNDS, self_rounds, unparked, early, late);
  CHECK_GT(early, 0);
  CHECK_GT(late, 0);
  WAIT_UNTIL(tu_stats_sum(rt, tasks) == 0 && tu_stats_sum(rt, timers) == 0,
             LONG_MS);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* The race of an unpark against the deadline                              */
/* ====================================================================== */

/* Each iteration is two parks: the race (a deadline from just past to
** 30 us ahead, against the host's unpark after a random delay), then a
** park the host ends once it has recorded its unpark's return, which
** keeps the two sides in lockstep without spinning. Tokens go through a
** semaphore the host thread blocks on. */
typedef struct race {
  int iters;
  int i;                /* step only */
  int phase;            /* step only: 0 begin race, 1 race ended, 2 synced */
  uint64_t rng;         /* step only */
  ums_sem_t *posted[2]; /* released once per token of each kind */
  tokbox_t box[2];      /* 0: the race park; 1: the lockstep park */
  int *results;         /* step writes */
  int *rcs;             /* host writes */
} race_t;

static void race_publish(race_t *r, int which, ums_park_token_t tok) {
  tok_put(&r->box[which], tok);
  CHECK_RC(ums_sem_release(r->posted[which], 1), 0);
}

static int race_step(void *arg) {
  race_t *r = arg;
  ums_park_token_t tok;
  if (r->phase == 1) {
    int res = ums_park_result();
    CHECK(res == 42 || res == UMS_ETIMEDOUT);
    r->results[r->i] = res;
    /* Wait for the host to be done with this iteration. */
    CHECK_RC(ums_park_begin(UMS_FOREVER, &tok), 0);
    race_publish(r, 1, tok);
    r->phase = 2;
    return UMS_STEP_PARK;
  }
  if (r->phase == 2) {
    CHECK_RC(ums_park_result(), 0);
    r->i++;
  }
  if (r->i == r->iters) {
    ums_step_set_result(PTR(r->i), 0);
    return UMS_STEP_DONE;
  }
  int64_t off = (int64_t)(rng_next(&r->rng) % 35000) - 5000;
  CHECK_RC(ums_park_begin(ums_now() + off, &tok), 0);
  race_publish(r, 0, tok);
  r->phase = 1;
  return UMS_STEP_PARK;
}

static void test_unpark_deadline_race(void) {
  rt = tu_runtime_new(2);
  race_t r;
  memset(&r, 0, sizeof r);
  r.iters = RACE_ITERS;
  r.rng = 99;
  r.posted[0] = ums_sem_new(0);
  r.posted[1] = ums_sem_new(0);
  r.results = calloc(RACE_ITERS, sizeof(int));
  r.rcs = calloc(RACE_ITERS, sizeof(int));
  CHECK(r.posted[0] && r.posted[1] && r.results && r.rcs);
  ums_task_t t = spawn_step_on(0, race_step, &r);
  uint64_t hrng = 7;
  for (int i = 0; i < RACE_ITERS; i++) {
    CHECK_RC(ums_sem_acquire(r.posted[0], ums_deadline(tu_ms(LONG_MS))), 0);
    ums_park_token_t tok = tok_get(&r.box[0]);
    spin_ns((int64_t)(rng_next(&hrng) % 40000));
    r.rcs[i] = ums_unpark(rt, tok, 42);
    CHECK_RC(ums_sem_acquire(r.posted[1], ums_deadline(tu_ms(LONG_MS))), 0);
    CHECK_RC(ums_unpark(rt, tok_get(&r.box[1]), 0), 0);
  }
  JOIN_EXPECT(t, PTR(RACE_ITERS), 0);
  int won = 0, timed_out = 0;
  for (int i = 0; i < RACE_ITERS; i++) {
    if (r.rcs[i] == 0 && r.results[i] == 42)
      won++;
    else if (r.rcs[i] == UMS_ESRCH && r.results[i] == UMS_ETIMEDOUT)
      timed_out++;
    else
      tu_fail(__FILE__, __LINE__,
              "iteration %d: unpark returned %d (%s) but the park ended "
              "with %d (%s)",
              i, r.rcs[i], ums_err_name(r.rcs[i]), r.results[i],
              ums_err_name(r.results[i]));
  }
  printf("   %d races: unpark won %d, deadline won %d\n", RACE_ITERS, won,
         timed_out);
  CHECK_GT(won, 0);
  CHECK_GT(timed_out, 0);
  CHECK_RC(ums_sem_delete(r.posted[0]), 0);
  CHECK_RC(ums_sem_delete(r.posted[1]), 0);
  free(r.results);
  free(r.rcs);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* A same-scheduler unpark racing the deadline, a foreign unpark, a cancel */
/* ====================================================================== */

/* A park begins and is parked without t->lock (park.c), and an unpark
** from the task's own scheduler goes straight to its runnable queue. Each
** iteration here races, for one park with a deadline from just past to
** 30 us ahead: an unpark by a step task of the same scheduler (outcome 1,
** after a random spin that holds the scheduler, so a deadline can pass
** unseen), an unpark from a host thread (outcome 2, which can land before
** the parker's step has even returned) and the timer. Exactly one may
** win, its outcome must be the park's, and the parker must be stepped
** exactly once per wake: a task queued twice would be stepped while
** parked again (ums_park_result() == UMS_EBUSY) or would skip an
** iteration.
**
** With a local park (UMS_PARK_LOCAL: no lock at all on its end) the host
** holds the current token too, and its unpark must be refused every time
** (UMS_EPERM, or UMS_ESRCH once the park has ended); the same-scheduler
** unpark and the timer still race, and exactly one of them ends it. */
typedef struct srace {
  int iters;
  int flags;             /* of every park (0 or UMS_PARK_LOCAL) */
  int i, phase;          /* parker only */
  uint64_t rng;          /* parker only */
  uint64_t urng;         /* local unparker only */
  tokbox_t box;          /* the race park's token */
  atomic_int posted;     /* iterations whose token is in box */
  atomic_int local_done; /* iterations the local unparker has tried */
  atomic_int host_done;  /* iterations the host has tried */
  int *results;          /* parker writes */
  int *rc_local;         /* local unparker writes */
  int *rc_host;          /* host writes */
  int steps;             /* parker only: steps taken */
} srace_t;

static int srace_parker(void *arg) {
  srace_t *r = arg;
  r->steps++;
  if (r->phase == 1) {
    int res = ums_park_result();
    CHECK(res != UMS_EBUSY);  /* stepped while parked: queued twice */
    CHECK(res == 1 || res == 2 || res == UMS_ETIMEDOUT);
    r->results[r->i] = res;
    r->phase = 2;
  }
  if (r->phase == 2) {
    /* Lockstep: both unparkers are done with this iteration. */
    if (atomic_load(&r->local_done) <= r->i ||
        atomic_load(&r->host_done) <= r->i)
      return UMS_STEP_YIELD;
    r->i++;
    r->phase = 0;
  }
  if (r->i == r->iters) {
    ums_step_set_result(PTR(r->i), 0);
    return UMS_STEP_DONE;
  }
  int64_t off = (int64_t)(rng_next(&r->rng) % 35000) - 5000;
  ums_park_token_t tok;
  CHECK_RC(ums_park_begin_ex(ums_now() + off, r->flags, &tok), 0);
  tok_put(&r->box, tok);
  atomic_store(&r->posted, r->i + 1);
  r->phase = 1;
  return UMS_STEP_PARK;
}

static int srace_local(void *arg) {
  srace_t *r = arg;
  int done = atomic_load(&r->local_done);
  if (done == r->iters) {
    ums_step_set_result(PTR(done), 0);
    return UMS_STEP_DONE;
  }
  if (atomic_load(&r->posted) > done) {
    ums_park_token_t tok = tok_get(&r->box);
    spin_ns((int64_t)(rng_next(&r->urng) % 40000));
    r->rc_local[done] = ums_unpark(rt, tok, 1);
    atomic_store(&r->local_done, done + 1);
  }
  return UMS_STEP_YIELD;
}

static void same_sched_unpark_races(int flags) {
  bool local = flags & UMS_PARK_LOCAL;
  rt = tu_runtime_new(2);
  srace_t r;
  memset(&r, 0, sizeof r);
  r.iters = RACE_ITERS;
  r.flags = flags;
  r.rng = 5;
  r.urng = 11;
  r.results = calloc(RACE_ITERS, sizeof(int));
  r.rc_local = calloc(RACE_ITERS, sizeof(int));
  r.rc_host = calloc(RACE_ITERS, sizeof(int));
  CHECK(r.results && r.rc_local && r.rc_host);
  ums_task_t p = spawn_step_on(0, srace_parker, &r);
  ums_task_t u = spawn_step_on(0, srace_local, &r);
  uint64_t hrng = 3;
  int64_t until = ums_deadline(tu_ms(LONG_MS * 6));
  for (int i = 0; i < RACE_ITERS; i++) {
    while (atomic_load(&r.posted) <= i) {
      if (ums_now() > until) tu_fail(__FILE__, __LINE__, "no token %d", i);
      sched_yield();
    }
    ums_park_token_t tok = tok_get(&r.box);
    spin_ns((int64_t)(rng_next(&hrng) % 40000));
    r.rc_host[i] = ums_unpark(rt, tok, 2);
    atomic_store(&r.host_done, i + 1);
  }
  JOIN_EXPECT(p, PTR(RACE_ITERS), 0);
  JOIN_EXPECT(u, PTR(RACE_ITERS), 0);
  int wins[3] = {0, 0, 0};
  for (int i = 0; i < RACE_ITERS; i++) {
    int lw = r.rc_local[i] == 0, hw = r.rc_host[i] == 0;
    int tw = r.results[i] == UMS_ETIMEDOUT;
    CHECK(r.rc_local[i] == 0 || r.rc_local[i] == UMS_ESRCH);
    if (local)
      CHECK(r.rc_host[i] == UMS_EPERM || r.rc_host[i] == UMS_ESRCH);
    else
      CHECK(r.rc_host[i] == 0 || r.rc_host[i] == UMS_ESRCH);
    if (lw + hw + tw != 1 || (lw && r.results[i] != 1) ||
        (hw && r.results[i] != 2))
      tu_fail(__FILE__, __LINE__,
              "iteration %d: local unpark %d, host unpark %d, park ended "
              "with %d",
              i, r.rc_local[i], r.rc_host[i], r.results[i]);
    wins[lw ? 0 : hw ? 1 : 2]++;
  }
  printf("   %d races: same-scheduler unpark won %d, host unpark %d, "
         "deadline %d; parker stepped %d times\n",
         RACE_ITERS, wins[0], wins[1], wins[2], r.steps);
  CHECK_GT(wins[0], 0);
  CHECK_GT(wins[2], 0);
  if (local) {
    int refused = 0;
    for (int i = 0; i < RACE_ITERS; i++) refused += r.rc_host[i] == UMS_EPERM;
    printf("   host unpark refused with UMS_EPERM %d times\n", refused);
    CHECK_GT(refused, 0);  /* it did hold a current token */
  }
  free(r.results);
  free(r.rc_local);
  free(r.rc_host);
  tu_runtime_shutdown(rt);
}

static void test_same_sched_unpark_races(void) { same_sched_unpark_races(0); }

static void test_local_park_unpark_races(void) {
  same_sched_unpark_races(UMS_PARK_LOCAL);
}

/* The same with a cancel instead of the host's unpark: one parker task per
** iteration (a cancel is for good), parked with a deadline, against an
** unpark from a step task of its scheduler and a cancel from the host.
** Its park ends exactly once: with the unpark's outcome exactly when that
** unpark reported success, else timed out or cancelled. A local park's
** end takes no lock; its cancel is delivered on the scheduler's thread. */
typedef struct cvictim {
  int flags;            /* of the park (0 or UMS_PARK_LOCAL) */
  int phase;
  int result;           /* the park's outcome, or 99: never parked */
  tokbox_t box;
  atomic_int posted;
} cvictim_t;

static int cvictim_step(void *arg) {
  cvictim_t *v = arg;
  if (v->phase == 1) {
    v->result = ums_park_result();
    CHECK(v->result != UMS_EBUSY);
    v->phase = 2;
    return UMS_STEP_DONE;
  }
  CHECK(v->phase == 0);
  v->phase = 1;
  uint64_t x = (uint64_t)(uintptr_t)v * 0x9e3779b97f4a7c15u;
  int64_t off = (int64_t)((x >> 20) % 35000) - 5000;
  ums_park_token_t tok;
  int rc = ums_park_begin_ex(ums_now() + off, v->flags, &tok);
  if (rc == UMS_ECANCELED) {
    v->result = 99;
    v->phase = 2;
    atomic_store(&v->posted, -1);
    return UMS_STEP_DONE;
  }
  CHECK_RC(rc, 0);
  tok_put(&v->box, tok);
  atomic_store(&v->posted, 1);
  return UMS_STEP_PARK;
}

typedef struct cunparker {
  cvictim_t *v;
  uint64_t rng;
  int rc;
} cunparker_t;

static int cunparker_step(void *arg) {
  cunparker_t *u = arg;
  int posted = atomic_load(&u->v->posted);
  if (posted == 0) return UMS_STEP_YIELD;
  u->rc = UMS_ESRCH;
  if (posted == 1) {
    spin_ns((int64_t)(rng_next(&u->rng) % 40000));
    u->rc = ums_unpark(rt, tok_get(&u->v->box), 1);
  }
  return UMS_STEP_DONE;
}

static void same_sched_unpark_cancel_race(int flags) {
  enum { N = RACE_ITERS / 4 };
  rt = tu_runtime_new(2);
  cvictim_t *vs = calloc(N, sizeof *vs);
  cunparker_t *us = calloc(N, sizeof *us);
  CHECK(vs && us);
  uint64_t hrng = 17;
  int wins[4] = {0, 0, 0, 0};
  /* The check below wants the unpark to have won at least once (else the
  ** race was never run both ways). Under TSan the timing can leave every
  ** victim of a round to its deadline or the cancel: up to four rounds. */
  for (int round = 0; round < 4 && wins[0] == 0; round++) {
    memset(vs, 0, N * sizeof *vs);
    memset(us, 0, N * sizeof *us);
    for (int i = 0; i < N; i++) {
      vs[i].flags = flags;
      us[i].v = &vs[i];
      us[i].rng = (uint64_t)i + 1;
      ums_task_t v = spawn_step_on(0, cvictim_step, &vs[i]);
      ums_task_t u = spawn_step_on(0, cunparker_step, &us[i]);
      spin_ns((int64_t)(rng_next(&hrng) % 40000));
      CHECK_RC(ums_task_cancel(rt, v), 0);
      JOIN_EXPECT(v, PTR(0), 0);
      JOIN_EXPECT(u, PTR(0), 0);
      int res = vs[i].result, rc = us[i].rc;
      CHECK(rc == 0 || rc == UMS_ESRCH);
      if ((rc == 0) != (res == 1) ||
          !(res == 1 || res == UMS_ETIMEDOUT || res == UMS_ECANCELED ||
            res == 99))
        tu_fail(__FILE__, __LINE__,
                "victim %d: unpark returned %d, park ended with %d", i, rc,
                res);
      wins[res == 1 ? 0 : res == UMS_ETIMEDOUT ? 1 : res == UMS_ECANCELED ? 2
                                                                          : 3]++;
    }
    printf("   after round %d of %d victims: unpark won %d, deadline %d, "
           "cancel %d, "
           "cancelled before parking %d\n",
           round + 1, N, wins[0], wins[1], wins[2], wins[3]);
  }
  CHECK_GT(wins[0], 0);
  free(vs);
  free(us);
  tu_runtime_shutdown(rt);
}

static void test_same_sched_unpark_cancel_race(void) {
  same_sched_unpark_cancel_race(0);
}

static void test_local_park_cancel_race(void) {
  same_sched_unpark_cancel_race(UMS_PARK_LOCAL);
}

/* The tokens of local parks (UMS_PARK_LOCAL): only the task's own
** scheduler ends one. Another scheduler's task and a host thread holding
** the current token are refused (UMS_EPERM) and change nothing; stale and
** forged tokens get UMS_ESRCH as for any park; NOCANCEL combines with
** LOCAL, other flags are refused. */
typedef struct ltok {
  int calls;
  tokbox_t box;          /* the second park's token, for the others */
  atomic_int other_rc;   /* what scheduler 1's task got, or 1: not yet */
  int res1, res2;
} ltok_t;

static int ltok_step(void *arg) {
  ltok_t *s = arg;
  ums_runtime_t *r = ums_current_runtime();
  s->calls++;
  if (s->calls == 1) {
    ums_park_token_t tok, f;
    CHECK_RC(ums_park_begin_ex(UMS_FOREVER, 4, &tok), UMS_EINVAL);
    CHECK_RC(ums_park_begin_ex(UMS_FOREVER, UMS_PARK_LOCAL, &tok), 0);
    /* A local park's own scheduler ends it (here the task itself). */
    f = tok;
    f.seq ^= (uint64_t)1 << 63;  /* the same park named as not local */
    CHECK_RC(ums_unpark(r, f, 9), UMS_ESRCH);
    f = tok;
    f.seq++;
    CHECK_RC(ums_unpark(r, f, 9), UMS_ESRCH);
    CHECK_RC(ums_unpark(r, tok, 7), 0);
    CHECK_RC(ums_unpark(r, tok, 8), UMS_ESRCH);
    return UMS_STEP_PARK;
  }
  if (s->calls == 2) {
    s->res1 = ums_park_result();
    ums_park_token_t tok;
    CHECK_RC(ums_park_begin_ex(UMS_FOREVER, UMS_PARK_LOCAL | UMS_PARK_NOCANCEL,
                               &tok),
             0);
    tok_put(&s->box, tok);
    return UMS_STEP_PARK;
  }
  s->res2 = ums_park_result();
  ums_step_set_result(PTR(s->calls), 0);
  return UMS_STEP_DONE;
}

typedef struct ltok_other {
  ltok_t *s;
} ltok_other_t;

/* On scheduler 1: a task of another scheduler holding the current token
** of a local park. */
static int ltok_other_step(void *arg) {
  ltok_other_t *o = arg;
  if (!atomic_load_explicit(&o->s->box.ready, memory_order_acquire))
    return UMS_STEP_YIELD;
  atomic_store(&o->s->other_rc,
               ums_unpark(ums_current_runtime(), tok_get(&o->s->box), 5));
  return UMS_STEP_DONE;
}

typedef struct ltok_helper {
  ltok_t *s;
  atomic_int go;
  int rc;
} ltok_helper_t;

static int ltok_helper_step(void *arg) {
  ltok_helper_t *h = arg;
  if (!atomic_load(&h->go)) return UMS_STEP_YIELD;
  h->rc = ums_unpark(ums_current_runtime(), tok_get(&h->s->box), 6);
  return UMS_STEP_DONE;
}

static void test_local_park_tokens(void) {
  rt = tu_runtime_new(2);
  ltok_t s;
  memset(&s, 0, sizeof s);
  atomic_store(&s.other_rc, 1);
  ltok_other_t o = {&s};
  ltok_helper_t h;
  memset(&h, 0, sizeof h);
  h.s = &s;
  ums_task_t t = spawn_step_on(0, ltok_step, &s);
  ums_task_t ot = spawn_step_on(1, ltok_other_step, &o);
  JOIN_EXPECT(ot, PTR(0), 0);
  CHECK_RC(atomic_load(&s.other_rc), UMS_EPERM);
  ums_park_token_t tok = tok_get(&s.box);
  CHECK_RC(ums_unpark(rt, tok, 5), UMS_EPERM);  /* a host thread */
  CHECK_RC(ums_task_cancel(rt, t), 0);          /* NOCANCEL: still parked */
  usleep(5000);
  CHECK_EQ(s.calls, 2);
  ums_park_token_t f = tok;
  f.seq ^= (uint64_t)1 << 63;
  CHECK_RC(ums_unpark(rt, f, 5), UMS_ESRCH);
  ums_task_t ht = spawn_step_on(0, ltok_helper_step, &h);
  atomic_store(&h.go, 1);
  JOIN_EXPECT(ht, PTR(0), 0);
  CHECK_RC(h.rc, 0);
  JOIN_EXPECT(t, PTR(3), 0);
  CHECK_RC(s.res1, 7);
  CHECK_RC(s.res2, 6);
  CHECK_RC(ums_unpark(rt, tok, 5), UMS_ESRCH);  /* stale now */
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Shutdown with step tasks parked forever                                 */
/* ====================================================================== */

enum { SD_PARK_FOREVER, SD_PARK_LONG, SD_BLOCK_IN_STEP, SD_KINDS };

typedef struct sd_step {
  int kind;
  int cleanup_yields;
  ums_sem_t *sem;
  atomic_int *entered;
  atomic_int *finished;
  int calls;
  int phase;
  int seen;
} sd_step_t;

static int sd_step_fn(void *arg) {
  sd_step_t *s = arg;
  s->calls++;
  if (s->phase == 0) {
    s->phase = 1;
    if (s->kind == SD_BLOCK_IN_STEP) {
      atomic_fetch_add(s->entered, 1);
      s->seen = ums_sem_acquire(s->sem, UMS_FOREVER);
      s->phase = 2;
    } else {
      ums_park_token_t tok;
      int64_t dl = s->kind == SD_PARK_FOREVER
                       ? UMS_FOREVER
                       : ums_deadline(3600 * UMS_NSEC_PER_SEC);
      CHECK_RC(ums_park_begin(dl, &tok), 0);
      atomic_fetch_add(s->entered, 1);
      return UMS_STEP_PARK;
    }
  }
  if (s->phase == 1) {
    s->seen = ums_park_result();
    s->phase = 2;
  }
  CHECK(ums_cancelled());
  ums_park_token_t tok2;
  CHECK_RC(ums_park_begin(UMS_FOREVER, &tok2), UMS_ECANCELED);
  /* Cleanup may take a few more steps. */
  if (s->cleanup_yields-- > 0) return UMS_STEP_YIELD;
  atomic_fetch_add(s->finished, 1);
  ums_step_set_result(PTR(s->seen), 0);
  return UMS_STEP_DONE;
}

typedef struct sd_c {
  ums_event_t *ev;
  atomic_int *entered;
  int rc;
} sd_c_t;

static void *sd_c_fn(void *arg) {
  sd_c_t *c = arg;
  atomic_fetch_add(c->entered, 1);
  c->rc = ums_event_wait(c->ev, UMS_FOREVER);
  return NULL;
}

static void test_shutdown_parked_steps(void) {
  enum { NS = 60, NC = 4 };
  rt = tu_runtime_new(2);
  ums_sem_t *sem = ums_sem_new(0);
  ums_event_t *ev = ums_event_new(1, 0);
  CHECK(sem && ev);
  atomic_int entered = 0, finished = 0;
  static sd_step_t s[NS];
  sd_c_t c[NC];
  int nblocked = 0;
  for (int i = 0; i < NS; i++) {
    s[i] = (sd_step_t){.kind = i % SD_KINDS,
                       .cleanup_yields = i % 4,
                       .sem = sem,
                       .entered = &entered,
                       .finished = &finished};
    nblocked += s[i].kind == SD_BLOCK_IN_STEP;
    ums_spawn_opts_t o = {.sched = i % 2, .detached = (i % 5) == 0};
    CHECK_RC(ums_task_spawn_step(rt, &o, sd_step_fn, &s[i], NULL), 0);
  }
  for (int i = 0; i < NC; i++) {
    c[i] = (sd_c_t){.ev = ev, .entered = &entered};
    CHECK_RC(ums_task_spawn(rt, NULL, sd_c_fn, &c[i], NULL), 0);
  }
  WAIT_UNTIL(atomic_load(&entered) == NS + NC && all_idle(), LONG_MS);
  CHECK_EQ(tu_stats_sum(rt, tasks), NS + NC);
  CHECK_EQ(tu_stats_sum(rt, workers_active), nblocked + NC);

  int64_t start = ums_now();
  int r = ums_runtime_shutdown(rt, ums_deadline(tu_ms(50)));
  CHECK_RC(r, UMS_ETIMEDOUT);
  CHECK_GE(tu_elapsed_ms(start), 50);
  CHECK_LT(tu_elapsed_ms(start), LONG_MS);
  tu_live_runtimes--;
  CHECK_THREADS(tu_thread_baseline());
  rt = NULL;

  CHECK_EQ(atomic_load(&finished), NS);
  for (int i = 0; i < NS; i++) {
    CHECK_RC(s[i].seen, UMS_ECANCELED);
    CHECK_EQ(s[i].phase, 2);
    CHECK_EQ(s[i].cleanup_yields, -1);
    int want_calls = (s[i].kind == SD_BLOCK_IN_STEP ? 1 : 2) + i % 4;
    CHECK_EQ(s[i].calls, want_calls);
  }
  for (int i = 0; i < NC; i++) CHECK_RC(c[i].rc, UMS_ECANCELED);
  CHECK_RC(ums_sem_delete(sem), 0);
  CHECK_RC(ums_event_delete(ev), 0);
}

/* ====================================================================== */
/* A park that ended before ums_park_wait, and a cancel in between         */
/* ====================================================================== */

/* The park ends (from another thread, or by the task itself) before the
** task reaches ums_park_wait, which then returns the outcome at once. The
** wake-up the unparker queued must not leak into the task's next wait. */
typedef struct early_wait {
  int self;
  tokbox_t box;
  atomic_int unparked;
  int rc, sleep_rc;
  int64_t slept;
} early_wait_t;

static void *early_wait_fn(void *arg) {
  early_wait_t *e = arg;
  ums_park_token_t tok;
  CHECK_RC(ums_park_begin(UMS_FOREVER, &tok), 0);
  if (e->self) {
    CHECK_RC(ums_unpark(rt, tok, 7), 0);
  } else {
    tok_put(&e->box, tok);
    SPIN_UNTIL(atomic_load(&e->unparked), LONG_MS);
  }
  e->rc = ums_park_wait();
  int64_t t0 = ums_now();
  e->sleep_rc = ums_sleep(tu_ms(20));
  e->slept = ums_now() - t0;
  return PTR(1);
}

static void test_park_wait_after_early_unpark(void) {
  rt = tu_runtime_new(2);
  for (int self = 0; self < 2; self++) {
    early_wait_t e;
    memset(&e, 0, sizeof e);
    e.self = self;
    ums_task_t t = spawn_c_on(0, early_wait_fn, &e);
    if (!self) {
      WAIT_UNTIL(atomic_load_explicit(&e.box.ready, memory_order_acquire),
                 LONG_MS);
      CHECK_RC(ums_unpark(rt, tok_get(&e.box), 7), 0);
      atomic_store(&e.unparked, 1);
    }
    JOIN_EXPECT(t, PTR(1), 0);
    CHECK_RC(e.rc, 7);
    /* A sleep of 20 ms after it really sleeps 20 ms. */
    CHECK_RC(e.sleep_rc, 0);
    CHECK_GE(e.slept, tu_ms(20));
  }
  tu_runtime_shutdown(rt);
}

/* The same inside a step: it unparks itself, waits (at once), returns
** YIELD: it must be stepped exactly once more. */
typedef struct early_step {
  int calls;
  int rc;
} early_step_t;

static int early_wait_step(void *arg) {
  early_step_t *e = arg;
  e->calls++;
  CHECK_LE(e->calls, 2);
  if (e->calls == 1) {
    ums_park_token_t tok;
    CHECK_RC(ums_park_begin(UMS_FOREVER, &tok), 0);
    CHECK_RC(ums_unpark(ums_current_runtime(), tok, 7), 0);
    e->rc = ums_park_wait();
    return UMS_STEP_YIELD;
  }
  ums_step_set_result(PTR(e->rc), 0);
  return UMS_STEP_DONE;
}

static void test_step_park_wait_after_self_unpark(void) {
  rt = tu_runtime_new(1);
  early_step_t e;
  memset(&e, 0, sizeof e);
  ums_task_t t = spawn_step_on(0, early_wait_step, &e);
  JOIN_EXPECT(t, PTR(7), 0);
  CHECK_EQ(e.calls, 2);
  tu_runtime_shutdown(rt);
}

/* A task cancels itself between ums_park_begin and ums_park_wait: the
** wait is the next wait point, so it returns UMS_ECANCELED (as a step's
** UMS_STEP_PARK return does), not the deadline's UMS_ETIMEDOUT. */
static void *cancel_then_wait_fn(void *arg) {
  ums_park_token_t tok;
  CHECK_RC(ums_park_begin(ums_deadline(tu_ms(500)), &tok), 0);
  CHECK_RC(ums_task_cancel(rt, ums_self()), 0);
  return PTR(ums_park_wait());
}

static int cancel_then_wait_step(void *arg) {
  ums_step_set_result(cancel_then_wait_fn(arg), 0);
  return UMS_STEP_DONE;
}

static void test_cancel_between_begin_and_wait(void) {
  rt = tu_runtime_new(1);
  ums_task_t t = spawn_c_on(0, cancel_then_wait_fn, NULL);
  JOIN_EXPECT(t, PTR(UMS_ECANCELED), 0);
  t = spawn_step_on(0, cancel_then_wait_step, NULL);
  JOIN_EXPECT(t, PTR(UMS_ECANCELED), 0);
  tu_runtime_shutdown(rt);
}

/* ums_exit is for C tasks: "Aborts the process outside a C task". */
static void test_exit_in_step_aborts(void) {
  expect_abort("exit-in-step", NULL);
}

/* A C task that returns with a park begun: the park must not outlive the
** task (ums_unpark of its token: UMS_ESRCH), or the runtime must reject
** the violation as it does for step tasks (an abort). */
static void test_c_task_ends_with_park_pending(void) {
  char err[8192];
  int st = run_child("c-ends-parked", err, sizeof err);
  bool clean = WIFEXITED(st) && WEXITSTATUS(st) == 0;
  bool aborted = WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
  if (!clean && !aborted)
    tu_fail(__FILE__, __LINE__, "child c-ends-parked: %s %d; stderr:\n%s",
            WIFSIGNALED(st) ? "signal" : "exit status",
            WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st), err);
}

/* ====================================================================== */

static const struct {
  const char *name;
  void (*fn)(void);
} tests[] = {
#define T(fn)                                                                  \
  { #fn, fn }
    T(test_step_yield_done),
    T(test_step_round_robin),
    T(test_unpark_parties),
    T(test_unpark_disarms_timer),
    T(test_park_deadline),
    T(test_stale_and_bad_tokens),
    T(test_c_task_park_wait),
    T(test_cancel_parked_step),
    T(test_cancel_while_stepping),
    T(test_cancel_before_start),
    T(test_blocking_in_step),
    T(test_step_workers),
    T(test_misuse_guards),
    T(test_misuse_aborts),
    T(test_stress_park_rounds),
    T(test_unpark_deadline_race),
    T(test_same_sched_unpark_races),
    T(test_same_sched_unpark_cancel_race),
    T(test_local_park_tokens),
    T(test_local_park_unpark_races),
    T(test_local_park_cancel_race),
    T(test_shutdown_parked_steps),
    /* Bugs found while writing these tests come last, so that every test
    ** above still reports. */
    T(test_park_wait_after_early_unpark),
    T(test_step_park_wait_after_self_unpark),
    T(test_cancel_between_begin_and_wait),
    T(test_exit_in_step_aborts),
    T(test_c_task_ends_with_park_pending),
#undef T
};

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) return child_main(argv[2]);
  int ntests = (int)(sizeof tests / sizeof tests[0]);
  for (int i = 0; i < ntests; i++) {
    bool run = argc < 2;
    for (int a = 1; a < argc; a++)
      if (strcmp(argv[a], tests[i].name) == 0) run = true;
    if (!run) continue;
    printf("-- %s\n", tests[i].name);
    fflush(stdout);
    int64_t start = ums_now();
    tests[i].fn();
    printf("   ok (%" PRId64 " ms)\n", tu_elapsed_ms(start));
    fflush(stdout);
  }
  return 0;
}
