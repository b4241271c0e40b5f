/*
** lext.c: the C extension API (runtime/include/ums-lua.h), and the
** preemptive-call path it shares with ums.ffi (lccall.c).
**
** ums.core publishes a static ums_lua_api_t in the registry of every Lua
** state it is loaded into (lums_open_ext). A C module's lua_CFunction
** calls ums_lua_preempt through it: ext_preempt below. One call:
**
**   Lua thread (scheduler)              pool thread
**   ext_preempt: guard owns ud (a
**     to-be-closed userdata on the
**     C function's stack)
**   job takes ud; ums_preempt_begin_spin --> job_run: work(ud)
**   park (yield, or bind the worker)    CAS DONE, unpark
**     (or, the scheduler otherwise idle, spin in place: the pool's
**     CAS DONE ends the spin, and ext_k runs at once, no park)
**   ext_k: ums_preempt_end = 0
**     guard owns ud again
**     k(L, UMS_LUA_OK, ud) via run_k
**   the C function's frame closes:
**     guard releases ud
**
** When the caller gives up (timeout: k(L, UMS_LUA_TIMEOUT, NULL);
** cancellation: ums.CANCELLED raised), ud stays with the job, and the
** runtime calls job_release on the pool thread once the work returned.
**
** Ownership of ud, at every moment exactly one of: the guard (g->owned),
** the job in flight (from ums_preempt_begin until ums_preempt_end returns
** 0, or, if the caller gave up, until the runtime calls job_release).
*/
#include "lums.h"
#include "lext.h"
#include "lpark.h"
#include "ums-lua.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define GUARD_MT "ums.lua.guard"

/* ---------------------------------------------------------------------- */
/* Going preemptive: shared by ums.ffi and ums_lua_preempt                 */
/* ---------------------------------------------------------------------- */

/* The name for a message: the caller's, or the running function's. Only
** computed on error paths (it may search the loaded modules). */
static const char *name_or_fname(lua_State *L, const char *name) {
  return name ? name : ums_lua_pushfname(L);
}

/* What follows the begin of a call for lums_preempt_start and
** lums_preempt_start_prepared. */
static int started(lua_State *L, ltask *t, const char *name, int rc,
                   lua_KContext ctx, lua_KFunction k) {
  /* Returned during the spin at the call site: no park, no yield. */
  if (rc == 1) return k(L, LUA_OK, ctx);
  /* On failure the runtime has called release(arg) (or, cancelled during
  ** the spin, will, once the call returns). */
  if (rc == UMS_ECANCELED) return lums_raise_cancelled(L);
  if (rc == UMS_EBUSY)
    return luaL_error(L, "%s: cannot call between ums.park_begin and "
                         "ums.park_wait", name_or_fname(L, name));
  if (rc)
    return luaL_error(L, "%s: %s", name_or_fname(L, name),
                      ums_strerror(rc));
  return lums_park_finish(L, t, ctx, k);
}

int lums_preempt_start(lua_State *L, ltask *t, const char *name,
                       ums_preempt_fn fn, void *arg, ums_preempt_fn release,
                       int64_t deadline, ums_preempt_call_t **call,
                       lua_KContext ctx, lua_KFunction k) {
  /* Spinning for the call prolongs the step: not once the quantum has
  ** asked it to end. */
  int rc = lums_quantum_due(t)
               ? ums_preempt_begin(fn, arg, release, deadline, call)
               : ums_preempt_begin_spin(fn, arg, release, deadline, call);
  return started(L, t, name, rc, ctx, k);
}

int lums_preempt_start_prepared(lua_State *L, ltask *t, const char *name,
                                ums_preempt_call_t *call, ums_preempt_fn fn,
                                void *arg, ums_preempt_fn release,
                                int64_t deadline, bool interrupt,
                                lua_KContext ctx, lua_KFunction k) {
  int rc = ums_preempt_begin_prepared(
      call, fn, arg, release, deadline,
      (lums_quantum_due(t) ? 0 : UMS_PREEMPT_SPIN) |
          (interrupt ? UMS_PREEMPT_INTERRUPT : 0));
  return started(L, t, name, rc, ctx, k);
}

int lums_preempt_settle(lua_State *L, ums_preempt_call_t *call,
                        const char *name) {
  return lums_preempt_settle_copy(L, call, name, NULL, 0);
}

int lums_preempt_settle_copy(lua_State *L, ums_preempt_call_t *call,
                             const char *name, void *out, size_t n) {
  int rc = ums_preempt_end_copy(call, out, n);
  if (rc == 0 || rc == UMS_ETIMEDOUT) return rc;
  if (rc == UMS_ECANCELED) return lums_raise_cancelled(L);
  return luaL_error(L, "%s: %s", name_or_fname(L, name), ums_strerror(rc));
}

/* ---------------------------------------------------------------------- */
/* The job: what the pool runs                                             */
/* ---------------------------------------------------------------------- */

typedef struct job {
  ums_lua_work_t pub;          /* [const] what the work function sees */
  _Atomic int gave_up;         /* set by the Lua thread once its park ended
                                  by timeout or cancel; read by the work */
  ums_lua_work_fn work;        /* [const] */
  void *ud;                    /* [const pointer] owned by the job */
  ums_lua_release_fn release;  /* [const] */
  int flags;                   /* [const] UMS_LUA_* */
  int err;                     /* [pool thread, then the Lua thread once
                                  the call is settled] errno after work */
  ums_preempt_call_t *call;    /* [Lua thread] the call in flight */
} job;

static int job_abandoned(const ums_lua_work_t *w) {
  const job *j = (const job *)w;
  return atomic_load_explicit(&j->gave_up, memory_order_relaxed);
}

static void job_init(job *j, ums_lua_work_fn work, void *ud,
                     ums_lua_release_fn release, int flags) {
  j->pub.size = sizeof j->pub;
  j->pub.abandoned = job_abandoned;
  atomic_init(&j->gave_up, 0);
  j->work = work;
  j->ud = ud;
  j->release = release;
  j->flags = flags;
  j->err = 0;
  j->call = NULL;
}

/* The work, on a pool thread (or the caller's, outside tasks). */
static void job_run(void *arg) {
  job *j = arg;
  if (j->flags & UMS_LUA_ERRNO) errno = 0;
  j->work(j->ud, &j->pub);
  j->err = errno;
}

/* The runtime's release callback: the caller gave up (or the call could
** not start) and the work is over. Any thread. */
static void job_release(void *arg) {
  job *j = arg;
  if (j->release) j->release(j->ud);
  free(j);
}

/* ---------------------------------------------------------------------- */
/* The guard: ud's owner on the Lua side                                   */
/* ---------------------------------------------------------------------- */

/* A full userdata on the calling C function's stack, marked to-be-closed:
** its __close (at the function's return, or as an error unwinds it)
** releases ud if it owns it. __gc does the same for a frame that is never
** closed (a user's coroutine that died of an error and was dropped). All
** fields are the Lua thread's. */
typedef struct guard {
  void *ud;
  ums_lua_release_fn release;
  bool owned;            /* ud is the guard's to release */
  bool set_errno;        /* UMS_LUA_ERRNO */
  int status;            /* for k: UMS_LUA_OK or UMS_LUA_TIMEOUT */
  int err;               /* errno for k */
  ums_lua_cont_fn k;
  job *j;                /* the job in flight, until the continuation */
} guard;

static int guard_close(lua_State *L) {
  guard *g = (guard *)lua_touserdata(L, 1);
  if (g && g->owned) {
    g->owned = false;
    if (g->release) g->release(g->ud);
  }
  return 0;
}

/* Pushes a new guard that owns nothing yet; run under lua_pcall, so that
** running out of memory here still lets the caller release ud. */
static int new_guard(lua_State *L) {
  guard *g = (guard *)lua_newuserdatauv(L, sizeof *g, 0);
  memset(g, 0, sizeof *g);
  luaL_setmetatable(L, GUARD_MT);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* The continuation                                                        */
/* ---------------------------------------------------------------------- */

/* Calls k in a frame of its own: k may pop the values below it without
** closing the guard, and may itself yield. Upvalue-free: the guard is its
** first argument. */
static int run_k(lua_State *L) {
  guard *g = (guard *)lua_touserdata(L, 1);
  lua_remove(L, 1);
  void *ud = g->owned ? g->ud : NULL;
  if (g->set_errno && g->status == UMS_LUA_OK) errno = g->err;
  return g->k(L, g->status, ud);
}

static int results_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  return lua_gettop(L) - (int)ctx;
}

/* Runs k through run_k with copies of the values below the guard at gidx
** as its stack; returns k's results. */
static int call_k(lua_State *L, int gidx) {
  luaL_checkstack(L, gidx + 1, "too many values for the continuation");
  lua_pushcfunction(L, run_k);
  for (int i = 1; i <= gidx; i++) lua_pushvalue(L, i);
  lua_rotate(L, gidx + 2, 1);  /* the guard first */
  lua_callk(L, gidx, LUA_MULTRET, gidx, results_k);
  return lua_gettop(L) - gidx;
}

/* After the park: settle the call, hand ud back to the guard, run k. */
static int ext_k(lua_State *L, int status, lua_KContext ctx) {
  int gidx = (int)ctx;
  guard *g = (guard *)lua_touserdata(L, gidx);
  job *j = g->j;
  g->j = NULL;
  /* Before ums_preempt_end: until its CAS the job is alive for sure (the
  ** runtime frees a given-up job only after that CAS). */
  if (status != LUA_OK && ums_park_result() < 0)
    atomic_store_explicit(&j->gave_up, 1, memory_order_relaxed);
  int rc = lums_preempt_settle(L, j->call, NULL);
  if (rc == 0) {
    /* The work returned: the job is ours, ud the guard's again. */
    g->owned = true;
    g->status = UMS_LUA_OK;
    g->err = j->err;
    free(j);
  } else {
    /* Timed out: the job is the runtime's (job_release frees it). */
    g->status = UMS_LUA_TIMEOUT;
  }
  return call_k(L, gidx);
}

/* ---------------------------------------------------------------------- */
/* ums_lua_preempt                                                         */
/* ---------------------------------------------------------------------- */

static int64_t to_deadline(double timeout) {
  if (!(timeout >= 0) || timeout > 1e9) return UMS_FOREVER;
  return ums_deadline((int64_t)(timeout * 1e9));
}

static int ext_preempt(lua_State *L, ums_lua_work_fn work, void *ud,
                       ums_lua_release_fn release, ums_lua_cont_fn k,
                       double timeout, int flags) {
  const char *bad = !work ? "the work function is NULL"
                  : !k ? "the continuation is NULL"
                  : (flags & ~UMS_LUA_ERRNO) ? "unknown flags"
                  : NULL;
  if (bad || !lua_checkstack(L, 4)) {
    if (release) release(ud);
    if (!bad) bad = "stack overflow";
    return luaL_error(L, "ums_lua_preempt (in '%s'): %s",
                      ums_lua_pushfname(L), bad);
  }
  lua_pushcfunction(L, new_guard);
  if (lua_pcall(L, 0, 1, 0) != LUA_OK) {
    if (release) release(ud);
    return lua_error(L);
  }
  /* From here on, an error anywhere releases ud through the guard. */
  guard *g = (guard *)lua_touserdata(L, -1);
  g->ud = ud;
  g->release = release;
  g->owned = true;
  g->k = k;
  g->set_errno = (flags & UMS_LUA_ERRNO) != 0;
  lua_toclose(L, -1);
  int gidx = lua_gettop(L);

  ltask *t = lums_cur_task;
  if (!t || !t->vmrun) {
    /* Outside a task: right here, and nobody can give up on it. */
    job j;
    job_init(&j, work, ud, release, flags);
    job_run(&j);
    g->status = UMS_LUA_OK;
    g->err = j.err;
    return call_k(L, gidx);
  }
  job *j = malloc(sizeof *j);
  if (!j)
    return luaL_error(L, "%s: out of memory", ums_lua_pushfname(L));
  job_init(j, work, ud, release, flags);
  g->owned = false;  /* the job's now */
  g->j = j;
  return lums_preempt_start(L, t, NULL, job_run, j, job_release,
                            to_deadline(timeout), &j->call, gidx, ext_k);
}

/* ---------------------------------------------------------------------- */
/* ums_lua_wait_fd                                                         */
/* ---------------------------------------------------------------------- */

/* A wait in flight: a userdata pushed above the caller's stack (at
** index top + 1), dropped before k runs. Touched only by the task. */
typedef struct fdwait {
  ums_fs_req_t *req;
  ums_lua_fd_cont_fn k;
  void *ctx;
  int top;               /* the caller's stack top */
} fdwait;

static int fd_result(lua_State *L, int64_t r, ums_lua_fd_cont_fn k,
                     void *ctx) {
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  if (r == UMS_ETIMEDOUT) r = 0;
  if (r < 0)
    return luaL_error(L, "%s: %s", ums_lua_pushfname(L), strerror((int)-r));
  return k(L, (int)r, ctx);
}

static int wait_fd_k(lua_State *L, int status, lua_KContext kctx) {
  (void)status;
  fdwait *w = (fdwait *)kctx;
  int64_t r = ums_net_end(w->req, NULL, NULL);
  ums_lua_fd_cont_fn k = w->k;
  void *ctx = w->ctx;
  lua_settop(L, w->top);  /* w goes with it */
  return fd_result(L, r, k, ctx);
}

static int ext_wait_fd(lua_State *L, int fd, int events, double timeout,
                       ums_lua_fd_cont_fn k, void *ctx) {
  ltask *t = lums_cur_task;
  if (!t || !t->vmrun) {
    int64_t r = ums_wait_fd(fd, events, to_deadline(timeout));
    return fd_result(L, r, k, ctx);
  }
  int top = lua_gettop(L);
  fdwait *w = lua_newuserdatauv(L, sizeof *w, 0);
  w->k = k;
  w->ctx = ctx;
  w->top = top;
  int rc = ums_wait_fd_begin(fd, events, to_deadline(timeout), &w->req);
  if (rc == UMS_EBUSY)
    return luaL_error(L, "%s: cannot wait between ums.park_begin and "
                         "ums.park_wait", ums_lua_pushfname(L));
  if (rc > 0) return lums_answered_now(L, (lua_KContext)w, wait_fd_k);
  if (rc) {
    lua_settop(L, top);
    return fd_result(L, rc, k, ctx);
  }
  return lums_park_finish(L, t, (lua_KContext)w, wait_fd_k);
}

/* Static: the table must outlive every state (the module is pinned). */
static const ums_lua_api_t ext_api = {
    .version = UMS_LUA_API_VERSION,
    .size = sizeof(ums_lua_api_t),
    .preempt = ext_preempt,
    .wait_fd = ext_wait_fd,
};

void lums_open_ext(lua_State *L) {
  if (luaL_newmetatable(L, GUARD_MT)) {
    lua_pushcfunction(L, guard_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, guard_close);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  lua_pushlightuserdata(L, (void *)&ext_api);
  lua_setfield(L, LUA_REGISTRYINDEX, UMS_LUA_API_KEY);
}
