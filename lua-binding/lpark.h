/*
** lpark.h: parking a Lua task (lpark.c). Every wait of the binding is a
** park: lums_park_begin (or _begin_wait, saying what is waited for), then
** lums_park_finish, whose continuation reads ums_park_result(); any thread
** of the run ends a park with lums_unpark, and the owner of a wait queue
** (lwaitq.h) its waiters' parks with lums_q_wake. core.park_begin,
** park_wait, unpark, yield, sleep and run_until_idle are the Lua side
** (ltask.c).
*/
#ifndef LPARK_H
#define LPARK_H

#include "lums.h"
#include "lquantum.h"

/* Where one task stands in a park, embedded in its ltask (ltask.park).
** The waits (this header, lpark.c, ltask.c's) set it as a park begins
** and finishes; a yield that is no park (ums.yield, the quantum) clears
** parking; the step (lums.c) reads it to answer UMS_STEP_PARK and ends a
** park a step left begun; the quantum does not yield inside a begun one.
** The task's life cycle (lums.c) clears it with lpark_task_reset before
** the record runs another task. Scheduler thread. */
typedef struct lpark_task {
  bool parking;          /* a wait yielded: the step returns UMS_STEP_PARK */
  bool begun;            /* between park_begin and park_wait: the quantum
                            must not yield here */
  ums_park_token_t tok;  /* the begun park; written before it is read */
} lpark_task;

static inline void lpark_task_reset(lpark_task *p) {
  p->parking = p->begun = false;
}

/* After lpark_task, which struct ltask embeds: ltask.h includes this
** header first, for it. */
#include "ltask.h"

/* The current task, or raises "ums.<fname>: not inside a task". Inline:
** every wait starts with it. */
static inline ltask *lums_need_task(lua_State *L, const char *fname) {
  ltask *t = lums_cur_task;
  if (__builtin_expect(t != NULL && t->vmrun != NULL, 1)) return t;
  return lums_not_in_task(L, fname);
}

/* Begins a park of t (the current task) with an absolute deadline; raises
** core.CANCELLED if t was cancelled, or an error. */
LUMS_HIDDEN int lums_park_begin(lua_State *L, ltask *t, int64_t deadline,
                                int flags, ums_park_token_t *tok);
/* The result r of a park as Lua sees it (core.park_wait's): pushes the
** outcome, or nil, "timeout"; raises core.CANCELLED, or an error for a
** wait the deadlock detector ended. */
LUMS_HIDDEN int lums_push_park_result(lua_State *L, int r);
/* Raises for a park that could not begin (r from ums_park_begin_*). */
LUMS_HIDDEN int lums_park_failed(lua_State *L, int r);
/* The same as lums_park_begin, saying what the task waits for
** (ums_park_begin_wait): a UMS_WAIT_* type, the object waited on (its
** address, as tostring shows it) and the task holding it (0: none or
** unknown). Inline: it is on the path of every channel message. */
static inline int lums_park_begin_wait(lua_State *L, ltask *t,
                                       int64_t deadline, int flags,
                                       int type, const void *object,
                                       ums_task_t blocker,
                                       ums_park_token_t *tok) {
  int r = ums_park_begin_wait(deadline, flags, type, object, blocker, tok);
  if (__builtin_expect(r != 0, 0)) return lums_park_failed(L, r);
  t->park.begun = true;
  t->park.tok = *tok;
  return 0;
}
/* Whether a wait of task t, made on Lua thread L, yields to the scheduler
** (t's own coroutine, where Lua can yield) rather than blocking t's
** worker: the choice lums_park_finish makes, for callers that loop over
** several waits and must not recurse into their continuation when they
** block (lfs.c). */
LUMS_HIDDEN bool lums_can_yield(lua_State *L, ltask *t);
/* Blocks only the worker of t (the current task, whose park has begun)
** until the park ends, and returns; the caller reads ums_park_result().
** For a wait that may have to park again after its wake-up (a look that
** lost a race): where Lua cannot yield, the caller loops around this
** instead of letting lums_park_block call its continuation, which would
** park again from inside it and grow the C stack one level per wait. */
LUMS_HIDDEN void lums_park_block_wait(ltask *t);
/* lums_park_finish's other way: blocks only this task's worker
** (lums_park_block_wait), then calls k. */
LUMS_HIDDEN int lums_park_block(lua_State *L, ltask *t, lua_KContext ctx,
                                lua_KFunction k);
/* Ends the wait begun by lums_park_begin: yields to the scheduler with
** continuation k where Lua can yield (lums_can_yield), else blocks only
** this task; k then reads the outcome with ums_park_result(). Inline: it
** is on the path of every channel message. */
static inline int lums_park_finish(lua_State *L, ltask *t, lua_KContext ctx,
                                   lua_KFunction k) {
  t->park.begun = false;
  if (__builtin_expect(L == t->co, 1) && lua_isyieldable(L)) {
    t->park.parking = true;
    return lua_yieldk(L, 0, ctx, k);
  }
  return lums_park_block(L, t, ctx, k);
}
/* Ends park tok of task t with outcome: true if this call ended it, false
** if that park had already ended (timed out, cancelled, unparked).
** Inline: a channel message makes one. */
static inline bool lums_unpark(ltask *t, ums_park_token_t tok, int outcome) {
  if (!t->vmrun) return false;
  return ums_unpark(t->vmrun->rt, tok, outcome) == 0;
}

/* Ends the park of the first live waiter of q with outcome
** kase * 2 + status (status itself for every waiter but a select's) and
** returns it, off the queue; NULL when q holds no live waiter. Stale
** waiters met on the way are dropped. */
static inline lwait *lums_q_wake(lwaitq *q, int status) {
  lwait *w;
  while ((w = lums_q_first(q)) != NULL) {
    lums_q_unlink(w);
    if (lums_unpark(w->task, w->tok, w->kase * 2 + status)) return w;
  }
  return NULL;
}

/* Ends the parks of all live waiters of q (lums_q_wake), leaving
** q empty; returns how many were woken. */
static inline int lums_q_wake_all(lwaitq *q, int status) {
  int n = 0;
  while (lums_q_wake(q, status)) n++;
  return n;
}

/* The waiting half of lwaitq.h's protocol for one queue: begins t's park
** (as lums_park_begin_wait, raising with nothing queued) and queues t's
** own waiter on q. The caller sets what else its queue's owner reads in
** the waiter (w->L, w->vidx), then calls lums_park_finish. */
static inline lwait *lums_q_park_begin(lua_State *L, ltask *t, lwaitq *q,
                                       int64_t deadline, int flags,
                                       int type, const void *object,
                                       ums_task_t blocker) {
  lwait *w = &t->wait;
  lums_park_begin_wait(L, t, deadline, flags, type, object, blocker,
                       &w->tok);
  w->task = t;
  w->kase = 0;
  lums_q_push(q, w);
  return w;
}


/* Begins a park of t like lums_park_begin, but returns the runtime's
** error code (UMS_ECANCELED, ...) instead of raising: for callers that
** hold a lock they must release first. */
LUMS_HIDDEN int lums_park_try_begin(ltask *t, int64_t deadline, int flags,
                                    ums_park_token_t *tok);
/* The same, saying what the task waits for (see lums_park_begin_wait). */
LUMS_HIDDEN int lums_park_try_begin_wait(ltask *t, int64_t deadline,
                                         int flags, int type,
                                         const void *object,
                                         ums_park_token_t *tok);

/* A call whose deferred form answered at once (a socket _begin that
** returned 1: no park begun): its yield point, then continuation k takes
** the result as it would after a park. */
static inline int lums_answered_now(lua_State *L, lua_KContext ctx,
                                    lua_KFunction k) {
  LUMS_YIELD_POINT_K(L, ctx, k);
  return k(L, LUA_OK, ctx);
}

#endif
