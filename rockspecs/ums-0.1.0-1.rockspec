-- The ums rock: the ums.core module, libums and libums-lua, the headers,
-- ums.pc and the Lua stdlib, built and installed by the project's CMake.
-- `luarocks --lua-version=5.4 make rockspecs/ums-0.1.0-1.rockspec` from a
-- checkout builds and installs it into the rocks tree.
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
  -- No license has been chosen for ums yet; set it here when one is.
  license = "unspecified",
  labels = { "scheduler", "coroutines", "async", "io_uring" },
}
dependencies = {
  "lua >= 5.4, < 5.5",
}
external_dependencies = {
  LIBFFI = { header = "ffi.h" },
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
  },
}
