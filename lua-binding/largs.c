/*
** largs.c: the argument checks and the errors the files of the ums.core
** module share (largs.h). Error messages name the Lua function the way
** the Lua manual numbers its arguments.
*/
#include "largs.h"

#include <string.h>

int lums_argerr(lua_State *L, int narg, const char *fname, const char *msg) {
  lua_Debug ar;
  if (lua_getstack(L, 0, &ar) && lua_getinfo(L, "n", &ar) &&
      ar.namewhat && strcmp(ar.namewhat, "method") == 0) {
    if (--narg == 0)
      return luaL_error(L, "calling '%s' on bad self (%s)", fname, msg);
  }
  return luaL_error(L, "bad argument #%d to '%s' (%s)", narg, fname, msg);
}

const char *lums_typename(lua_State *L, int idx) {
  if (luaL_getmetafield(L, idx, "__name") == LUA_TSTRING) {
    const char *s = lua_tostring(L, -1);  /* kept alive by the metatable */
    lua_pop(L, 1);
    return s;
  }
  return luaL_typename(L, idx);
}

int lums_typeerr(lua_State *L, int narg, const char *fname,
                 const char *expected) {
  return lums_argerr(L, narg, fname,
                     lua_pushfstring(L, "%s expected, got %s", expected,
                                     lums_typename(L, narg)));
}

int64_t lums_check_timeout(lua_State *L, int idx) {
  if (lua_isnoneornil(L, idx)) return UMS_FOREVER;
  lua_Number s = luaL_checknumber(L, idx);
  luaL_argcheck(L, s == s, idx, LUMS_NAN_TIMEOUT);
  luaL_argcheck(L, s >= 0, idx, "timeout must not be negative");
  if (s > 1e9) return UMS_FOREVER;
  return ums_deadline((int64_t)(s * 1e9));
}

ltask *lums_not_in_task(lua_State *L, const char *fname) {
  luaL_error(L, "ums.%s: not inside a task (call it from a function run "
                "by ums.run or ums.spawn)", fname);
  return NULL;
}

void lums_push_cancelled(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, LUMS_CANCELLED_KEY);
}

int lums_raise_cancelled(lua_State *L) {
  lums_push_cancelled(L);
  return lua_error(L);
}
