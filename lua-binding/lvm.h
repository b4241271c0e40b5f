/*
** lvm.h: many Lua VMs in one run (not installed). Three files share it:
**   lvm.c     one VM per scheduler, created on that scheduler's thread;
**             work submitted by value (ums.submit), placement on the
**             least-loaded scheduler, and stealing of work not started;
**   lcopy.c   values copied out of one VM into a C buffer and from there
**             into another VM, so that no VM touches another's memory;
**   lshared.c objects any VM may use (ums.shared.*): reference counted C
**             structs, one proxy userdata per VM, waits that park the task
**             and wake-ups that go through the runtime's unpark (so a task
**             of another scheduler is woken through its completion list).
** lums.c calls the lums_vms_* functions around a run; lhost.c (the C
** host API of ums-lua.h) drives the same machinery without a main VM.
*/
#ifndef LVM_H
#define LVM_H

#include "lums.h"

#include <pthread.h>

#include "ums-lua.h"

/* ====================================================================== */
/* The VMs of a run (lvm.c)                                                */
/* ====================================================================== */

/* What a run needs from the module it runs (lums.c) to make, start and
** end the VMs of its schedulers. Whoever makes the run hands it over
** (lums_vm_ops), so that lvm.c, which the module drives, does not call
** back into it. [const] */
typedef struct lums_vm_ops {
  lua_CFunction open;    /* require "ums.core" in a new VM */
  /* Installs the run's os.exit in a new VM. */
  void (*swap_os_exit)(lua_State *L, bool install);
  /* lums_run_new, lums_run_free, lums_task_start, lums_report_errors. */
  lrun *(*run_new)(lua_State *L, lvms *vms, ums_runtime_t *rt, int sched,
                   int64_t quantum);
  void (*run_free)(lua_State *L, lrun *r, bool close_vm);
  void (*task_start)(lrun *r, int nargs);
  void (*report_errors)(lua_State *L);
} lums_vm_ops;
/* lums.c's. */
LUMS_HIDDEN extern const lums_vm_ops lums_vm_ops_module;

/* Makes the run-wide state for a run on rt, on the main thread before the
** run starts: package.path, package.cpath and the init module are read
** from L (the main VM) now; ops make its other VMs (kept, not copied).
** NULL when out of memory. */
LUMS_HIDDEN lvms *lums_vms_new(lua_State *L, ums_runtime_t *rt,
                               const lums_vm_ops *ops);
/* A hosted run (lhost.c): no main VM; every scheduler's VM, scheduler 0's
** included, is made by lvm.c on its own thread, with these paths (NULL:
** Lua's defaults), init module (NULL: none) and quantum (ns, 0: none),
** and setup(L, sched, arg) called in it after require "ums" and before
** the init module (may raise; the VM then refuses its work). Any thread.
** NULL when out of memory. Closed by lums_vms_close(NULL, v). */
typedef int (*lums_vm_setup_fn)(lua_State *L, int sched, void *arg);
LUMS_HIDDEN lvms *lums_vms_new_hosted(ums_runtime_t *rt,
                                      const lums_vm_ops *ops,
                                      const char *path, const char *cpath,
                                      const char *init, int64_t quantum,
                                      lums_vm_setup_fn setup,
                                      void *setup_arg);
/* Whether v is a hosted run (no main VM, no os.exit of its own). */
LUMS_HIDDEN bool lums_vms_hosted(lvms *v);
/* Whether the run's quantum may interrupt Lua code anywhere (preempt =
** true), not only at the calls that can wait. Set before any VM is made,
** by the thread that makes v. */
LUMS_HIDDEN void lums_vms_set_preempt(lvms *v, bool on);
LUMS_HIDDEN bool lums_vms_preempt(lvms *v);
/* Records the main VM's lrun as the VM of scheduler 0. */
LUMS_HIDDEN void lums_vms_set_main(lvms *v, lrun *main);
/* The run's quantum monitor (lums_monitor_new), recorded by
** lums_vms_set_monitor before any VM is made (NULL: none). */
LUMS_HIDDEN void lums_vms_set_monitor(lvms *v, lmonitor *monitor);
LUMS_HIDDEN lmonitor *lums_vms_monitor(lvms *v);
/* Number of schedulers, and the VM of scheduler i (NULL: none yet). Any
** thread; a VM once there stays until lums_vms_close. */
LUMS_HIDDEN int lums_vms_count(lvms *v);
LUMS_HIDDEN lrun *lums_vms_at(lvms *v, int i);
/* Counts work that may still start other work: each VM with a Lua task
** not finished (lums.c holds once per VM, not per task), each request
** not started, each dispatcher. Any thread. */
LUMS_HIDDEN void lums_vms_hold(lvms *v);
LUMS_HIDDEN void lums_vms_release(lvms *v);
/* Blocks the main thread until nothing is held any more, an os.exit
** was requested or Ctrl-C came (true), or until the absolute monotonic deadline
** (false; UMS_FOREVER: none). */
LUMS_HIDDEN bool lums_vms_wait_quiet(lvms *v, int64_t deadline);
/* Whether lums_vms_wait_quiet would return true at once. */
LUMS_HIDDEN bool lums_vms_quiet(lvms *v);
/* os.exit in a task of any VM: the first request is kept; cancels the
** run's first task and ends lums_vms_wait_quiet. */
LUMS_HIDDEN void lums_vms_request_exit(lvms *v, int code, bool close);
LUMS_HIDDEN bool lums_vms_exit_requested(lvms *v, int *code, bool *close);
/* Ctrl-C (lintr.c's watcher): cancels the run as lums_vms_request_exit
** does, without an exit; ends lums_vms_wait_quiet. Any thread. */
LUMS_HIDDEN void lums_vms_interrupt(lvms *v);
/* The run is failing (its first task raised, or os.exit): requests not
** started yet are not started any more. Any thread. */
LUMS_HIDDEN void lums_vms_stop(lvms *v);
/* After ums_runtime_shutdown (no scheduler thread is left): ends the
** requests never started (cancelled), reports through L's on_error the
** errors of submitted work nobody joined, closes the VMs of the other
** schedulers and frees v. L is the main VM, on the main thread. */
LUMS_HIDDEN void lums_vms_close(lua_State *L, lvms *v);
/* Task t ends for a reason of the runtime's (msg) before or while it
** runs its coroutine (fresh: it never ran): if it carries a work request,
** the request ends with that error, since the code that would have ended
** it never runs. On the task's scheduler. */
LUMS_HIDDEN void lums_vms_task_failed(ltask *t, bool fresh, const char *msg);

/* ====================================================================== */
/* Work requests (lvm.c)                                                   */
/* ====================================================================== */

typedef struct lreq lreq;

/* Copying values needs lmsg and lshared (below); the request itself is
** defined after them. */

/* ====================================================================== */
/* Copying values (lcopy.c)                                                */
/* ====================================================================== */

typedef struct lshared lshared;

/* Encoded values in C memory: no Lua object, so any thread may hold,
** move and free it. Whoever holds the pointer owns it (a request, a
** channel's buffer, a waiter) and frees it with lcopy_free. */
#define LMSG_INLINE 48
typedef struct lmsg {
  char *data;            /* the encoding: inl or malloc'ed */
  size_t len, cap;
  lshared **refs;        /* shared objects named by the values, one
                            reference each, dropped by lcopy_free */
  uint32_t nrefs, caprefs;
  int nvalues;
  uint32_t nids;         /* tables and functions in it */
  char inl[LMSG_INLINE];
} lmsg;

/* Encodes the n values from index first of L. nil, booleans, integers
** and floats (kept apart), strings, tables (nested; shared references and
** cycles kept) without metatables, Lua functions whose only upvalue is
** _ENV (as bytecode; _ENV becomes the receiving VM's globals) and shared
** objects (by reference). For anything else returns NULL, sets *bad to
** the position (0-based) of the top-level value it is in, and writes
** "<root><path>: <what it is>" into err, e.g.
** "args[2].config.callback: function with upvalues (n)". The root is
** root[i] for the i-th value, or root alone when `indexed` is false.
** Raises only for memory errors, freeing what it built. */
LUMS_HIDDEN lmsg *lcopy_encode(lua_State *L, int first, int n,
                               const char *root, bool indexed, char *err,
                               size_t errsz, int *bad);
/* Encodes the n values from index first into m (the caller's memory)
** when they are all nil, booleans, numbers or strings, and returns true;
** returns false, m untouched, for anything else. Raises only for memory
** errors, with nothing left in m. */
LUMS_HIDDEN bool lcopy_encode_scalars(lua_State *L, int first, int n,
                                      lmsg *m);
/* Pushes fresh copies of m's values onto L and returns their number. m
** is left as it was (it may be decoded again). Raises on memory errors. */
LUMS_HIDDEN int lcopy_decode(lua_State *L, const lmsg *m);
/* The same, then frees m, also when decoding raises. */
LUMS_HIDDEN int lcopy_decode_free(lua_State *L, lmsg *m);
/* The same for a message in the caller's memory: releases what m holds
** (not m itself), also when decoding raises. */
LUMS_HIDDEN int lcopy_decode_clear(lua_State *L, lmsg *m);
/* Frees m and drops its references. NULL is ignored. Any thread. */
LUMS_HIDDEN void lcopy_free(lmsg *m);
/* Releases what m holds (its data and references), not m itself: for a
** message in the caller's memory. Any thread. */
LUMS_HIDDEN void lcopy_clear(lmsg *m);
/* Moves the message src into dst (both the caller's memory): dst owns
** what src held, and src is to be forgotten, not cleared. */
LUMS_HIDDEN void lcopy_move(lmsg *dst, lmsg *src);

/* A C host's values (ums_lua_value_t, trees of nil, booleans, integers,
** floats, strings and tables) to a message, without a VM: NULL with err
** set to "<root>[i]<path>: <why>" for a bad value (an unknown type, a nil
** or NaN key) or "out of memory". Any thread. */
LUMS_HIDDEN lmsg *lcopy_from_values(const ums_lua_value_t *v, int n,
                                    const char *root, char *err,
                                    size_t errsz);
/* A message to the host's values: 0 with *out (m->nvalues values, NULL
** when none; the caller frees each and the array) or -1 with err set:
** functions and shared objects cannot reach the host, nor a table that
** contains itself. A table met twice without a cycle is copied twice.
** Any thread. */
LUMS_HIDDEN int lcopy_to_values(const lmsg *m, ums_lua_value_t **out,
                                const char *root, char *err, size_t errsz);

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

/* ---- Work requests (lvm.c) ---- */

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
  lvms *vms;             /* [const] valid while the request is not done */
  char *name;            /* [const] "module.function", or NULL */
  char *chunk;           /* [const] host: Lua source to load, or NULL */
  size_t chunklen;       /* [const] */
  char *chunkname;       /* [const] host: its name in tracebacks */
  lmsg *fn;              /* [owner: the queue, then its task] the function
                            (NULL with a name or a chunk) */
  lmsg *args;            /* [owner: the queue, then its task] */
  /* Called once by req_finish, after the outcome is stored and before
  ** the run lets go of the request, on the thread that ends it (host
  ** requests: results to the host, its callback). NULL for Lua ones. */
  void (*on_finish)(lreq *r);  /* [const] */
  /* [h.lock] */
  int state;             /* R_* */
  bool cancel_req;       /* cancel asked after it left its queue, before
                            its task began */
  bool joined;           /* somebody took the outcome */
  ums_task_t task;       /* R_RUNNING: its task */
  int sched;             /* where it runs or ran; -1 before */
  lswaitq joiners;
  /* [h.lock; const once R_DONE] */
  int outcome;           /* O_* */
  lmsg *results;         /* the results (O_OK) or the error value */
  char *traceback;
  /* [vms->lock] */
  ums_link_t qlink;      /* in vms->q[home] while queued */
  int home;              /* the queue it is in */
  bool queued;
  ums_link_t llink;      /* in vms->active or vms->failed */
};

/* Frees what a request owns (not r itself): its kind's destroy calls it. */
LUMS_HIDDEN void lums_req_clear(lreq *r);
/* Queues r, filled by its maker (rt, vms, the work, state R_QUEUED,
** sched -1) and holding its maker's reference, on scheduler target (< 0:
** the least-loaded one, here winning ties; here may be -1), and starts
** dispatchers. Takes the run's reference and hold. Returns 0, or
** UMS_ESHUTDOWN when the run is ending (r is then finished cancelled).
** Any thread. */
LUMS_HIDDEN int lums_req_queue(lvms *v, lreq *r, int target, int here);
/* Cancels r: one not started never starts (finished cancelled here, on
** the calling thread); a running one sees ums.CANCELLED at its next wait
** (or quantum). false once done. Any thread. */
LUMS_HIDDEN bool lums_req_cancel(lreq *r);

/* ums.shared.channel([size]), for lchan.c's channel{shared = true}. */
LUMS_HIDDEN int lums_shared_channel(lua_State *L);

#endif
