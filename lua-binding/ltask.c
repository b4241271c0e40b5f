/*
** ltask.c: tasks as Lua sees them: ums.self() and the current task's
** waits (yield, sleep, park_begin/park_wait/unpark, run_until_idle, all
** parks: lpark.c), task handles and their methods (join, cancel, status,
** name, id, locals, tostring), and the joins that wait for a task's
** end. A handle outlives its task and keeps only the outcome (struct
** lhandle); lums.c's task life cycle fills it in when the task ends and
** wakes the joiners.
*/
#include "ltask.h"
#include "lpark.h"

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

static int l_self(lua_State *L) {
  ltask *t = lums_cur_task;
  if (!t || !t->h)
    lua_pushnil(L);
  else
    lums_push_handle(L, t);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* The current task's waits                                                */
/* ---------------------------------------------------------------------- */

lpark_args lums_check_park_args(lua_State *L, int idx) {
  lpark_args a;
  a.deadline = lums_check_timeout(L, idx);
  a.flags = lua_toboolean(L, idx + 1) ? UMS_PARK_NOCANCEL : 0;
  lua_Integer type = luaL_optinteger(L, idx + 2, UMS_WAIT_PARK);
  luaL_argcheck(L, type > UMS_WAIT_NONE && type < UMS_WAIT_NTYPES, idx + 2,
                "not a wait type (see ums.WAIT)");
  a.type = (int)type;
  a.object = lua_topointer(L, idx + 3);
  lhandle *blocker =
      lua_isnoneornil(L, idx + 4) ? NULL : lums_check_task(L, idx + 4);
  a.blocker = blocker ? blocker->id : 0;
  return a;
}

/* core.park_begin([timeout [, nocancel [, wait_type [, object
** [, blocker]]]]]) -> seq. wait_type: a value of core.WAIT (default
** "park"); object: what the task waits on (any value; its address names
** it); blocker: the task holding it (a task handle or nil). */
static int l_park_begin(lua_State *L) {
  ltask *t = lums_need_task(L, "park_begin");
  if (t->park.begun)
    return luaL_error(L, "ums.park_begin: a park is already in progress "
                         "(call ums.park_wait first)");
  ums_park_token_t tok;
  lpark_args a = lums_check_park_args(L, 1);
  lums_park_begin_wait(L, t, a.deadline, a.flags, a.type, a.object,
                       a.blocker, &tok);
  lua_pushinteger(L, (lua_Integer)tok.seq);
  return 1;
}

static int park_wait_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  return lums_push_park_result(L, ums_park_result());
}

/* core.park_wait() -> outcome | nil, "timeout" */
static int l_park_wait(lua_State *L) {
  ltask *t = lums_need_task(L, "park_wait");
  if (!t->park.begun)
    return luaL_error(L, "ums.park_wait: no park in progress (call "
                         "ums.park_begin first)");
  return lums_park_finish(L, t, 0, park_wait_k);
}

/* core.unpark(task, seq [, outcome]) -> boolean */
static int l_unpark(lua_State *L) {
  lhandle *h = lums_check_task(L, 1);
  lua_Integer seq = luaL_checkinteger(L, 2);
  lua_Integer outcome = luaL_optinteger(L, 3, 0);
  luaL_argcheck(L, outcome >= 0 && outcome <= 0x7fffffff, 3,
                "outcome must be a non-negative integer");
  ums_park_token_t tok = {h->id, (uint64_t)seq};
  lua_pushboolean(L, h->t && lums_unpark(h->t, tok, (int)outcome));
  return 1;
}

static int yield_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  if (ums_cancelled()) return lums_raise_cancelled(L);
  return 0;
}

/* ums.yield of task t, the current one, for ums.<fname>. */
static int task_yield(lua_State *L, ltask *t, const char *fname) {
  if (t->park.begun)
    return luaL_error(L, "ums.%s: cannot yield between park_begin and "
                         "park_wait", fname);
  if (ums_cancelled()) return lums_raise_cancelled(L);
  if (L == t->co && lua_isyieldable(L)) {
    t->park.parking = false;
    return lua_yieldk(L, 0, 0, yield_k);
  }
  int r = ums_yield();
  lums_become_current(t);
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  return 0;
}

static int l_yield(lua_State *L) {
  return task_yield(L, lums_need_task(L, "yield"), "yield");
}

static int sleep_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  if (ums_park_result() == UMS_ECANCELED) return lums_raise_cancelled(L);
  return 0;
}

static int l_sleep(lua_State *L) {
  lua_Number s = luaL_checknumber(L, 1);
  luaL_argcheck(L, s == s, 1, "sleep time is NaN, not a number of seconds");
  luaL_argcheck(L, s >= 0, 1, "sleep time must not be negative");
  ltask *t = lums_need_task(L, "sleep");
  /* A sleep of no time is a yield, to the back of the run queue: where a
  ** park whose timer is due at once would end too (timer.c), without the
  ** park and the timer. */
  if (s == 0) return task_yield(L, t, "sleep");
  ums_park_token_t tok;
  int64_t deadline =
      s > 1e9 ? UMS_FOREVER : ums_deadline((int64_t)(s * 1e9));
  lums_park_begin_wait(L, t, deadline, 0, UMS_WAIT_SLEEP, NULL, 0, &tok);
  return lums_park_finish(L, t, 0, sleep_k);
}

static int idle_k(lua_State *L, int status, lua_KContext ctx) {
  int r = ums_park_result();
  (void)status;
  (void)ctx;
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  if (r == UMS_ETIMEDOUT) {
    lua_pushnil(L);
    lua_pushliteral(L, "timeout");
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.run_until_idle([timeout]) -> true | nil, "timeout": parks until
** no other task can run (ums_wait_idle); with a virtual clock, before the
** clock moves. */
static int l_run_until_idle(lua_State *L) {
  int64_t deadline = lums_check_timeout(L, 1);
  ltask *t = lums_need_task(L, "run_until_idle");
  if (t->park.begun)
    return luaL_error(L, "ums.run_until_idle: cannot wait between "
                         "park_begin and park_wait");
  int r = ums_park_begin_idle(deadline, &t->park.tok);
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  if (r) return luaL_error(L, "ums.run_until_idle: %s", ums_strerror(r));
  t->park.begun = true;
  return lums_park_finish(L, t, 0, idle_k);
}

/* ---------------------------------------------------------------------- */
/* Task methods                                                            */
/* ---------------------------------------------------------------------- */

void lums_handle_extras(lua_State *L, int idx, int narr) {
  lhandle *h = (lhandle *)lua_touserdata(L, idx);
  if (h->extras) {
    lua_getmetatable(L, idx);
    return;
  }
  idx = lua_absindex(L, idx);
  lua_createtable(L, narr, 4);
  lua_getmetatable(L, idx);  /* the shared one, copied field by field */
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    lua_pushvalue(L, -2);
    lua_insert(L, -2);
    lua_rawset(L, -5);
  }
  lua_pop(L, 1);
  lua_pushvalue(L, -1);
  lua_setmetatable(L, idx);
  h->extras = true;
}

/* Pushes the error and the traceback of the failed task whose handle h is
** at idx. */
void lums_handle_push_failure(lua_State *L, int idx, lhandle *h) {
  if (h->nomem) {
    lua_getfield(L, LUA_REGISTRYINDEX, LUMS_NOMEM_KEY);
    lua_pushnil(L);
    return;
  }
  lums_handle_get_extras(L, idx);
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
      switch (h->res) {
        case RES_NIL: lua_pushnil(L); break;
        case RES_BOOL: lua_pushboolean(L, h->r.b); break;
        case RES_INT: lua_pushinteger(L, h->r.i); break;
        case RES_FLT: lua_pushnumber(L, h->r.n); break;
        case RES_LUD: lua_pushlightuserdata(L, h->r.p); break;
        default:
          lums_handle_get_extras(L, idx);
          lua_rawgeti(L, -1, 1);
          lua_remove(L, -2);
      }
      return 2;
    }
    lums_handle_get_extras(L, idx);
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

/* What a join and an end wait do once their park is over: -1 when the
** task has ended, else what they return (a timeout's nil, "timeout"). A
** cancellation raises. A joiner whose park ended otherwise than by the
** task's end (timeout, cancel) takes its waiter off the task's joiners
** itself; one woken by the end is off already (lwaitq.h). */
static int join_over(lua_State *L, lhandle *h) {
  int r = ums_park_result();
  lums_q_unlink(&lums_cur_task->wait);
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  if (h->state != T_DONE) {
    lua_pushnil(L);
    lua_pushliteral(L, "timeout");
    return 2;
  }
  return -1;
}

static int join_k(lua_State *L, int status, lua_KContext ctx) {
  lhandle *h = (lhandle *)lua_touserdata(L, 1);
  (void)status;
  (void)ctx;
  int n = join_over(L, h);
  return n >= 0 ? n : lums_handle_push_outcome(L, 1, h);
}

static int wait_end_k(lua_State *L, int status, lua_KContext ctx) {
  lhandle *h = (lhandle *)lua_touserdata(L, 1);
  (void)status;
  (void)ctx;
  int n = join_over(L, h);
  if (n >= 0) return n;
  lua_pushboolean(L, 1);
  return 1;
}

/* join on a task not done yet: parks the caller (the handle at 1) and
** goes on in k. Out of line, so that a join on a finished task, the
** usual one, needs no stack frame of its size. */
static __attribute__((noinline)) int join_wait(lua_State *L, lhandle *h,
                                               int64_t deadline,
                                               lua_KFunction k) {
  ltask *me = lums_need_task(L, "join");
  ltask *t = h->t;
  if (me == t) return luaL_error(L, "ums: a task cannot join itself");
  if (t->vmrun != me->vmrun)
    return luaL_error(L, "ums: cannot join a task of another run");
  /* Local (UMS_PARK_LOCAL): the joined task is of this VM (checked
  ** above), and its end, the only waker of its joiners, runs on this
  ** VM's scheduler thread, as do the joiner's own timer and cancel. */
  lums_q_park_begin(L, me, &t->joiners, deadline, UMS_PARK_LOCAL,
                    UMS_WAIT_JOIN, h, h->id);
  return lums_park_finish(L, me, 0, k);
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
  return join_wait(L, h, deadline, join_k);
}

/* core.wait_end(task [, timeout]) -> true | nil, "timeout": waits for
** the task's end as a join does, but leaves its outcome untaken, so that
** core.take_unjoined can still tell whether somebody joined it. */
static int l_wait_end(lua_State *L) {
  LUMS_YIELD_POINT(L, l_wait_end);
  lhandle *h = lums_check_task(L, 1);
  int64_t deadline = UMS_FOREVER;
  if (lua_gettop(L) != 1) {
    deadline = lums_check_timeout(L, 2);
    lua_settop(L, 1);
  }
  if (h->state != T_DONE) return join_wait(L, h, deadline, wait_end_k);
  lua_pushboolean(L, 1);
  return 1;
}

/* core.take_unjoined(task) -> true, err, traceback | false: for a task that
** ended with an error (not a cancellation) which nobody joined, its error
** and traceback, and the task counts as joined from then on: neither its
** handle's finalizer nor the run's end reports it to on_error again. The
** caller (stdlib/ums/test.lua, at a block's end) reports it instead. */
static int l_take_unjoined(lua_State *L) {
  lhandle *h = lums_check_task(L, 1);
  if (h->state != T_DONE || h->ok || h->cancelled || h->joined) {
    lua_pushboolean(L, 0);
    return 1;
  }
  h->joined = true;
  lua_pushboolean(L, 1);
  lums_handle_push_failure(L, 1, h);
  return 3;
}

static int l_task_cancel(lua_State *L) {
  lhandle *h = lums_check_task(L, 1);
  if (!h->t || !h->t->vmrun || h->state == T_DONE) {
    lua_pushboolean(L, 0);
    return 1;
  }
  lua_pushboolean(L, ums_task_cancel(h->t->vmrun->rt, h->id) == 0);
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
  if (lums_handle_get_extras(L, idx) == LUA_TTABLE) {
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
    if (h->t && h->t->vmrun && h->state != T_DONE)
      ums_task_set_name(h->t->vmrun->rt, h->id, lua_tostring(L, 2));
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
  static const luaL_Reg funcs[] = {
      {"self", l_self},
      {"yield", l_yield},
      {"sleep", l_sleep},
      {"run_until_idle", l_run_until_idle},
      {"park_begin", l_park_begin},
      {"park_wait", l_park_wait},
      {"unpark", l_unpark},
      {"wait_end", l_wait_end},
      {"take_unjoined", l_take_unjoined},
      {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}
