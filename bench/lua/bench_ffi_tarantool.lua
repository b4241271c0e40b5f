--[[
bench_ffi_tarantool.lua: the Tarantool figures for bench_ffi.lua: a trivial
C call (getpid) made through coio_call, Tarantool's thread pool for
blocking calls, from Lua fibers (bench_coio.so, built from bench_coio.c
when Tarantool's headers are installed). Tarantool's Lua is LuaJIT (Lua
5.1 language).

usage: tarantool bench/lua/bench_ffi_tarantool.lua --cpath DIR
                 [--quick] [--reps N]

  coio_1   one fiber makes N1 calls, one at a time: seconds per call
  coio_64  64 fibers make N64 calls between them: seconds per call
Prints one line per figure, "tarantool.<id> <seconds per call>", medians
of --reps repetitions of wall time.
]]

local fiber = require 'fiber'
local clock = require 'clock'

local opt = { quick = false, reps = 5, cpath = nil }
do
  local i = 1
  while arg and i <= #arg do
    local a = arg[i]
    if a == '--quick' then opt.quick = true
    elseif a == '--reps' then i = i + 1; opt.reps = tonumber(arg[i])
    elseif a == '--cpath' then i = i + 1; opt.cpath = arg[i]
    else
      io.stderr:write('bench_ffi_tarantool: unknown option ' .. a .. '\n')
      os.exit(2)
    end
    i = i + 1
  end
end
if not opt.cpath then
  io.stderr:write('bench_ffi_tarantool: --cpath DIR (where bench_coio.so is) '
    .. 'is required\n')
  os.exit(2)
end
if opt.quick then opt.reps = math.min(opt.reps, 2) end
package.cpath = opt.cpath .. '/?.so;' .. package.cpath
local coio = require 'bench_coio'

local N1 = opt.quick and 2000 or 20000
local N64 = opt.quick and 6400 or 64000
local FIBERS = 64

local function median(t)
  table.sort(t)
  local n = #t
  if n % 2 == 1 then return t[(n + 1) / 2] end
  return (t[n / 2] + t[n / 2 + 1]) / 2
end

local function measure(fn)
  local s = {}
  for i = 1, opt.reps do s[i] = fn() end
  return median(s)
end

local getpid = coio.getpid
local pid = getpid()
assert(type(pid) == 'number' and pid > 0)

local function one()
  local t0 = clock.monotonic()
  for _ = 1, N1 do getpid() end
  return (clock.monotonic() - t0) / N1
end

local function many()
  local per = math.floor(N64 / FIBERS)
  local done = fiber.channel(FIBERS)
  local t0 = clock.monotonic()
  for _ = 1, FIBERS do
    fiber.create(function()
      for _ = 1, per do getpid() end
      done:put(true)
    end)
  end
  for _ = 1, FIBERS do done:get() end
  return (clock.monotonic() - t0) / (per * FIBERS)
end

print(string.format('tarantool.coio_1 %.9f', measure(one)))
print(string.format('tarantool.coio_64 %.9f', measure(many)))
os.exit(0)
