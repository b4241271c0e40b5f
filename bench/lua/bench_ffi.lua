--[[
bench_ffi.lua: a trivial C call made preemptive from Lua, ums.ffi next to
its floors and luv's thread pool, in one run (issue 5's benchmark, Lua
side; bench/bench_preempt.c has the C side and the raw thread handoff).

usage: lua5.4 bench/lua/bench_ffi.lua [--quick] [--reps N]

  direct      the same C function declared UMS_INLINE (called directly)
  ums_1       one task calls it preemptively N times (a round trip each:
              the task parks, a C-call pool thread runs it, the task
              resumes), microseconds per call
  ums_64      64 tasks doing the same at once: calls per second
  luv_1       luv: uv.new_work + work:queue round trips, one at a time
              (the work function runs in luv's thread pool, in a separate
              Lua state, and its after-callback in the loop)
  luv_64      64 such chains at once: calls per second
  tt_1        Tarantool: coio_call from a Lua fiber (bench_coio.so, run by
              bench_ffi_tarantool.lua in a tarantool process), 1 in flight
  tt_64       64 fibers doing the same at once
  handoff     the raw thread handoff (bench_floor.thread_handoff): a plain
              C loop hands getpid to another thread and sleeps on a
              condition variable until it answers, one round trip each
  handoff_spin  the same with both threads busy-polling: the physical
              floor of a cross-thread round trip
  struct_1    ums_1 with a C function taking a struct by value and
              writing one through an out-parameter (bench_floor.so's
              bench_struct_call), beside the plain call (target: within
              20% of ums_1)
  struct_64   the same from 64 tasks (target: within 20% of ums_64)
  new_ums     ums.ffi.new of that small struct (CPU time per new, each
              kept in a ring of 64 slots)
  new_luajit  LuaJIT's ffi.new of the same struct, the same way, in a
              luajit process (Debian's luajit) in the same run
The C function is getpid(2) everywhere (a system call that does not
block). Medians of --reps repetitions of wall time. luv, Tarantool and the
floors join in when installed or built (bench_floor.so, bench_coio.so on
LUA_CPATH).
]]

local ums = require "ums"
local has_luv, uv = pcall(require, "luv")
local fmt = string.format

local opt = { quick = false, reps = 5 }
do
  local i = 1
  while i <= #arg do
    if arg[i] == "--quick" then opt.quick = true
    elseif arg[i] == "--reps" then
      i = i + 1
      opt.reps = math.tointeger(tonumber(arg[i]))
      if not opt.reps or opt.reps < 1 then
        io.stderr:write("bench_ffi: --reps needs a positive integer\n")
        os.exit(2)
      end
    else
      io.stderr:write("bench_ffi: unknown option " .. arg[i] .. "\n")
      os.exit(2)
    end
    i = i + 1
  end
end
if opt.quick then opt.reps = math.min(opt.reps, 2) end

local N1 = opt.quick and 2000 or 20000
local NNEW = opt.quick and 20000 or 2000000
local N64 = opt.quick and 6400 or 64000
local TASKS = 64

local ffi = ums.ffi
ffi.cdef[[ int getpid(void); ]]
local C = ffi.C
ffi.cdef[[ UMS_INLINE int getppid(void); ]]

local now = ums.now

-- The struct call's C function lives in bench_floor.so (a plain exported
-- function beside the Lua module's).
local floor_path = package.searchpath("bench_floor", package.cpath)
ffi.cdef[[ struct bench_pt { int x, y; double w; }; ]]
local SL
if floor_path then
  ffi.cdef[[ int bench_struct_call(struct bench_pt p, struct bench_pt *out); ]]
  SL = ffi.load(floor_path)
end

local function median(t)
  table.sort(t)
  local n = #t
  if n % 2 == 1 then return t[(n + 1) // 2] end
  return (t[n // 2] + t[n // 2 + 1]) / 2
end

local function measure(fn)
  local s = {}
  for i = 1, opt.reps do s[i] = fn() end
  return median(s)
end

local function direct()
  return ums.run(function()
    local f = C.getppid
    local t0 = now()
    for _ = 1, N1 do f() end
    return (now() - t0) / N1
  end)
end

local function ums_1()
  return ums.run(function()
    local f = C.getpid
    local t0 = now()
    for _ = 1, N1 do f() end
    return (now() - t0) / N1
  end)
end

local function ums_64()
  return ums.run(function()
    local f = C.getpid
    local per = N64 // TASKS
    local t0 = now()
    local ts = {}
    for i = 1, TASKS do
      ts[i] = ums.spawn(function() for _ = 1, per do f() end end)
    end
    for _, t in ipairs(ts) do assert(t:join()) end
    return (now() - t0) / (per * TASKS)
  end)
end

local function struct_1()
  return ums.run(function()
    local f = SL.bench_struct_call
    local p = ffi.new("struct bench_pt", {x = 1, y = 2, w = 0.5})
    local out = ffi.new("struct bench_pt")
    local t0 = now()
    for _ = 1, N1 do f(p, out) end
    assert(out.x == 2 and out.w == 0.5)
    return (now() - t0) / N1
  end)
end

local function struct_64()
  return ums.run(function()
    local f = SL.bench_struct_call
    local per = N64 // TASKS
    local t0 = now()
    local ts = {}
    for i = 1, TASKS do
      ts[i] = ums.spawn(function()
        local p = ffi.new("struct bench_pt", {x = i, y = 2, w = 0.5})
        local out = ffi.new("struct bench_pt")
        for _ = 1, per do f(p, out) end
        assert(out.y == i)
      end)
    end
    for _, t in ipairs(ts) do assert(t:join()) end
    return (now() - t0) / (per * TASKS)
  end)
end

-- CPU time per ffi.new, as bench_ffi_luajit.lua measures LuaJIT's.
local function new_ums()
  local ring = {}
  local t0 = os.clock()
  for i = 1, NNEW do ring[i % 64 + 1] = ffi.new("struct bench_pt") end
  return (os.clock() - t0) / NNEW
end

local function luv_chains(chains, total)
  local per = total // chains
  local done = 0
  local t0 = uv.hrtime()
  for _ = 1, chains do
    local left = per
    local w
    w = uv.new_work(function()
      -- luv runs this in a pool thread's own Lua state: no upvalues
      return 1
    end, function()
      done = done + 1
      left = left - 1
      if left > 0 then w:queue() end
    end)
    w:queue()
  end
  uv.run()
  assert(done == per * chains)
  return (uv.hrtime() - t0) / 1e9 / (per * chains)
end

local rows = {}
local function row(id, what, secs_per_call)
  rows[#rows + 1] = { id = id, what = what, us = secs_per_call * 1e6,
                      per_s = 1 / secs_per_call }
end

io.stderr:write("bench_ffi: direct\n")
row("direct", "getpid declared UMS_INLINE", measure(direct))
io.stderr:write("bench_ffi: ums, 1 in flight\n")
row("ums_1", "ums.ffi preemptive call, 1 in flight", measure(ums_1))
io.stderr:write("bench_ffi: ums, 64 in flight\n")
row("ums_64", "ums.ffi preemptive calls, 64 tasks", measure(ums_64))
if SL then
  io.stderr:write("bench_ffi: struct calls\n")
  row("struct_1", "struct by value + out-parameter, 1 in flight",
    measure(struct_1))
  row("struct_64", "struct by value + out-parameter, 64 tasks",
    measure(struct_64))
end
io.stderr:write("bench_ffi: ffi.new\n")
row("new_ums", "ums.ffi.new of a 16-byte struct", measure(new_ums))
do
  local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
  local p = io.popen(fmt("command -v luajit >/dev/null && env -u LD_PRELOAD "
    .. "luajit '%s/bench_ffi_luajit.lua' %d %d 2>/dev/null", here, NNEW,
    opt.reps))
  local v = tonumber((p:read("a") or ""):match("luajit%.new (%S+)"))
  p:close()
  if v then row("new_luajit", "LuaJIT ffi.new of the same struct", v) end
end
if has_luv then
  io.stderr:write("bench_ffi: luv\n")
  row("luv_1", "luv work:queue round trip, 1 in flight",
    measure(function() return luv_chains(1, N1) end))
  row("luv_64", "luv work:queue, 64 chains",
    measure(function() return luv_chains(TASKS, N64) end))
end

if floor_path then
  local floor = require "bench_floor"
  io.stderr:write("bench_ffi: raw thread handoff\n")
  row("handoff", "raw thread handoff, condition variable",
    measure(function() return floor.thread_handoff(N1, false) / N1 end))
  row("handoff_spin", "raw thread handoff, both sides spinning",
    measure(function() return floor.thread_handoff(N1, true) / N1 end))
end

-- Tarantool's coio_call, in its own process (without a sanitizer preloaded
-- into it: the ASan smoke run), when tarantool and bench_coio.so are there.
do
  local dir = floor_path and floor_path:match("^(.*)/[^/]*$")
  if dir and package.searchpath("bench_coio", dir .. "/?.so") then
    local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
    local cmd = fmt("command -v tarantool >/dev/null && env -u LD_PRELOAD "
      .. "tarantool '%s/bench_ffi_tarantool.lua' --cpath '%s' --reps %d%s "
      .. "2>/dev/null", here, dir, opt.reps, opt.quick and " --quick" or "")
    io.stderr:write("bench_ffi: tarantool coio_call\n")
    local tt = {}
    local p = io.popen(cmd)
    for line in p:lines() do
      local id, v = line:match("^tarantool%.(%S+) (%S+)")
      if id then tt[id] = tonumber(v) end
    end
    p:close()
    if tt.coio_1 and tt.coio_64 then
      row("tt_1", "Tarantool coio_call from a fiber, 1 in flight", tt.coio_1)
      row("tt_64", "Tarantool coio_call, 64 fibers", tt.coio_64)
    end
  end
end

local by = {}
for _, r in ipairs(rows) do by[r.id] = r end
print(fmt("%-12s %-44s %12s %14s", "figure", "what", "us/call", "calls/s"))
for _, r in ipairs(rows) do
  print(fmt("%-12s %-44s %12.2f %14.0f", r.id, r.what, r.us, r.per_s))
end
for _, peer in ipairs { { "luv", "luv" }, { "tt", "Tarantool" } } do
  local p1, p64 = by[peer[1] .. "_1"], by[peer[1] .. "_64"]
  if p1 then
    print(fmt("latency, 1 in flight: ums is %.1fx faster than %s "
      .. "(target >= 20x)", p1.us / by.ums_1.us, peer[2]))
    print(fmt("throughput, 64 in flight: ums is %.2fx %s (target >= 2x)",
      by.ums_64.per_s / p64.per_s, peer[2]))
  end
end
if by.handoff then
  print(fmt("ums 1 in flight / raw condvar handoff: %.2f; "
    .. "/ spinning handoff: %.2f", by.ums_1.us / by.handoff.us,
    by.ums_1.us / by.handoff_spin.us))
end
if by.struct_1 then
  print(fmt("struct call / plain call: %.2f with 1 in flight, %.2f with 64 "
    .. "(target <= 1.20)", by.struct_1.us / by.ums_1.us,
    by.struct_64.us / by.ums_64.us))
end
if by.new_luajit then
  print(fmt("ffi.new of a small struct: ums.ffi %.0f ns, LuaJIT %.0f ns "
    .. "(ums.ffi takes %.1fx LuaJIT's time)", by.new_ums.us * 1e3,
    by.new_luajit.us * 1e3, by.new_ums.us / by.new_luajit.us))
end
print(fmt("(%d repetitions, medians of wall time; ffi.new: CPU time)",
  opt.reps))
