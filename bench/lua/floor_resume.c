/*
** floor_resume.c: the bench_floor Lua module, floors for bench_ums.lua that
** plain Lua cannot measure.
**
**   bench_floor.resume_yield(n) -> seconds
**       A C loop calls lua_resume n times on one coroutine whose body is a
**       C function that yields (lua_yieldk, with itself as continuation)
**       every time it is resumed: n x (lua_resume + lua_yield), no Lua
**       code in between. The floor for one task switch driven from C.
**   bench_floor.resume_lua_yield(n) -> seconds
**       The same C loop, but the coroutine body is a Lua loop calling a C
**       function that yields (as a ums task calling ums.yield does): the
**       floor for a switch when the task body is Lua.
**   bench_floor.now() -> monotonic seconds (CLOCK_MONOTONIC)
**
** Built as a plain shared object, not linked against liblua (lua5.4
** exports the API).
*/
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <lauxlib.h>
#include <lua.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int l_now(lua_State *L) {
  lua_pushnumber(L, now_s());
  return 1;
}

/* The C body: yields forever, resuming in its own continuation. */
static int body_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  return lua_yieldk(L, 0, ctx, body_k);
}

static int body(lua_State *L) { return body_k(L, LUA_OK, 0); }

/* A C function called from Lua that yields (no results, no continuation
** needed: lua_yield returns to the Lua caller on resume). */
static int c_yield(lua_State *L) { return lua_yield(L, 0); }

/* Resumes co n times; every resume must end in a yield. */
static double drive(lua_State *L, lua_State *co, lua_Integer n) {
  int nres;
  double t0 = now_s();
  for (lua_Integer i = 0; i < n; i++) {
    int st = lua_resume(co, L, 0, &nres);
    if (st != LUA_YIELD) {
      luaL_error(L, "bench_floor: coroutine did not yield: %s",
                 lua_tostring(co, -1));
    }
    if (nres) lua_pop(co, nres);
  }
  return now_s() - t0;
}

static int l_resume_yield(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 0, 1, "count must not be negative");
  lua_State *co = lua_newthread(L);
  lua_pushcfunction(co, body);
  lua_pushnumber(L, drive(L, co, n));
  return 1;
}

static const char LUA_BODY[] =
    "local y = ... ; return function() while true do y() end end";

static int l_resume_lua_yield(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 0, 1, "count must not be negative");
  lua_State *co = lua_newthread(L);
  if (luaL_loadstring(co, LUA_BODY) != LUA_OK) {
    lua_xmove(co, L, 1);
    return lua_error(L);
  }
  lua_pushcfunction(co, c_yield);
  lua_call(co, 1, 1); /* the body function, ready to be resumed */
  lua_pushnumber(L, drive(L, co, n));
  return 1;
}

int luaopen_bench_floor(lua_State *L) {
  static const luaL_Reg funcs[] = {{"resume_yield", l_resume_yield},
                                   {"resume_lua_yield", l_resume_lua_yield},
                                   {"now", l_now},
                                   {NULL, NULL}};
  luaL_newlib(L, funcs);
  return 1;
}
