/*
** lproxy.h: objects any VM may use (ums.shared.*): reference counted C
** structs, one proxy userdata per VM (lproxy.c), waits that park the
** task and wake-ups that go through the runtime's unpark, so that a task
** of another scheduler is woken through its completion list; the kinds
** themselves are lshared.c's.
*/
#ifndef LPROXY_H
#define LPROXY_H

#include "lcopy.h"

#include <pthread.h>

/* ====================================================================== */
/* Shared objects (lproxy.c: objects and proxies; lshared.c: the kinds)    */
/* ====================================================================== */

typedef struct lshared_kind {
  const char *name;            /* __name of the proxies, "ums.shared.x" */
  void (*destroy)(lshared *o); /* the last reference is gone: free o */
  const luaL_Reg *methods;     /* methods of the proxies */
} lshared_kind;

/* The header of every shared object. refs counts the proxies (one per VM
** that has the object, however many Lua references point to it there),
** the messages that name it, and whatever else holds it; the last
** lshared_unref calls kind->destroy on whatever thread drops it. */
struct lshared {
  const lshared_kind *kind;    /* [const] */
  _Atomic uint32_t refs;       /* [atomic] */
  pthread_mutex_t lock;        /* guards the kind's own state */
};

/* Fills the header of a zeroed object made in C (no proxy): refs 1. */
LUMS_HIDDEN void lshared_init(lshared *o, const lshared_kind *k);
LUMS_HIDDEN void lshared_ref(lshared *o);
LUMS_HIDDEN void lshared_unref(lshared *o);
/* The shared object at idx of L, or NULL. */
LUMS_HIDDEN lshared *lshared_test(lua_State *L, int idx);
/* The object of kind k at idx, or raises "bad argument ... (k->name
** expected, got ...)" naming fname. */
LUMS_HIDDEN lshared *lshared_check(lua_State *L, int idx,
                                   const lshared_kind *k, const char *fname);
/* Pushes L's proxy for o: the one L already has, or a new one holding a
** reference of its own. */
LUMS_HIDDEN void lshared_push(lua_State *L, lshared *o);
/* Creates a zeroed object of `size` bytes (struct lshared first) and
** pushes its proxy, which holds its only reference. Raises when out of
** memory. */
LUMS_HIDDEN void *lshared_new(lua_State *L, size_t size,
                              const lshared_kind *k);
/* Creates kind k's proxy metatable in L's VM (each VM, at luaopen). */
LUMS_HIDDEN void lshared_register(lua_State *L, const lshared_kind *k);
/* Creates L's VM's proxy cache (each VM, at luaopen, before any proxy). */
LUMS_HIDDEN void lshared_open_proxies(lua_State *L);

/* A task waiting on a shared object. Allocated by lshared_wait_begin and
** freed by lshared_wait_end, in between reachable only through the
** object's queue (under its lock) and the waiting task's continuation
** context. A waker sets msg (a channel value handed over) before it
** unparks, under the lock, and takes it back if the unpark fails. */
typedef struct lswait lswait;
typedef struct lswaitq {
  ums_list_t list;             /* [object lock] of lswait.link, FIFO */
  _Atomic int n;               /* [object lock] to write; any thread may
                                  read it to learn whether a wake-up is
                                  needed at all (lshared.c's channel) */
} lswaitq;
struct lswait {
  ums_link_t link;             /* [object lock] on q's list */
  lswaitq *q;                  /* [object lock] its queue; NULL once off */
  lshared *obj;                /* [const] the object (a proxy on the
                                  waiting task's stack keeps it alive) */
  ums_runtime_t *rt;           /* [const] the waiting task's runtime */
  ums_park_token_t tok;        /* [const] its park */
  ums_task_t task;             /* [const] the waiting task */
  lmsg *msg;                   /* [object lock] a value handed over */
};

/* With o->lock held by the current task me: begins me's park with the
** deadline and queues a new waiter on q. On failure (cancelled, out of
** memory) releases the lock and raises. */
LUMS_HIDDEN lswait *lshared_wait_begin(lua_State *L, ltask *me, lshared *o,
                                       lswaitq *q, int64_t deadline);
/* In the continuation, once the park has ended: takes w off its queue if
** it is still on one, hands over w->msg (*msg; NULL if none), frees w and
** returns the park's outcome (>= 0 granted, UMS_ETIMEDOUT,
** UMS_ECANCELED). */
LUMS_HIDDEN int lshared_wait_end(lswait *w, lmsg **msg);
/* With the lock held: ends the park of the first waiter of q whose park
** has not ended yet with outcome and returns it (off the queue), or NULL.
** Waiters whose park ended otherwise are dropped from q on the way. If
** msg is not NULL, the granted waiter gets it in w->msg. */
LUMS_HIDDEN lswait *lshared_grant(lswaitq *q, int outcome, lmsg *msg);
/* The first waiter of q, or NULL. [object lock] */
static inline lswait *lshared_first(const lswaitq *q) {
  return UMS_LIST_ENTRY(q->list.head, lswait, link);
}
LUMS_HIDDEN void lshared_grant_all(lswaitq *q, int outcome);


/* ums.shared.channel([size]) (lshared.c), for lchan.c's
** channel{shared = true}. */
LUMS_HIDDEN int lums_shared_channel(lua_State *L);

#endif
