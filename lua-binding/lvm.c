/*
** lvm.c: one Lua VM per scheduler, and the run they belong to.
**
** A Lua VM is single-threaded, so using every CPU from Lua takes one VM
** per scheduler. The caller's VM is scheduler 0's; the VM of any other
** scheduler is created the first time that scheduler starts submitted
** work (ldisp.c, lums_run_ready), on that scheduler's own thread, with
** the main VM's package.path and package.cpath (read when the run began)
** and the init module (ums.config{init = ...}) loaded first. A VM is
** touched only by its scheduler's thread while the run lasts; once
** ums_runtime_shutdown has joined the scheduler threads, core.run closes
** the VMs on the main thread (lums_run_close, lums_run_free), where
** nothing else can touch them any more.
**
** Ending a run. Every VM with a Lua task left and every queued request
** holds the run (lrun.live); core.run waits until nothing holds it
** before it shuts the runtime down, because once ums_runtime_shutdown
** begins, nothing may spawn, and starting a request spawns its task.
** On a failed run (the first task raised, os.exit, or core.run_limit's
** time limit passed) requests are cancelled instead of started
** (lums_run_stop, ldisp.c), the runtime cancels every task, and the
** requests it never gave to a scheduler are ended by its shutdown.
*/
#define _GNU_SOURCE  /* strdup */
#include "ltask.h"
#include "lvm.h"

#include <errno.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct lvmslot {
  lua_State *L;          /* [owner; the main thread after the run] the
                            VM's main thread; NULL for scheduler 0 (the
                            caller's VM) and until created */
  int init_state;        /* [owner] 0 init module not run, 1 ok, 2 failed */
  char *init_err;        /* [owner] why, when it failed */
  bool failed;           /* [owner] the VM could not be created */
};

/* ---------------------------------------------------------------------- */
/* Holding the run                                                         */
/* ---------------------------------------------------------------------- */

void lums_run_hold(lrun *v) {
  atomic_fetch_add_explicit(&v->live, 1, memory_order_relaxed);
}

void lums_run_release(lrun *v) {
  if (atomic_fetch_sub_explicit(&v->live, 1, memory_order_acq_rel) == 1) {
    pthread_mutex_lock(&v->quiet_lock);
    pthread_cond_broadcast(&v->quiet_cond);
    pthread_mutex_unlock(&v->quiet_lock);
    /* A run whose caller runs the scheduler looks again (core.run). */
    ums_runtime_pause(v->rt);
  }
}

bool lums_run_quiet(lrun *v) {
  pthread_mutex_lock(&v->quiet_lock);
  bool quiet = atomic_load(&v->live) == 0 || v->exit_requested ||
               v->interrupted;
  pthread_mutex_unlock(&v->quiet_lock);
  return quiet;
}

bool lums_run_wait_quiet(lrun *v, int64_t deadline) {
  struct timespec ts = {(time_t)(deadline / UMS_NSEC_PER_SEC),
                        (long)(deadline % UMS_NSEC_PER_SEC)};
  bool quiet = true;
  pthread_mutex_lock(&v->quiet_lock);
  while (atomic_load(&v->live) > 0 && !v->exit_requested &&
         !v->interrupted) {
    if (deadline == UMS_FOREVER) {
      pthread_cond_wait(&v->quiet_cond, &v->quiet_lock);
    } else if (pthread_cond_timedwait(&v->quiet_cond, &v->quiet_lock,
                                      &ts) == ETIMEDOUT &&
               atomic_load(&v->live) > 0 && !v->exit_requested &&
               !v->interrupted) {
      quiet = false;
      break;
    }
  }
  pthread_mutex_unlock(&v->quiet_lock);
  return quiet;
}

/* Ends the run early: nothing more starts and the first task is
** cancelled; the main thread then shuts the runtime down without waiting,
** which cancels every other task. The first task's id was stored before
** it could start, hence before any task or signal watcher that can end
** the run existed. */
static void cancel_run(lrun *v) {
  lums_run_stop(v);
  ums_task_cancel(v->rt, v->main->main->id);
  ums_runtime_pause(v->rt);
}

void lums_run_request_exit(lrun *v, int code, bool close) {
  pthread_mutex_lock(&v->quiet_lock);
  if (!v->exit_requested) {
    v->exit_requested = true;
    v->exit_code = code;
    v->exit_close = close;
  }
  pthread_cond_broadcast(&v->quiet_cond);
  pthread_mutex_unlock(&v->quiet_lock);
  cancel_run(v);
}

void lums_run_interrupt(lrun *v) {
  pthread_mutex_lock(&v->quiet_lock);
  v->interrupted = true;
  pthread_cond_broadcast(&v->quiet_cond);
  pthread_mutex_unlock(&v->quiet_lock);
  cancel_run(v);
}

void lums_run_stop(lrun *v) { atomic_store(&v->stopping, true); }

bool lums_run_exit_requested(lrun *v, int *code, bool *close) {
  pthread_mutex_lock(&v->quiet_lock);
  bool r = v->exit_requested;
  *code = v->exit_code;
  *close = v->exit_close;
  pthread_mutex_unlock(&v->quiet_lock);
  return r;
}

/* ---------------------------------------------------------------------- */
/* The run's VMs                                                           */
/* ---------------------------------------------------------------------- */

/* A copy of the string field `key` of the global table `tbl`, or NULL. */
static char *dup_field(lua_State *L, const char *tbl, const char *key) {
  int top = lua_gettop(L);
  char *s = NULL;
  if (lua_getglobal(L, tbl) == LUA_TTABLE &&
      lua_getfield(L, -1, key) == LUA_TSTRING)
    s = strdup(lua_tostring(L, -1));
  lua_settop(L, top);
  return s;
}

/* The run-wide state without any VM's settings; NULL when out of memory. */
static lrun *run_alloc(ums_runtime_t *rt) {
  int n = ums_runtime_schedulers(rt);
  lrun *v = calloc(1, sizeof *v);
  if (!v) return NULL;
  v->rt = rt;
  v->nsched = n;
  v->vm = calloc((size_t)n, sizeof *v->vm);
  v->slot = calloc((size_t)n, sizeof *v->slot);
  pthread_mutex_init(&v->reqs.lock, NULL);
  pthread_mutex_init(&v->quiet_lock, NULL);
  /* Deadlines are ums_now() readings: CLOCK_MONOTONIC. */
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&v->quiet_cond, &ca);
  pthread_condattr_destroy(&ca);
  if (!v->vm || !v->slot) {
    lums_run_free(v);
    return NULL;
  }
  return v;
}

lrun *lums_run_new(lua_State *L, ums_runtime_t *rt,
                   const lums_vm_ops *ops) {
  lrun *v = run_alloc(rt);
  if (!v) return NULL;
  v->ops = ops;
  int top = lua_gettop(L);
  v->path = dup_field(L, "package", "path");
  v->cpath = dup_field(L, "package", "cpath");
  if (lua_getfield(L, LUA_REGISTRYINDEX, "ums.config") == LUA_TTABLE &&
      lua_getfield(L, -1, "init") == LUA_TSTRING)
    v->init = strdup(lua_tostring(L, -1));
  lua_settop(L, top);
  return v;
}

/* strdup of NULL is NULL; *ok turns false when memory runs out. */
static char *dup_opt(const char *s, bool *ok) {
  char *d = s ? strdup(s) : NULL;
  if (s && !d) *ok = false;
  return d;
}

lrun *lums_run_new_hosted(ums_runtime_t *rt, const lums_vm_ops *ops,
                          const char *path, const char *cpath,
                          const char *init, int64_t quantum,
                          lums_vm_setup_fn setup, void *setup_arg) {
  lrun *v = run_alloc(rt);
  if (!v) return NULL;
  v->ops = ops;
  bool ok = true;
  v->hosted = true;
  v->path = dup_opt(path, &ok);
  v->cpath = dup_opt(cpath, &ok);
  v->init = dup_opt(init, &ok);
  v->quantum = quantum;
  v->setup = setup;
  v->setup_arg = setup_arg;
  if (!ok) {
    lums_run_free(v);
    return NULL;
  }
  return v;
}

bool lums_run_hosted(lrun *v) { return v->hosted; }

void lums_run_set_preempt(lrun *v, bool on) { v->preempt = on; }

bool lums_run_preempt(lrun *v) { return v->preempt; }

void lums_run_set_main(lrun *v, lvmrun *main) {
  v->main = main;
  v->quantum = main->q.quantum;
  atomic_store_explicit(&v->vm[0], main, memory_order_release);
}

void lums_run_set_monitor(lrun *v, lmonitor *monitor) {
  v->monitor = monitor;
}

lmonitor *lums_run_monitor(lrun *v) { return v->monitor; }

int lums_run_count(lrun *v) { return v->nsched; }

lvmrun *lums_run_at(lrun *v, int i) {
  return atomic_load_explicit(&v->vm[i], memory_order_acquire);
}

/* Sets up a new VM: standard libraries, the main VM's paths, ums itself,
** the os.exit of runs, and the lvmrun. Protected call on the new VM:
** (lrun, scheduler) -> lvmrun. */
static int vm_setup(lua_State *L) {
  lrun *v = (lrun *)lua_touserdata(L, 1);
  int s = (int)lua_tointeger(L, 2);
  luaL_openlibs(L);
  lua_getglobal(L, "package");
  if (v->path) {
    lua_pushstring(L, v->path);
    lua_setfield(L, -2, "path");
  }
  if (v->cpath) {
    lua_pushstring(L, v->cpath);
    lua_setfield(L, -2, "cpath");
  }
  /* This module itself, however the main VM got it (a host may have
  ** linked it in rather than put it on package.cpath). */
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, v->ops->open);
  lua_setfield(L, -2, "ums.core");
  lua_pop(L, 2);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "ums");
  lua_call(L, 1, 0);
  v->ops->swap_os_exit(L, true);
  if (v->setup) {
    int rc = v->setup(L, s, v->setup_arg);
    if (rc != 0)
      return luaL_error(L, "the host's setup function returned %d", rc);
  }
  /* Last: nothing after it may fail and leave it behind. */
  lvmrun *r = v->ops->run_new(L, v, v->rt, s, v->quantum);
  if (!r) return luaL_error(L, "out of memory");
  lua_pushlightuserdata(L, r);
  return 1;
}

/* The VM of scheduler s, created if need be. On s's thread only. NULL,
** with *err set, when it cannot be created. */
static lvmrun *vm_get(lrun *v, int s, const char **err) {
  lvmrun *r = atomic_load_explicit(&v->vm[s], memory_order_relaxed);
  lvmslot *sl = &v->slot[s];
  if (r) return r;
  if (sl->failed) {
    *err = sl->init_err;
    return NULL;
  }
  lua_State *L = luaL_newstate();
  if (!L) {
    *err = "cannot create a Lua state: out of memory";
    return NULL;
  }
  lua_pushcfunction(L, vm_setup);
  lua_pushlightuserdata(L, v);
  lua_pushinteger(L, s);
  if (lua_pcall(L, 2, 1, 0) != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    char buf[512];
    snprintf(buf, sizeof buf, "ums: cannot set up the Lua VM of scheduler "
             "%d: %s", s, msg ? msg : "(error object is not a string)");
    sl->failed = true;
    sl->init_err = strdup(buf);
    lua_close(L);
    *err = sl->init_err ? sl->init_err : "ums: cannot set up a Lua VM";
    return NULL;
  }
  r = (lvmrun *)lua_touserdata(L, -1);
  lua_pop(L, 1);
  sl->L = L;
  atomic_store_explicit(&v->vm[s], r, memory_order_release);
  return r;
}

/* Protected: require(name). */
static int require_protected(lua_State *L) {
  const char *name = (const char *)lua_touserdata(L, 1);
  lua_getglobal(L, "require");
  lua_pushstring(L, name);
  lua_call(L, 1, 0);
  return 0;
}

/* Loads the init module in VM r (once per VM, before its first request).
** Returns NULL or why it failed. On r's scheduler thread. */
static const char *vm_init(lrun *v, lvmrun *r) {
  lvmslot *sl = &v->slot[r->sched];
  if (!v->init || sl->init_state == 1) return NULL;
  if (sl->init_state == 2) return sl->init_err;
  lua_State *L = r->SL;
  lua_pushcfunction(L, require_protected);
  lua_pushlightuserdata(L, v->init);
  if (lua_pcall(L, 1, 0, 0) == LUA_OK) {
    sl->init_state = 1;
    return NULL;
  }
  const char *msg = lua_tostring(L, -1);
  char buf[1024];
  snprintf(buf, sizeof buf, "ums: the init module '%s' failed in the VM of "
           "scheduler %d: %s", v->init, r->sched,
           msg ? msg : "(error object is not a string)");
  lua_pop(L, 1);
  sl->init_state = 2;
  sl->init_err = strdup(buf);
  return sl->init_err ? sl->init_err : "ums: the init module failed";
}

lvmrun *lums_run_ready(lrun *v, int s, const char **err, bool *refuse) {
  *err = NULL;
  lvmrun *vm = vm_get(v, s, err);
  if (vm) *err = vm_init(v, vm);
  *refuse = *err && (v->slot[s].failed || v->slot[s].init_state == 2);
  return *err ? NULL : vm;
}

bool lums_run_vm_ready(lrun *v, int s) {
  return atomic_load_explicit(&v->vm[s], memory_order_relaxed) &&
         (!v->init || v->slot[s].init_state == 1);
}

const char *lums_run_refusal(lrun *v, int s) {
  lvmslot *sl = &v->slot[s];
  if (!sl->failed && sl->init_state != 2) return NULL;
  return sl->init_err ? sl->init_err : "ums: cannot set up a Lua VM";
}

lua_State *lums_run_report_state(lrun *v, lua_State *L) {
  for (int i = 0; !v->main && v->slot && i < v->nsched && !L; i++)
    L = v->slot[i].L;
  return L;
}

/* ---------------------------------------------------------------------- */
/* The end of a run                                                        */
/* ---------------------------------------------------------------------- */

/* Protected on a VM being closed: (lrun) -> reports its errors. */
static int report_protected(lua_State *L) {
  lrun *v = (lrun *)lua_touserdata(L, 1);
  lua_settop(L, 0);
  v->ops->report_errors(L);
  return 0;
}

void lums_run_free(lrun *v) {
  int first = v->main ? 1 : 0;
  for (int i = first; v->slot && i < v->nsched; i++) {
    lvmslot *sl = &v->slot[i];
    lvmrun *r = atomic_load_explicit(&v->vm[i], memory_order_acquire);
    if (sl->L) {
      /* Nothing in that VM protects this call: a memory error must not
      ** reach its panic function. */
      lua_pushcfunction(sl->L, report_protected);
      lua_pushlightuserdata(sl->L, v);
      if (lua_pcall(sl->L, 1, 0, 0) != LUA_OK) lua_pop(sl->L, 1);
      lua_close(sl->L);
      v->ops->run_free(NULL, r, true);
    }
    free(sl->init_err);
  }
  if (v->slot && first == 1) free(v->slot[0].init_err);
  free(v->vm);
  free(v->slot);
  free(v->path);
  free(v->cpath);
  free(v->init);
  pthread_mutex_destroy(&v->reqs.lock);
  pthread_mutex_destroy(&v->quiet_lock);
  pthread_cond_destroy(&v->quiet_cond);
  free(v);
}
