/*
** bench_coio.c: a Tarantool C module for bench_ffi_tarantool.lua. It makes
** Tarantool's way of going preemptive, coio_call (the function runs on
** Tarantool's coio thread pool while the calling fiber yields), callable
** from Lua, so that Tarantool's figure is measured the way ums.ffi's is:
** a Lua loop making a trivial call (getpid) through the pool.
**
**   bench_coio.getpid() -> pid, by coio_call
**
** Built against Tarantool's headers (module.h and its LuaJIT lua.h, from
** the tarantool-dev package), not linked: Tarantool's executable exports
** both APIs. Never loaded by lua5.4.
*/
#include <module.h>

#include <lauxlib.h>
#include <lua.h>
#include <stdarg.h>
#include <unistd.h>

static ssize_t getpid_cb(va_list ap) {
  (void)ap;
  return (ssize_t)getpid();
}

static int l_getpid(lua_State *L) {
  ssize_t r = coio_call(getpid_cb);
  if (r < 0) return luaL_error(L, "coio_call failed");
  lua_pushinteger(L, (lua_Integer)r);
  return 1;
}

LUA_API int luaopen_bench_coio(lua_State *L) {
  lua_newtable(L);
  lua_pushcfunction(L, l_getpid);
  lua_setfield(L, -2, "getpid");
  return 1;
}
