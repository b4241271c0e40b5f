/*
** lums.h: what the files of the ums.core module share (not installed).
** The structs every file reads (a task, its handle, one VM's part of a
** run); lums.c owns the task life cycle and runs. The quantum is in
** lquantum.h, parking in lpark.h, the Lua side of tasks in ltask.h,
** argument checks in largs.h; lvm.h adds the VMs of other
** schedulers, value copying and shared objects (lvm.c, lcopy.c,
** lproxy.c, lshared.c).
*/
#ifndef LUMS_H
#define LUMS_H

#include "largs.h"
#include "lquantum.h"
#include "ums-binding.h"
#include "ums-list.h"

#include <lauxlib.h>
#include <lua.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define LUMS_HIDDEN __attribute__((visibility("hidden")))

/* Memory the binding recycles itself (freed small blocks, task records)
** is poisoned while it waits under AddressSanitizer, so that a use after
** its owner gave it up is still reported. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define LUMS_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define LUMS_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define LUMS_POISON(p, n) ((void)(p), (void)(n))
#define LUMS_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* The longest time a setting in seconds may give (ums.config's bound):
** its nanoseconds still fit an int64_t. */
#define LUMS_MAX_SECONDS 1e9

typedef struct lvmrun lvmrun;
typedef struct lrun lrun;
typedef struct lstall lstall;  /* lstats.c: stall reports of a run */
typedef struct lalloc lalloc;  /* lalloc.c: a VM's small-block cache */
typedef struct lkept lkept;    /* lums.c: what a VM keeps between runs */

enum { T_NEW, T_LIVE, T_DONE };

typedef struct ltask ltask;
typedef struct lhandle lhandle;
typedef struct lreq lreq;
typedef struct lwait lwait;

/* A FIFO of waiters on one side of a channel. Every Lua task of a VM
** runs on that VM's one scheduler thread, so queues need no lock: the
** code between two waits runs as one atomic step. */
typedef struct lwaitq {
  ums_list_t list;       /* of lwait.link, FIFO */
} lwaitq;

/* A task waiting on one channel operation (one per select case). It lives
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
  lua_State *L;          /* the Lua thread that waits: a send's value is at
                            index vidx of its stack; a receive gets its
                            value pushed on it, above the waiting frame */
  int vidx;
  int kase;              /* 0, or the select case (1-based) */
  int64_t deadline;      /* a stream lock's wait: when the call gives up */
};

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

typedef struct joiner {
  ums_park_token_t tok;
} joiner_t;

/* A live task: everything its run needs while it runs or waits. Not a
** Lua object: ltasks are records of their VM's slab (lums.c, struct
** lkept), pooled with their coroutines (lvmrun.pool) and recycled, so a
** stale pointer to one is only ever used together with a park token,
** whose task id the runtime checks. Scheduler thread only. */
struct ltask {
  lhandle *h;            /* its handle (h->id: its runtime id); NULL while
                            pooled */
  lvmrun *vmrun;         /* its VM's part of a run; NULL while pooled */
  lua_State *co;         /* its coroutine (kept while pooled) */
  int slot;              /* [const] its number in the VM's slab: the VM's
                            anchor table holds co at LUMS_ANCHOR_CO(slot)
                            and, while the task is live, its handle at
                            LUMS_ANCHOR_HANDLE(slot) */
  int nargs;             /* arguments waiting for the first resume */
  bool parking;          /* a wait yielded: the step returns UMS_STEP_PARK */
  bool park_begun;       /* between park_begin and park_wait: the quantum
                            must not yield here */
  ums_park_token_t park_tok;  /* the begun park */
  bool finish_pending;   /* ended with a park begun: finish next step */
  int finish_st, finish_nres;
  joiner_t *joiners;     /* tasks waiting in join: join1 or malloc'ed */
  int njoiners, capjoiners;
  joiner_t join1[2];     /* room for the usual one or two joiners */
  lwait wait;            /* its channel send/recv while parked in one */
  int ffi_errno;         /* errno right after its last ums.ffi call */
  void *ffi_cbframe;     /* lccb.c: the inline ums.ffi call it is in,
                            whose callbacks run Lua on its thread */
  ums_buf_t *rfbuf;      /* lfs.c: the buffer of the ums.fs.readfile it is
                            in (the task's reference; the request holds
                            its own while it runs); released when the call
                            ends, or when the task ends if a raise cut the
                            call short (give_back_task) */
  lreq *req;             /* lreq.c: the work request it runs (set when
                            that begins, so that an end the request's code
                            never sees still ends the request), or NULL */
  lqhook hook;           /* lquantum.c: the user's hook while ums has
                            its own on co */
};

/* Where a task that ended with exactly one result keeps it
** (lhandle.res): a value the collector need not see is copied into the
** handle itself, so that the usual end (`return value`) neither finds
** the handle's Lua value nor stores anything in Lua; any other value
** goes to the handle's extras (ltask.h) at 1. */
enum { RES_EXTRAS, RES_NIL, RES_BOOL, RES_INT, RES_FLT, RES_LUD };

/* A task's handle: the full userdata Lua code holds (ums.spawn's result,
** ums.self()). It outlives the task, so it keeps only the outcome; it is
** kept small (48 bytes, no user value: see ltask.h's extras) because one
** is allocated and collected per task. */
struct lhandle {
  const char *tag;       /* &lums_task_tag: tells a task handle apart */
  ltask *t;              /* the live task; NULL once done */
  ums_task_t id;         /* runtime id, kept after the end */
  uint8_t state;         /* T_NEW, T_LIVE, T_DONE */
  bool ok;               /* done: ended normally */
  bool cancelled;        /* done: ended by cancellation */
  bool joined;           /* its outcome was taken by a join */
  bool nomem;            /* done with an error whose value and traceback
                            could not be kept for lack of memory: it
                            reads as "out of memory", with no traceback */
  uint8_t res;           /* done ok with one result: where it is (RES_*) */
  int nres;              /* done ok: number of results */
  union {                /* the one result, unless res is RES_EXTRAS */
    lua_Integer i;
    lua_Number n;
    void *p;
    int b;
  } r;
};


/* One VM's part of a run. A run has one VM per scheduler that runs Lua
** (the caller's own VM on scheduler 0, the others created by lvm.c), and
** one lvmrun for each; a VM and its lvmrun are touched only by the thread of
** their scheduler while the run lasts. What the VMs share (the runtime,
** work queues, the quantum monitor, os.exit) is in lrun (lvm.c). */
struct lvmrun {
  ums_runtime_t *rt;
  lrun *run;             /* [const] the run it is part of (lvm.c) */
  int sched;             /* [const] index of the scheduler running this VM */
  lua_State *SL;         /* the run's own thread, for scheduler-side work */
  lkept *kept;           /* [const] what the VM keeps between runs (its
                            ltask slab, its anchor table, SL); the run owns
                            the pool until lums_vmrun_free gives it back */
  int anchors;           /* [const] registry ref of the VM's anchor
                            table (see ltask.slot) */
  lquantum q;            /* lquantum.c: this VM's quantum */
  lhandle *main;                    /* main VM: the run's first task, set
                                       before it is spawned (its id is
                                       stored by the runtime before it
                                       can start); NULL in other VMs */
  /* Pool of ltasks, each with its reset coroutine and registry slots
  ** (no lua_newthread or luaL_ref per task). */
  ltask **pool;
  int npool, cappool;
  /* Tasks of this VM not finished yet. The VM holds the run
  ** (lums_run_hold) once while it has any, not once per task: the hold
  ** is an atomic read-modify-write on a word every VM shares, which a
  ** spawn and a finish each paid. [Lua thread; the main thread for the
  ** run's first task, before the run starts] */
  int nlive;
  /* Stall reports (lstats.c). The run's state is shared by its VMs; the
  ** monitor thread posts a report for this VM's scheduler and raises
  ** stall_pending, and this VM's thread delivers it from a hook or at its
  ** next step. */
  lstall *stall;                    /* [const] NULL: no stall detection */
  _Atomic int stall_pending;
  _Atomic int stall_custom;         /* this VM has an on_stall handler */
  /* Freed ums.ffi call requests of the standard size, kept for the next
  ** calls of this VM's tasks (lccall.c): a request is larger than malloc's
  ** per-thread cache takes, and 64 calls in flight spent a sixth of
  ** their instructions in malloc. [Lua thread; freed with the run] */
  void **ffi_free;
  int nffi_free, capffi_free;
  /* The VM's small-block cache (lalloc.c), installed by lums_vmrun_new,
  ** removed by lums_vmrun_free; NULL: none. */
  lalloc *alloc;
};

/* Where a task's values sit in its VM's anchor table (ltask.slot). */
#define LUMS_ANCHOR_CO(slot) (2 * (lua_Integer)(slot) + 1)
#define LUMS_ANCHOR_HANDLE(slot) (2 * (lua_Integer)(slot) + 2)

/* Pushes the handle of live task t (ums.self()'s result). */
static inline void lums_push_handle(lua_State *L, const ltask *t) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, t->vmrun->anchors);
  lua_rawgeti(L, -1, LUMS_ANCHOR_HANDLE(t->slot));
  lua_replace(L, -2);
}

/* ---- Calls shared between the module's files (lums.c) ---- */

/* Every task userdata starts with this address (see lchan.c's chan_tag
** for why not luaL_checkudata). */
LUMS_HIDDEN extern const char lums_task_tag;


/* Whether the quantum monitor has found task t's running step past its
** quantum (lquantum.h). */
static inline bool lums_quantum_due(ltask *t) {
  lvmrun *r = t->vmrun;
  return r && lums_quantum_past(&r->q);
}

/* A call whose deferred form answered at once (a socket _begin that
** returned 1: no park begun): its yield point, then continuation k takes
** the result as it would after a park. */
static inline int lums_answered_now(lua_State *L, lua_KContext ctx,
                                    lua_KFunction k) {
  LUMS_YIELD_POINT_K(L, ctx, k);
  return k(L, LUA_OK, ctx);
}

/* lalloc.c: puts a cache of small freed blocks in front of L's allocator
** (lua_setallocf), for as long as L runs tasks. NULL when out of memory
** (then nothing changes). */
LUMS_HIDDEN lalloc *lums_alloc_install(lua_State *L);
/* Gives every cached block back to the allocator underneath and, if the
** cache's allocator is still L's, puts that one back (L NULL: the VM is
** closed already). NULL is ignored. */
LUMS_HIDDEN void lums_alloc_remove(lua_State *L, lalloc *a);

/* lfs.c: adds the fs table to the module table at the top. */
LUMS_HIDDEN void lums_open_fs(lua_State *L);

/* lnet.c: adds the net table to the module table at the top. */
LUMS_HIDDEN void lums_open_net(lua_State *L);
/* lsocket.c: adds the socket table (ums.socket's helpers). */
LUMS_HIDDEN void lums_open_socket(lua_State *L);

/* lffi.c: adds the ffi table to the module table at the top. */
LUMS_HIDDEN void lums_open_ffi(lua_State *L);
/* lcdata.c: the I/O buffer behind the ums.ffi.buffer at idx, storing its
** size in *size; NULL for any other value. The userdata owns one
** reference, dropped when it is collected: a caller that hands the buffer
** to a request that may outlive the call takes its own (the runtime's
** requests do, ums.h "Ownership"). */
LUMS_HIDDEN ums_buf_t *lums_test_buf(lua_State *L, int idx, size_t *size);

/* lext.c: publishes the C extension API (ums-lua.h) in L's registry. */
LUMS_HIDDEN void lums_open_ext(lua_State *L);

/* lext.c: going preemptive from a C function of the binding, for the
** current task t: hands fn(arg) to the C-call pool (ums_preempt_begin_spin,
** storing the call in *call) and ends the park with lums_park_finish,
** so k runs once the call has returned or been given up. When the call
** returned during the runtime's spin at the call site, no park was begun
** and k runs at once, with status LUA_OK (after a park: LUA_YIELD), so k
** must read ums_park_result() only when status is not LUA_OK. On failure to
** start, the runtime has called release(arg) and this raises (naming
** `name`, or, if it is NULL, the running function; or ums.CANCELLED). */
LUMS_HIDDEN int lums_preempt_start(lua_State *L, ltask *t, const char *name,
                                   ums_preempt_fn fn, void *arg,
                                   ums_preempt_fn release, int64_t deadline,
                                   ums_preempt_call_t **call,
                                   lua_KContext ctx, lua_KFunction k);
/* lext.c: in k, settles the call: returns 0 (it returned; arg is the
** caller's again) or UMS_ETIMEDOUT (given up; arg is the runtime's);
** raises ums.CANCELLED when the task was cancelled, or an error. */
LUMS_HIDDEN int lums_preempt_settle(lua_State *L, ums_preempt_call_t *call,
                                    const char *name);
/* The same for a call whose record the caller prepared
** (ums_preempt_prepare): begins it with ums_preempt_begin_prepared (on
** failure the record is gone too); k then settles it with
** lums_preempt_settle_copy, which on 0 first copies n bytes of the
** record's inline area to out (ums_preempt_end_copy). */
/* interrupt: UMS_PREEMPT_INTERRUPT, a task giving up interrupts fn. */
LUMS_HIDDEN int lums_preempt_start_prepared(lua_State *L, ltask *t,
                                            const char *name,
                                            ums_preempt_call_t *call,
                                            ums_preempt_fn fn, void *arg,
                                            ums_preempt_fn release,
                                            int64_t deadline, bool interrupt,
                                            lua_KContext ctx,
                                            lua_KFunction k);
LUMS_HIDDEN int lums_preempt_settle_copy(lua_State *L,
                                         ums_preempt_call_t *call,
                                         const char *name, void *out,
                                         size_t n);

/* lchan.c: adds channel and select to the module table at the top. */
LUMS_HIDDEN void lums_open_chan(lua_State *L);

/* ---- lstats.c: stats, tasks, waits, stall reports ---- */

/* Adds stats, tasks, waits, waits_reset, on_stall and the WAIT table to
** the module table at the top, and info to the task methods. */
LUMS_HIDDEN void lums_open_stats(lua_State *L);
/* A run's stall state: made before its runtime starts (the runtime's
** on_stall callback is lums_stall_cb with the state as argument), told
** the run's VMs once they exist, freed after the runtime and every VM
** but the main one are gone. NULL when out of memory (no reports). */
LUMS_HIDDEN lstall *lums_stall_new(lua_State *L, int64_t threshold);
LUMS_HIDDEN void lums_stall_attach(lstall *s, lrun *run);
LUMS_HIDDEN void lums_stall_free(lstall *s);
LUMS_HIDDEN void lums_stall_cb(const ums_stall_t *st, void *arg);
/* A run's deadlock report (ums_config_t.on_deadlock): made before its
** runtime starts, told the run's VMs once they exist. When nothing can
** wake the run's tasks, lums_deadlock_cb (on the thread of the scheduler
** that found it) writes the report, with the tracebacks of the tasks of
** that scheduler's VM, and cancels every task so that the run ends.
** lums_deadlock_take hands the report to the caller (free() it; NULL:
** none) once every runtime thread is gone. */
typedef struct ldeadlock ldeadlock;
LUMS_HIDDEN ldeadlock *lums_deadlock_new(void);
LUMS_HIDDEN void lums_deadlock_attach(ldeadlock *d, lrun *run);
LUMS_HIDDEN void lums_deadlock_cb(ums_runtime_t *rt, int sched, void *arg);
LUMS_HIDDEN char *lums_deadlock_take(ldeadlock *d);
LUMS_HIDDEN void lums_deadlock_free(ldeadlock *d);
/* Whether the VM of L has an on_stall handler. */
LUMS_HIDDEN bool lums_stall_has_handler(lua_State *L);
/* In a hook on a VM's thread, task t running L: delivers a pending stall
** report of t (with its traceback) if there is one. */
LUMS_HIDDEN void lums_stall_hook(lua_State *L, ltask *t);
/* Delivers a pending report of r's VM without a traceback: the stalled
** step ended before it ran Lua code again. L: a thread of r's VM that may
** run the handler (r's own thread at a step, the main thread at the end
** of the run). */
LUMS_HIDDEN void lums_stall_flush(lvmrun *r, lua_State *L);
static inline bool lums_stall_pending(lvmrun *r) {
  return atomic_load_explicit(&r->stall_pending, memory_order_relaxed);
}

/* ---- For lvm.c: VMs of other schedulers ---- */

/* Fills a fresh lvmrun for the VM whose main thread is L, running on
** scheduler `sched` of run's runtime (lvm.c creates the VM, on that
** scheduler's thread). Returns NULL when out of memory. */
LUMS_HIDDEN lvmrun *lums_vmrun_new(lua_State *L, lrun *run, ums_runtime_t *rt,
                               int sched, int64_t quantum);
/* Frees r and its pooled tasks. With close_vm, the VM is about to be
** closed and its registry is left alone. */
LUMS_HIDDEN void lums_vmrun_free(lua_State *L, lvmrun *r, bool close_vm);
/* Starts a task in r's VM, on r's scheduler, running the function below
** the nargs values at the top of r->SL (all popped). Raises on failure;
** call it protected. */
LUMS_HIDDEN void lums_task_start(lvmrun *r, int nargs);
/* Installs the run's os.exit in L (lums.c's run_os_exit). */
LUMS_HIDDEN void lums_swap_os_exit(lua_State *L, bool install);
/* Reports the errors of tasks nobody joined in L's VM (end of a run). */
LUMS_HIDDEN void lums_report_errors(lua_State *L);

/* lintr.c: Ctrl-C during ums.run (see the top of lintr.c). run() calls
** lums_intr_block first (NULL: Ctrl-C is not watched; every call below
** accepts it), lums_intr_watch once the first task exists,
** lums_intr_settle before the runtime shuts down (true: Ctrl-C
** interrupted the run; nothing is cancelled after it) and lums_intr_end,
** which gives SIGINT back, on every way out once the runtime's threads
** are gone. All on the thread that called ums.run. */
typedef struct lintr lintr;
LUMS_HIDDEN lintr *lums_intr_block(void);
LUMS_HIDDEN void lums_intr_watch(lintr *in, lrun *run);
LUMS_HIDDEN bool lums_intr_settle(lintr *in);
LUMS_HIDDEN void lums_intr_end(lintr *in);

/* What require "ums.core" runs (lums.c); public as ums_lua_open. */
LUMS_HIDDEN int lums_open(lua_State *L);

/* lshared.c: shared objects (ums.shared.*), registered in every VM. */
LUMS_HIDDEN void lums_open_shared(lua_State *L);
/* lwork.c: ums.submit and the rest of the many-VM API. */
LUMS_HIDDEN void lums_open_work(lua_State *L);

#endif
