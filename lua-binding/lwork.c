/*
** lwork.c: ums.submit, ums.submit_on and the work handles. ums.submit(fn,
** ...) makes a work request (lreq.c): the function (bytecode, or a
** "module.function" name) and the arguments are copied into C memory
** (lcopy.c) and the request is queued (ldisp.c) where the runtime's
** placement puts it, or on the scheduler submit_on names. The handle is a
** shared object (lproxy.c), so any VM may join or cancel it and pass it
** on. At the end of the run (lums_run_close) the errors of failed work
** nobody joined go to the main VM's on_error.
*/
#define _GNU_SOURCE  /* strdup */
#include "lvm.h"
#include "lpark.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ONERROR_KEY "ums.on_error"     /* lums.c */

static const luaL_Reg work_methods[];
static void req_destroy(lshared *o) {
  lums_req_clear((lreq *)o);
  free(o);
}

static const lshared_kind work_kind = {"ums.work", req_destroy, work_methods};

/* Checks a "module.function" name. */
static bool good_name(const char *s, size_t len) {
  const char *dot = strrchr(s, '.');
  return len > 0 && strlen(s) == len && dot && dot != s && dot[1] != '\0';
}

/* Submits the function (or name) at fidx with the values above it. */
static int submit(lua_State *L, int target, int fidx, const char *fname) {
  const int ufidx = fidx;  /* argument numbers in messages */
  ltask *me = lums_need_task(L, fname);
  lrun *v = me->vmrun->run;
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
  r->run = v;
  r->sched = -1;
  r->state = R_QUEUED;
  if (!(r->done = ums_event_new(1, 0)))
    return luaL_error(L, "ums.%s: out of memory", fname);
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

  if (lums_req_queue(v, r, target) == UMS_ESHUTDOWN)
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
  int n = me->vmrun->run->nsched;
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
  if (!t || !t->vmrun)
    lua_pushnil(L);
  else
    lua_pushinteger(L, t->vmrun->sched);
  return 1;
}

/* ums.schedulers() -> the number of schedulers of the run; nil outside. */
static int l_schedulers(lua_State *L) {
  ltask *t = lums_cur_task;
  if (!t || !t->vmrun)
    lua_pushnil(L);
  else
    lua_pushinteger(L, t->vmrun->run->nsched);
  return 1;
}

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
  int res = ums_event_wait_end((ums_event_t *)ctx);
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
  if (!me || !me->vmrun || self) {
    pthread_mutex_unlock(&r->h.lock);
    if (self) return luaL_error(L, "ums.work:join: work cannot join itself");
    lums_need_task(L, "work:join");
  }
  int rc = ums_event_wait_begin_as(r->done, deadline, UMS_WAIT_JOIN, r);
  pthread_mutex_unlock(&r->h.lock);
  if (rc == 1) return lums_park_finish(L, me, (lua_KContext)r->done, join_k);
  /* Done since the look above (0), or no wait could begin. */
  if (rc == 0) return join_k(L, LUA_OK, (lua_KContext)r->done);
  if (rc == UMS_ECANCELED) return lums_raise_cancelled(L);
  return luaL_error(L, "ums: cannot wait: %s", ums_strerror(rc));
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

/* Calls L's on_error for each failed request nobody joined. */
static void report_failed(lua_State *L, lrun *v) {
  lreq *r;
  while ((r = REQ_OF_L(v->reqs.failed.head)) != NULL) {
    ums_list_remove(&v->reqs.failed, &r->llink);
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

void lums_run_close(lua_State *L, lrun *v) {
  lums_disp_close(v);
  lua_State *RL = lums_run_report_state(v, L);
  if (RL) {
    report_failed(RL, v);
  } else {
    lreq *r;
    while ((r = REQ_OF_L(v->reqs.failed.head)) != NULL) {
      ums_list_remove(&v->reqs.failed, &r->llink);
      lshared_unref(&r->h);
    }
  }
  lums_run_free(v);
}

void lums_open_work(lua_State *L) {
  static const luaL_Reg funcs[] = {{"submit", l_submit},
                                   {"submit_on", l_submit_on},
                                   {"scheduler", l_scheduler},
                                   {"schedulers", l_schedulers},
                                   {NULL, NULL}};
  lshared_register(L, &work_kind);
  luaL_setfuncs(L, funcs, 0);
}

