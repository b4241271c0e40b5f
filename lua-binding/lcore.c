/*
** lcore.c: ums/core.so, the module `require "ums.core"` loads from
** package.cpath. Everything is in libums-lua (and the runtime in libums),
** which this module links: a process that also links them directly (a C
** host) therefore has one copy of ums, whichever way Lua code reaches it.
*/
#include "ums-lua.h"

int luaopen_ums_core(lua_State *L);

int luaopen_ums_core(lua_State *L) { return ums_lua_open(L); }
