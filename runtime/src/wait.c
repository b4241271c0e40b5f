/*
** wait.c: wait queues and the park/wake protocol shared by every
** primitive.
**
** The invariant that makes "exactly one of granted, timed out, cancelled"
** hold across threads: a waiter that sits on a queue changes state only
** while the queue's lock is held, and whoever changes it unlinks it in the
** same critical section. So a granter that finds a waiter on the queue
** always wins, and a timeout or cancel that takes the lock and finds the
** state already changed does nothing. Waits on no queue (a sleep) are
** ended only by the owner scheduler's thread (its timer or its delivery of
** a cancel), which serialises them the same way.
**
** A task parks by running the scheduler pass on its own fiber; a host
** thread parks on a futex on the waiter's state word.
**
** The steps on every message's path (queueing a waiter, ums__waiter_init,
** ums__waiter_finish, ums__wake) are inline in internal.h; this file has
** the wait itself and the rest.
*/
#include "internal.h"

#include <errno.h>

ums__waiter_t *ums__wq_grant_first(ums__wq_t *q, int outcome,
                                   ums__wake_t *wk) {
  ums__waiter_t *w;
  while ((w = ums__wq_first(q)) != NULL) {
    if (ums__waiter_finish(w, outcome, wk)) return w;
    /* Not reachable under the invariant above; unlink defensively so a
    ** broken waiter cannot wedge the queue. */
    ums__wq_remove(q, w);
  }
  return NULL;
}

void ums__wakelist_add(ums__wakelist_t *wl, const ums__wake_t *wk) {
  if (wk->task) {
    wk->task->wake_next = NULL;
    if (wl->tail)
      wl->tail->wake_next = wk->task;
    else
      wl->head = wk->task;
    wl->tail = wk->task;
  } else if (wk->futex) {
    if (wl->nfutex < UMS__WAKELIST_FUTEX)
      wl->futex[wl->nfutex++] = wk->futex;
    else
      ums__futex_wake(wk->futex, 1);
  }
}

void ums__wakelist_run(ums__wakelist_t *wl) {
  ums__task_t *t = wl->head;
  while (t) {
    /* Read the link first: once ready, t may run and park again. */
    ums__task_t *next = t->wake_next;
    ums__task_ready(t);
    t = next;
  }
  for (int i = 0; i < wl->nfutex; i++) ums__futex_wake(wl->futex[i], 1);
  ums__wakelist_init(wl);
}

void ums__wq_grant_all(ums__wq_t *q, int outcome, ums__wakelist_t *wl) {
  ums__wake_t wk;
  while (ums__wq_grant_first(q, outcome, &wk)) ums__wakelist_add(wl, &wk);
}

static bool abort_locked(ums__waiter_t *w, int outcome, ums__wake_t *wk) {
  bool won;
  if (w->lock) ums__lock(w->lock);
  won = ums__waiter_finish(w, outcome, wk);
  if (w->lock) ums__unlock(w->lock);
  return won;
}

void ums__waiter_abort(ums__waiter_t *w, int outcome) {
  ums__wake_t wk;
  if (abort_locked(w, outcome, &wk)) ums__wake(&wk);
}

/* The task's wait timer fired: its wait, if one is still on, times out. */
void ums__wait_timeout(ums__sched_t *s, ums__timer_t *tm) {
  (void)s;
  ums__task_t *t = UMS__CONTAINER_OF(tm, ums__task_t, timer);
  if (t->wait) ums__waiter_abort(t->wait, UMS_ETIMEDOUT);
}

int ums__wait(ums__waiter_t *w, int64_t deadline) {
  ums__task_t *t = w->task;
  if (t) {
    ums__sched_t *s = t->sched;
    if (deadline != UMS_FOREVER) ums__wait_timer_arm(s, t, deadline);
    t->wait = w;
    t->state = UMS__T_PARKED;
    ums__wait_begin(s, t, w);
    if (w->lock) ums__unlock(w->lock);
    ums__sched_schedule(s);
    t->wait = NULL;
    ums__wait_timer_stop(s, t);
    return (int)atomic_load_explicit(&w->state, memory_order_acquire);
  }

  /* A host thread. */
  if (w->lock) ums__unlock(w->lock);
  for (;;) {
    uint32_t st = atomic_load_explicit(&w->state, memory_order_acquire);
    if (st != UMS__WAITING) {
      /* The waker set our state inside its critical section and may not
      ** have released the lock yet; pass through it once, so that when we
      ** return (and the caller perhaps frees the object) the waker is done
      ** with the object. */
      if (w->lock) {
        ums__lock(w->lock);
        ums__unlock(w->lock);
      }
      return (int)st;
    }
    if (ums__futex_wait(&w->state, UMS__WAITING, deadline) == -ETIMEDOUT) {
      ums__wake_t wk;
      /* Either our timeout wins (no wake needed: we are the waiter) or an
      ** outcome already won and is in w->state. */
      abort_locked(w, UMS_ETIMEDOUT, &wk);
      return (int)atomic_load_explicit(&w->state, memory_order_acquire);
    }
  }
}
