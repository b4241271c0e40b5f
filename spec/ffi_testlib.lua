-- Shared by the ums.ffi specs that call the C test library
-- (spec/ffi_testlib.c), loaded with dofile:
--   path()          its path: built by CMake (UMS_FFI_TESTLIB), or compiled
--                   here with cc when a spec is run by hand; the second
--                   result says whether the caller should remove it
--   open()          loads it with ums.ffi.load (declare its functions
--                   first); close() in the spec's teardown removes a copy
--                   compiled here
--   errmsg(f, ...)  the error f(...) raises, as a string (fails if none)
local M = {}
local opened_path, opened_temp
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

function M.open()
  opened_path, opened_temp = M.path()
  return require("ums").ffi.load(opened_path)
end

function M.close()
  collectgarbage()
  if opened_temp then os.remove(opened_path) end
  opened_path, opened_temp = nil, nil
end

function M.errmsg(f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected an error")
  return tostring(err)
end

return M
