/*
** lwaitq.h: the wait queues of one VM (a channel's sides, a stream's
** lock, a task's joiners, and through core.waitq (lwaitq.c) the standard
** library's mutex, semaphore, event, condition variable, wait group, group
** and work queue): FIFOs of parked tasks, each waiter an lwait.
**
** The protocol, the one every queue of a VM follows:
**   * all tasks of a VM run on its one scheduler thread, and the code
**     between two waits runs as one atomic step, so a queue has no lock;
**   * a waiter begins its park (which raises, with nothing queued, for a
**     cancelled task), pushes its lwait and parks, with nothing between
**     that can yield or be preempted (lpark_task.begun);
**   * a waker takes the first waiter off and unparks it (lums_q_wake,
**     lpark.h); a failed unpark means that park already ended (timed
**     out, cancelled), so that waiter was stale and the next is tried.
**     Exactly one of waker, timer and cancel ends a park: the runtime's
**     unpark decides;
**   * a waiter whose park ended otherwise (timeout, cancel, deadlock
**     break, another select case) unlinks itself when it resumes, so a
**     queue keeps no stale waiter past its task's next step.
** A task waits on one thing at a time, so its own lwait (ltask.wait)
** serves every plain wait and waiting allocates nothing; only a select,
** which waits on several, has an array of them (lchan.c).
*/
#ifndef LWAITQ_H
#define LWAITQ_H

#include "lums.h"
#include "ums-list.h"

typedef struct lwait lwait;

/* A FIFO of waiters; its owner (a channel, a stream, a joined task, a
** core.waitq userdata) keeps it, and a queued waiter's task keeps that
** owner alive (its waiting frame holds it). */
typedef struct lwaitq {
  ums_list_t list;       /* of lwait.link, FIFO */
} lwaitq;

/* A task waiting on one queue: a channel operation (one per select
** case), a stream's lock, or the end of a task it joins. It lives
** in the waiting task (ltask.wait) or, for select, in a userdata on the
** waiting thread's stack, so it outlives the yield. A waker unlinks it
** and unparks its task with outcome kase * 2 + status; a waiter whose park
** ended otherwise unlinks it when it resumes. All fields are the
** scheduler thread's. */
struct lwait {
  ums_link_t link;       /* on q's list */
  lwaitq *q;             /* the queue it is on; NULL once off */
  ltask *task;           /* the waiting task */
  ums_park_token_t tok;  /* its park */
  lua_State *L;          /* a channel wait's Lua thread: a send's value is at
                            index vidx of its stack; a receive gets its
                            value pushed on it, above the waiting frame */
  int vidx;
  int kase;              /* 0, or the select case (1-based) */
  int64_t deadline;      /* a stream lock's wait: when the call gives up */
};

/* Makes w a waiter on no queue: for a task record about to run another
** task. */
static inline void lums_wait_reset(lwait *w) {
  w->q = NULL;
  w->link.prev = w->link.next = NULL;
}

/* Appends w to q. */
static inline void lums_q_push(lwaitq *q, lwait *w) {
  w->q = q;
  ums_list_push_back(&q->list, &w->link);
}

/* The first waiter of q, or NULL. */
static inline lwait *lums_q_first(const lwaitq *q) {
  return UMS_LIST_ENTRY(q->list.head, lwait, link);
}

/* Takes w off its queue, if it is on one. */
static inline void lums_q_unlink(lwait *w) {
  lwaitq *q = w->q;
  if (!q) return;
  ums_list_remove(&q->list, &w->link);
  w->q = NULL;
}

/* The number of waiters on q, stale ones included. */
static inline int lums_q_len(const lwaitq *q) {
  int n = 0;
  for (const ums_link_t *l = q->list.head; l; l = l->next) n++;
  return n;
}

#endif
