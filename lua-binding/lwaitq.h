/*
** lwaitq.h: the wait queues of one VM (a channel's sides, a stream's
** lock, a task's joiners): FIFOs of parked tasks, each waiter an lwait.
** The queue's owner (lchan.c, lstream.c, ltask.c) pushes, and wakes with
** lums_q_wake_first (lpark.h); a waiter unlinks itself when its park
** ended otherwise.
*/
#ifndef LWAITQ_H
#define LWAITQ_H

#include "lums.h"
#include "ums-list.h"

typedef struct lwait lwait;

/* A FIFO of waiters (one side of a channel, a stream's lock, the tasks
** joining a task). Every Lua task of a VM runs on that VM's one
** scheduler thread, so queues need no lock: the code between two waits
** runs as one atomic step. */
typedef struct lwaitq {
  ums_list_t list;       /* of lwait.link, FIFO */
} lwaitq;

/* A task waiting on one queue: a channel operation (one per select
** case), a stream's lock, or the end of a task it joins. It lives
** in the waiting task (ltask.wait) or, for select, in a userdata on the
** waiting thread's stack, so it outlives the yield. A waker unlinks it
** and unparks its task with outcome kase * 2 + status; a waiter whose park
** ended otherwise (timeout, cancel, another select case) unlinks it when
** it resumes. All fields are the scheduler thread's. */
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

#endif
