-- Shared by the ums.ffi specs that call the C test library
-- (spec/ffi_testlib.c), loaded with dofile:
--   path()          its path: built by CMake (UMS_FFI_TESTLIB), or compiled
--                   here with cc when a spec is run by hand; the second
--                   result says whether the caller should remove it
--   errmsg(f, ...)  the error f(...) raises, as a string (fails if none)
local M = {}
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"

function M.path()
  local path = os.getenv("UMS_FFI_TESTLIB")
  if path then return path, false end
  path = os.tmpname()
  os.remove(path)
  path = path .. ".so"
  local p = assert(io.popen(("env -u LD_PRELOAD cc -std=gnu11 -shared "
    .. "-fPIC -o %s %sffi_testlib.c 2>&1"):format(path, dir)))
  local out = p:read("a")
  assert(p:close(), out)
  return path, true
end

function M.errmsg(f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected an error")
  return tostring(err)
end

return M
