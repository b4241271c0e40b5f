/*
** lreq.h: work requests (lreq.c). A request is what ums.submit and a C
** host's ums_lua_submit make: a function (bytecode, a "module.function"
** name, or a host's chunk of source) and its arguments copied into C
** memory, queued as a work item of the runtime (ldisp.h), run as a task of
** the VM of the scheduler that takes it, and its outcome kept for
** whoever joins (lwork.c's handles, lhost.c).
*/
#ifndef LREQ_H
#define LREQ_H

#include "lproxy.h"

enum { R_QUEUED, R_STARTING, R_RUNNING, R_DONE };
enum { O_OK, O_ERROR, O_CANCELLED };

/* A work request. Made by ums.submit (a shared object, "ums.work", whose
** handles in any VM hold references) or by a C host (lhost.c, kind
** "ums.host.work", held by the host's handle). The run holds a reference
** while the request is not done (active list) and, for a Lua request
** that failed, until the run's end (failed list). */
struct lreq {
  lshared h;
  ums_runtime_t *rt;     /* [const] */
  lrun *run;             /* [const] valid while the request is not done */
  char *name;            /* [const] "module.function", or NULL */
  char *chunk;           /* [const] host: Lua source to load, or NULL */
  size_t chunklen;       /* [const] */
  char *chunkname;       /* [const] host: its name in tracebacks */
  lmsg *fn;              /* [owner: the queue, then its task] the function
                            (NULL with a name or a chunk) */
  lmsg *args;            /* [owner: the queue, then its task] */
  /* Called once by lums_req_finish, after the outcome is stored and
  ** before the run lets go of the request, on the thread that ends it
  ** (host requests: results to the host, its callback). NULL for Lua
  ** ones. */
  void (*on_finish)(lreq *r);  /* [const] */
  /* [h.lock] */
  int state;             /* R_* */
  bool cancel_req;       /* cancel asked after it left its queue, before
                            its task began */
  bool joined;           /* somebody took the outcome */
  ums_task_t task;       /* R_RUNNING: its task */
  int sched;             /* where it runs or ran; -1 before */
  /* [const] set (manual reset) once the request is done; its joiners
  ** wait on it. NULL for a host's request, which nobody joins. */
  ums_event_t *done;
  /* [h.lock; const once R_DONE] */
  int outcome;           /* O_* */
  lmsg *results;         /* the results (O_OK) or the error value */
  char *traceback;
  ums_work_t work;       /* [the runtime's while queued] its work item
                            (ldisp.c) */
  /* [run->reqs.lock] */
  ums_link_t llink;      /* in run->reqs.active or run->reqs.failed */
};

/* The requests of a run: embedded in it (lrun.reqs). The lock also
** guards the placement's state (ldispatch, ldisp.h). */
typedef struct lreqs {
  pthread_mutex_t lock;  /* never held while a request's own lock is
                            taken */
  ums_list_t active;     /* [lock] of lreq.llink: requests not done (one
                            reference each) */
  ums_list_t failed;     /* [lock] of lreq.llink: failed Lua requests,
                            kept for on_error at the end of the run (one
                            reference each) */
} lreqs;

#define REQ_OF_L(l) UMS_LIST_ENTRY(l, lreq, llink)

/* Frees what a request owns (not r itself): its kind's destroy calls it. */
LUMS_HIDDEN void lums_req_clear(lreq *r);
/* Ends request r with its outcome: wakes its joiners and moves it off
** the run's active list. results and tb become r's (tb is copied). Any
** thread; r's lock and the run's lock must not be held. */
LUMS_HIDDEN void lums_req_finish(lreq *r, int outcome, lmsg *results,
                                 const char *tb);
/* Ends r with an error message made here (no Lua error value). */
LUMS_HIDDEN void lums_req_fail(lreq *r, const char *msg);
/* Protected call on the VM vm (an lvmrun *) of the scheduler that takes r:
** (vm, r) -> starts r's task there. On that scheduler's thread. */
LUMS_HIDDEN int lums_req_start(lua_State *L);
/* The work request a task runs, embedded in its ltask (ltask.req).
** lreq.c owns it: it is set when the request's code begins, so that an
** end that code never sees still ends the request (lums_req_task_failed),
** and cleared when it ends; the task's life cycle (lums.c) clears it with
** lreq_task_reset before the record runs another task. Scheduler
** thread. */
typedef struct lreq_task {
  lreq *running;         /* NULL: none */
} lreq_task;

static inline void lreq_task_reset(lreq_task *q) { q->running = NULL; }

/* Task t ends for a reason of the runtime's (msg) before or while it
** runs its coroutine (fresh: it never ran): if it carries a work request,
** the request ends with that error, since the code that would have ended
** it never runs. On the task's scheduler. */
LUMS_HIDDEN void lums_req_task_failed(ltask *t, bool fresh, const char *msg);

#endif
