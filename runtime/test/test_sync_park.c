/*
** test_sync_park.c: the park-based forms of the runtime's sync objects,
** driven by step tasks on two schedulers. First the queued park they are
** made of (park.c's ums__park_begin_queued, on a queue of the test's own):
** granted from the other scheduler, timed out, cancelled, refused to
** ums_unpark, and thousands of races of a grant against the deadline and
** against a cancel. Then each object's _begin/_end (mutex lock, semaphore
** acquire, event wait, cond wait with its re-lock): the same outcomes, a
** poll, mutual exclusion with blocking waiters on the same mutex, and the
** races of a grant against the deadline. A wait ends exactly once: a
** grant that found the waiter is its outcome, one that did not stays with
** the object, and no waiter is left on a queue.
*/
#include "internal.h"
#include "sync-util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ums_runtime_t *rt;

/* ====================================================================== */
/* Queued parks (park.c): a step task's park on an object's queue          */
/* ====================================================================== */

#if defined(__SANITIZE_THREAD__)
#define QRACE_ITERS 500
#define QCANCEL_TASKS 300
#else
#define QRACE_ITERS 1000
#define QCANCEL_TASKS 2000
#endif

/* An object of the test's own: a lock and the queue it guards, as sync.c's
** objects have. */
typedef struct qobj {
  ums__lock_t lock;
  ums__wq_t wq;
} qobj_t;

static size_t qobj_waiters(qobj_t *o) {
  ums__lock(&o->lock);
  size_t n = o->wq.n;
  ums__unlock(&o->lock);
  return n;
}

/* Grants o's first waiter with outcome, as a sync object's release does;
** returns whether there was one. */
static bool qobj_grant(qobj_t *o, int outcome) {
  ums__wake_t wk;
  ums__lock(&o->lock);
  bool any = ums__wq_grant_first(&o->wq, outcome, &wk) != NULL;
  ums__unlock(&o->lock);
  if (any) ums__wake(&wk);
  return any;
}

/* One queued park of a step task: begun with `flags` and `deadline` in the
** first step (and, with self_unpark, ended there by the task itself
** through its token), read in the second. */
typedef struct qone {
  qobj_t *o;
  int64_t deadline;
  int flags;
  int self_unpark;       /* the outcome to unpark itself with, or -1 */
  int phase;             /* the step only */
  ums_park_token_t tok;  /* written before `begun` */
  _Atomic int begun;
  int result;            /* the outcome; read after the join */
  size_t left;           /* waiters left on o when the park ended */
} qone_t;

static int qone_step(void *arg) {
  qone_t *q = arg;
  if (q->phase == 0) {
    ums__waiter_t *w = NULL;
    ums__lock(&q->o->lock);
    CHECK_OK(ums__park_begin_queued(&q->o->wq, &q->o->lock, q->deadline,
                                    q->flags, UMS_WAIT_EVENT, q->o, 0, &w,
                                    &q->tok));
    CHECK(w != NULL && w->linked);
    /* A second park, queued or not, waits for the end of this one. */
    CHECK_EQ(ums__park_begin_queued(&q->o->wq, &q->o->lock, UMS_FOREVER, 0,
                                    UMS_WAIT_EVENT, q->o, 0, NULL, NULL),
             UMS_EBUSY);
    CHECK_EQ(ums_park_begin(UMS_FOREVER, NULL), UMS_EBUSY);
    ums__unlock(&q->o->lock);
    if (q->self_unpark >= 0)
      CHECK_OK(ums_unpark(rt, q->tok, q->self_unpark));
    q->phase = 1;
    atomic_store(&q->begun, 1);
    return UMS_STEP_PARK;
  }
  q->result = ums_park_result();
  q->left = qobj_waiters(q->o);
  ums_step_set_result(NULL, 0);
  return UMS_STEP_DONE;
}

static void *qgrant_task(void *arg) {
  qone_t *q = arg;
  su_await(&q->begun, 1);
  su_await_idle(rt, 0); /* the step task is parked */
  /* Only its granters may end a queued park: another task's unpark of
  ** its token is refused. */
  CHECK_EQ(ums_unpark(rt, q->tok, 3), UMS_EPERM);
  CHECK(qobj_grant(q->o, 0));
  return NULL;
}

/* A C task's queued park, ended by ums_park_wait. */
static void *qwait_task(void *arg) {
  qone_t *q = arg;
  ums__lock(&q->o->lock);
  CHECK_OK(ums__park_begin_queued(&q->o->wq, &q->o->lock, q->deadline, 0,
                                  UMS_WAIT_EVENT, q->o, 0, NULL, &q->tok));
  ums__unlock(&q->o->lock);
  atomic_store(&q->begun, 1);
  q->result = ums_park_wait();
  q->left = qobj_waiters(q->o);
  return NULL;
}

static void queued_park_basic(void) {
  qobj_t o;
  memset(&o, 0, sizeof o);
  su_watchdog_start("queued park: grant, timeout, cancel, tokens", 60);
  /* Granted by a task of another scheduler. */
  qone_t q = {.o = &o, .deadline = UMS_FOREVER, .self_unpark = -1};
  ums_task_t t = su_spawn_step(rt, 0, qone_step, &q);
  su_join(rt, su_spawn(rt, 1, qgrant_task, &q));
  su_join(rt, t);
  CHECK_EQ(q.result, 0);
  CHECK_EQ(q.left, 0);
  /* A host thread's unpark is refused the same way; the park's end then
  ** makes the token stale. */
  CHECK_EQ(ums_unpark(rt, q.tok, 0), UMS_ESRCH);
  q = (qone_t){.o = &o, .deadline = UMS_FOREVER, .self_unpark = -1};
  t = su_spawn_step(rt, 0, qone_step, &q);
  su_await(&q.begun, 1);
  CHECK_EQ(ums_unpark(rt, q.tok, 0), UMS_EPERM);
  su_await_idle(rt, 0);
  CHECK(qobj_grant(&o, 0));
  su_join(rt, t);
  CHECK_EQ(q.result, 0);
  CHECK_EQ(q.left, 0);
  /* The deadline: the park leaves the queue with UMS_ETIMEDOUT. */
  q = (qone_t){.o = &o, .deadline = ums_deadline(2 * MS), .self_unpark = -1};
  su_join(rt, su_spawn_step(rt, 1, qone_step, &q));
  CHECK_EQ(q.result, UMS_ETIMEDOUT);
  CHECK_EQ(q.left, 0);
  CHECK(!qobj_grant(&o, 0));
  /* The task itself ends its park through its token (the binding's way
  ** out of a step that ends with a park begun). */
  q = (qone_t){.o = &o, .deadline = UMS_FOREVER, .self_unpark = 5};
  su_join(rt, su_spawn_step(rt, 1, qone_step, &q));
  CHECK_EQ(q.result, 5);
  CHECK_EQ(q.left, 0);
  /* A cancel ends it with UMS_ECANCELED, off the queue. */
  q = (qone_t){.o = &o, .deadline = UMS_FOREVER, .self_unpark = -1};
  t = su_spawn_step(rt, 1, qone_step, &q);
  su_await(&q.begun, 1);
  su_await_idle(rt, 1);
  CHECK_OK(ums_task_cancel(rt, t));
  su_join(rt, t);
  CHECK_EQ(q.result, UMS_ECANCELED);
  CHECK_EQ(q.left, 0);
  /* UMS_PARK_NOCANCEL: the cancel waits for the grant. */
  q = (qone_t){.o = &o, .deadline = UMS_FOREVER, .flags = UMS_PARK_NOCANCEL,
               .self_unpark = -1};
  t = su_spawn_step(rt, 1, qone_step, &q);
  su_await(&q.begun, 1);
  su_await_idle(rt, 1);
  CHECK_OK(ums_task_cancel(rt, t));
  su_await_idle(rt, 1);
  CHECK_EQ(qobj_waiters(&o), 1);
  CHECK(qobj_grant(&o, 0));
  su_join(rt, t);
  CHECK_EQ(q.result, 0);
  CHECK_EQ(q.left, 0);
  /* A C task waits for its queued park in ums_park_wait. */
  q = (qone_t){.o = &o, .deadline = UMS_FOREVER};
  t = su_spawn(rt, 1, qwait_task, &q);
  su_await(&q.begun, 1);
  su_await_idle(rt, 1);
  CHECK(qobj_grant(&o, 0));
  su_join(rt, t);
  CHECK_EQ(q.result, 0);
  CHECK_EQ(q.left, 0);
  q = (qone_t){.o = &o, .deadline = ums_deadline(2 * MS)};
  su_join(rt, su_spawn(rt, 1, qwait_task, &q));
  CHECK_EQ(q.result, UMS_ETIMEDOUT);
  CHECK_EQ(q.left, 0);
  /* Outside a task, and with a flag it does not take. */
  ums__lock(&o.lock);
  CHECK_EQ(ums__park_begin_queued(&o.wq, &o.lock, UMS_FOREVER, 0,
                                  UMS_WAIT_EVENT, &o, 0, NULL, NULL),
           UMS_EPERM);
  ums__unlock(&o.lock);
  su_watchdog_stop();
  printf("  %-44s ok\n", "queued park: grant, timeout, cancel, tokens");
}

/* Whether a race of grants against deadlines goes on after round i: to
** `rounds`, then until each outcome (granted, timed out) has come up once,
** up to RACE_ROUNDS_MAX(rounds). On a loaded machine, where either thread
** may lose its CPU for longer than a deadline again and again, one side
** can win every one of `rounds`; a race that never grants or never times
** out still ends, and fails its check. */
#define RACE_ROUNDS_MAX(rounds) ((rounds) * 20)
static bool race_more(int i, int rounds, bool granted, bool timed_out) {
  return i < rounds ||
         (!(granted && timed_out) && i < RACE_ROUNDS_MAX(rounds));
}

/* The race of a grant from another scheduler against the deadline, one
** park at a time: a step task on scheduler 0 parks on the queue with a
** deadline from now to 30 us ahead; a C task on scheduler 1 grants after
** a random spin. Exactly one may win: the grant finds the waiter if and
** only if the park's outcome is 0, the park is never left on the queue,
** and the parker is stepped once per park (a second queueing would step
** it while it is parked again: ums_park_result() == UMS_EBUSY). Both
** outcomes must come up (race_more). */
#define QRACE_ITERS_MAX RACE_ROUNDS_MAX(QRACE_ITERS)
typedef struct qrace {
  qobj_t o;
  int i, phase;          /* the parker only */
  uint64_t rng;          /* the parker only */
  _Atomic int posted;    /* parks begun */
  _Atomic int tried;     /* grants tried */
  int results[QRACE_ITERS_MAX];  /* the parker writes */
  char granted[QRACE_ITERS_MAX]; /* the granter writes */
  bool got_grant, got_timeout;   /* the parker: outcomes seen so far */
  _Atomic int done;              /* the parker has made its last park */
  _Atomic int left;      /* parks that found a waiter left on the queue */
} qrace_t;

static uint64_t qrng(uint64_t *s) {
  uint64_t x = *s ? *s : 0x9e3779b97f4a7c15u;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

static void qspin(int64_t ns) {
  int64_t until = ums_now() + ns;
  while (ums_now() < until) {
  }
}

static int qrace_parker(void *arg) {
  qrace_t *r = arg;
  if (r->phase == 1) {
    int res = ums_park_result();
    CHECK(res != UMS_EBUSY);
    if (qobj_waiters(&r->o)) atomic_fetch_add(&r->left, 1);
    r->results[r->i] = res;
    if (res == 0) r->got_grant = true;
    if (res == UMS_ETIMEDOUT) r->got_timeout = true;
    r->phase = 2;
  }
  if (r->phase == 2) {
    /* The granter must be done with this park before the next begins. */
    if (atomic_load(&r->tried) <= r->i) return UMS_STEP_YIELD;
    r->i++;
    r->phase = 0;
  }
  if (!race_more(r->i, QRACE_ITERS, r->got_grant, r->got_timeout)) {
    atomic_store(&r->done, 1);
    ums_step_set_result(NULL, 0);
    return UMS_STEP_DONE;
  }
  int64_t dl = ums_now() + (int64_t)(qrng(&r->rng) % 30000);
  ums__lock(&r->o.lock);
  CHECK_OK(ums__park_begin_queued(&r->o.wq, &r->o.lock, dl, 0,
                                  UMS_WAIT_MUTEX, &r->o, 0, NULL, NULL));
  ums__unlock(&r->o.lock);
  r->phase = 1;
  atomic_store(&r->posted, r->i + 1);
  return UMS_STEP_PARK;
}

static void *qrace_granter(void *arg) {
  qrace_t *r = arg;
  uint64_t rng = 77;
  for (int i = 0;; i++) {
    while (atomic_load(&r->posted) <= i) {
      if (atomic_load(&r->done)) return NULL;
      CHECK_OK(ums_yield());
    }
    qspin((int64_t)(qrng(&rng) % 40000));
    r->granted[i] = qobj_grant(&r->o, 0);
    atomic_store(&r->tried, i + 1);
  }
  return NULL;
}

static void queued_park_grant_timeout_race(void) {
  int64_t t0 = ums_now();
  qrace_t *r = calloc(1, sizeof *r);
  CHECK(r != NULL);
  r->rng = 12345;
  su_watchdog_start("queued park: grant/timeout race", 120);
  ums_task_t p = su_spawn_step(rt, 0, qrace_parker, r);
  su_join(rt, su_spawn(rt, 1, qrace_granter, r));
  su_join(rt, p);
  su_watchdog_stop();
  int won = 0, timed_out = 0;
  for (int i = 0; i < r->i; i++) {
    if (r->granted[i] && r->results[i] == 0)
      won++;
    else if (!r->granted[i] && r->results[i] == UMS_ETIMEDOUT)
      timed_out++;
    else {
      fprintf(stderr, "park %d: granted %d, outcome %d (%s)\n", i,
              r->granted[i], r->results[i], su_name(r->results[i]));
      exit(1);
    }
  }
  CHECK_EQ(atomic_load(&r->left), 0);
  CHECK(won > 0 && timed_out > 0);
  printf("  %-44s ok (%.1f ms; %d granted, %d timed out)\n",
         "queued park: grant races the deadline",
         (double)(ums_now() - t0) / 1e6, won, timed_out);
  free(r);
}

/* The race of a grant against a cancel: many step tasks of scheduler 0
** park on one queue for ever; a task of scheduler 1 grants them one by one
** while this host thread cancels them all. Each park ends exactly once:
** as many parks were granted as grants found a waiter, the rest were
** cancelled, and the queue is empty at the end. */
typedef struct qcancel {
  qobj_t *o;
  int phase;
  _Atomic int *begun;
  int result;
} qcancel_t;

static int qcancel_step(void *arg) {
  qcancel_t *c = arg;
  if (c->phase == 0) {
    ums__lock(&c->o->lock);
    int r = ums__park_begin_queued(&c->o->wq, &c->o->lock, UMS_FOREVER, 0,
                                   UMS_WAIT_SEMAPHORE, c->o, 0, NULL, NULL);
    ums__unlock(&c->o->lock);
    atomic_fetch_add(c->begun, 1);
    if (r) {  /* cancelled before it began */
      c->result = r;
      ums_step_set_result(NULL, 0);
      return UMS_STEP_DONE;
    }
    c->phase = 1;
    return UMS_STEP_PARK;
  }
  c->result = ums_park_result();
  ums_step_set_result(NULL, 0);
  return UMS_STEP_DONE;
}

static qobj_t qc_obj;
static _Atomic int qc_begun, qc_grants, qc_stop;

static void *qcancel_granter(void *unused) {
  uint64_t rng = 9;
  while (!atomic_load(&qc_stop) || qobj_waiters(&qc_obj)) {
    qspin((int64_t)(qrng(&rng) % 10000));
    if (qobj_grant(&qc_obj, 0))
      atomic_fetch_add(&qc_grants, 1);
    else
      CHECK_OK(ums_yield());
  }
  return NULL;
}

/* One round: returns through *granted and *cancelled how the parks
** ended. */
static void qcancel_round(uint64_t seed, int *granted, int *cancelled) {
  qcancel_t *c = calloc(QCANCEL_TASKS, sizeof *c);
  ums_task_t *t = calloc(QCANCEL_TASKS, sizeof *t);
  CHECK(c && t);
  memset(&qc_obj, 0, sizeof qc_obj);
  atomic_store(&qc_begun, 0);
  atomic_store(&qc_grants, 0);
  atomic_store(&qc_stop, 0);
  ums_task_t g = su_spawn(rt, 1, qcancel_granter, NULL);
  for (int i = 0; i < QCANCEL_TASKS; i++) {
    c[i] = (qcancel_t){.o = &qc_obj, .begun = &qc_begun};
    t[i] = su_spawn_step(rt, 0, qcancel_step, &c[i]);
  }
  uint64_t rng = seed;
  for (int i = 0; i < QCANCEL_TASKS; i++) {
    if (qrng(&rng) % 4 == 0) qspin((int64_t)(qrng(&rng) % 10000));
    CHECK_OK(ums_task_cancel(rt, t[i]));
  }
  for (int i = 0; i < QCANCEL_TASKS; i++) su_join(rt, t[i]);
  atomic_store(&qc_stop, 1);
  su_join(rt, g);
  int ng = 0;
  for (int i = 0; i < QCANCEL_TASKS; i++) {
    if (c[i].result == 0) {
      ng++;
      (*granted)++;
    } else if (c[i].result == UMS_ECANCELED) {
      (*cancelled)++;
    } else {
      fprintf(stderr, "task %d: outcome %d (%s)\n", i, c[i].result,
              su_name(c[i].result));
      exit(1);
    }
  }
  CHECK_EQ(ng, atomic_load(&qc_grants));
  CHECK_EQ(qobj_waiters(&qc_obj), 0);
  free(c);
  free(t);
}

static void queued_park_grant_cancel_race(void) {
  int64_t t0 = ums_now();
  int granted = 0, cancelled = 0, rounds = 0;
  su_watchdog_start("queued park: grant/cancel race", 120);
  /* Rounds until both outcomes were seen: how the two threads interleave
  ** depends on the machine's load. */
  while (rounds < 20 && (granted == 0 || cancelled == 0))
    qcancel_round(5 + (uint64_t)rounds++, &granted, &cancelled);
  su_watchdog_stop();
  CHECK(granted > 0 && cancelled > 0);
  printf("  %-44s ok (%.1f ms; %d rounds, %d granted, %d cancelled)\n",
         "queued park: grant races a cancel", (double)(ums_now() - t0) / 1e6,
         rounds, granted, cancelled);
}

/* ====================================================================== */
/* Park-based forms (_begin/_end) driven by step tasks                     */
/* ====================================================================== */

#if defined(__SANITIZE_THREAD__)
#define PB_ITERS 300
#else
#define PB_ITERS 500
#endif

enum { PB_MUTEX, PB_SEM, PB_EVENT, PB_COND, PB_NKINDS };
static const char *const pb_name[PB_NKINDS] = {"mutex lock", "sem acquire",
                                               "event wait", "cond wait"};

/* The objects a stepper waits on, one of each kind. */
typedef struct pbobj {
  ums_mutex_t *m;
  ums_sem_t *s;
  ums_event_t *e;  /* auto reset */
  ums_cond_t *c;   /* over cm */
  ums_mutex_t *cm;
} pbobj_t;

static int pb_begin(int kind, pbobj_t *o, int64_t deadline) {
  switch (kind) {
  case PB_MUTEX: return ums_mutex_lock_begin(o->m, deadline);
  case PB_SEM: return ums_sem_acquire_begin(o->s, deadline);
  case PB_EVENT: return ums_event_wait_begin(o->e, deadline);
  default: return ums_cond_wait_begin(o->c, o->cm, deadline);
  }
}

static int pb_end(int kind, pbobj_t *o) {
  switch (kind) {
  case PB_MUTEX: return ums_mutex_lock_end(o->m);
  case PB_SEM: return ums_sem_acquire_end(o->s);
  case PB_EVENT: return ums_event_wait_end(o->e);
  default: return ums_cond_wait_end(o->c, o->cm);
  }
}

/* What a grant of each kind is: what another party does to end a wait. */
static void pb_grant(int kind, pbobj_t *o) {
  switch (kind) {
  case PB_MUTEX: CHECK_OK(ums_mutex_unlock(o->m)); break;
  case PB_SEM: CHECK_OK(ums_sem_release(o->s, 1)); break;
  case PB_EVENT: CHECK_OK(ums_event_set(o->e)); break;
  default:
    CHECK_OK(ums_mutex_lock(o->cm, UMS_FOREVER));
    CHECK_OK(ums_cond_signal(o->c));
    CHECK_OK(ums_mutex_unlock(o->cm));
    break;
  }
}

/* A step task that waits once with the park-based form and records the
** outcome: `begin` is what _begin returned, `outcome` what _end gave
** (or _begin's own result when it did not park), `steps` how many steps
** the wait took. For a cond wait it holds cm first (taking it with the
** park-based lock too) and checks that it holds it again at the end. */
typedef struct pbwait {
  int kind;
  pbobj_t *o;
  int64_t deadline;
  int64_t timeout;     /* > 0: the deadline is this far from the begin
                          call, computed in the task just before it */
  int phase;
  int begin, outcome, steps;
  _Atomic int parked;  /* set once the park is begun */
} pbwait_t;

static int pbwait_step(void *arg) {
  pbwait_t *w = arg;
  w->steps++;
  int r;
  switch (w->phase) {
  case 0:
    if (w->kind == PB_COND) {
      r = ums_mutex_lock_begin(w->o->cm, UMS_FOREVER);
      CHECK(r == 0 || r == 1);
      w->phase = 1;
      if (r == 1) return UMS_STEP_PARK;
      /* fall through */
    } else {
      w->phase = 1;
    }
    /* fall through */
  case 1:
    if (w->kind == PB_COND && w->steps > 1 && w->begin == 0)
      CHECK_OK(ums_mutex_lock_end(w->o->cm));
    if (w->timeout > 0) w->deadline = ums_deadline(w->timeout);
    w->begin = r = pb_begin(w->kind, w->o, w->deadline);
    w->phase = 2;
    if (r == 1) {
      /* The task is a waiter now: a second park cannot begin. */
      CHECK_EQ(ums_park_begin(UMS_FOREVER, NULL), UMS_EBUSY);
      CHECK_EQ(pb_end(w->kind, w->o), UMS_EBUSY);
      atomic_store(&w->parked, 1);
      return UMS_STEP_PARK;
    }
    w->outcome = r;
    break;
  case 2:
    r = pb_end(w->kind, w->o);
    if (r == 1) {
      CHECK_EQ(w->kind, PB_COND);  /* the re-lock of the mutex */
      return UMS_STEP_PARK;
    }
    w->outcome = r;
    break;
  }
  if (w->kind == PB_COND) {
    CHECK_EQ(ums_mutex_trylock(w->o->cm), UMS_EBUSY);
    CHECK_OK(ums_mutex_unlock(w->o->cm)); /* ours again */
  }
  if (w->kind == PB_MUTEX && w->outcome == 0)
    CHECK_OK(ums_mutex_unlock(w->o->m));
  ums_step_set_result(NULL, 0);
  return UMS_STEP_DONE;
}

static void pbobj_init(pbobj_t *o) {
  o->m = ums_mutex_new();
  o->s = ums_sem_new(0);
  o->e = ums_event_new(0, 0);
  o->c = ums_cond_new();
  o->cm = ums_mutex_new();
  CHECK(o->m && o->s && o->e && o->c && o->cm);
}

static void pbobj_free(pbobj_t *o) {
  CHECK_OK(ums_mutex_delete(o->m));
  CHECK_OK(ums_sem_delete(o->s));
  CHECK_OK(ums_event_delete(o->e));
  CHECK_OK(ums_cond_delete(o->c));
  CHECK_OK(ums_mutex_delete(o->cm));
}

/* Makes the object of `kind` unavailable for a waiter (the mutex held by
** this host thread; the others are unavailable as made). */
static void pb_hold(int kind, pbobj_t *o) {
  if (kind == PB_MUTEX) CHECK_OK(ums_mutex_lock(o->m, UMS_FOREVER));
}

/* Granted from another scheduler, a host thread, timed out, cancelled,
** and taken at once, for each kind. */
static void *pb_grant_task(void *arg) {
  pbwait_t *w = arg;
  su_await(&w->parked, 1);
  su_await_idle(rt, 0);
  pb_grant(w->kind, w->o);
  return NULL;
}

static void begin_end_basic(void) {
  su_watchdog_start("park-based forms: basic", 60);
  for (int kind = 0; kind < PB_NKINDS; kind++) {
    pbobj_t o;
    pbobj_init(&o);
    /* Granted by a task of scheduler 1 (the mutex: the unlock is the
    ** holder's, a task of scheduler 1). */
    pbwait_t w = {.kind = kind, .o = &o, .deadline = UMS_FOREVER};
    if (kind == PB_MUTEX) {
      CHECK_OK(ums_mutex_lock(o.m, UMS_FOREVER)); /* the host holds it */
      ums_task_t t = su_spawn_step(rt, 0, pbwait_step, &w);
      su_await(&w.parked, 1);
      su_await_idle(rt, 0);
      CHECK_OK(ums_mutex_unlock(o.m)); /* handed straight to the task */
      su_join(rt, t);
    } else {
      ums_task_t t = su_spawn_step(rt, 0, pbwait_step, &w);
      su_join(rt, su_spawn(rt, 1, pb_grant_task, &w));
      su_join(rt, t);
    }
    CHECK_EQ(w.begin, 1);
    CHECK_EQ(w.outcome, 0);
    /* The deadline. */
    pb_hold(kind, &o);
    /* The deadline is taken in the task: one taken here may pass before
    ** a loaded machine first runs the task, and its begin then answers
    ** UMS_ETIMEDOUT at once instead of parking. */
    w = (pbwait_t){.kind = kind, .o = &o, .timeout = 2 * MS};
    su_join(rt, su_spawn_step(rt, 1, pbwait_step, &w));
    CHECK_EQ(w.begin, 1);
    CHECK_EQ(w.outcome, UMS_ETIMEDOUT);
    /* A cancel. */
    w = (pbwait_t){.kind = kind, .o = &o, .deadline = UMS_FOREVER};
    ums_task_t t = su_spawn_step(rt, 1, pbwait_step, &w);
    su_await(&w.parked, 1);
    su_await_idle(rt, 1);
    CHECK_OK(ums_task_cancel(rt, t));
    su_join(rt, t);
    CHECK_EQ(w.begin, 1);
    CHECK_EQ(w.outcome, UMS_ECANCELED);
    /* A poll (a deadline that has passed) does not park, except a cond
    ** wait, which lets the mutex go and takes it back. */
    w = (pbwait_t){.kind = kind, .o = &o, .deadline = ums_now() - MS};
    su_join(rt, su_spawn_step(rt, 1, pbwait_step, &w));
    CHECK_EQ(w.begin, kind == PB_COND ? 1 : UMS_ETIMEDOUT);
    CHECK_EQ(w.outcome, UMS_ETIMEDOUT);
    if (kind == PB_MUTEX) CHECK_OK(ums_mutex_unlock(o.m));
    /* Available at once: no park. */
    if (kind != PB_COND) {
      if (kind == PB_SEM) CHECK_OK(ums_sem_release(o.s, 1));
      if (kind == PB_EVENT) CHECK_OK(ums_event_set(o.e));
      w = (pbwait_t){.kind = kind, .o = &o, .deadline = UMS_FOREVER};
      su_join(rt, su_spawn_step(rt, 1, pbwait_step, &w));
      CHECK_EQ(w.begin, 0);
      CHECK_EQ(w.outcome, 0);
      CHECK_EQ(w.steps, 1);
    }
    /* Outside a task: a wait that would park cannot begin. */
    pb_hold(kind, &o);
    if (kind == PB_SEM || kind == PB_EVENT)
      CHECK_EQ(pb_begin(kind, &o, UMS_FOREVER), UMS_EPERM);
    if (kind == PB_MUTEX) {
      CHECK_EQ(ums_mutex_lock_begin(o.m, UMS_FOREVER), UMS_EDEADLK);
      CHECK_OK(ums_mutex_unlock(o.m));
    }
    /* _end with no such wait. */
    CHECK_EQ(pb_end(kind, &o), UMS_EPERM);
    pbobj_free(&o);
  }
  CHECK_EQ(ums_mutex_lock_begin(NULL, 0), UMS_EINVAL);
  CHECK_EQ(ums_cond_wait_begin(NULL, NULL, 0), UMS_EINVAL);
  su_watchdog_stop();
  printf("  %-44s ok\n", "park-based forms: grant, timeout, cancel, poll");
}

/* Mutual exclusion with both forms mixed: step tasks of two schedulers
** (park-based lock) and C tasks (blocking lock) increment a counter under
** one mutex; a lost handoff hangs, a double grant loses increments. */
typedef struct pbmx {
  ums_mutex_t *m;
  long *counter;
  int left, phase;
} pbmx_t;

static int pbmx_step(void *arg) {
  pbmx_t *x = arg;
  for (;;) {
    if (x->phase == 1) {
      CHECK_OK(ums_mutex_lock_end(x->m));
    } else {
      if (x->left == 0) {
        ums_step_set_result(NULL, 0);
        return UMS_STEP_DONE;
      }
      int r = ums_mutex_lock_begin(x->m, UMS_FOREVER);
      if (r == 1) {
        x->phase = 1;
        return UMS_STEP_PARK;
      }
      CHECK_OK(r);
    }
    x->phase = 0;
    long v = *x->counter;
    if (x->left % 3 == 0) {
      /* Hold it across a pass of the scheduler sometimes. */
      *x->counter = v + 1;
      x->left--;
      CHECK_OK(ums_mutex_unlock(x->m));
      return UMS_STEP_YIELD;
    }
    *x->counter = v + 1;
    x->left--;
    CHECK_OK(ums_mutex_unlock(x->m));
  }
}

static ums_mutex_t *pbmx_m;
static long pbmx_counter;

static void *pbmx_blocking(void *arg) {
  int n = (int)(intptr_t)arg;
  for (int i = 0; i < n; i++) {
    CHECK_OK(ums_mutex_lock(pbmx_m, UMS_FOREVER));
    pbmx_counter++;
    if (i % 7 == 0) CHECK_OK(ums_yield());
    CHECK_OK(ums_mutex_unlock(pbmx_m));
  }
  return NULL;
}

static void begin_end_mutex_exclusion(void) {
  int64_t t0 = ums_now();
  su_watchdog_start("park-based forms: mutex exclusion", 120);
  pbmx_m = ums_mutex_new();
  pbmx_counter = 0;
  pbmx_t x[4];
  ums_task_t t[6];
  for (int i = 0; i < 4; i++) {
    x[i] = (pbmx_t){.m = pbmx_m, .counter = &pbmx_counter,
                    .left = PB_ITERS / 4};
    t[i] = su_spawn_step(rt, i % 2, pbmx_step, &x[i]);
  }
  t[4] = su_spawn(rt, 0, pbmx_blocking, (void *)(intptr_t)(PB_ITERS / 4));
  t[5] = su_spawn(rt, 1, pbmx_blocking, (void *)(intptr_t)(PB_ITERS / 4));
  for (int i = 0; i < 6; i++) su_join(rt, t[i]);
  CHECK_EQ(pbmx_counter, 6 * (PB_ITERS / 4));
  CHECK_OK(ums_mutex_delete(pbmx_m));
  su_watchdog_stop();
  printf("  %-44s ok (%.1f ms)\n", "park-based forms: mutex, two schedulers",
         (double)(ums_now() - t0) / 1e6);
}

/* The race of a grant from another scheduler against the deadline and a
** cancel, for each kind: a step task of scheduler 0 waits with a deadline
** from now to 30 us ahead; a C task of scheduler 1 grants after a random
** spin. A grant that found the waiter must be the wait's outcome (0), a
** grant that found none must stay with the object (the next wait takes
** it at once, or, for a cond signal, is lost: a cond keeps no signal),
** and nothing is granted twice. Both outcomes must come up (race_more).
*/
typedef struct pbrace {
  int kind;
  pbobj_t o;
  pbwait_t w;            /* the current wait; the parker writes */
  int i;                 /* the parker only */
  uint64_t rng;          /* the parker only */
  _Atomic int posted;    /* waits begun */
  _Atomic int tried;     /* grants made */
  _Atomic int taken;     /* mutex: waits the granter holds it for */
  _Atomic int done;      /* the parker has made its last wait */
  int granted_at_once, granted, timed_out;  /* the parker writes */
} pbrace_t;

static void *pbrace_granter(void *arg) {
  pbrace_t *r = arg;
  uint64_t rng = 31;
  if (r->kind == PB_MUTEX) {
    /* The mutex is held by this task whenever a wait begins; its unlock
    ** is the grant. */
    CHECK_OK(ums_mutex_lock(r->o.m, UMS_FOREVER));
    atomic_store(&r->taken, 1);
  }
  for (int i = 0;; i++) {
    while (atomic_load(&r->posted) <= i) {
      if (atomic_load(&r->done)) {
        /* Held for a wait that never came. */
        if (r->kind == PB_MUTEX) CHECK_OK(ums_mutex_unlock(r->o.m));
        return NULL;
      }
      CHECK_OK(ums_yield());
    }
    qspin((int64_t)(qrng(&rng) % 40000));
    pb_grant(r->kind, &r->o);
    atomic_store(&r->tried, i + 1);
    if (r->kind == PB_MUTEX) {
      CHECK_OK(ums_mutex_lock(r->o.m, UMS_FOREVER));
      atomic_store(&r->taken, i + 2);
    }
  }
}

static int pbrace_parker(void *arg) {
  pbrace_t *r = arg;
  pbwait_t *w = &r->w;
  if (w->phase == 2) {
    int st = pbwait_step(w);
    if (st != UMS_STEP_DONE) return st;
    if (w->outcome == 0)
      r->granted++;
    else if (w->outcome == UMS_ETIMEDOUT)
      r->timed_out++;
    else
      CHECK_EQ(w->outcome, 0);
    w->phase = 3;
  }
  if (w->phase == 3) {
    /* The granter must be done with this wait before the next begins. */
    if (atomic_load(&r->tried) <= r->i) return UMS_STEP_YIELD;
    /* A grant that found no waiter stays with the object: take it now,
    ** so that the next wait starts from an unavailable object. */
    if (r->kind == PB_SEM && ums_sem_tryacquire(r->o.s) == 0)
      r->granted_at_once++;
    if (r->kind == PB_EVENT && ums_event_wait_begin(r->o.e, 0) == 0)
      r->granted_at_once++;
    r->i++;
    w->phase = 4;
  }
  if (!race_more(r->i, PB_ITERS, r->granted > 0, r->timed_out > 0)) {
    atomic_store(&r->done, 1);
    ums_step_set_result(NULL, 0);
    return UMS_STEP_DONE;
  }
  if (r->kind == PB_MUTEX && atomic_load(&r->taken) <= r->i)
    return UMS_STEP_YIELD;
  int64_t dl = ums_now() + (int64_t)(qrng(&r->rng) % 30000);
  *w = (pbwait_t){.kind = r->kind, .o = &r->o, .deadline = dl, .phase = 1};
  if (r->kind == PB_COND) CHECK_OK(ums_mutex_trylock(r->o.cm));
  int st = pbwait_step(w);
  atomic_store(&r->posted, r->i + 1);
  if (st == UMS_STEP_DONE) {
    /* Not parked: only a deadline that passed at once does that here. */
    CHECK_EQ(w->outcome, UMS_ETIMEDOUT);
    r->timed_out++;
    w->phase = 3;
    return UMS_STEP_YIELD;
  }
  return st;
}

static void begin_end_races(void) {
  for (int kind = 0; kind < PB_NKINDS; kind++) {
    int64_t t0 = ums_now();
    su_watchdog_start(pb_name[kind], 180);
    pbrace_t *r = calloc(1, sizeof *r);
    CHECK(r != NULL);
    r->kind = kind;
    r->rng = 1000 + (uint64_t)kind;
    pbobj_init(&r->o);
    ums_task_t g = su_spawn(rt, 1, pbrace_granter, r);
    ums_task_t p = su_spawn_step(rt, 0, pbrace_parker, r);
    su_join(rt, p);
    su_join(rt, g);
    su_watchdog_stop();
    CHECK_EQ(r->granted + r->timed_out, r->i);
    CHECK(r->granted > 0 && r->timed_out > 0);
    if (kind == PB_SEM || kind == PB_EVENT)
      CHECK_EQ(r->granted + r->granted_at_once, r->i);
    CHECK_EQ(ums_sem_value(r->o.s), 0);
    CHECK_EQ(ums_mutex_is_locked(r->o.m), 0);
    CHECK_EQ(ums_mutex_is_locked(r->o.cm), 0);
    pbobj_free(&r->o);
    printf("  park-based %-33s ok (%.1f ms; %d granted, %d timed out)\n",
           pb_name[kind], (double)(ums_now() - t0) / 1e6, r->granted,
           r->timed_out);
    free(r);
  }
}

/* ====================================================================== */

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("test_sync_park: 4 schedulers\n");
  rt = su_runtime(4, 0);
  queued_park_basic();
  queued_park_grant_timeout_race();
  queued_park_grant_cancel_race();
  begin_end_basic();
  begin_end_mutex_exclusion();
  begin_end_races();
  su_teardown(rt);
  printf("test_sync_park: ok\n");
  return 0;
}
