-- bench_ffi_luajit.lua: LuaJIT's ffi.new of the small struct bench_ffi.lua
-- makes with ums.ffi, run by bench_ffi.lua in a luajit process (Debian's
-- luajit) in the same run. Each result is kept in a ring of 64 slots, as
-- bench_ffi.lua does, so that the JIT cannot sink the allocation.
-- usage: luajit bench_ffi_luajit.lua N REPS -> "luajit.new <seconds/new>"
-- (LuaJIT is Lua 5.1: no integer division operator here)
local ffi = require "ffi"
ffi.cdef[[ struct bench_pt { int x, y; double w; }; ]]
local n, reps = tonumber(arg[1]), tonumber(arg[2])
local function once()
  local ring = {}
  local t0 = os.clock()
  for i = 1, n do ring[i % 64 + 1] = ffi.new("struct bench_pt") end
  return (os.clock() - t0) / n
end
local s = {}
for i = 1, reps do s[i] = once() end
table.sort(s)
print(("luajit.new %.12f"):format(s[math.floor((reps + 1) / 2)]))
