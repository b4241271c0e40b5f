/*
** lquantum.h: the quantum of Lua tasks (lquantum.c; not installed). A
** task past its quantum yields at its next call that can wait (the
** yield points below) and, with preemption on, at any instruction (a
** signal and a count hook, qhook); ums's hook keeps the user's own hooks
** working; the runtime's monitor thread finds the steps past their
** quantum (ums_runtime_watch). Each VM of a run has an lquantum (embedded
** in its lvmrun), each task an lqhook (embedded in its ltask), and the run
** one lmonitor, what that thread looks at.
*/
#ifndef LQUANTUM_H
#define LQUANTUM_H

#include "largs.h"

#include <lua.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct lmonitor lmonitor;
typedef struct lnopreempt lnopreempt;

/* The user's hook on a task's coroutine while ums has its own there
** (the quantum's or a stall report's): restored when ums is done, called
** meanwhile at its own mask and count. Scheduler thread (and its signal
** handler, see hook_arm in lquantum.c). */
typedef struct lqhook {
  lua_Hook uhook;
  int umask, ucount, uleft;    /* uleft: what is left of its count */
  int qleft;                   /* what is left of ums's own count */
  volatile sig_atomic_t qsig;  /* the quantum's signal armed qhook and
                                  qhook has not run its errand yet */
  volatile sig_atomic_t busy;      /* debug.gethook or debug.sethook is at
                                      the hook: the signal handler leaves
                                      it alone */
  volatile sig_atomic_t deferred;  /* and left hook_arm to that call */
  bool yielded;  /* the step ends in a yield from qhook (a preemption) */
} lqhook;

/* One VM's quantum. running_co and step_seq are written by the VM's Lua
** thread, read by the monitor and by the signal handler (which runs on
** the Lua thread). */
typedef struct lquantum {
  int64_t quantum;       /* [const] ns; 0: off */
  bool preempt;          /* [const] the quantum may interrupt Lua code
                            anywhere (a signal and a hook), not only at
                            the calls that can wait */
  lnopreempt *nopreempt;  /* [const] this VM's nopreempt chunks */
  _Atomic(lua_State *) running_co;  /* coroutine of the running step */
  _Atomic uint64_t step_seq;        /* steps started so far */
  _Atomic uint64_t preempt_seq;     /* the step past its quantum */
  _Atomic uint64_t preemptions;     /* quantum expiries that yielded */
  pthread_t lua_thread;             /* the scheduler thread running Lua */
  _Atomic int lua_thread_known;
  lmonitor *watch;       /* [const] the monitor watching this VM, or NULL */
  /* [const] Delivers a pending stall report of task t running L from
  ** qhook (lstats.c's lums_stall_hook, given by the lvmrun's maker). */
  void (*stall_hook)(lua_State *L, ltask *t);
} lquantum;

/* The task whose step is running on this thread (a scheduler thread):
** set by the step and by a task that waited on its own worker
** (lums_become_current). Initial-exec TLS: see UMS__TLS_IE in the
** runtime. */
extern _Thread_local ltask *lums_cur_task LUMS_HIDDEN
    __attribute__((tls_model("initial-exec")));

/* ---- A VM's quantum, for lums.c's runs and steps ---- */

/* Sets up q for the VM whose main thread is L, watched by monitor m (NULL:
** none), as VM `sched` of m's run. */
LUMS_HIDDEN void lums_quantum_init(lquantum *q, lua_State *L, lmonitor *m,
                                   int sched, int64_t quantum, bool preempt,
                                   void (*stall_hook)(lua_State *, ltask *));
/* The first step of q's VM on this thread: the signal handler's target. */
LUMS_HIDDEN void lums_quantum_bind_thread(lquantum *q);
/* This thread runs Lua of its own again (the end of a run it ran). */
LUMS_HIDDEN void lums_quantum_leave_thread(void);
/* Publishes a step that starts, co running. The monitor needs no word
** from the step: its scheduler is busy, so the runtime's monitor looks. */
static inline void lums_quantum_step(lquantum *q, lua_State *co) {
  atomic_store_explicit(&q->running_co, co, memory_order_relaxed);
  atomic_store_explicit(&q->step_seq,
      atomic_load_explicit(&q->step_seq, memory_order_relaxed) + 1,
      memory_order_relaxed);
}

/* ThreadSanitizer delivers asynchronous signals only when the thread next
** enters an intercepted call, which a pure-Lua loop in the uninstrumented
** interpreter never does. TSan builds therefore poll: the monitor posts a
** request and a sparse count hook, which each step arms
** (lums_quantum_poll), takes it. */
#if defined(__SANITIZE_THREAD__)
#define LUMS_QUANTUM_POLL 1
LUMS_HIDDEN void lums_quantum_poll(ltask *t);
#endif
/* After a step that yielded: a preemption signalled just as the step
** ended set a hook nobody needs any more, and the user's is put back. */
LUMS_HIDDEN void lums_hook_disarm(lua_State *L, ltask *t);
/* At the end of a step that yielded: lums_hook_disarm, unless qhook made
** the yield (then qhook stays for the resumed instruction). */
LUMS_HIDDEN void lums_hook_step_end(lua_State *L, ltask *t);

/* Before task t waits on its own worker: the quantum monitor must not see
** it as running (it would signal a task that is not running Lua). */
LUMS_HIDDEN void lums_before_block(ltask *t);
/* Makes t the current task again after it waited on its own worker (other
** steps ran on this thread meanwhile). */
LUMS_HIDDEN void lums_become_current(ltask *t);

/* Whether the quantum monitor has found q's running step past its
** quantum: then the task should not prolong the step, e.g. by spinning
** for a preemptive call, and yields at its next call that can wait. */
static inline bool lums_quantum_past(lquantum *q) {
  return atomic_load_explicit(&q->preempt_seq, memory_order_relaxed) ==
         atomic_load_explicit(&q->step_seq, memory_order_relaxed);
}

/* The yield point of a call that can wait: a task past its quantum
** yields here (continuation k with ctx, which goes on with the call when
** the task is next stepped). Returns -1 where the task cannot yield (then
** the call goes on); otherwise does not return. Every call the Lua API
** documents as possibly waiting passes through it on its path that need
** not wait, through one of the two macros below (ltask.h defines
** lums_quantum_due): LUMS_YIELD_POINT runs a lua_CFunction fn again from
** its start, LUMS_YIELD_POINT_K continues with k. */
LUMS_HIDDEN int lums_quantum_yield(lua_State *L, lua_KContext ctx,
                                   lua_KFunction k);
LUMS_HIDDEN int lums_quantum_again_k(lua_State *L, int status,
                                     lua_KContext ctx);
#define LUMS_YIELD_POINT_K(L, ctx, k)                             \
  do {                                                            \
    ltask *yp_t = lums_cur_task;                                  \
    if (yp_t && lums_quantum_due(yp_t)) {                         \
      int yp_n = lums_quantum_yield((L), (ctx), (k));             \
      if (yp_n >= 0) return yp_n;                                 \
    }                                                             \
  } while (0)
#define LUMS_YIELD_POINT(L, fn) \
  LUMS_YIELD_POINT_K(L, (lua_KContext)(fn), lums_quantum_again_k)

/* Asks the thread of VM q for a hook on the coroutine it runs (what the
** quantum does), so that a pending stall report is delivered as soon as
** that coroutine runs Lua code. Any thread. */
LUMS_HIDDEN void lums_request_hook(lquantum *q);

/* ---- The monitor ---- */

/* The quantum's looks at a run of rt's up to nsched VMs, each of which
** lums_quantum_init attaches, made by rt's monitor thread (registered
** here: on the thread that made rt, before its first task) from now on
** when quantum > 0, or, with defer (a run of ums.run without
** preemption), from the run's second task on (lums_monitor_want). stall:
** the run reports stalls, whose hooks the quantum's signal brings
** (installed when quantum > 0 or stall). The caller owns it and frees it
** with lums_monitor_free (NULL is ignored) once rt is shut down. NULL
** when out of memory (*err 0) or when rt's monitor thread cannot be
** started (*err is a UMS_E* code). */
LUMS_HIDDEN lmonitor *lums_monitor_new(ums_runtime_t *rt, int nsched,
                                       int64_t quantum, bool defer,
                                       bool stall, int *err);
LUMS_HIDDEN void lums_monitor_free(lmonitor *m);
/* Starts q's run's deferred looks, if any (any VM's thread, at a spawn):
** only a period to change, which cannot fail (the monitor thread was
** started with the run). */
LUMS_HIDDEN void lums_monitor_want(lquantum *q);

/* Adds nopreempt_chunk and quantum_point to the module table at the top,
** and puts debug.gethook and debug.sethook as a task sees them in L. */
LUMS_HIDDEN void lums_open_quantum(lua_State *L);

#endif
