/*
** lums.h: the base every file of the ums.core module includes (not
** installed): visibility, poisoning, the names of the binding's structs,
** and the calls that open each file's part of the module (lums.c makes
** them) or that lums.c makes for lvm.c. Each concept has a header of its
** own: a task and its handle in ltask.h, one VM's part of a run and the
** run in lvm.h, parking in lpark.h, wait queues in lwaitq.h, the quantum
** in lquantum.h, argument checks in largs.h, stats and stall reports in
** lstats.h.
*/
#ifndef LUMS_H
#define LUMS_H

#include "largs.h"
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
typedef struct ltask ltask;    /* ltask.h: a live task */
typedef struct lhandle lhandle;  /* ltask.h: a task's handle */
typedef struct lreq lreq;      /* lreq.h: a work request */

/* ---- Each file's part of the module, opened by lums_open (lums.c) ---- */

/* lfs.c: adds the fs table to the module table at the top. */
LUMS_HIDDEN void lums_open_fs(lua_State *L);

/* lnet.c: adds the net table to the module table at the top. */
LUMS_HIDDEN void lums_open_net(lua_State *L);
/* lsocket.c: adds the socket table (ums.socket's helpers). */
LUMS_HIDDEN void lums_open_socket(lua_State *L);

/* lffi.c: adds the ffi table to the module table at the top. */
LUMS_HIDDEN void lums_open_ffi(lua_State *L);

/* lext.c: publishes the C extension API (ums-lua.h) in L's registry. */
LUMS_HIDDEN void lums_open_ext(lua_State *L);

/* lchan.c: adds channel and select to the module table at the top. */
LUMS_HIDDEN void lums_open_chan(lua_State *L);

/* lwaitq.c: adds core.waitq and its functions to the module table. */
LUMS_HIDDEN void lums_open_waitq(lua_State *L);

/* lshared.c: shared objects (ums.shared.*), registered in every VM. */
LUMS_HIDDEN void lums_open_shared(lua_State *L);
/* lwork.c: ums.submit and the rest of the many-VM API. */
LUMS_HIDDEN void lums_open_work(lua_State *L);

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

/* What require "ums.core" runs (lums.c); public as ums_lua_open. */
LUMS_HIDDEN int lums_open(lua_State *L);

#endif
