/*
** lpark.c: parking a Lua task, the C side of every wait of the binding. A
** wait yields to the scheduler with a continuation where Lua can yield
** (the task's own coroutine), and otherwise blocks only this task's
** worker (lums_park_block), while another worker runs the scheduler. The
** Lua side (core.park_begin, park_wait, unpark, yield, sleep,
** run_until_idle) is in ltask.c.
*/
#include "lpark.h"

/* Finishes a wait whose park has begun: yields with continuation k where
** Lua can yield here, else blocks this task's worker. k reads the outcome
** with ums_park_result(). */
bool lums_can_yield(lua_State *L, ltask *t) {
  return L == t->co && lua_isyieldable(L);
}

void lums_park_block_wait(ltask *t) {
  t->park.begun = false;
  lums_before_block(t);
  ums_park_wait();
  lums_become_current(t);
}

int lums_park_block(lua_State *L, ltask *t, lua_KContext ctx,
                    lua_KFunction k) {
  lums_park_block_wait(t);
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
  t->park.begun = true;
  t->park.tok = *tok;
  return 0;
}

int lums_park_begin(lua_State *L, ltask *t, int64_t deadline, int flags,
                      ums_park_token_t *tok) {
  return lums_park_begin_wait(L, t, deadline, flags, UMS_WAIT_PARK, NULL, 0,
                              tok);
}

int lums_push_park_result(lua_State *L, int r) {
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

int lums_park_failed(lua_State *L, int r) {
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  return luaL_error(L, "ums: cannot park: %s", ums_strerror(r));
}
