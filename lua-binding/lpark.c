/*
** lpark.c: parking a Lua task, and the waits of the current task built on
** it (core.park_begin/park_wait/unpark, yield, sleep, run_until_idle). A
** wait yields to the scheduler with a continuation where Lua can yield
** (the task's own coroutine), and otherwise blocks only this task's
** worker (lums_park_block), while another worker runs the scheduler.
*/
#include "lpark.h"
#include "ltask.h"

/* Finishes a wait whose park has begun: yields with continuation k where
** Lua can yield here, else blocks this task's worker. k reads the outcome
** with ums_park_result(). */
bool lums_can_yield(lua_State *L, ltask *t) {
  return L == t->co && lua_isyieldable(L);
}

int lums_park_block(lua_State *L, ltask *t, lua_KContext ctx,
                    lua_KFunction k) {
  lums_before_block(t);
  ums_park_wait();
  lums_become_current(t);
  return k(L, LUA_YIELD, ctx);
}

int lums_park_try_begin(ltask *t, int64_t deadline, int flags,
                        ums_park_token_t *tok) {
  return lums_park_try_begin_wait(t, deadline, flags, UMS_WAIT_PARK, NULL,
                                  tok);
}

int lums_park_try_begin_wait(ltask *t, int64_t deadline, int flags,
                             int type, const void *object,
                             ums_park_token_t *tok) {
  int r = ums_park_begin_wait(deadline, flags, type, object, 0, tok);
  if (r) return r;
  t->park_begun = true;
  t->park_tok = *tok;
  return 0;
}

int lums_park_begin(lua_State *L, ltask *t, int64_t deadline, int flags,
                      ums_park_token_t *tok) {
  return lums_park_begin_wait(L, t, deadline, flags, UMS_WAIT_PARK, NULL, 0,
                              tok);
}

int lums_park_failed(lua_State *L, int r) {
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  return luaL_error(L, "ums: cannot park: %s", ums_strerror(r));
}

/* core.park_begin([timeout [, nocancel [, wait_type [, object
** [, blocker]]]]]) -> seq. wait_type: a value of core.WAIT (default
** "park"); object: what the task waits on (any value; its address names
** it); blocker: the task holding it (a task handle or nil). */
static int l_park_begin(lua_State *L) {
  ltask *t = lums_need_task(L, "park_begin");
  if (t->park_begun)
    return luaL_error(L, "ums.park_begin: a park is already in progress "
                         "(call ums.park_wait first)");
  ums_park_token_t tok;
  int64_t deadline = lums_check_timeout(L, 1);
  lua_Integer type = luaL_optinteger(L, 3, UMS_WAIT_PARK);
  luaL_argcheck(L, type > UMS_WAIT_NONE && type < UMS_WAIT_NTYPES, 3,
                "not a wait type (see ums.WAIT)");
  lhandle *blocker = lua_isnoneornil(L, 5) ? NULL : lums_check_task(L, 5);
  lums_park_begin_wait(L, t, deadline,
                       lua_toboolean(L, 2) ? UMS_PARK_NOCANCEL : 0,
                       (int)type, lua_topointer(L, 4),
                       blocker ? blocker->id : 0, &tok);
  lua_pushinteger(L, (lua_Integer)tok.seq);
  return 1;
}

static int park_wait_k(lua_State *L, int status, lua_KContext ctx) {
  int r = ums_park_result();
  (void)status;
  (void)ctx;
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  /* Only a park that cancellation cannot end gets this (ums.h,
  ** "Deadlocks"). */
  if (r == UMS_EDEADLK)
    return luaL_error(L, "deadlock: nothing could ever end this wait "
                         "(ended by the deadlock detector)");
  if (r == UMS_ETIMEDOUT) {
    lua_pushnil(L);
    lua_pushliteral(L, "timeout");
    return 2;
  }
  lua_pushinteger(L, r);
  return 1;
}

/* core.park_wait() -> outcome | nil, "timeout" */
static int l_park_wait(lua_State *L) {
  ltask *t = lums_need_task(L, "park_wait");
  if (!t->park_begun)
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

static int l_yield(lua_State *L) {
  ltask *t = lums_need_task(L, "yield");
  if (t->park_begun)
    return luaL_error(L, "ums.yield: cannot yield between park_begin and "
                         "park_wait");
  if (ums_cancelled()) return lums_raise_cancelled(L);
  if (L == t->co && lua_isyieldable(L)) {
    t->parking = false;
    return lua_yieldk(L, 0, 0, yield_k);
  }
  int r = ums_yield();
  lums_become_current(t);
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  return 0;
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
  if (t->park_begun)
    return luaL_error(L, "ums.run_until_idle: cannot wait between "
                         "park_begin and park_wait");
  int r = ums_park_begin_idle(deadline, &t->park_tok);
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  if (r) return luaL_error(L, "ums.run_until_idle: %s", ums_strerror(r));
  t->park_begun = true;
  return lums_park_finish(L, t, 0, idle_k);
}

void lums_open_park(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"yield", l_yield},
      {"sleep", l_sleep},
      {"run_until_idle", l_run_until_idle},
      {"park_begin", l_park_begin},
      {"park_wait", l_park_wait},
      {"unpark", l_unpark},
      {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}
