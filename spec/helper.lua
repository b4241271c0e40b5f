-- spec/helper.lua: lets a spec find the ums modules when Busted is run by
-- hand from the source tree (`lua5.4 /usr/bin/busted spec/x_spec.lua`),
-- and returns the `ums` module. Under ctest, LUA_PATH and LUA_CPATH already
-- point into the build tree (spec/CMakeLists.txt) and are left alone.
--
-- The C module is looked up in $UMS_BUILD_DIR (a scratch or sanitizer
-- build tree), else in <repo>/build.
--
-- Load it with dofile from the spec's own directory, so that it does not
-- depend on the working directory or on LUA_PATH:
--   local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)")
--     or "./") .. "helper.lua")

local function dirname(path)
  return path:match("^(.*)/[^/]*$") or "."
end

local here = debug.getinfo(1, "S").source:match("^@(.*)$") or "spec/x"
local root = dirname(dirname(here))

if not package.searchpath("ums.sync", package.path) then
  package.path = root .. "/stdlib/?.lua;" .. root .. "/stdlib/?/init.lua;"
    .. package.path
end
if not package.searchpath("ums.core", package.cpath) then
  local build = os.getenv("UMS_BUILD_DIR") or (root .. "/build")
  package.cpath = build .. "/lua-binding/?.so;" .. package.cpath
end

return require "ums"
