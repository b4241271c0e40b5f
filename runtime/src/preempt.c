/*
** preempt.c: going preemptive. A task hands a blocking C call to the
** runtime's C-call pool (pool.c, rt->preempt_pool) and parks; the pool
** thread runs it and unparks the task, which its own scheduler then
** resumes (seed 000, "Going Preemptive").
**
** A call is a small heap record shared by two references: the caller's
** (dropped by ums_preempt_end) and the pool's (dropped when the work has
** ended). Exactly one of "returned" and "given up" decides it, with one
** CAS on state, as for file I/O requests (io.c):
**   - the pool thread, after fn returned, moves INFLIGHT -> DONE and, if
**     it won, unparks the caller; if it lost, the caller had given up and
**     the pool thread calls release(arg);
**   - the caller, once its park has ended, moves INFLIGHT -> ABANDONED:
**     if it won, its park ended by deadline or cancel and the call goes on
**     detached; if it lost, fn has returned (the unpark may still be on
**     its way, or may have lost to the deadline) and the result is 0.
** The caller looks at the state only after its park has ended, so the
** park's own exactly-one-outcome protocol (park.c) and this one never
** disagree. A pool thread that finds a call already ABANDONED before it
** starts skips fn.
*/
#include "internal.h"

#include <stdlib.h>

enum { CALL_INFLIGHT = 0, CALL_DONE = 1, CALL_ABANDONED = 2 };

struct ums_preempt_call {
  _Atomic uint32_t refs;       /* [atomic] caller + pool */
  _Atomic int state;           /* [atomic] CALL_* */
  ums_preempt_fn fn;           /* [const] */
  void *arg;                   /* [const pointer] the data: the caller's
                                  until it gives up, then release's */
  ums_preempt_fn release;      /* [const] */
  ums__sched_t *sched;         /* [const] the caller's scheduler */
  ums_park_token_t token;      /* [const once submitted] the caller's park */
  ums__pool_work_t work;       /* [pool] */
  ums_preempt_call_t *next_free; /* [owner of sched] in its call_free */
};

/* Records a scheduler keeps for its next calls. */
#define CALL_CACHE_MAX 256

static void call_unref(ums_preempt_call_t *c) {
  if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
    return;
  /* Back to its scheduler's cache when that scheduler drops the last
  ** reference (the caller, the usual case); a pool thread frees. */
  ums__sched_t *s = c->sched;
  if (ums__sched_current() == s && s->ncall_free < CALL_CACHE_MAX) {
    c->next_free = s->call_free;
    s->call_free = c;
    s->ncall_free++;
    return;
  }
  free(c);
}

void ums__preempt_cache_clear(ums__sched_t *s) {
  while (s->call_free) {
    ums_preempt_call_t *c = s->call_free;
    s->call_free = c->next_free;
    free(c);
  }
  s->ncall_free = 0;
}

/* The pool's side: runs fn unless the caller has already given up, then
** settles the call. Runs on a pool thread (or on the caller's own thread
** when the pool could not start one). */
static void call_run(ums__pool_work_t *w) {
  ums_preempt_call_t *c = UMS__CONTAINER_OF(w, ums_preempt_call_t, work);
  ums__sched_t *s = c->sched;
  if (atomic_load_explicit(&c->state, memory_order_acquire) !=
      CALL_ABANDONED)
    c->fn(c->arg);
  int expect = CALL_INFLIGHT;
  if (atomic_compare_exchange_strong(&c->state, &expect, CALL_DONE)) {
    /* Copy what the unpark needs: once our reference is gone the caller
    ** may free c. A stale token (the park already ended by its deadline)
    ** is refused, and the caller then finds DONE. The scheduler outlives
    ** this: the runtime destroys the pool before its schedulers. */
    ums_park_token_t token = c->token;
    call_unref(c);
    ums_unpark(s->rt, token, 0);
  } else {
    if (c->release) c->release(c->arg);
    call_unref(c);
  }
  /* After the unpark, so that the scheduler's idle spin (sched.c) keeps
  ** watching until the task is on its completion list. */
  atomic_fetch_sub_explicit(&s->preempt_pending, 1, memory_order_release);
}

int ums_preempt_begin(ums_preempt_fn fn, void *arg, ums_preempt_fn release,
                      int64_t deadline, ums_preempt_call_t **call) {
  int rc;
  ums__task_t *t = ums__task_current();
  ums_preempt_call_t *c = NULL;
  if (!fn || !call) {
    rc = UMS_EINVAL;
    goto fail;
  }
  if (!t) {
    rc = UMS_EPERM;
    goto fail;
  }
  ums__sched_t *s = t->sched;
  if (s->call_free) {
    c = s->call_free;
    s->call_free = c->next_free;
    s->ncall_free--;
  } else if (!(c = malloc(sizeof *c))) {
    rc = UMS_ENOMEM;
    goto fail;
  }
  if ((rc = ums_park_begin_wait(deadline, 0, UMS_WAIT_PREEMPT, NULL, 0,
                                &c->token)) != 0)
    goto fail;
  atomic_store_explicit(&c->refs, 2, memory_order_relaxed);
  atomic_store_explicit(&c->state, CALL_INFLIGHT, memory_order_relaxed);
  c->fn = fn;
  c->arg = arg;
  c->release = release;
  c->sched = s;
  c->work.run = call_run;
  atomic_fetch_add_explicit(&s->preempt_pending, 1, memory_order_relaxed);
  UMS__COUNT(s, preempt_calls);
  *call = c;
  if (ums__pool_submit(&s->rt->preempt_pool, &c->work) != 0)
    /* No pool thread at all and none can start: run it here, blocking
    ** this scheduler for its length, rather than fail a call that could
    ** be made. Its unpark then ends a park not yet waited on, which the
    ** park protocol allows. */
    call_run(&c->work);
  return 0;

fail:
  free(c);
  if (release) release(arg);
  return rc;
}

int ums_preempt_end(ums_preempt_call_t *c) {
  if (!c) return UMS_EINVAL;
  int rc = 0, expect = CALL_INFLIGHT;
  if (atomic_compare_exchange_strong(&c->state, &expect, CALL_ABANDONED)) {
    /* The park ended without the call's unpark: by its deadline or a
    ** cancellation. The call goes on detached; release frees arg. */
    rc = ums_park_result();
    if (rc >= 0) rc = UMS_ECANCELED; /* a foreign unpark: still given up */
  }
  call_unref(c);
  return rc;
}

int ums_preempt(ums_preempt_fn fn, void *arg, ums_preempt_fn release,
                int64_t deadline) {
  if (!fn) {
    if (release) release(arg);
    return UMS_EINVAL;
  }
  if (!ums__task_current()) {
    fn(arg);
    return 0;
  }
  ums_preempt_call_t *c;
  int rc = ums_preempt_begin(fn, arg, release, deadline, &c);
  if (rc) return rc;
  ums_park_wait();
  return ums_preempt_end(c);
}
