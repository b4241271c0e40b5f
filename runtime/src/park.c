/*
** park.c: step tasks' parking, and ums_park_* for C tasks.
**
** Each task embeds one park waiter (t->park) guarded by t->lock. It sits
** on no queue: ums_unpark, the task's timer and a cancellation all take
** t->lock and race for the same state word, so exactly one ends the park
** (the protocol of wait.c). The winner makes the task runnable exactly
** once; the task's own side only ever parks it, never queues it, which is
** what keeps a step that was unparked before it returned from being run
** twice.
**
** Only ending a park takes the lock. Beginning one and parking after a
** step do not: they run on the task's own thread, where the timer and
** the delivery of a cancel run too, so the only party they can race with
** is another thread's ums_unpark, and the comments at
** ums_park_begin_wait and ums__park_after_step say why that race is
** harmless. A channel message between two tasks of one scheduler thus
** costs one uncontended lock instead of three.
**
** A queued park (ums__park_begin_queued) is a wait on an object's queue
** (a mutex, a semaphore, a channel): t->park itself sits on the object's
** ums__wq_t, with w->lock the object's lock and not t->lock, so the
** object's granters end it with ums__wq_grant_first/_all like any other
** waiter of wait.c, and the task's timer and cancel (ums__waiter_abort)
** take the object's lock too. Its token carries UMS__PARK_SEQ_QUEUED;
** ums_unpark, which holds t->lock, could not order itself with a granter,
** so it refuses that token (UMS_EPERM) except from the task itself on its
** own thread, which takes the object's lock like a timer would (the
** binding ends a park its step left begun that way). The outcome the
** task reads is the granter's (0: granted; ums_park_result), the
** timer's or the cancel's.
**
** A local park (UMS_PARK_LOCAL) is ended without the lock at all. Its
** token stays on the task's scheduler thread, and so does everything
** else that may end it: the task's timer, its cancel (delivered on that
** thread, sched.c drain_cancels) and a step that ends with the park
** begun (the binding unparks it itself). Those run one at a time, so
** the state needs no lock between them. Another thread may still hold a
** stale token of an earlier park, or be handed the current one by
** mistake: its ums_unpark reads the state, id and sequence (atomics)
** and never writes, because a stale sequence cannot match and a local
** token's own bit makes it refuse the current one (UMS_EPERM). A lock
** held by such a reader orders nothing the local end needs.
*/
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

int ums_park_begin(int64_t deadline, ums_park_token_t *token) {
  return ums_park_begin_ex(deadline, 0, token);
}

int ums_park_begin_ex(int64_t deadline, int flags, ums_park_token_t *token) {
  return ums_park_begin_wait(deadline, flags, UMS_WAIT_PARK, NULL, 0, token);
}

int ums__park_may_begin(const ums__task_t *t, int flags) {
  if (t->park_pending) return UMS_EBUSY;
  /* A step task's last step runs on a stack that is not its own. */
  if (UMS__UNLIKELY(t->start_err)) return t->start_err;
  if (!(flags & UMS_PARK_NOCANCEL) &&
      atomic_load_explicit(&t->cancelled, memory_order_relaxed))
    return UMS_ECANCELED;
  return 0;
}

/* Begins t's park with the sequence bits `kind` (UMS__PARK_SEQ_LOCAL or
** UMS__PARK_SEQ_QUEUED, or none) on queue q under lock (a plain park: no
** queue, t->lock). */
static int park_begin(ums__task_t *t, int64_t deadline, int flags, int type,
                      const void *object, ums_task_t blocker, uint64_t kind,
                      ums__wq_t *q, ums__lock_t *lock,
                      ums_park_token_t *token) {
  if (type <= UMS_WAIT_NONE || type >= UMS_WAIT_NTYPES) return UMS_EINVAL;
  int rc = ums__park_may_begin(t, flags);
  if (rc) return rc;
  bool nocancel = (flags & UMS_PARK_NOCANCEL) != 0;
  /* No lock: the previous park has ended (the task would not be running
  ** otherwise), and nobody changes an ended park. Other threads only look
  ** at it, under t->lock, through ums__park_is, which reads the state
  ** before the sequence; so the sequence goes first and the state that
  ** opens the park last, with release. (task was set when the task was
  ** allocated; wq and lock say which lock guards this park's state.) */
  ums__waiter_t *w = &t->park;
  w->data = NULL;
  w->aux = 0;
  w->nocancel = nocancel;
  w->type = (uint8_t)type;
  w->obj = object;
  w->blocker = blocker;
  w->wq = q;
  w->lock = lock;
  uint64_t seq =
      ((atomic_load_explicit(&t->park_seq, memory_order_relaxed) + 1) &
       ~(UMS__PARK_SEQ_LOCAL | UMS__PARK_SEQ_QUEUED)) |
      kind;
  atomic_store_explicit(&t->park_seq, seq, memory_order_relaxed);
  if (token) {
    token->task = atomic_load_explicit(&t->id, memory_order_relaxed);
    token->seq = seq;
  }
  atomic_store_explicit(&w->state, UMS__WAITING, memory_order_release);
  t->park_deadline = deadline;
  t->park_pending = true;
  return 0;
}

int ums_park_begin_wait(int64_t deadline, int flags, int type,
                        const void *object, ums_task_t blocker,
                        ums_park_token_t *token) {
  ums__task_t *t = ums__task_current();
  if (!t) return UMS_EPERM;
  if (flags & ~(UMS_PARK_NOCANCEL | UMS_PARK_LOCAL)) return UMS_EINVAL;
  return park_begin(t, deadline, flags, type, object, blocker,
                    (flags & UMS_PARK_LOCAL) ? UMS__PARK_SEQ_LOCAL : 0,
                    NULL, &t->lock, token);
}

int ums__park_begin_queued(ums__wq_t *q, ums__lock_t *lock, int64_t deadline,
                           int flags, int type, const void *object,
                           ums_task_t blocker, ums__waiter_t **wp,
                           ums_park_token_t *token) {
  ums__task_t *t = ums__task_current();
  if (!t) return UMS_EPERM;
  if (flags & ~UMS_PARK_NOCANCEL) return UMS_EINVAL;
  int r = park_begin(t, deadline, flags, type, object, blocker,
                     UMS__PARK_SEQ_QUEUED, q, lock, token);
  if (r) return r;
  /* On the queue with the state open: from here a granter holding lock
  ** may end the park, and the task may not have parked yet; whoever ends
  ** it queues the task, exactly as ums_unpark does for a plain park. */
  ums__wq_push(q, &t->park);
  if (wp) *wp = &t->park;
  return 0;
}

int ums__park_on(ums__wq_t *q, ums__lock_t *lock, int64_t deadline,
                 int flags, int type, const void *object, ums_task_t blocker,
                 void *data, int64_t aux, ums_park_token_t *token) {
  ums__waiter_t *w;
  int r = ums__park_begin_queued(q, lock, deadline, flags, type, object,
                                 blocker, &w, token);
  if (r == 0) {
    w->data = data;
    w->aux = aux;
  }
  ums__unlock(lock);
  return r ? r : 1;
}

int ums__park_outcome(const ums__wq_t *q, ums__waiter_t **w) {
  ums__task_t *t = ums__task_current();
  if (!t) return UMS_EPERM;
  if (t->park.wq != q) return t->park_pending ? UMS_EBUSY : UMS_EINVAL;
  uint32_t st = atomic_load_explicit(&t->park.state, memory_order_acquire);
  if (t->park_pending || st == UMS__WAITING) return UMS_EBUSY;
  if (w) *w = &t->park;
  return (int)st;
}

/* Parks the running task until its park ends. Whoever ended the park (an
** unpark that came before this call included) queued the task exactly
** once, so the task always goes through the scheduler to take that one
** wake-up; returning early would leave it queued for the next wait. */
static int park_consume(ums__task_t *t, int64_t deadline) {
  t->park_pending = false;
  /* A cancel delivered while the task was running (itself, or another
  ** task of its scheduler) left it to this wait point. */
  if (atomic_load(&t->cancelled) && !t->park.nocancel)
    ums__waiter_abort(&t->park, UMS_ECANCELED);
  ums__lock(t->park.lock);
  return ums__wait(&t->park, deadline);
}

int ums_park_wait(void) {
  ums__task_t *t = ums__task_current();
  if (!t || !t->park_pending) return UMS_EINVAL;
  return park_consume(t, t->park_deadline);
}

void ums__park_drop(ums__task_t *t) {
  ums__waiter_abort(&t->park, UMS_ECANCELED);
  t->park.nocancel = false;
  park_consume(t, UMS_FOREVER);
}

void ums__park_undo(ums__task_t *t) {
  /* Ended like any park, under the lock, so that a stale token or
  ** token_live (sched.c) sees a settled park; but the wake-up is not
  ** delivered: nobody parked, nothing must be queued. */
  ums__wake_t unused;
  ums__lock(t->park.lock);
  ums__waiter_finish(&t->park, 0, &unused);
  ums__unlock(t->park.lock);
  t->park_pending = false;
}

int ums_park_result(void) {
  ums__task_t *t = ums__task_current();
  if (!t) return UMS_EPERM;
  uint32_t st = atomic_load_explicit(&t->park.state, memory_order_acquire);
  return st == UMS__WAITING ? UMS_EBUSY : (int)st;
}

/* Queues t, whose park this thread has just ended. */
static inline void unpark_queue(ums__sched_t *cur, ums__task_t *t) {
  ums__sched_t *s = t->sched;
  if (s == cur && !s->expiring) {
    /* ums__task_ready's usual own-scheduler branch, inline. */
    ums__wait_ready(t);
    t->state = UMS__T_RUNNABLE;
    ums__sched_push_runnable(s, t);
  } else {
    ums__task_ready(t);
  }
}

/* ums_unpark of a queued park's current token (see the top of the file):
** only the task itself, on its own thread, may end it this way; its
** object's granters end it through the queue. The owner wrote the park's
** lock, so it may read it; the object's lock decides the race with a
** granter. */
static __attribute__((noinline)) int unpark_queued(ums__sched_t *cur,
                                                   ums__task_t *t,
                                                   int outcome) {
  if (!cur || cur->cur_task != t) return UMS_EPERM;
  ums__wake_t wk;
  ums__lock(t->park.lock);
  bool won = ums__waiter_finish(&t->park, outcome, &wk);
  ums__unlock(t->park.lock);
  if (!won) return UMS_ESRCH;
  ums__wake(&wk);
  return 0;
}

/* Ends t's park with outcome if token names it. The park waiter is on no
** queue and wakes a task, so this is ums__waiter_finish and ums__wake
** written out for it: the same-scheduler wake takes one lock and goes
** straight to the runnable queue. */
static inline int unpark(ums__sched_t *cur, ums__task_t *t,
                         ums_park_token_t token, int outcome) {
  ums__lock(&t->lock);
  if (!ums__park_is(t, token)) {
    ums__unlock(&t->lock);
    return UMS_ESRCH;
  }
  if (token.seq & UMS__PARK_SEQ_LOCAL) {
    /* A local park's current token, off its scheduler's thread. */
    ums__unlock(&t->lock);
    return UMS_EPERM;
  }
  if (UMS__UNLIKELY(token.seq & UMS__PARK_SEQ_QUEUED)) {
    ums__unlock(&t->lock);
    return unpark_queued(cur, t, outcome);
  }
  atomic_store_explicit(&t->park.state, (uint32_t)outcome,
                        memory_order_release);
  ums__unlock(&t->lock);
  unpark_queue(cur, t);
  return 0;
}

/* ums_unpark of a local park's token on a scheduler thread: no lock (see
** the top of the file). Only when the token is current is t alive and
** parked, so t->sched is read after that check. */
static inline int unpark_local(ums__sched_t *cur, ums__task_t *t,
                               ums_park_token_t token, int outcome) {
  if (!ums__park_is(t, token)) return UMS_ESRCH;
  if (t->sched != cur) return UMS_EPERM;
  atomic_store_explicit(&t->park.state, (uint32_t)outcome,
                        memory_order_release);
  unpark_queue(cur, t);
  return 0;
}

/* ums_unpark from a thread that is not one of rt's schedulers: bracketed,
** so that rt outlives the call. */
static __attribute__((noinline)) int unpark_ext(ums_runtime_t *rt,
                                                ums_park_token_t token,
                                                int outcome) {
  if (!rt || outcome < 0) return UMS_EINVAL;
  ums__rt_enter(rt);
  ums__task_t *t = ums__task_lookup(rt, token.task);
  int r = t ? unpark(ums__sched_current(), t, token, outcome) : UMS_ESRCH;
  ums__rt_leave(rt);
  return r;
}

/* ums_unpark of a park that is not local, on one of rt's threads. */
static __attribute__((noinline)) int unpark_own(ums__sched_t *cur,
                                                ums_park_token_t token,
                                                int outcome) {
  ums__task_t *t = ums__task_lookup(cur->rt, token.task);
  return t ? unpark(cur, t, token, outcome) : UMS_ESRCH;
}

int ums_unpark(ums_runtime_t *rt, ums_park_token_t token, int outcome) {
  ums__sched_t *cur = ums__sched_current();
  /* One of rt's own threads (a task, the usual case) needs no bracket
  ** (ums__rt_enter_ext). The other ways are out of line, which keeps
  ** this one (a channel's) free of their register saves. */
  if (UMS__LIKELY(cur && cur->rt == rt && outcome >= 0)) {
    if (UMS__LIKELY(token.seq & UMS__PARK_SEQ_LOCAL)) {
      ums__task_t *t = ums__task_lookup(rt, token.task);
      return t ? unpark_local(cur, t, token, outcome) : UMS_ESRCH;
    }
    return unpark_own(cur, token, outcome);
  }
  return unpark_ext(rt, token, outcome);
}

/* No lock on the way in: until the task is parked, only other threads'
** unparks can end its park (under t->lock; the owner's own timer and
** cancel delivery run on this thread), and a winner queues the task
** itself. If one wins between the load below and the stores after it,
** the task is queued while its record says parked: t->wait and the timer
** are dropped when it runs (run_step), and a timer or cancel that comes
** first finds the park ended. */
void ums__park_after_step(ums__sched_t *s, ums__task_t *t) {
  t->park_pending = false;
  if (atomic_load_explicit(&t->park.state, memory_order_acquire) !=
      UMS__WAITING)
    return; /* the park already ended and its winner queued the task */
  t->wait = &t->park;
  t->state = UMS__T_PARKED;
  ums__wait_begin(s, t, &t->park);
  /* A cancel that came while the step ran found it running and left it
  ** to the next wait point: this is it. */
  if (atomic_load(&t->cancelled) && !t->park.nocancel)
    ums__waiter_abort(&t->park, UMS_ECANCELED);
  else if (t->park_deadline != UMS_FOREVER)
    ums__wait_timer_arm(s, t, t->park_deadline);
}

void ums__step_misuse(ums__task_t *t, const char *what) {
  fprintf(stderr, "ums: step task %s: %s\n",
          t->name[0] ? t->name : "(unnamed)", what);
  abort();
}
