/*
** lstats.h: what lstats.c gives the rest of the module: ums.stats, tasks,
** waits, a run's stall reports and its deadlock report.
*/
#ifndef LSTATS_H
#define LSTATS_H

#include "lums.h"

#include <stdatomic.h>

/* Stall reports' state of one VM, embedded in its lvmrun (lvmrun.stall).
** lstats.c owns its members: the run's monitor thread posts a report for
** this VM's scheduler and raises pending, and this VM's thread delivers
** it from a hook or at its next step. The VM's maker (lums.c) binds it to
** the run's stall state with lums_stall_vm_init and lums_stall_vm_set. */
typedef struct lstall_vm {
  lstall *state;         /* [const while the VM runs] the run's stall
                            state; NULL: no stall detection */
  _Atomic int pending;   /* a report waits for this VM's thread */
  _Atomic int has_handler; /* this VM has an on_stall handler */
} lstall_vm;

/* Fills v for a new VM whose main thread is L, sharing the run's stall
** state s (NULL: none). */
LUMS_HIDDEN void lums_stall_vm_init(lstall_vm *v, lstall *s, lua_State *L);
/* The run's stall state v shares (NULL: none), and the same set anew:
** the main VM is made before its run's stall state is handed to it, and
** gives it up before that state is freed. */
static inline lstall *lums_stall_vm_state(const lstall_vm *v) {
  return v->state;
}
static inline void lums_stall_vm_set(lstall_vm *v, lstall *s) {
  v->state = s;
}

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
static inline bool lums_stall_pending(lstall_vm *v) {
  return atomic_load_explicit(&v->pending, memory_order_relaxed);
}

#endif
