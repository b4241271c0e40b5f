/*
** largs.h: the argument checks and the errors every file of the ums.core
** module raises (largs.c). It depends on nothing else of the binding, so
** any file may include it.
*/
#ifndef LARGS_H
#define LARGS_H

#include "ums-binding.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdbool.h>
#include <stdint.h>

#ifndef LUMS_HIDDEN
#define LUMS_HIDDEN __attribute__((visibility("hidden")))
#endif

/* What every function that takes seconds says of a NaN timeout. */
#define LUMS_NAN_TIMEOUT "timeout is NaN, not a number of seconds"

/* The registry key of core.CANCELLED, the error value of a cancelled
** task's waits (set when the module opens). */
#define LUMS_CANCELLED_KEY "ums.CANCELLED"

/* Raises "bad argument #narg to 'fname' (msg)" like luaL_argerror, but
** with the function's own name: called through pcall or a local, a C
** function's name is otherwise unknown ('?'). In a method call
** (ch:send(...)) self does not count. */
LUMS_HIDDEN int lums_argerr(lua_State *L, int narg, const char *fname,
                            const char *msg);
/* The type name of the value at idx as error messages give it: its
** metatable's __name if it has one, as luaL_typeerror does. */
LUMS_HIDDEN const char *lums_typename(lua_State *L, int idx);
/* lums_argerr with "<expected> expected, got <type>", the type named as
** luaL_typeerror names it (a metatable's __name first). */
LUMS_HIDDEN int lums_typeerr(lua_State *L, int narg, const char *fname,
                             const char *expected);

/* A timeout in seconds at idx, as the calls with a timeout argument take
** it: nil or math.huge wait forever (UMS_FOREVER); 0 polls and sets
** *poll. Raises through lums_argerr/lums_typeerr, naming fname. Inline:
** a channel's send and receive with a timeout read one. */
static inline int64_t lums_opt_timeout(lua_State *L, int idx,
                                       const char *fname, bool *poll) {
  *poll = false;
  int t = lua_type(L, idx);
  if (t <= LUA_TNIL) return UMS_FOREVER;  /* none or nil */
  if (t != LUA_TNUMBER) lums_typeerr(L, idx, fname, "number");
  lua_Number s = lua_tonumber(L, idx);
  if (s != s) lums_argerr(L, idx, fname, LUMS_NAN_TIMEOUT);
  if (!(s >= 0))
    lums_argerr(L, idx, fname, "timeout must be a non-negative number");
  if (s == 0) {
    *poll = true;
    return 0;
  }
  if (s > 1e9) return UMS_FOREVER;
  return ums_deadline((int64_t)(s * 1e9));
}

/* The deadline of the optional timeout in seconds at idx (nil: forever),
** raising through luaL_argcheck for a bad one: park_begin, join and
** run_until_idle take it so. */
LUMS_HIDDEN int64_t lums_check_timeout(lua_State *L, int idx);

/* Raises "ums.<fname>: not inside a task" (typed as a task lookup so that
** lums_need_task can return its result). */
typedef struct ltask ltask;
LUMS_HIDDEN ltask *lums_not_in_task(lua_State *L, const char *fname);
/* Pushes core.CANCELLED. */
LUMS_HIDDEN void lums_push_cancelled(lua_State *L);
/* Raises core.CANCELLED. */
LUMS_HIDDEN int lums_raise_cancelled(lua_State *L);

#endif
