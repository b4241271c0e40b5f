/*
** lreq.c: work requests, what ums.submit (lwork.c) and a C host (lhost.c)
** make. A request carries its work by value (lcopy.c), so that it may
** start in any scheduler's VM; the scheduler the runtime gives it to
** (ldisp.c) starts it here as a task of that VM (lums_req_start), whose
** body runs the work under a message handler that keeps the traceback,
** catches every error and copies the results or the error out. Whatever
** ends a request (its task, a cancel, a refusal, the end of the run) ends
** it through lums_req_finish, which wakes its joiners and takes it off
** the run's active list.
*/
#define _GNU_SOURCE  /* strdup */
#include "ltask.h"
#include "lvm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void lums_req_clear(lreq *r) {
  if (r->done) ums_event_delete(r->done);
  free(r->name);
  free(r->chunk);
  free(r->chunkname);
  lcopy_free(r->fn);
  lcopy_free(r->args);
  lcopy_free(r->results);
  free(r->traceback);
}

void lums_req_finish(lreq *r, int outcome, lmsg *results, const char *tb) {
  lrun *v = r->run;
  char *tbcopy = tb ? strdup(tb) : NULL;
  pthread_mutex_lock(&r->h.lock);
  r->outcome = outcome;
  r->results = results;
  r->traceback = tbcopy;
  r->state = R_DONE;
  pthread_mutex_unlock(&r->h.lock);
  /* After the state: a joiner that finds the request not done under the
  ** lock begins its wait before this set, or finds the event set. */
  if (r->done) ums_event_set(r->done);
  pthread_mutex_lock(&v->reqs.lock);
  ums_list_remove(&v->reqs.active, &r->llink);
  /* A host request's outcome always reaches the host (on_finish); only
  ** Lua ones wait for on_error at the end of the run. */
  bool keep = outcome == O_ERROR && !r->on_finish;
  if (keep) ums_list_push_front(&v->reqs.failed, &r->llink);
  pthread_mutex_unlock(&v->reqs.lock);
  if (r->on_finish) r->on_finish(r);
  if (!keep) lshared_unref(&r->h);
}

void lums_req_fail(lreq *r, const char *msg) {
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
  lums_req_finish(r, O_ERROR, m, msg);
}

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
** -> nothing; the message is left in r->results by lums_req_finish's
** caller. */
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
  lums_cur_task->req.running = NULL;
  encode_out o;
  if (status == LUA_OK || status == LUA_YIELD) {
    int n = lua_gettop(L) - 1;  /* above the message handler */
    lmsg *m = encode_values(L, n, "results", &o);
    if (m) {
      lums_req_finish(r, O_OK, m, NULL);
    } else {
      char buf[320];
      snprintf(buf, sizeof buf, "ums.submit: cannot copy the results: %s",
               o.err);
      lums_req_fail(r, buf);
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
  lums_req_finish(r, cancelled ? O_CANCELLED : O_ERROR, m,
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
    lums_req_finish(r, O_CANCELLED, NULL, "cancelled before it started");
    return 0;
  }
  lums_cur_task->req.running = r;
  lua_pushnil(L);
  lua_pushnil(L);
  lua_pushcclosure(L, req_msgh, 2);  /* one per request, on its stack */
  lua_pushcfunction(L, req_body);
  lua_pushlightuserdata(L, r);
  int st = lua_pcallk(L, 1, LUA_MULTRET, 1, (lua_KContext)r, req_main_k);
  return req_main_k(L, st, (lua_KContext)r);
}

void lums_req_task_failed(ltask *t, bool fresh, const char *msg) {
  lreq *r = t->req.running;
  /* A request not begun yet has its function and argument still on the
  ** coroutine. */
  if (fresh && lua_tocfunction(t->co, 1) == req_main)
    r = (lreq *)lua_touserdata(t->co, 2);
  t->req.running = NULL;
  if (r) lums_req_fail(r, msg);
}

int lums_req_start(lua_State *L) {
  lvmrun *vm = (lvmrun *)lua_touserdata(L, 1);
  lreq *r = (lreq *)lua_touserdata(L, 2);
  lua_settop(L, 0);
  lua_pushcfunction(L, req_main);
  lua_pushlightuserdata(L, r);
  vm->run->ops->task_start(vm, 1);
  return 0;
}
