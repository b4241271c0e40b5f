-- The ums rock: what a Lua user needs, built by the project's CMake with
-- UMS_LUA_STANDALONE: ums/core.so with the runtime linked in (no shared
-- library of ums to find), the stdlib (ums/*.lua) and the ums command. C
-- users install with `cmake --install` instead (docs/install.md).
--
-- From a checkout, as root:     luarocks --lua-version=5.4 make
--                  as a user:   luarocks --lua-version=5.4 make --local
-- (the rockspec is found in rockspecs/; give its path if asked). CMake
-- finds libffi and Lua 5.4 with pkg-config, so Debian's multiarch ffi.h
-- needs no LIBFFI_INCDIR. LuaRocks builds in build.luarocks/ inside the
-- checkout and leaves it there; .gitignore covers it (/build*/).
rockspec_format = "3.0"
package = "ums"
version = "0.1.0-1"
source = {
  -- The project's repository; `luarocks make` uses the checkout at hand.
  url = "git+https://git.invalid/ums.git",
  tag = "v0.1.0",
}
description = {
  summary = "A user-mode scheduler for Lua 5.4, in C",
  detailed = [[
ums gives Lua (and C hosts that embed Lua) green threads that never block
each other: cooperative schedulers, one per CPU, a Lua VM per scheduler,
timeouts on every wait, asynchronous file I/O and a preemptive pool for
blocking C calls (ums.ffi).]],
  license = "MIT",
  labels = { "scheduler", "coroutines", "async", "io_uring" },
}
dependencies = {
  "lua >= 5.4, < 5.5",
}
build = {
  type = "cmake",
  variables = {
    CMAKE_BUILD_TYPE = "Release",
    CMAKE_INSTALL_PREFIX = "$(PREFIX)",
    UMS_LUA_CMOD_DIR = "$(LIBDIR)",
    UMS_LUA_LMOD_DIR = "$(LUADIR)",
    UMS_BUILD_TESTS = "OFF",
    UMS_BUILD_BENCH = "OFF",
    UMS_LUA_STANDALONE = "ON",
  },
}
