/*
** ltask.c: task handles: ums.self(), the handle methods (join, cancel,
** status, name, id, locals, tostring) and the joins that wait for a task's
** end. A handle outlives its task and keeps only the outcome (struct
** lhandle); lums.c's task life cycle fills it in when the task ends and
** wakes the joiners.
*/
#include "ltask.h"
#include "lpark.h"

#include <stdlib.h>
#include <string.h>

/* The task whose step runs on this thread: set by the step and by a task
** that waited on its own worker (lums_become_current). */
_Thread_local ltask *lums_cur_task;

const char lums_task_tag = 0;

lhandle *lums_to_task(lua_State *L, int idx) {
  lhandle *h = (lhandle *)lua_touserdata(L, idx);
  if (!h || lua_rawlen(L, idx) != sizeof *h || h->tag != &lums_task_tag)
    return NULL;
  return h;
}

lhandle *lums_check_task(lua_State *L, int idx) {
  lhandle *h = lums_to_task(L, idx);
  if (!h) luaL_checkudata(L, idx, LUMS_TASK_MT);  /* the usual error */
  return h;
}

/* A joiner that timed out takes its entry back, so that polling join with
** a timeout does not grow the list. */
static void drop_joiner(ltask *t, ums_task_t who, uint64_t seq) {
  for (int i = 0; i < t->njoiners; i++) {
    if (t->joiners[i].tok.task == who && t->joiners[i].tok.seq == seq) {
      t->joiners[i] = t->joiners[--t->njoiners];
      return;
    }
  }
}

static int l_self(lua_State *L) {
  ltask *t = lums_cur_task;
  if (!t || t->self_ref == LUA_NOREF)
    lua_pushnil(L);
  else
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->self_ref);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* Task methods                                                            */
/* ---------------------------------------------------------------------- */

/* Pushes the error and the traceback of the failed task whose handle h is
** at idx. */
void lums_handle_push_failure(lua_State *L, int idx, lhandle *h) {
  if (h->nomem) {
    lua_getfield(L, LUA_REGISTRYINDEX, LUMS_NOMEM_KEY);
    lua_pushnil(L);
    return;
  }
  lua_getiuservalue(L, idx, 1);
  lua_getfield(L, -1, X_ERR);
  lua_getfield(L, -2, X_TB);
  lua_remove(L, -3);
}

/* Pushes a finished task's outcome as join returns it. */
int lums_handle_push_outcome(lua_State *L, int idx, lhandle *h) {
  h->joined = true;
  if (h->ok) {
    lua_pushboolean(L, 1);
    if (h->nres == 0) return 1;
    if (h->nres == 1) {
      lua_getiuservalue(L, idx, LUMS_UV_RESULT);
      return 2;
    }
    lua_getiuservalue(L, idx, 1);
    int tbl = lua_gettop(L);
    luaL_checkstack(L, h->nres, "too many results");
    for (int i = 1; i <= h->nres; i++) lua_rawgeti(L, tbl, i);
    lua_remove(L, tbl);
    return 1 + h->nres;
  }
  lua_pushboolean(L, 0);
  lums_handle_push_failure(L, idx, h);
  return 3;
}

static int join_k(lua_State *L, int status, lua_KContext ctx) {
  lhandle *h = (lhandle *)lua_touserdata(L, 1);
  (void)status;
  int r = ums_park_result();
  if (h->state != T_DONE)
    drop_joiner(h->t, lums_cur_task->h->id, (uint64_t)ctx);
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  if (h->state != T_DONE) {
    lua_pushnil(L);
    lua_pushliteral(L, "timeout");
    return 2;
  }
  return lums_handle_push_outcome(L, 1, h);
}

/* join on a task not done yet: parks the caller (the handle at 1). Out
** of line, so that a join on a finished task, the usual one, needs no
** stack frame of its size. */
static __attribute__((noinline)) int join_wait(lua_State *L, lhandle *h,
                                               int64_t deadline) {
  ltask *me = lums_need_task(L, "join");
  ltask *t = h->t;
  if (me == t) return luaL_error(L, "ums: a task cannot join itself");
  if (t->run != me->run)
    return luaL_error(L, "ums: cannot join a task of another run");
  if (t->njoiners == t->capjoiners) {
    int cap = t->capjoiners * 2;
    joiner_t *j = malloc((size_t)cap * sizeof *j);
    if (!j) return luaL_error(L, "ums: out of memory");
    memcpy(j, t->joiners, (size_t)t->njoiners * sizeof *j);
    if (t->joiners != t->join1) free(t->joiners);
    t->joiners = j;
    t->capjoiners = cap;
  }
  ums_park_token_t tok;
  lums_park_begin_wait(L, me, deadline, 0, UMS_WAIT_JOIN, h, h->id, &tok);
  t->joiners[t->njoiners++].tok = tok;
  return lums_park_finish(L, me, (lua_KContext)tok.seq, join_k);
}

static int l_task_join(lua_State *L) {
  LUMS_YIELD_POINT(L, l_task_join);
  lhandle *h = lums_check_task(L, 1);
  int64_t deadline = UMS_FOREVER;
  if (lua_gettop(L) != 1) {  /* no timeout (the usual call): no look */
    deadline = lums_check_timeout(L, 2);
    lua_settop(L, 1);
  }
  if (h->state == T_DONE) return lums_handle_push_outcome(L, 1, h);
  return join_wait(L, h, deadline);
}

static int l_task_cancel(lua_State *L) {
  lhandle *h = lums_check_task(L, 1);
  if (!h->t || !h->t->run || h->state == T_DONE) {
    lua_pushboolean(L, 0);
    return 1;
  }
  lua_pushboolean(L, ums_task_cancel(h->t->run->rt, h->id) == 0);
  return 1;
}

static int l_task_status(lua_State *L) {
  lhandle *h = lums_check_task(L, 1);
  const char *s;
  if (h->state == T_DONE)
    s = h->ok ? "done" : h->cancelled ? "cancelled" : "error";
  else if (h->state == T_NEW)
    s = "pending";
  else if (h->t == lums_cur_task)
    s = "running";
  else
    s = "suspended";
  lua_pushstring(L, s);
  return 1;
}

/* Pushes the name of the task at (absolute) idx: "" when it has none. */
static void push_name(lua_State *L, int idx) {
  if (lua_getiuservalue(L, idx, 1) == LUA_TTABLE) {
    if (lua_getfield(L, -1, X_NAME) == LUA_TSTRING) {
      lua_remove(L, -2);
      return;
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  lua_pushliteral(L, "");
}

static int l_task_name(lua_State *L) {
  lums_check_task(L, 1);
  if (!lua_isnoneornil(L, 2)) {
    size_t len;
    luaL_checklstring(L, 2, &len);
    luaL_argcheck(L, len < 32, 2, "name longer than 31 bytes");
    lums_handle_extras(L, 1, 0);
    lua_pushvalue(L, 2);
    lua_setfield(L, -2, X_NAME);
    /* The runtime keeps it too, for ums.tasks() and stall reports, which
    ** must not need this VM. */
    lhandle *h = lums_to_task(L, 1);
    if (h->t && h->t->run && h->state != T_DONE)
      ums_task_set_name(h->t->run->rt, h->id, lua_tostring(L, 2));
  }
  lua_settop(L, 1);
  push_name(L, 1);
  return 1;
}

static int l_task_id(lua_State *L) {
  lhandle *h = lums_check_task(L, 1);
  lua_pushinteger(L, (lua_Integer)h->id);
  return 1;
}

static int l_task_locals(lua_State *L) {
  lums_check_task(L, 1);
  lua_settop(L, 1);
  lums_handle_extras(L, 1, 0);
  if (lua_getfield(L, 2, X_LOCALS) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, 2, X_LOCALS);
  }
  return 1;
}

static int l_task_tostring(lua_State *L) {
  lhandle *h = lums_check_task(L, 1);
  lua_settop(L, 1);
  push_name(L, 1);
  const char *name = lua_tostring(L, -1);
  if (name[0])
    lua_pushfstring(L, "ums.task %s (%p)", name, (void *)h);
  else
    lua_pushfstring(L, "ums.task (%p)", (void *)h);
  return 1;
}

void lums_task_metatable(lua_State *L) {
  static const luaL_Reg task_methods[] = {
      {"join", l_task_join},     {"cancel", l_task_cancel},
      {"status", l_task_status}, {"name", l_task_name},
      {"id", l_task_id},         {"locals", l_task_locals},
      {NULL, NULL}};
  if (luaL_newmetatable(L, LUMS_TASK_MT)) {
    luaL_newlib(L, task_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_task_tostring);
    lua_setfield(L, -2, "__tostring");
  }
}

void lums_open_task(lua_State *L) {
  lua_pushcfunction(L, l_self);
  lua_setfield(L, -2, "self");
}
