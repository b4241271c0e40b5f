--[[
bench_fs_tarantool.lua: the peer figures for bench_fs.lua with Tarantool's
fio (file I/O on its coio thread pool, each call yielding the fiber).
Tarantool's Lua is LuaJIT (Lua 5.1 language).

usage: tarantool bench/lua/bench_fs_tarantool.lua [--quick] [--reps N]
                                                  [--dir DIR]

Same files (bench_fs.lua creates them), shapes and medians of wall time:
  big1     one fiber reads the big file with fh:read(1 MiB)
  big64    64 fibers, each fh:pread(1 MiB, off) over its slice of one fh
  small64  64 fibers open, read whole and close the small files
Prints one line per figure: "tarantool.<id> <value> <unit>".
]]

local fio = require 'fio'
local fiber = require 'fiber'
local clock = require 'clock'

local now = clock.monotonic
local fmt = string.format

local opt = { quick = false, reps = 5, dir = '/tmp/ums-bench-io' }
do
  local i = 1
  while arg and i <= #arg do
    local a = arg[i]
    if a == '--quick' then opt.quick = true
    elseif a == '--reps' then i = i + 1; opt.reps = tonumber(arg[i])
    elseif a == '--dir' then i = i + 1; opt.dir = arg[i]
    else
      io.stderr:write('bench_fs_tarantool: unknown option ' .. a .. '\n')
      os.exit(2)
    end
    i = i + 1
  end
end
if opt.quick then opt.reps = math.min(opt.reps, 2) end

local MiB = 1024 * 1024
local BIG_SIZE = opt.quick and 64 * MiB or 1024 * MiB
local NSMALL = opt.quick and 500 or 10000
local TASKS = 64
local big_path = opt.dir .. '/big.dat'
local small_paths = {}
for i = 0, NSMALL - 1 do
  small_paths[#small_paths + 1] = fmt('%s/small/%02d/f%05d', opt.dir,
    i % 100, i)
end

local function check_files()
  local st = fio.stat(big_path)
  if not st or st.size ~= BIG_SIZE then
    io.stderr:write('bench_fs_tarantool: run bench_fs.lua first (it makes '
      .. big_path .. ')\n')
    os.exit(2)
  end
end

local function big1()
  local fh = assert(fio.open(big_path, {'O_RDONLY'}))
  local total = 0
  while true do
    local s = fh:read(MiB)
    if not s or #s == 0 then break end
    total = total + #s
  end
  fh:close()
  assert(total == BIG_SIZE)
end

local function join_all(fs)
  for _, f in ipairs(fs) do
    local ok, err = f:join()
    assert(ok, err)
  end
end

local function big64()
  local fh = assert(fio.open(big_path, {'O_RDONLY'}))
  local slice = BIG_SIZE / TASKS
  local fs = {}
  for k = 0, TASKS - 1 do
    local f = fiber.new(function()
      local off, stop = k * slice, (k + 1) * slice
      while off < stop do
        local s = fh:pread(math.min(MiB, stop - off), off)
        assert(s and #s > 0)
        off = off + #s
      end
    end)
    f:set_joinable(true)
    fs[#fs + 1] = f
  end
  join_all(fs)
  fh:close()
end

local function small64()
  local fs = {}
  for k = 1, TASKS do
    local f = fiber.new(function()
      for i = k, NSMALL, TASKS do
        local fh = assert(fio.open(small_paths[i], {'O_RDONLY'}))
        local s = fh:read(65536)
        assert(#s == 4096)
        fh:close()
      end
    end)
    f:set_joinable(true)
    fs[#fs + 1] = f
  end
  join_all(fs)
end

local function median(t)
  table.sort(t)
  local n = #t
  if n % 2 == 1 then return t[(n + 1) / 2] end
  return (t[n / 2] + t[n / 2 + 1]) / 2
end

local function measure(fn)
  local s = {}
  for _ = 1, opt.reps do
    local t0 = now()
    fn()
    s[#s + 1] = now() - t0
  end
  return median(s)
end

check_files()
big1()  -- warm
print(fmt('tarantool.big1 %.1f MB/s', BIG_SIZE / MiB / measure(big1)))
print(fmt('tarantool.big64 %.1f MB/s', BIG_SIZE / MiB / measure(big64)))
print(fmt('tarantool.small64 %.1f files/s', NSMALL / measure(small64)))
os.exit(0)
