/*
** lvm.h: many Lua VMs in one run (not installed): the run-wide state and
** one VM per scheduler, created on that scheduler's thread (lvm.c). The
** work submitted to them is lreq.h's (requests), ldisp.h's (where they
** run) and lwork.c's (ums.submit and the handles); the values they carry
** are lcopy.h's, the objects they share lproxy.h's.
** lums.c calls the lums_run_* functions around a run; lhost.c (the C
** host API of ums-lua.h) drives the same machinery without a main VM.
*/
#ifndef LVM_H
#define LVM_H

#include "lums.h"
#include "lccall.h"
#include "lstats.h"
#include "lquantum.h"

#include <pthread.h>

#include "ldisp.h"
#include "lreq.h"
#include "ums-lua.h"

/* One VM's part of a run. A run has one VM per scheduler that runs Lua
** (the caller's own VM on scheduler 0, the others created by lvm.c), and
** one lvmrun for each; a VM and its lvmrun are touched only by the thread of
** their scheduler while the run lasts. What the VMs share (the runtime,
** work queues, the quantum monitor, os.exit) is in lrun (lvm.c).
** lums.c fills the lvmrun (lums_vmrun_new) and frees it
** (lums_vmrun_free); each embedded struct is declared, and its members
** touched, by the file its comment names. */
struct lvmrun {
  ums_runtime_t *rt;
  lrun *run;             /* [const] the run it is part of (lvm.c) */
  int sched;             /* [const] index of the scheduler running this VM */
  lua_State *SL;         /* the run's own thread, for scheduler-side work */
  lkept *kept;           /* [const] what the VM keeps between runs (its
                            ltask slab, its anchor table, SL); the run owns
                            the pool until lums_vmrun_free gives it back */
  int anchors;           /* [const] registry ref of the VM's anchor
                            table, which holds the anchor threads of
                            its task records' chunks (ltask.h) */
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
  lstall_vm stall;       /* lstats.h: this VM's stall reports */
  lffi_vm ffi;           /* lccall.h: its tasks' ums.ffi calls */
  /* lalloc.h: the VM's small-block cache, an object of lalloc.c's that
  ** lums_vmrun_new installs and lums_vmrun_free removes; NULL: none. */
  lalloc *alloc;
};

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
  /* lums_vmrun_new, lums_vmrun_free, lums_task_start, lums_report_errors. */
  lvmrun *(*run_new)(lua_State *L, lrun *run, ums_runtime_t *rt, int sched,
                   int64_t quantum);
  void (*run_free)(lua_State *L, lvmrun *r, bool close_vm);
  void (*task_start)(lvmrun *r, int nargs);
  void (*report_errors)(lua_State *L);
} lums_vm_ops;
/* lums.c's. */
LUMS_HIDDEN extern const lums_vm_ops lums_vm_ops_module;

/* A hosted run's setup of each VM (lums_run_new_hosted). */
typedef int (*lums_vm_setup_fn)(lua_State *L, int sched, void *arg);

/* Scheduler-side state of one VM (lvm.c). */
typedef struct lvmslot lvmslot;

/* The run-wide state. */
struct lrun {
  ums_runtime_t *rt;     /* [const] */
  const lums_vm_ops *ops;  /* [const] the module's VM calls */
  int nsched;            /* [const] */
  int64_t quantum;       /* [const] from the main VM's lvmrun */
  bool preempt;          /* [const once set, before any VM] the quantum
                            may interrupt Lua code anywhere */
  lvmrun *main;          /* [const once set] the main VM's lvmrun */
  lmonitor *monitor;     /* [const once set, before any VM] the run's
                            quantum monitor (lquantum.c), owned by
                            whoever made the run */
  char *path, *cpath;    /* [const] package.path, package.cpath */
  char *init;            /* [const] the init module, or NULL */
  lums_vm_setup_fn setup;  /* [const] hosted: the host's setup, or NULL */
  void *setup_arg;       /* [const] */
  bool hosted;           /* [const] no main VM (lhost.c) */
  _Atomic(lvmrun *) *vm;   /* [atomic; written once by the scheduler] */
  lvmslot *slot;         /* [owner: scheduler i's thread] */

  lreqs reqs;            /* the run's requests (lreq.c) */
  ldispatch disp;        /* [reqs.lock] their queues (ldisp.c) */

  _Atomic int64_t live;  /* [atomic] holds (lums_run_hold) */
  _Atomic bool stopping; /* [atomic] the run failed: start nothing more */
  pthread_mutex_t quiet_lock; /* guards the wait for live == 0 and exit */
  pthread_cond_t quiet_cond;
  bool exit_requested;   /* [quiet_lock] */
  int exit_code;         /* [quiet_lock] */
  bool exit_close;       /* [quiet_lock] */
  bool interrupted;      /* [quiet_lock] Ctrl-C came */
};

/* Makes the run-wide state for a run on rt, on the main thread before the
** run starts: package.path, package.cpath and the init module are read
** from L (the main VM) now; ops make its other VMs (kept, not copied).
** NULL when out of memory. */
LUMS_HIDDEN lrun *lums_run_new(lua_State *L, ums_runtime_t *rt,
                               const lums_vm_ops *ops);
/* A hosted run (lhost.c): no main VM; every scheduler's VM, scheduler 0's
** included, is made by lvm.c on its own thread, with these paths (NULL:
** Lua's defaults), init module (NULL: none) and quantum (ns, 0: none),
** and setup(L, sched, arg) called in it after require "ums" and before
** the init module (may raise; the VM then refuses its work). Any thread.
** NULL when out of memory. Closed by lums_run_close(NULL, v). */
LUMS_HIDDEN lrun *lums_run_new_hosted(ums_runtime_t *rt,
                                      const lums_vm_ops *ops,
                                      const char *path, const char *cpath,
                                      const char *init, int64_t quantum,
                                      lums_vm_setup_fn setup,
                                      void *setup_arg);
/* Whether v is a hosted run (no main VM, no os.exit of its own). */
LUMS_HIDDEN bool lums_run_hosted(lrun *v);
/* Whether the run's quantum may interrupt Lua code anywhere (preempt =
** true), not only at the calls that can wait. Set before any VM is made,
** by the thread that makes v. */
LUMS_HIDDEN void lums_run_set_preempt(lrun *v, bool on);
LUMS_HIDDEN bool lums_run_preempt(lrun *v);
/* Records the main VM's lvmrun as the VM of scheduler 0. */
LUMS_HIDDEN void lums_run_set_main(lrun *v, lvmrun *main);
/* The run's quantum monitor (lums_monitor_new), recorded by
** lums_run_set_monitor before any VM is made (NULL: none). */
LUMS_HIDDEN void lums_run_set_monitor(lrun *v, lmonitor *monitor);
LUMS_HIDDEN lmonitor *lums_run_monitor(lrun *v);
/* Number of schedulers, and the VM of scheduler i (NULL: none yet). Any
** thread; a VM once there stays until lums_run_close. */
LUMS_HIDDEN int lums_run_count(lrun *v);
LUMS_HIDDEN lvmrun *lums_run_at(lrun *v, int i);
/* Counts work that may still start other work: each VM with a Lua task
** not finished (lums.c holds once per VM, not per task), each request
** not started. Any thread. */
LUMS_HIDDEN void lums_run_hold(lrun *v);
LUMS_HIDDEN void lums_run_release(lrun *v);
/* Blocks the main thread until nothing is held any more, an os.exit
** was requested or Ctrl-C came (true), or until the absolute monotonic deadline
** (false; UMS_FOREVER: none). */
LUMS_HIDDEN bool lums_run_wait_quiet(lrun *v, int64_t deadline);
/* Whether lums_run_wait_quiet would return true at once. */
LUMS_HIDDEN bool lums_run_quiet(lrun *v);
/* os.exit in a task of any VM: the first request is kept; cancels the
** run's first task and ends lums_run_wait_quiet. */
LUMS_HIDDEN void lums_run_request_exit(lrun *v, int code, bool close);
LUMS_HIDDEN bool lums_run_exit_requested(lrun *v, int *code, bool *close);
/* Ctrl-C (lintr.c's watcher): cancels the run as lums_run_request_exit
** does, without an exit; ends lums_run_wait_quiet. Any thread. */
LUMS_HIDDEN void lums_run_interrupt(lrun *v);
/* The run is failing (its first task raised, or os.exit): requests not
** started yet are not started any more. Any thread. */
LUMS_HIDDEN void lums_run_stop(lrun *v);
/* After ums_runtime_shutdown (no scheduler thread is left): ends the
** requests never started (cancelled), reports through L's on_error the
** errors of submitted work nobody joined, closes the VMs of the other
** schedulers and frees v. L is the main VM (NULL: a hosted run), on the
** main thread. lwork.c's: it ends the requests before lums_run_free. */
LUMS_HIDDEN void lums_run_close(lua_State *L, lrun *v);
/* The rest of lums_run_close, once every request has ended: closes the
** VMs of the other schedulers (each reports its own errors first) and
** frees v. */
LUMS_HIDDEN void lums_run_free(lrun *v);
/* The VM that reports the run's failed requests at its end: L (the main
** VM), or in a hosted run the first VM made; NULL: none. */
LUMS_HIDDEN lua_State *lums_run_report_state(lrun *v, lua_State *L);
/* The VM of scheduler s, made if need be, with the init module loaded:
** NULL with *err set when it cannot be had, and *refuse true when it
** never will (its setup or its init module failed; err then lives as
** long as v). On s's thread, outside any Lua task (ldisp.c's
** "ums.vmstart" step task). */
LUMS_HIDDEN lvmrun *lums_run_ready(lrun *v, int s, const char **err,
                                 bool *refuse);
/* Whether scheduler s's VM is made and its init module loaded, so that
** lums_run_ready would return it at once. On s's thread. */
LUMS_HIDDEN bool lums_run_vm_ready(lrun *v, int s);
/* Why scheduler s refuses work (its VM or init module failed; lives as
** long as v), or NULL. On s's thread. */
LUMS_HIDDEN const char *lums_run_refusal(lrun *v, int s);

#endif
