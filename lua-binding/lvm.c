/*
** lvm.c: one Lua VM per scheduler, and work submitted to them by value.
**
** A Lua VM is single-threaded, so using every CPU from Lua takes one VM
** per scheduler. The caller's VM is scheduler 0's; the VM of any other
** scheduler is created the first time that scheduler starts submitted
** work, on that scheduler's own thread, with the main VM's package.path
** and package.cpath (read when the run began) and the init module
** (ums.config{init = ...}) loaded first. A VM is touched only by its
** scheduler's thread while the run lasts; once ums_runtime_shutdown has
** joined the scheduler threads, core.run closes the VMs on the main
** thread (lums_vms_close), where nothing else can touch them any more.
**
** ums.submit(fn, ...) makes a work request: the function (bytecode, or a
** "module.function" name) and the arguments are copied into C memory
** (lcopy.c) and the request is queued for the least-loaded scheduler
** (fewest tasks plus queued requests), or for the one submit_on names.
** The handle is a shared object (lshared.c), so any VM may join or cancel
** it and pass it on.
**
** Placement and stealing. Requests wait in per-scheduler queues until a
** dispatcher starts them. A dispatcher is a C step task, at most one per
** scheduler, that exists while any queue holds work: each step it starts
** one request if its scheduler has nothing else runnable, taking the
** oldest request of its own queue or, when that is empty, stealing the
** oldest of the longest other queue; otherwise it yields and looks again
** after the others have run. So a scheduler keeps at most one runnable
** request of its own at a time (more may wait: a request that parks makes
** room for the next), and a scheduler with nothing to do takes work that
** has not started yet from a busy one. Once started, a request is a task
** of its VM and stays there. SQL Server never moves a connection: two
** heavy connections on one scheduler leave another CPU idle. Here the
** unstarted ones move. A request passed over for STARVE_NS starts anyway,
** so a scheduler whose tasks keep yielding cannot starve its queue.
**
** Ending a run. Every VM with a Lua task left, every queued request and
** every dispatcher holds the run (lvms.live); core.run waits until
** nothing holds it before it shuts the runtime down, because once
** ums_runtime_shutdown begins, nothing may spawn, and a dispatcher must.
** On a failed run (the first task raised, os.exit, or core.run_limit's
** time limit passed) dispatchers start nothing more (lums_vms_stop), the
** runtime cancels every task, and the requests never started are
** cancelled by lums_vms_close.
*/
#define _GNU_SOURCE  /* strdup */
#include "lvm.h"
#include "lpark.h"

#include <errno.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A request passed over this long by a busy scheduler starts anyway. */
#define STARVE_NS (100 * UMS_NSEC_PER_MSEC)

#define ONERROR_KEY "ums.on_error"     /* lums.c */

/* ---------------------------------------------------------------------- */
/* Run-wide state                                                          */
/* ---------------------------------------------------------------------- */

typedef struct lreqq {
  ums_list_t list;       /* of lreq.qlink, FIFO */
  int n;
} lreqq;

#define REQ_OF_Q(l) UMS_LIST_ENTRY(l, lreq, qlink)
#define REQ_OF_L(l) UMS_LIST_ENTRY(l, lreq, llink)

/* Scheduler-side state of one VM. [owner]: the scheduler's thread. */
typedef struct lvmslot {
  lua_State *L;          /* [owner; the main thread after the run] the
                            VM's main thread; NULL for scheduler 0 (the
                            caller's VM) and until created */
  int init_state;        /* [owner] 0 init module not run, 1 ok, 2 failed */
  char *init_err;        /* [owner] why, when it failed */
  bool failed;           /* [owner] the VM could not be created */
} lvmslot;

struct lvms {
  ums_runtime_t *rt;     /* [const] */
  const lums_vm_ops *ops;  /* [const] the module's VM calls */
  int nsched;            /* [const] */
  int64_t quantum;       /* [const] from the main VM's lrun */
  bool preempt;          /* [const once set, before any VM] the quantum
                            may interrupt Lua code anywhere */
  lrun *main;            /* [const once set] the main VM's lrun */
  lmonitor *monitor;     /* [const once set, before any VM] the run's
                            quantum monitor (lquantum.c), owned by
                            whoever made the run */
  char *path, *cpath;    /* [const] package.path, package.cpath */
  char *init;            /* [const] the init module, or NULL */
  lums_vm_setup_fn setup;  /* [const] hosted: the host's setup, or NULL */
  void *setup_arg;       /* [const] */
  bool hosted;           /* [const] no main VM (lhost.c) */
  _Atomic(lrun *) *vm;   /* [atomic; written once by the scheduler] */
  lvmslot *slot;         /* [owner: scheduler i's thread] */

  pthread_mutex_t lock;  /* guards what follows; never held while a
                            request's own lock is taken */
  lreqq *q;              /* [lock] per scheduler: requests not started */
  bool *disp;            /* [lock] per scheduler: a dispatcher exists */
  bool *refused;         /* [lock] per scheduler: its VM could not be set
                            up (or its init module failed), so it takes
                            no work and its queue is empty */
  int nrefused;          /* [lock] how many have refused */
  const char *refusal;   /* [lock] the latest refusal's message (a slot's
                            init_err, freed by lums_vms_close) */
  ums_list_t active;     /* [lock] of lreq.llink: requests not done (one
                            reference each) */
  ums_list_t failed;     /* [lock] of lreq.llink: failed requests, kept for
                            on_error at the end of the run (one reference
                            each) */
  ums_sched_stats_t *rows; /* [lock] scratch for placement */

  _Atomic int64_t live;  /* [atomic] holds (see the top of this file) */
  _Atomic bool stopping; /* [atomic] the run failed: start nothing more */
  pthread_mutex_t quiet_lock; /* guards the wait for live == 0 and exit */
  pthread_cond_t quiet_cond;
  bool exit_requested;   /* [quiet_lock] */
  int exit_code;         /* [quiet_lock] */
  bool exit_close;       /* [quiet_lock] */
  bool interrupted;      /* [quiet_lock] Ctrl-C came */
};

/* ---------------------------------------------------------------------- */
/* Work requests                                                           */
/* ---------------------------------------------------------------------- */

/* struct lreq is in lvm.h: lhost.c makes requests too. */

void lums_req_clear(lreq *r) {
  free(r->name);
  free(r->chunk);
  free(r->chunkname);
  lcopy_free(r->fn);
  lcopy_free(r->args);
  lcopy_free(r->results);
  free(r->traceback);
}

static void req_destroy(lshared *o) {
  lums_req_clear((lreq *)o);
  free(o);
}

static const luaL_Reg work_methods[];
static const lshared_kind work_kind = {"ums.work", req_destroy, work_methods};

static void q_push(lreqq *q, lreq *r) {
  ums_list_push_back(&q->list, &r->qlink);
  q->n++;
}

static void q_remove(lreqq *q, lreq *r) {
  ums_list_remove(&q->list, &r->qlink);
  q->n--;
}

/* Ends request r with its outcome: wakes its joiners and moves it off
** the run's active list. results and tb become r's. Any thread; r's lock
** and the run's lock must not be held. */
static void req_finish(lreq *r, int outcome, lmsg *results, const char *tb) {
  lvms *v = r->vms;
  char *tbcopy = tb ? strdup(tb) : NULL;
  pthread_mutex_lock(&r->h.lock);
  r->outcome = outcome;
  r->results = results;
  r->traceback = tbcopy;
  r->state = R_DONE;
  lshared_grant_all(&r->joiners, 0);
  pthread_mutex_unlock(&r->h.lock);
  pthread_mutex_lock(&v->lock);
  ums_list_remove(&v->active, &r->llink);
  /* A host request's outcome always reaches the host (on_finish); only
  ** Lua ones wait for on_error at the end of the run. */
  bool keep = outcome == O_ERROR && !r->on_finish;
  if (keep) ums_list_push_front(&v->failed, &r->llink);
  pthread_mutex_unlock(&v->lock);
  if (r->on_finish) r->on_finish(r);
  if (!keep) lshared_unref(&r->h);
}

/* Ends r with an error message made here (no Lua error value). */
static void req_fail(lreq *r, const char *msg) {
  lmsg *m = NULL;
  /* A string is all an lmsg needs; built by hand, no VM at hand. */
  size_t n = strlen(msg);
  m = calloc(1, sizeof *m);
  char *data = m ? malloc(1 + sizeof n + n) : NULL;
  if (m && data) {
    data[0] = 's';
    memcpy(data + 1, &n, sizeof n);
    memcpy(data + 1 + sizeof n, msg, n);
    m->data = data;
    m->len = m->cap = 1 + sizeof n + n;
    m->nvalues = 1;
  } else {
    free(m);
    m = NULL;  /* join then reports the error value as nil */
  }
  req_finish(r, O_ERROR, m, msg);
}

/* ---------------------------------------------------------------------- */
/* Holding the run                                                         */
/* ---------------------------------------------------------------------- */

void lums_vms_hold(lvms *v) {
  atomic_fetch_add_explicit(&v->live, 1, memory_order_relaxed);
}

void lums_vms_release(lvms *v) {
  if (atomic_fetch_sub_explicit(&v->live, 1, memory_order_acq_rel) == 1) {
    pthread_mutex_lock(&v->quiet_lock);
    pthread_cond_broadcast(&v->quiet_cond);
    pthread_mutex_unlock(&v->quiet_lock);
    /* A run whose caller runs the scheduler looks again (core.run). */
    ums_runtime_pause(v->rt);
  }
}

bool lums_vms_quiet(lvms *v) {
  pthread_mutex_lock(&v->quiet_lock);
  bool quiet = atomic_load(&v->live) == 0 || v->exit_requested ||
               v->interrupted;
  pthread_mutex_unlock(&v->quiet_lock);
  return quiet;
}

bool lums_vms_wait_quiet(lvms *v, int64_t deadline) {
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
static void cancel_run(lvms *v) {
  lums_vms_stop(v);
  ums_task_cancel(v->rt, v->main->main->id);
  ums_runtime_pause(v->rt);
}

void lums_vms_request_exit(lvms *v, int code, bool close) {
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

void lums_vms_interrupt(lvms *v) {
  pthread_mutex_lock(&v->quiet_lock);
  v->interrupted = true;
  pthread_cond_broadcast(&v->quiet_cond);
  pthread_mutex_unlock(&v->quiet_lock);
  cancel_run(v);
}

void lums_vms_stop(lvms *v) { atomic_store(&v->stopping, true); }

bool lums_vms_exit_requested(lvms *v, int *code, bool *close) {
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
static lvms *vms_alloc(ums_runtime_t *rt) {
  int n = ums_runtime_schedulers(rt);
  lvms *v = calloc(1, sizeof *v);
  if (!v) return NULL;
  v->rt = rt;
  v->nsched = n;
  v->vm = calloc((size_t)n, sizeof *v->vm);
  v->slot = calloc((size_t)n, sizeof *v->slot);
  v->q = calloc((size_t)n, sizeof *v->q);
  v->disp = calloc((size_t)n, sizeof *v->disp);
  v->refused = calloc((size_t)n, sizeof *v->refused);
  v->rows = calloc((size_t)n, sizeof *v->rows);
  pthread_mutex_init(&v->lock, NULL);
  pthread_mutex_init(&v->quiet_lock, NULL);
  /* Deadlines are ums_now() readings: CLOCK_MONOTONIC. */
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&v->quiet_cond, &ca);
  pthread_condattr_destroy(&ca);
  if (!v->vm || !v->slot || !v->q || !v->disp || !v->refused || !v->rows) {
    lums_vms_close(NULL, v);
    return NULL;
  }
  return v;
}

lvms *lums_vms_new(lua_State *L, ums_runtime_t *rt,
                   const lums_vm_ops *ops) {
  lvms *v = vms_alloc(rt);
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

lvms *lums_vms_new_hosted(ums_runtime_t *rt, const lums_vm_ops *ops,
                          const char *path, const char *cpath,
                          const char *init, int64_t quantum,
                          lums_vm_setup_fn setup, void *setup_arg) {
  lvms *v = vms_alloc(rt);
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
    lums_vms_close(NULL, v);
    return NULL;
  }
  return v;
}

bool lums_vms_hosted(lvms *v) { return v->hosted; }

void lums_vms_set_preempt(lvms *v, bool on) { v->preempt = on; }

bool lums_vms_preempt(lvms *v) { return v->preempt; }

void lums_vms_set_main(lvms *v, lrun *main) {
  v->main = main;
  v->quantum = main->q.quantum;
  atomic_store_explicit(&v->vm[0], main, memory_order_release);
}

void lums_vms_set_monitor(lvms *v, lmonitor *monitor) {
  v->monitor = monitor;
}

lmonitor *lums_vms_monitor(lvms *v) { return v->monitor; }

int lums_vms_count(lvms *v) { return v->nsched; }

lrun *lums_vms_at(lvms *v, int i) {
  return atomic_load_explicit(&v->vm[i], memory_order_acquire);
}

/* Sets up a new VM: standard libraries, the main VM's paths, ums itself,
** the os.exit of runs, and the lrun. Protected call on the new VM:
** (lvms, scheduler) -> lrun. */
static int vm_setup(lua_State *L) {
  lvms *v = (lvms *)lua_touserdata(L, 1);
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
  lrun *r = v->ops->run_new(L, v, v->rt, s, v->quantum);
  if (!r) return luaL_error(L, "out of memory");
  lua_pushlightuserdata(L, r);
  return 1;
}

/* The VM of scheduler s, created if need be. On s's thread only. NULL,
** with *err set, when it cannot be created. */
static lrun *vm_get(lvms *v, int s, const char **err) {
  lrun *r = atomic_load_explicit(&v->vm[s], memory_order_relaxed);
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
  r = (lrun *)lua_touserdata(L, -1);
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
static const char *vm_init(lvms *v, lrun *r) {
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

/* ---------------------------------------------------------------------- */
/* Running a request (in its VM, as a task)                                */
/* ---------------------------------------------------------------------- */

/* Message handler of a request, a C closure made per request: keeps the
** error value (upvalue 1) and the traceback where it was raised (upvalue
** 2), and returns the value itself. Lua also runs the parser under this
** handler (a reader of `load` that raises, a chunk nested too deeply), so
** anything else would change what `load` returns to the work; req_main_k
** reads the upvalues right after the pcall. */
static int req_msgh(lua_State *L) {
  lua_settop(L, 1);
  const char *msg = lua_type(L, 1) == LUA_TSTRING ? lua_tostring(L, 1) : NULL;
  luaL_traceback(L, L, msg, 1);
  /* The two C frames below the work's function are this file's (req_body
  ** and req_main): the traceback ends at the work, as a task's does. */
  size_t len;
  const char *tb = lua_tolstring(L, -1, &len);
  static const char cframe[] = "\n\t[C]: in ?";
  size_t n = sizeof cframe - 1;
  for (int i = 0; i < 2 && len >= n && memcmp(tb + len - n, cframe, n) == 0;
       i++)
    len -= n;
  lua_pushlstring(L, tb, len);
  lua_replace(L, lua_upvalueindex(2));
  lua_pushvalue(L, 1);
  lua_replace(L, lua_upvalueindex(1));
  lua_settop(L, 1);
  return 1;
}

static int body_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  return lua_gettop(L);
}

/* The request's function with its arguments, in the request's VM: (r) ->
** the function's results. */
static int req_body(lua_State *L) {
  lreq *r = (lreq *)lua_touserdata(L, 1);
  lua_settop(L, 0);
  if (r->name) {
    /* "a.b.c": require "a.b", then its field c. */
    const char *dot = strrchr(r->name, '.');
    lua_getglobal(L, "require");
    lua_pushlstring(L, r->name, (size_t)(dot - r->name));
    lua_call(L, 1, 1);
    if (!lua_istable(L, 1))
      return luaL_error(L, "ums.submit: the module of '%s' is not a table "
                        "(%s)", r->name, luaL_typename(L, 1));
    if (lua_getfield(L, 1, dot + 1) != LUA_TFUNCTION)
      return luaL_error(L, "ums.submit: '%s' is not a function (%s)",
                        r->name, luaL_typename(L, -1));
    lua_remove(L, 1);
  } else if (r->chunk) {
    if (luaL_loadbufferx(L, r->chunk, r->chunklen, r->chunkname, "t") !=
        LUA_OK)
      return lua_error(L);
  } else {
    lmsg *fn = r->fn;
    r->fn = NULL;  /* this task's now */
    lcopy_decode_free(L, fn);
  }
  lmsg *args = r->args;
  r->args = NULL;
  int n = lcopy_decode_free(L, args);
  lua_callk(L, n, LUA_MULTRET, 0, body_k);
  return lua_gettop(L);
}

/* Encodes what the request gives back, protected: (r, outcome, values...)
** -> nothing; the message is left in r->results by req_finish's caller. */
typedef struct encode_out {
  lmsg *m;
  char err[256];
  int bad;
} encode_out;

static int encode_protected(lua_State *L) {
  encode_out *o = (encode_out *)lua_touserdata(L, 1);
  const char *root = lua_tostring(L, 2);
  int n = lua_gettop(L) - 2;
  o->m = lcopy_encode(L, 3, n, root, strcmp(root, "results") == 0, o->err,
                      sizeof o->err, &o->bad);
  return 0;
}

/* Encodes the n values at the top of L; NULL and err filled when one
** cannot be copied (or memory runs out). */
static lmsg *encode_values(lua_State *L, int n, const char *root,
                           encode_out *o) {
  o->m = NULL;
  o->err[0] = '\0';
  lua_pushcfunction(L, encode_protected);
  lua_pushlightuserdata(L, o);
  lua_pushstring(L, root);
  lua_rotate(L, -(n + 3), 3);
  if (lua_pcall(L, n + 2, 0, 0) != LUA_OK) {
    snprintf(o->err, sizeof o->err, "%s", lua_tostring(L, -1)
             ? lua_tostring(L, -1) : "out of memory");
    lua_pop(L, 1);
    return NULL;
  }
  return o->m;
}

static int req_main_k(lua_State *L, int status, lua_KContext ctx) {
  lreq *r = (lreq *)ctx;
  lums_cur_task->req = NULL;
  encode_out o;
  if (status == LUA_OK || status == LUA_YIELD) {
    int n = lua_gettop(L) - 1;  /* above the message handler */
    lmsg *m = encode_values(L, n, "results", &o);
    if (m) {
      req_finish(r, O_OK, m, NULL);
    } else {
      char buf[320];
      snprintf(buf, sizeof buf, "ums.submit: cannot copy the results: %s",
               o.err);
      req_fail(r, buf);
    }
    return 0;
  }
  /* The error, with the traceback the handler (at 1) kept for it; none
  ** when the handler did not see this value (it failed itself, memory ran
  ** out, or a __close replaced the error). */
  const char *tb = NULL;
  lua_getupvalue(L, 1, 1);
  if (lua_rawequal(L, -1, -2)) {
    lua_getupvalue(L, 1, 2);
    tb = lua_tostring(L, -1);
    lua_remove(L, -2);
  } else {
    lua_pop(L, 1);
    lua_pushnil(L);
  }
  lua_pushvalue(L, -2);
  lua_getfield(L, LUA_REGISTRYINDEX, LUMS_CANCELLED_KEY);
  bool cancelled = lua_rawequal(L, -1, -2);
  lua_pop(L, 1);
  lmsg *m = NULL;
  if (!cancelled) {
    lua_pushvalue(L, -1);
    m = encode_values(L, 1, "error", &o);
    if (!m) {
      /* An error value that cannot cross: its string form does. */
      luaL_tolstring(L, -1, NULL);
      m = encode_values(L, 1, "error", &o);
    }
  }
  req_finish(r, cancelled ? O_CANCELLED : O_ERROR, m,
             tb ? tb : "(no traceback)");
  return 0;
}

/* The body of a request's task: (r). Catches every error, so that the
** outcome always reaches the request; the task itself ends normally. */
static int req_main(lua_State *L) {
  lreq *r = (lreq *)lua_touserdata(L, 1);
  lua_settop(L, 0);
  pthread_mutex_lock(&r->h.lock);
  bool cancel = r->cancel_req;
  if (!cancel) {
    r->state = R_RUNNING;
    r->task = ums_self();
  }
  pthread_mutex_unlock(&r->h.lock);
  if (cancel) {
    req_finish(r, O_CANCELLED, NULL, "cancelled before it started");
    return 0;
  }
  lums_cur_task->req = r;
  lua_pushnil(L);
  lua_pushnil(L);
  lua_pushcclosure(L, req_msgh, 2);  /* one per request, on its stack */
  lua_pushcfunction(L, req_body);
  lua_pushlightuserdata(L, r);
  int st = lua_pcallk(L, 1, LUA_MULTRET, 1, (lua_KContext)r, req_main_k);
  return req_main_k(L, st, (lua_KContext)r);
}

void lums_vms_task_failed(ltask *t, bool fresh, const char *msg) {
  lreq *r = t->req;
  /* A request not begun yet has its function and argument still on the
  ** coroutine. */
  if (fresh && lua_tocfunction(t->co, 1) == req_main)
    r = (lreq *)lua_touserdata(t->co, 2);
  t->req = NULL;
  if (r) req_fail(r, msg);
}

/* Protected on the VM's own thread: (r) -> starts r's task. */
static int start_protected(lua_State *L) {
  lrun *vm = (lrun *)lua_touserdata(L, 1);
  lreq *r = (lreq *)lua_touserdata(L, 2);
  lua_settop(L, 0);
  lua_pushcfunction(L, req_main);
  lua_pushlightuserdata(L, r);
  vm->vms->ops->task_start(vm, 1);
  return 0;
}

static void refuse(lvms *v, int s, lreq *r, const char *err);

/* Starts request r, just taken off a queue, on scheduler s: in s's VM
** (created if need be) as a new task. Releases the queue's hold on the
** run. On s's thread, in its dispatcher. */
static void start_request(lvms *v, int s, lreq *r) {
  pthread_mutex_lock(&r->h.lock);
  bool cancel = r->cancel_req;
  if (!cancel) {
    r->state = R_STARTING;
    r->sched = s;
  }
  pthread_mutex_unlock(&r->h.lock);
  const char *err = NULL;
  if (cancel) {
    req_finish(r, O_CANCELLED, NULL, "cancelled before it started");
  } else {
    /* Lua code runs here outside any task (the init module, finalizers):
    ** ums waits must see "not inside a task", not a task blocked on
    ** another worker of this thread. */
    ltask *prev = lums_cur_task;
    lums_cur_task = NULL;
    lrun *vm = vm_get(v, s, &err);
    if (vm) err = vm_init(v, vm);
    /* A VM that cannot be set up, or whose init module failed, stays so:
    ** its scheduler refuses work from now on and r goes elsewhere. */
    if (err && (v->slot[s].failed || v->slot[s].init_state == 2)) {
      refuse(v, s, r, err);
      err = NULL;
    } else if (!err) {
      lua_State *L = vm->SL;
      lua_pushcfunction(L, start_protected);
      lua_pushlightuserdata(L, vm);
      lua_pushlightuserdata(L, r);
      if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
        char buf[256];
        snprintf(buf, sizeof buf, "ums.submit: cannot start the work: %s",
                 lua_tostring(L, -1) ? lua_tostring(L, -1) : "?");
        lua_pop(L, 1);
        /* The runtime refused the task because the run is being shut
        ** down: that is a cancellation, not an error of the work. */
        if (atomic_load(&v->stopping))
          req_finish(r, O_CANCELLED, NULL, "the run ended before it started");
        else
          req_fail(r, buf);
      }
    }
    lums_cur_task = prev;
    if (err) req_fail(r, err);
  }
  lums_vms_release(v);
}

/* ---------------------------------------------------------------------- */
/* Dispatchers                                                             */
/* ---------------------------------------------------------------------- */

typedef struct ldisp {
  lvms *v;               /* [const] */
  int sched;             /* [const] */
  int64_t busy_since;    /* [owner] when it first found the scheduler
                            busy since it last started work; 0: not */
  ums_sched_stats_t *rows; /* [owner] sched + 1 rows of scratch */
} ldisp;

/* Whether scheduler d->sched should start a request now: nothing else is
** runnable there, or the queue has been passed over for STARVE_NS. */
static bool sched_free(ldisp *d) {
  int s = d->sched;
  ums_runtime_stats(d->v->rt, d->rows, s + 1);
  if (d->rows[s].runnable == 0) return true;
  int64_t now = ums_now();
  if (d->busy_since == 0) {
    d->busy_since = now;
    return false;
  }
  return now - d->busy_since >= STARVE_NS;
}

/* Takes the next request for scheduler s: the oldest of its own queue,
** else the oldest of the longest other queue. [v->lock] */
static lreq *take_request(lvms *v, int s) {
  lreqq *q = &v->q[s];
  if (ums_list_empty(&q->list)) {
    int best = -1;
    for (int i = 0; i < v->nsched; i++)
      if (i != s && v->q[i].n > 0 && (best < 0 || v->q[i].n > v->q[best].n))
        best = i;
    if (best < 0) return NULL;
    q = &v->q[best];
  }
  lreq *r = REQ_OF_Q(q->list.head);
  q_remove(q, r);
  r->queued = false;
  return r;
}

static void disp_end(ldisp *d) {
  lvms *v = d->v;
  free(d->rows);
  free(d);
  lums_vms_release(v);
}

static int disp_spawn(lvms *v, int s);

/* The runtime cannot run dispatcher d any further (ums_step_error: no
** worker could be had for it). The request it would have started next
** fails with that error instead, and a new dispatcher takes over the
** queue: it runs once memory is back, or fails the next request the same
** way, so every queued request ends. If not even that can be spawned, the
** requests left in d's queue fail now: none may wait for a dispatcher
** that never comes. */
static int disp_fail(ldisp *d, int err) {
  lvms *v = d->v;
  int s = d->sched;
  const char *msg = ums_strerror(err);
  pthread_mutex_lock(&v->lock);
  lreq *r = take_request(v, s);
  if (!r) v->disp[s] = false;
  pthread_mutex_unlock(&v->lock);
  if (r) {
    req_fail(r, msg);
    if (disp_spawn(v, s) != 0) {
      for (;;) {
        pthread_mutex_lock(&v->lock);
        r = v->disp[s] ? NULL : REQ_OF_Q(v->q[s].list.head);
        if (r) {
          q_remove(&v->q[s], r);
          r->queued = false;
        }
        pthread_mutex_unlock(&v->lock);
        if (!r) break;
        req_fail(r, msg);
      }
    }
  }
  disp_end(d);
  return UMS_STEP_DONE;
}

static int disp_step(void *arg) {
  ldisp *d = arg;
  lvms *v = d->v;
  int s = d->sched;
  int err = ums_step_error();
  if (err) return disp_fail(d, err);
  /* Cancelled: the run is being torn down. Stopping: it failed. Either
  ** way the requests left are cancelled by lums_vms_close. */
  bool cancelled = ums_cancelled() || atomic_load(&v->stopping);
  if (!cancelled && !sched_free(d)) return UMS_STEP_YIELD;
  pthread_mutex_lock(&v->lock);
  lreq *r = cancelled || v->refused[s] ? NULL : take_request(v, s);
  if (!r) v->disp[s] = false;
  pthread_mutex_unlock(&v->lock);
  if (!r) {
    disp_end(d);
    return UMS_STEP_DONE;
  }
  d->busy_since = 0;
  start_request(v, s, r);
  return UMS_STEP_YIELD;
}

/* Starts a dispatcher on scheduler s, whose v->disp[s] the caller set.
** Returns 0 or the spawn's error (v->disp[s] is then cleared again). */
static int disp_spawn(lvms *v, int s) {
  ldisp *d = calloc(1, sizeof *d);
  ums_sched_stats_t *rows = calloc((size_t)s + 1, sizeof *rows);
  int rc = UMS_ENOMEM;
  if (d && rows) {
    d->v = v;
    d->sched = s;
    d->rows = rows;
    lums_vms_hold(v);
    ums_spawn_opts_t opts = {s, 1, "ums.dispatch"};
    rc = ums_task_spawn_step(v->rt, &opts, disp_step, d, NULL);
    if (rc == 0) return 0;
    lums_vms_release(v);
  }
  free(d);
  free(rows);
  pthread_mutex_lock(&v->lock);
  v->disp[s] = false;
  pthread_mutex_unlock(&v->lock);
  return rc;
}

/* ---------------------------------------------------------------------- */
/* ums.submit, ums.submit_on                                               */
/* ---------------------------------------------------------------------- */

/* The scheduler with the fewest tasks plus queued requests, among those
** that have not refused work; the caller's own (here; -1: none, a host
** thread) wins ties. -1 when every scheduler has refused. [v->lock] */
static int least_loaded(lvms *v, int here) {
  ums_runtime_stats(v->rt, v->rows, v->nsched);
  int best = -1;
  int64_t best_n = -1;
  for (int i = 0; i < v->nsched; i++) {
    if (v->refused[i]) continue;
    /* A dispatcher is not work of its scheduler's. */
    int64_t n = (int64_t)v->rows[i].tasks + v->q[i].n - (v->disp[i] ? 1 : 0);
    if (best_n < 0 || n < best_n || (n == best_n && i == here)) {
      best = i;
      best_n = n;
    }
  }
  return best;
}

/* Checks a "module.function" name. */
static bool good_name(const char *s, size_t len) {
  const char *dot = strrchr(s, '.');
  return len > 0 && strlen(s) == len && dot && dot != s && dot[1] != '\0';
}

/* Marks, with v->lock held, the schedulers that have no dispatcher and
** take work as getting one, in spawn[]; spawn_marked starts them once the
** lock is released. A dispatcher on every such scheduler: the target's
** starts a request, an idle one may steal it. */
static void mark_dispatchers(lvms *v, bool *spawn) {
  for (int i = 0; i < v->nsched; i++) {
    spawn[i] = !v->disp[i] && !v->refused[i];
    if (spawn[i]) v->disp[i] = true;
  }
}

/* Returns 0 or the first spawn's error. */
static int spawn_marked(lvms *v, const bool *spawn) {
  int rc = 0;
  for (int i = 0; i < v->nsched; i++) {
    if (!spawn[i]) continue;
    int e = disp_spawn(v, i);
    if (e && !rc) rc = e;
  }
  return rc;
}

/* Scheduler s could not set up its VM (err says why; it lives as long as
** v): from now on s takes no work, what is queued for s moves to the
** schedulers that take work, and so does r, which s's dispatcher had
** taken. When no scheduler takes work any more, r and every queued
** request end with the error, and so does every later request
** (lums_req_queue). r carries its queue's hold, which start_request
** releases; a requeued r gets a new one. On s's thread. */
static void refuse(lvms *v, int s, lreq *r, const char *err) {
  bool spawn[v->nsched];
  ums_list_t doomed = {NULL, NULL};  /* requests to fail, by qlink */
  pthread_mutex_lock(&r->h.lock);
  bool cancel = r->cancel_req;
  if (!cancel) {
    r->state = R_QUEUED;
    r->sched = -1;
  }
  pthread_mutex_lock(&v->lock);
  if (!v->refused[s]) {
    v->refused[s] = true;
    v->nrefused++;
  }
  v->refusal = err;
  int t = least_loaded(v, -1);
  if (t >= 0) {
    lreq *q;
    while ((q = REQ_OF_Q(v->q[s].list.head)) != NULL) {
      q_remove(&v->q[s], q);
      q->home = least_loaded(v, -1);
      q_push(&v->q[q->home], q);
    }
    if (!cancel) {
      lums_vms_hold(v);  /* the new queue's */
      r->home = t;
      r->queued = true;
      q_push(&v->q[t], r);
    }
    mark_dispatchers(v, spawn);
  } else {
    for (int i = 0; i < v->nsched; i++) {
      lreq *q;
      while ((q = REQ_OF_Q(v->q[i].list.head)) != NULL) {
        q_remove(&v->q[i], q);
        q->queued = false;
        ums_list_push_back(&doomed, &q->qlink);
      }
    }
    memset(spawn, 0, sizeof spawn);
  }
  pthread_mutex_unlock(&v->lock);
  pthread_mutex_unlock(&r->h.lock);
  if (cancel)
    req_finish(r, O_CANCELLED, NULL, "cancelled before it started");
  else if (t < 0)
    req_fail(r, err);
  for (ums_link_t *l; (l = ums_list_pop_front(&doomed)) != NULL;) {
    lreq *q = REQ_OF_Q(l);
    req_fail(q, err);
    lums_vms_release(v);  /* its queue's hold */
  }
  (void)spawn_marked(v, spawn);
}

int lums_req_queue(lvms *v, lreq *r, int target, int here) {
  bool spawn[v->nsched];
  lshared_ref(&r->h);  /* the run's, until done */
  lums_vms_hold(v);    /* the queue's, until started or cancelled */
  pthread_mutex_lock(&v->lock);
  /* A scheduler that refused work passes what is meant for it on. */
  if (target < 0 || v->refused[target]) target = least_loaded(v, here);
  ums_list_push_front(&v->active, &r->llink);
  if (target < 0) {
    /* Every scheduler refused: the work fails as theirs did. */
    const char *err = v->refusal;
    pthread_mutex_unlock(&v->lock);
    req_fail(r, err);
    lums_vms_release(v);
    return 0;
  }
  r->home = target;
  r->queued = true;
  q_push(&v->q[target], r);
  mark_dispatchers(v, spawn);
  pthread_mutex_unlock(&v->lock);
  int rc = spawn_marked(v, spawn);
  if (rc == UMS_ESHUTDOWN) {
    /* The run is ending: nothing will start it. */
    pthread_mutex_lock(&v->lock);
    bool was = r->queued;
    if (was) {
      q_remove(&v->q[r->home], r);
      r->queued = false;
    }
    pthread_mutex_unlock(&v->lock);
    if (was) {
      req_finish(r, O_CANCELLED, NULL, "the run is ending");
      lums_vms_release(v);
      return UMS_ESHUTDOWN;
    }
  }
  return 0;
}

/* Submits the function (or name) at fidx with the values above it. */
static int submit(lua_State *L, int target, int fidx, const char *fname) {
  const int ufidx = fidx;  /* argument numbers in messages */
  ltask *me = lums_need_task(L, fname);
  lvms *v = me->run->vms;
  int t = lua_type(L, fidx);
  char err[256];
  int bad;
  const char *name = NULL;
  if (t == LUA_TSTRING) {
    size_t len;
    name = lua_tolstring(L, fidx, &len);
    if (!good_name(name, len))
      lums_argerr(L, fidx, fname, "\"module.function\" expected");
  } else if (t != LUA_TFUNCTION) {
    lums_typeerr(L, fidx, fname, "function or \"module.function\"");
  }
  /* The handle first: if anything below raises, it frees what it has. */
  lreq *r = lshared_new(L, sizeof *r, &work_kind);
  lua_insert(L, fidx);  /* below the function; the arguments stay last */
  fidx++;
  r->rt = v->rt;
  r->vms = v;
  r->sched = -1;
  r->state = R_QUEUED;
  if (name && !(r->name = strdup(name)))
    return luaL_error(L, "ums.%s: out of memory", fname);
  if (!name) {
    r->fn = lcopy_encode(L, fidx, 1, "fn", false, err, sizeof err, &bad);
    if (!r->fn) lums_argerr(L, ufidx, fname, err);
  }
  int nargs = lua_gettop(L) - fidx;
  r->args = lcopy_encode(L, fidx + 1, nargs, "args", true, err, sizeof err,
                         &bad);
  if (!r->args) lums_argerr(L, ufidx + 1 + bad, fname, err);

  if (lums_req_queue(v, r, target, me->run->sched) == UMS_ESHUTDOWN)
    return luaL_error(L, "ums.%s: the run is ending", fname);
  lua_settop(L, fidx - 1);  /* the handle */
  return 1;
}

/* ums.submit(fn | "module.function", ...) -> work */
static int l_submit(lua_State *L) { return submit(L, -1, 1, "submit"); }

/* ums.submit_on(i, fn | "module.function", ...) -> work */
static int l_submit_on(lua_State *L) {
  int isint;
  lua_Integer i = lua_tointegerx(L, 1, &isint);
  if (!isint) {
    if (lua_type(L, 1) != LUA_TNUMBER)
      lums_typeerr(L, 1, "submit_on", "number");
    lums_argerr(L, 1, "submit_on", "number has no integer representation");
  }
  ltask *me = lums_need_task(L, "submit_on");
  int n = me->run->vms->nsched;
  if (i < 0 || i >= n)
    lums_argerr(L, 1, "submit_on",
                lua_pushfstring(L, "scheduler %I out of range (0 to %d)",
                                (LUAI_UACINT)i, n - 1));
  return submit(L, (int)i, 2, "submit_on");
}

/* ums.scheduler() -> the index of the current task's scheduler, from 0
** as everywhere (ums.stats, ums.tasks, the C API); nil outside tasks. */
static int l_scheduler(lua_State *L) {
  ltask *t = lums_cur_task;
  if (!t || !t->run)
    lua_pushnil(L);
  else
    lua_pushinteger(L, t->run->sched);
  return 1;
}

/* ums.schedulers() -> the number of schedulers of the run; nil outside. */
static int l_schedulers(lua_State *L) {
  ltask *t = lums_cur_task;
  if (!t || !t->run)
    lua_pushnil(L);
  else
    lua_pushinteger(L, t->run->vms->nsched);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* Work handles                                                            */
/* ---------------------------------------------------------------------- */

static lreq *check_work(lua_State *L, const char *fname) {
  return (lreq *)lshared_check(L, 1, &work_kind, fname);
}

/* Pushes a done request's outcome as join returns it. */
static int push_outcome(lua_State *L, lreq *r) {
  if (r->outcome == O_OK) {
    lua_pushboolean(L, 1);
    return 1 + (r->results ? lcopy_decode(L, r->results) : 0);
  }
  lua_pushboolean(L, 0);
  if (r->outcome == O_CANCELLED)
    lua_getfield(L, LUA_REGISTRYINDEX, LUMS_CANCELLED_KEY);
  else if (r->results)
    lcopy_decode(L, r->results);
  else
    lua_pushnil(L);
  lua_pushstring(L, r->traceback ? r->traceback : "");
  return 3;
}

static int join_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  lreq *r = (lreq *)lshared_test(L, 1);
  int res = lshared_wait_end((lswait *)ctx, NULL);
  if (res == UMS_ECANCELED) return lums_raise_cancelled(L);
  pthread_mutex_lock(&r->h.lock);
  bool done = r->state == R_DONE;
  if (done) r->joined = true;
  pthread_mutex_unlock(&r->h.lock);
  if (!done) {
    lua_pushnil(L);
    lua_pushliteral(L, "timeout");
    return 2;
  }
  return push_outcome(L, r);
}

/* w:join([timeout]) -> true, results... | false, err, traceback |
** nil, "timeout" */
static int work_join(lua_State *L) {
  LUMS_YIELD_POINT(L, work_join);
  lreq *r = check_work(L, "join");
  bool poll;
  int64_t deadline = lums_opt_timeout(L, 2, "join", &poll);
  lua_settop(L, 1);
  ltask *me = lums_cur_task;
  pthread_mutex_lock(&r->h.lock);
  if (r->state == R_DONE) {
    r->joined = true;
    pthread_mutex_unlock(&r->h.lock);
    return push_outcome(L, r);
  }
  if (poll) {
    pthread_mutex_unlock(&r->h.lock);
    lua_pushnil(L);
    lua_pushliteral(L, "timeout");
    return 2;
  }
  bool self = r->state == R_RUNNING && r->task == ums_self();
  if (!me || !me->run || self) {
    pthread_mutex_unlock(&r->h.lock);
    if (self) return luaL_error(L, "ums.work:join: work cannot join itself");
    lums_need_task(L, "work:join");
  }
  lswait *w = lshared_wait_begin(L, me, &r->h, &r->joiners, deadline);
  pthread_mutex_unlock(&r->h.lock);
  return lums_park_finish(L, me, (lua_KContext)w, join_k);
}

bool lums_req_cancel(lreq *r) {
  lvms *v = r->vms;
  bool dequeued = false, ok = true;
  ums_task_t task = 0;
  pthread_mutex_lock(&r->h.lock);
  switch (r->state) {
    case R_DONE:
      ok = false;
      break;
    case R_RUNNING:
      task = r->task;
      break;
    case R_STARTING:
      r->cancel_req = true;
      break;
    default: /* R_QUEUED: still in its queue, or taken by a dispatcher */
      pthread_mutex_lock(&v->lock);
      if (r->queued) {
        q_remove(&v->q[r->home], r);
        r->queued = false;
        dequeued = true;
      }
      pthread_mutex_unlock(&v->lock);
      if (!dequeued) r->cancel_req = true;
      break;
  }
  pthread_mutex_unlock(&r->h.lock);
  if (dequeued) {
    /* Off its queue, nobody else can start it now. */
    req_finish(r, O_CANCELLED, NULL, "cancelled before it started");
    lums_vms_release(v);
  }
  if (task) ums_task_cancel(r->rt, task);
  return ok;
}

/* w:cancel() -> true if the request was not done: one not started never
** starts; a running one sees ums.CANCELLED at its next wait (its quantum,
** if it computes). false once done. */
static int work_cancel(lua_State *L) {
  lua_pushboolean(L, lums_req_cancel(check_work(L, "cancel")));
  return 1;
}

/* w:status() -> "pending" | "running" | "done" | "error" | "cancelled" */
static int work_status(lua_State *L) {
  lreq *r = check_work(L, "status");
  pthread_mutex_lock(&r->h.lock);
  int st = r->state, out = r->outcome;
  pthread_mutex_unlock(&r->h.lock);
  const char *s = st == R_RUNNING ? "running"
                  : st != R_DONE  ? "pending"
                  : out == O_OK   ? "done"
                  : out == O_ERROR ? "error"
                                   : "cancelled";
  lua_pushstring(L, s);
  return 1;
}

/* w:scheduler() -> where it started (from 0), nil before. */
static int work_scheduler(lua_State *L) {
  lreq *r = check_work(L, "scheduler");
  pthread_mutex_lock(&r->h.lock);
  int s = r->sched;
  pthread_mutex_unlock(&r->h.lock);
  if (s < 0)
    lua_pushnil(L);
  else
    lua_pushinteger(L, s);
  return 1;
}

/* w:name() -> "module.function", or "" for a function. */
static int work_name(lua_State *L) {
  lreq *r = check_work(L, "name");
  lua_pushstring(L, r->name ? r->name : "");
  return 1;
}

static const luaL_Reg work_methods[] = {{"join", work_join},
                                        {"cancel", work_cancel},
                                        {"status", work_status},
                                        {"scheduler", work_scheduler},
                                        {"name", work_name},
                                        {NULL, NULL}};

/* ---------------------------------------------------------------------- */
/* The end of a run                                                        */
/* ---------------------------------------------------------------------- */

/* Calls L's on_error for each failed request nobody joined. */
static void report_failed(lua_State *L, lvms *v) {
  lreq *r;
  while ((r = REQ_OF_L(v->failed.head)) != NULL) {
    ums_list_remove(&v->failed, &r->llink);
    bool report = !r->joined;
    r->joined = true;
    if (report) {
      lua_getfield(L, LUA_REGISTRYINDEX, ONERROR_KEY);
      if (r->results)
        lcopy_decode(L, r->results);
      else
        lua_pushnil(L);
      lua_pushstring(L, r->traceback ? r->traceback : "");
      lshared_push(L, &r->h);
      if (lua_pcall(L, 3, 0, 0) != LUA_OK) {
        fprintf(stderr, "ums: error in the on_error handler: %s\n",
                lua_tostring(L, -1));
        lua_pop(L, 1);
      }
    }
    lshared_unref(&r->h);
  }
}

/* Protected on a VM being closed: (lvms) -> reports its errors. */
static int report_protected(lua_State *L) {
  lvms *v = (lvms *)lua_touserdata(L, 1);
  lua_settop(L, 0);
  v->ops->report_errors(L);
  return 0;
}

void lums_vms_close(lua_State *L, lvms *v) {
  /* Requests never started: the run ended first. */
  for (int i = 0; v->q && i < v->nsched; i++) {
    lreq *r;
    while ((r = REQ_OF_Q(v->q[i].list.head)) != NULL) {
      q_remove(&v->q[i], r);
      r->queued = false;
      req_finish(r, O_CANCELLED, NULL, "the run ended before it started");
    }
  }
  /* Requests whose task was cancelled before it began. */
  while (!ums_list_empty(&v->active))
    req_finish(REQ_OF_L(v->active.head), O_CANCELLED, NULL,
               "the run ended before it started");
  /* The main VM reports the failed requests nobody joined; a hosted run
  ** has none, and the first VM it made does it. */
  lua_State *RL = L;
  int first = v->main ? 1 : 0;
  for (int i = first; !v->main && v->slot && i < v->nsched && !RL; i++)
    RL = v->slot[i].L;
  if (RL) {
    report_failed(RL, v);
  } else {
    lreq *r;
    while ((r = REQ_OF_L(v->failed.head)) != NULL) {
      ums_list_remove(&v->failed, &r->llink);
      lshared_unref(&r->h);
    }
  }
  for (int i = first; v->slot && i < v->nsched; i++) {
    lvmslot *sl = &v->slot[i];
    lrun *r = atomic_load_explicit(&v->vm[i], memory_order_acquire);
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
  free(v->q);
  free(v->disp);
  free(v->refused);
  free(v->rows);
  free(v->path);
  free(v->cpath);
  free(v->init);
  pthread_mutex_destroy(&v->lock);
  pthread_mutex_destroy(&v->quiet_lock);
  pthread_cond_destroy(&v->quiet_cond);
  free(v);
}

/* ---------------------------------------------------------------------- */
/* Registration                                                            */
/* ---------------------------------------------------------------------- */

void lums_open_vm(lua_State *L) {
  static const luaL_Reg funcs[] = {{"submit", l_submit},
                                   {"submit_on", l_submit_on},
                                   {"scheduler", l_scheduler},
                                   {"schedulers", l_schedulers},
                                   {NULL, NULL}};
  lshared_register(L, &work_kind);
  luaL_setfuncs(L, funcs, 0);
}
