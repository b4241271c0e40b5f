--[[
bench_ums.lua: ums (Lua 5.4) next to its floors, in one run.

Usage: lua5.4 bench/lua/bench_ums.lua [--quick] [--json] [--reps N]
                                       [--only GROUP or GROUP.SHAPE] [--n N]
  --quick  every count scaled down 100x (ctest bench_lua_smoke)
  --json   one JSON object on stdout instead of the table
  --reps   repetitions per figure (default 5); figures are medians
  --only   only that group (spawn, switch, channel, sync, memory,
           quantum), or only one shape of the sync group (sync.mutex,
           ...): with --reps 1 and two values of --n, the difference of
           two callgrind counts is the instructions per operation
  --n      the count of the sync shapes (default 200000)
Needs ums.core and bench_floor.so on LUA_CPATH and stdlib/ on LUA_PATH
(bench/lua/run.sh sets them up). Without bench_floor the C floors are
skipped.

This VM is noisy (+-20% run to run, and other jobs share its 2 vCPUs):
compare figures within one run. Each repetition measures the floor and the
ums figure back to back, and the ratio column is the median of those
per-repetition ratios (time of ums / time of the floor: 1.0 = as fast as
the floor, 2.0 = twice as slow). Times are process CPU time (os.clock,
all threads), which a busy machine inflates far less than wall time; the
wall-clock medians are reported next to them. Every run of ums here uses
one scheduler and waits on nothing but its own tasks, so a large gap
between the two means the machine was busy, not that ums slept.

Figures
  spawn    floor: coroutine.create + resume of N empty functions.
           ums: one task spawns N tasks (an empty function) in batches of
           1000 and joins each batch (finished coroutines are reused);
           also all N spawned before any runs, then joined (no reuse),
           against its own floor: N coroutines created, then each resumed
           (N live coroutines at once, as there are N live tasks).
  switch   N yields between two tasks, ns per switch (one task to the
           other). Floors: two raw coroutines resumed alternately by a
           plain Lua loop; lua_resume + lua_yield from C (bench_floor),
           with a C body and with a Lua body calling a C yield.
  channel  N messages from one task to another on an unbuffered
           ums.channel, ns per message. Floor: a value carried by raw
           coroutine.resume / coroutine.yield.
  stats    switch and channel once more with ums.config{stats = false}
           (wait timing and CPU sampling off, issue 7), interleaved with
           the rest; stats.*_cost = time on / time off per repetition
           (target <= 1.05). bench/lua/stats_cost.sh counts instructions
           instead, which this VM's noise does not move.
  sync     the objects of ums.sync, ns per round trip between two
           tasks: mutex (each locks, yields holding it, unlocks: every
           lock waits for the other's unlock), event (two auto-reset
           events: set one, wait the other), semaphore (the same with two
           semaphores of 0), cond (a turn variable under a mutex, one
           condition variable, signal and wait), waitgroup (add, done by
           the other, wait) and group (ums.group: spawn one task and
           wait for the group; N/10 of them). Floor: the switch floor
           (two raw coroutines) for one round trip.
  memory   N tasks parked in ums.sleep, each in a fresh child process:
           Lua heap (collectgarbage "count") and RSS (/proc/self/status)
           growth per task; the same for N bare coroutines parked in
           coroutine.yield; "extra" = task - bare coroutine.
  quantum  a CPU-bound Lua loop (additions) and fib() in a task with
           ums.config{quantum = 0.004} and with quantum = 0; the ratio is
           speed with the quantum on / speed with it off (target >= 0.97).

Exit status 1 when a benchmark fails (not when a target is missed).
]]

local ums = require "ums"
local has_floor, floor = pcall(require, "bench_floor")
if not has_floor then floor = nil end

local now = ums.now
-- Process CPU time (clock(): CLOCK_PROCESS_CPUTIME_ID). The primary
-- figures use it: this VM is shared, and wall time includes the time the
-- benchmark was not running at all. Wall time is kept next to it.
local clock = os.clock

-- cpu ns per op, wall ns per op since (w0, c0)
local function per(n, w0, c0)
  return (clock() - c0) * 1e9 / n, (now() - w0) * 1e9 / n
end
local fmt = string.format

-- ---------------------------------------------------------------------
-- Options
-- ---------------------------------------------------------------------

local opt = { quick = false, json = false, reps = 5, child = nil }
do
  local i = 1
  while arg and i <= #arg do
    local a = arg[i]
    if a == "--quick" then opt.quick = true
    elseif a == "--json" then opt.json = true
    elseif a == "--reps" then
      i = i + 1
      opt.reps = math.tointeger(tonumber(arg[i]))
      if not opt.reps or opt.reps < 1 then
        io.stderr:write("bench_ums: --reps needs a positive integer\n")
        os.exit(2)
      end
    elseif a == "--only" then
      i = i + 1
      opt.only = arg[i]
    elseif a == "--n" then
      i = i + 1
      opt.n = math.tointeger(tonumber(arg[i]))
      if not opt.n or opt.n < 1 then
        io.stderr:write("bench_ums: --n needs a positive integer\n")
        os.exit(2)
      end
    elseif a == "--child" then
      i = i + 1
      opt.child = arg[i]
      i = i + 1
      opt.child_n = math.tointeger(tonumber(arg[i]))
    elseif a == "-h" or a == "--help" then
      print("usage: lua5.4 bench_ums.lua [--quick] [--json] [--reps N]")
      os.exit(0)
    else
      io.stderr:write("bench_ums: unknown option " .. a .. "\n")
      os.exit(2)
    end
    i = i + 1
  end
end

local scale = opt.quick and 100 or 1
local N = {
  spawn = 1000000 // scale,
  switch = 10000000 // scale,
  channel = 1000000 // scale,
  sync = opt.n or 200000 // scale,
  memory = 1000000 // scale,
  loop = 200000000 // scale,
  fib = opt.quick and 20 or 30,
}
local SPAWN_BATCH = 1000

-- ---------------------------------------------------------------------
-- Helpers
-- ---------------------------------------------------------------------

local function rss_kb()
  local f = io.open("/proc/self/status", "r")
  if not f then return 0 end
  local s = f:read("a")
  f:close()
  return tonumber(s:match("VmRSS:%s*(%d+)%s*kB")) or 0
end

local function full_gc()
  collectgarbage("collect")
  collectgarbage("collect")
end

local function median(t)
  local s = {}
  for i = 1, #t do s[i] = t[i] end
  table.sort(s)
  local n = #s
  if n == 0 then return nil end
  if n % 2 == 1 then return s[(n + 1) // 2] end
  return (s[n // 2] + s[n // 2 + 1]) / 2
end

local function minmax(t)
  local lo, hi = math.huge, -math.huge
  for i = 1, #t do
    if t[i] < lo then lo = t[i] end
    if t[i] > hi then hi = t[i] end
  end
  return lo, hi
end

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- The interpreter running this script (the lowest index of arg).
local function interpreter()
  local lo = 0
  while arg[lo - 1] do lo = lo - 1 end
  return lo < 0 and arg[lo] or "lua5.4"
end

local function progress(s)
  io.stderr:write(s, "\n")
  io.stderr:flush()
end

-- ---------------------------------------------------------------------
-- Results
-- ---------------------------------------------------------------------

local results = {}   -- in report order
local by_id = {}
local failed = false

-- samples: per-repetition values (ns per op, bytes, ...).
local function add(r)
  if r.samples and #r.samples > 0 then
    r.median = median(r.samples)
    r.min, r.max = minmax(r.samples)
  end
  if r.unit == "ns/op" and r.median and r.median > 0 then
    r.ops_per_s = 1e9 / r.median
  end
  if r.wall_samples and #r.wall_samples > 0 then
    r.wall_median = median(r.wall_samples)
  end
  if r.ratio_samples and #r.ratio_samples > 0 then
    r.ratio = median(r.ratio_samples)
  end
  results[#results + 1] = r
  by_id[r.id] = r
  return r
end

-- Runs fns (a list of {id, fn}) opt.reps times, interleaved: every
-- repetition runs each fn once, in order. fn returns ns per op. Returns
-- a table id -> list of samples.
local function interleaved(fns)
  local samples, walls = {}, {}
  for _, f in ipairs(fns) do samples[f[1]], walls[f[1]] = {}, {} end
  for rep = 1, opt.reps do
    for _, f in ipairs(fns) do
      full_gc()
      local ok, v, w = pcall(f[2])
      if not ok then
        io.stderr:write(fmt("bench_ums: %s failed: %s\n", f[1], tostring(v)))
        failed = true
        v = nil
      end
      if v then
        table.insert(samples[f[1]], v)
        table.insert(walls[f[1]], w)
      end
    end
    progress(fmt("  rep %d/%d done", rep, opt.reps))
  end
  return samples, walls
end

-- Per-repetition ratios a[i] / b[i].
local function ratios(a, b)
  local r = {}
  for i = 1, math.min(#a, #b) do r[i] = a[i] / b[i] end
  return r
end

local function in_run(fn, ...)
  return ums.run(fn, ...)
end

-- ---------------------------------------------------------------------
-- (a) spawn
-- ---------------------------------------------------------------------

local function empty() end

local function floor_spawn()
  local n = N.spawn
  local create, resume = coroutine.create, coroutine.resume
  local w0, c0 = now(), clock()
  for _ = 1, n do resume(create(empty)) end
  return per(n, w0, c0)
end

-- The floor of spawning all first: every coroutine is alive at once, so
-- the collector marks and the allocator holds N of them, as ums does with
-- N tasks spawned before any runs; the one-at-a-time floor above would
-- make that row look several times worse than what Lua itself pays.
local function floor_spawn_all()
  local n = N.spawn
  local create, resume = coroutine.create, coroutine.resume
  local cs = {}
  local w0, c0 = now(), clock()
  for i = 1, n do cs[i] = create(empty) end
  for i = 1, n do resume(cs[i]) end
  return per(n, w0, c0)
end

local function ums_spawn_join()
  return in_run(function()
    local n, b = N.spawn, SPAWN_BATCH
    local spawn = ums.spawn
    local ts = {}
    local w0, c0 = now(), clock()
    local done = 0
    while done < n do
      local k = math.min(b, n - done)
      for i = 1, k do ts[i] = spawn(empty) end
      for i = 1, k do
        local ok = ts[i]:join()
        if not ok then error("a task failed") end
      end
      done = done + k
    end
    return per(n, w0, c0)
  end)
end

local function ums_spawn_all()
  return in_run(function()
    local n = N.spawn
    local spawn = ums.spawn
    local ts = {}
    local w0, c0 = now(), clock()
    for i = 1, n do ts[i] = spawn(empty) end
    for i = 1, n do
      local ok = ts[i]:join()
      if not ok then error("a task failed") end
    end
    return per(n, w0, c0)
  end)
end

local function ums_spawn_detached()
  return in_run(function()
    local n, b = N.spawn, SPAWN_BATCH
    local spawn, yield = ums.spawn, ums.yield
    local count = 0
    local function work() count = count + 1 end
    local w0, c0 = now(), clock()
    local started = 0
    while started < n do
      local k = math.min(b, n - started)
      for _ = 1, k do spawn(work) end
      started = started + k
      while count < started do yield() end
    end
    return per(n, w0, c0)
  end)
end

local function bench_spawn()
  progress(fmt("spawn: %d tasks", N.spawn))
  local s, sw = interleaved {
    {"floor", floor_spawn},
    {"join", ums_spawn_join},
    {"detached", ums_spawn_detached},
    {"floor_all", floor_spawn_all},
    {"all", ums_spawn_all},
  }
  add { id = "floor.spawn", group = "spawn", kind = "floor",
        what = "coroutine.create + resume, empty function",
        n = N.spawn, unit = "ns/op", samples = s.floor, wall_samples = sw.floor }
  add { id = "ums.spawn_join", group = "spawn", kind = "ums",
        what = fmt("ums.spawn + join, batches of %d", SPAWN_BATCH),
        n = N.spawn, unit = "ns/op", samples = s.join, wall_samples = sw.join,
        floor = "floor.spawn", ratio_samples = ratios(s.join, s.floor) }
  add { id = "ums.spawn_detached", group = "spawn", kind = "ums",
        what = fmt("ums.spawn, batches of %d, not joined", SPAWN_BATCH),
        n = N.spawn, unit = "ns/op", samples = s.detached, wall_samples = sw.detached,
        floor = "floor.spawn",
        ratio_samples = ratios(s.detached, s.floor) }
  add { id = "floor.spawn_all", group = "spawn", kind = "floor",
        what = "coroutine.create of N, then resume of each",
        n = N.spawn, unit = "ns/op", samples = s.floor_all,
        wall_samples = sw.floor_all }
  add { id = "ums.spawn_all", group = "spawn", kind = "ums",
        what = "ums.spawn all N first, then join all",
        n = N.spawn, unit = "ns/op", samples = s.all, wall_samples = sw.all,
        floor = "floor.spawn_all", ratio_samples = ratios(s.all, s.floor_all) }
  local r = by_id["ums.spawn_join"]
  r.target = ">= 5M tasks/s (and >= 3.5x Tarantool fiber.new: run.sh)"
  if r.ops_per_s then r.pass = r.ops_per_s >= 5e6 end
end

-- ---------------------------------------------------------------------
-- (b) switch
-- ---------------------------------------------------------------------

local function floor_switch_lua()
  local n = N.switch // 2
  local yield, resume = coroutine.yield, coroutine.resume
  local function body() while true do yield() end end
  local a, b = coroutine.create(body), coroutine.create(body)
  local w0, c0 = now(), clock()
  for _ = 1, n do resume(a) resume(b) end
  return per(2 * n, w0, c0)
end

local function floor_switch_c()
  local w0, c0 = now(), clock()
  floor.resume_yield(N.switch)
  return per(N.switch, w0, c0)
end

local function floor_switch_c_luabody()
  local w0, c0 = now(), clock()
  floor.resume_lua_yield(N.switch)
  return per(N.switch, w0, c0)
end

local function ums_switch()
  return in_run(function()
    local n = N.switch // 2
    local yield = ums.yield
    local function body() for _ = 1, n do yield() end end
    local w0, c0 = now(), clock()
    local a, b = ums.spawn(body), ums.spawn(body)
    assert(a:join())
    assert(b:join())
    return per(2 * n, w0, c0)
  end)
end

local function with_config(settings, fn)
  return function()
    local old = ums.config()
    ums.config(settings)
    local ok, v, w = pcall(fn)
    ums.config(old)
    if not ok then error(v, 0) end
    return v, w
  end
end

local function with_quantum(q, fn)
  return with_config({ quantum = q }, fn)
end

-- Wait statistics and CPU sampling off (issue 7), to measure what they
-- cost on the same workload in the same run.
local function without_stats(fn)
  return with_config({ stats = false }, fn)
end

local function bench_switch()
  progress(fmt("switch: %d yields", N.switch))
  local fns = { {"lua", floor_switch_lua} }
  if floor then
    fns[#fns + 1] = {"c", floor_switch_c}
    fns[#fns + 1] = {"c_luabody", floor_switch_c_luabody}
  end
  fns[#fns + 1] = {"ums", ums_switch}
  fns[#fns + 1] = {"ums_q0", with_quantum(0, ums_switch)}
  fns[#fns + 1] = {"ums_nostats", without_stats(ums_switch)}
  local s, sw = interleaved(fns)
  add { id = "floor.switch_lua", group = "switch", kind = "floor",
        what = "two raw coroutines resumed by a Lua loop",
        n = N.switch, unit = "ns/op", samples = s.lua, wall_samples = sw.lua }
  if floor then
    add { id = "floor.switch_c", group = "switch", kind = "floor",
          what = "lua_resume + lua_yield from C (C body)",
          n = N.switch, unit = "ns/op", samples = s.c, wall_samples = sw.c }
    add { id = "floor.switch_c_luabody", group = "switch", kind = "floor",
          what = "lua_resume from C, Lua body calling a C yield",
          n = N.switch, unit = "ns/op", samples = s.c_luabody, wall_samples = sw.c_luabody }
  end
  local r = add { id = "ums.switch", group = "switch", kind = "ums",
        what = "ums.yield between two tasks (quantum 4 ms)",
        n = N.switch, unit = "ns/op", samples = s.ums, wall_samples = sw.ums,
        floor = "floor.switch_lua", ratio_samples = ratios(s.ums, s.lua),
        target = "<= 1.0 x plain-Lua-loop floor" }
  if r.ratio then r.pass = r.ratio <= 1.0 end
  if floor then r.ratio_c = median(ratios(s.ums, s.c)) end
  r = add { id = "ums.switch_q0", group = "switch", kind = "ums",
        what = "the same with quantum = 0 (no count hook)",
        n = N.switch, unit = "ns/op", samples = s.ums_q0, wall_samples = sw.ums_q0,
        floor = "floor.switch_lua", ratio_samples = ratios(s.ums_q0, s.lua) }
  if floor then r.ratio_c = median(ratios(s.ums_q0, s.c)) end
  add { id = "ums.switch_nostats", group = "switch", kind = "ums",
        what = "the same as ums.switch with stats = false",
        n = N.switch, unit = "ns/op", samples = s.ums_nostats,
        wall_samples = sw.ums_nostats,
        floor = "floor.switch_lua", ratio_samples = ratios(s.ums_nostats, s.lua) }
  r = add { id = "stats.switch_cost", group = "switch", kind = "ums",
        what = "ums.switch time, stats on / off",
        n = N.switch, unit = "x", samples = ratios(s.ums, s.ums_nostats),
        target = "<= 1.05" }
  if r.median then r.pass = r.median <= 1.05 end
end

-- ---------------------------------------------------------------------
-- (c) channel
-- ---------------------------------------------------------------------

local function floor_message()
  local n = N.channel
  local yield, resume = coroutine.yield, coroutine.resume
  local co = coroutine.create(function()
    for i = 1, n do yield(i) end
  end)
  local w0, c0 = now(), clock()
  for i = 1, n do
    local _, v = resume(co)
    if v ~= i then error("floor_message: lost a value") end
  end
  return per(n, w0, c0)
end

local function ums_channel()
  return in_run(function()
    local n = N.channel
    local ch = ums.channel()
    local w0, c0 = now(), clock()
    local p = ums.spawn(function()
      for i = 1, n do ch:send(i) end
    end)
    local c = ums.spawn(function()
      for i = 1, n do
        local v = ch:recv()
        if v ~= i then error("channel: got " .. tostring(v)) end
      end
    end)
    assert(p:join())
    assert(c:join())
    return per(n, w0, c0)
  end)
end

local function bench_channel()
  if not ums.channel then
    io.stderr:write("bench_ums: ums.channel is missing (stdlib/ums/sync.lua)"
      .. "; channel skipped\n")
    failed = true
    return
  end
  progress(fmt("channel: %d messages", N.channel))
  local s, sw = interleaved {
    {"floor", floor_message},
    {"ums", ums_channel},
    {"ums_q0", with_quantum(0, ums_channel)},
    {"ums_nostats", without_stats(ums_channel)},
  }
  add { id = "floor.message", group = "channel", kind = "floor",
        what = "a value carried by coroutine.resume/yield",
        n = N.channel, unit = "ns/op", samples = s.floor, wall_samples = sw.floor }
  local r = add { id = "ums.channel", group = "channel", kind = "ums",
        what = "unbuffered ums.channel, send -> recv (quantum 4 ms)",
        n = N.channel, unit = "ns/op", samples = s.ums, wall_samples = sw.ums,
        floor = "floor.message", ratio_samples = ratios(s.ums, s.floor),
        target = "<= 2.0 x floor" }
  if r.ratio then r.pass = r.ratio <= 2.0 end
  add { id = "ums.channel_q0", group = "channel", kind = "ums",
        what = "the same with quantum = 0",
        n = N.channel, unit = "ns/op", samples = s.ums_q0, wall_samples = sw.ums_q0,
        floor = "floor.message", ratio_samples = ratios(s.ums_q0, s.floor) }
  add { id = "ums.channel_nostats", group = "channel", kind = "ums",
        what = "the same as ums.channel with stats = false",
        n = N.channel, unit = "ns/op", samples = s.ums_nostats,
        wall_samples = sw.ums_nostats,
        floor = "floor.message", ratio_samples = ratios(s.ums_nostats, s.floor) }
  local r2 = add { id = "stats.channel_cost", group = "channel", kind = "ums",
        what = "ums.channel time, stats on / off",
        n = N.channel, unit = "x", samples = ratios(s.ums, s.ums_nostats),
        target = "<= 1.05" }
  if r2.median then r2.pass = r2.median <= 1.05 end
end

-- ---------------------------------------------------------------------
-- (c2) sync: ums.sync's objects, a round trip between two tasks
-- ---------------------------------------------------------------------

-- Two raw coroutines, one round trip per iteration: the floor of a
-- hand-off there and back.
local function floor_roundtrip()
  local n = N.sync
  local yield, resume = coroutine.yield, coroutine.resume
  local co = coroutine.create(function()
    while true do yield() end
  end)
  local w0, c0 = now(), clock()
  for _ = 1, n do resume(co) end
  return per(n, w0, c0)
end

-- Runs a and b (each given n) as two tasks, ns per iteration.
local function two_tasks(a, b)
  return in_run(function()
    local n = N.sync
    local w0, c0 = now(), clock()
    local ta, tb = ums.spawn(a, n), ums.spawn(b, n)
    assert(ta:join())
    assert(tb:join())
    return per(n, w0, c0)
  end)
end

local SYNC = {}

SYNC.mutex = function()
  local m = ums.mutex()
  local yield = ums.yield
  local function body(n)
    for _ = 1, n do
      m:lock()
      yield()
      m:unlock()
    end
  end
  return two_tasks(body, body)
end

SYNC.event = function()
  local e1, e2 = ums.event(), ums.event()
  return two_tasks(function(n)
    for _ = 1, n do e1:set(); e2:wait() end
  end, function(n)
    for _ = 1, n do e1:wait(); e2:set() end
  end)
end

SYNC.semaphore = function()
  local s1, s2 = ums.semaphore(0), ums.semaphore(0)
  return two_tasks(function(n)
    for _ = 1, n do s1:release(); s2:acquire() end
  end, function(n)
    for _ = 1, n do s1:acquire(); s2:release() end
  end)
end

SYNC.cond = function()
  local m, c = ums.mutex(), ums.cond()
  local turn = 0
  local function body(me)
    return function(n)
      for _ = 1, n do
        m:lock()
        while turn ~= me do c:wait(m) end
        turn = 1 - me
        c:signal()
        m:unlock()
      end
    end
  end
  return two_tasks(body(0), body(1))
end

SYNC.waitgroup = function()
  local wg, go = ums.waitgroup(), ums.event()
  return two_tasks(function(n)
    for _ = 1, n do
      wg:add(1)
      go:set()
      wg:wait()
    end
  end, function(n)
    for _ = 1, n do
      go:wait()
      wg:done()
    end
  end)
end

SYNC.group = function()
  return in_run(function()
    local n = N.sync // 10
    local w0, c0 = now(), clock()
    for _ = 1, n do
      local g = ums.group()
      g:spawn(empty)
      assert(g:wait())
    end
    return per(n, w0, c0)
  end)
end

local SYNC_ORDER = { "mutex", "event", "semaphore", "cond", "waitgroup",
  "group" }

local function bench_sync(only)
  progress(fmt("sync: %d round trips", N.sync))
  local fns = { {"floor", floor_roundtrip} }
  for _, k in ipairs(SYNC_ORDER) do
    if not only or only == k then fns[#fns + 1] = { k, SYNC[k] } end
  end
  local s, sw = interleaved(fns)
  add { id = "floor.roundtrip", group = "sync", kind = "floor",
        what = "two raw coroutines: resume, yield back",
        n = N.sync, unit = "ns/op", samples = s.floor,
        wall_samples = sw.floor }
  for _, k in ipairs(SYNC_ORDER) do
    if s[k] then
      add { id = "ums.sync_" .. k, group = "sync", kind = "ums",
            what = k == "group" and "ums.group: spawn one task, wait for it"
              or "ums." .. k .. ": a round trip between two tasks",
            n = k == "group" and N.sync // 10 or N.sync, unit = "ns/op",
            samples = s[k], wall_samples = sw[k], floor = "floor.roundtrip",
            ratio_samples = ratios(s[k], s.floor) }
    end
  end
end

-- ---------------------------------------------------------------------
-- (d) memory per parked task: measured in child processes
-- ---------------------------------------------------------------------

-- Child side: prints one line "return {…}" with the growth in KiB.
local function child_mem_bare(n)
  local yield = coroutine.yield
  local function park() yield() end
  local cos = {}
  full_gc()
  local kb0, rss0 = collectgarbage("count"), rss_kb()
  local c0 = clock()
  for i = 1, n do
    local co = coroutine.create(park)
    coroutine.resume(co)
    cos[i] = co
  end
  local dt = clock() - c0
  full_gc()
  local kb1, rss1 = collectgarbage("count"), rss_kb()
  print(fmt("return {n = %d, lua_kb = %.3f, rss_kb = %d, secs = %.6f}",
    #cos, kb1 - kb0, rss1 - rss0, dt))
end

local function child_mem_ums(n)
  local out = ums.run(function()
    local sleep = ums.sleep
    local function park() sleep(3600) end
    local ts = {}
    full_gc()
    local kb0, rss0 = collectgarbage("count"), rss_kb()
    local c0 = clock()
    for i = 1, n do ts[i] = ums.spawn(park) end
    -- Let every task run up to its sleep.
    repeat
      ums.sleep(0.001)
    until ts[n]:status() == "suspended" and ts[1]:status() == "suspended"
    local dt = clock() - c0
    for i = 1, n do
      local st = ts[i]:status()
      if st ~= "suspended" then error("task " .. i .. " is " .. st) end
    end
    full_gc()
    local kb1, rss1 = collectgarbage("count"), rss_kb()
    local line = fmt("return {n = %d, lua_kb = %.3f, rss_kb = %d, "
      .. "secs = %.6f}", #ts, kb1 - kb0, rss1 - rss0, dt)
    for i = 1, n do ts[i]:cancel() end
    return line
  end)
  print(out)
end

-- Parent side: runs one child, returns its table (or nil, message).
local function run_child(kind, n)
  local cmd = fmt("%s %s --child %s %d 2>&1; echo \"exit=$?\"",
    shell_quote(interpreter()), shell_quote(arg[0]), kind, n)
  local p = io.popen(cmd, "r")
  local out = p:read("a")
  p:close()
  local line = out:match("(return {[^\n]*})")
  local code = out:match("exit=(%d+)%s*$")
  if not line or code ~= "0" then
    return nil, fmt("child %s exited %s: %s", kind, tostring(code),
      out:sub(1, 500))
  end
  return load(line)()
end

local function bench_memory()
  progress(fmt("memory: %d parked tasks (child processes)", N.memory))
  local bare = { lua = {}, rss = {}, secs = {} }
  local task = { lua = {}, rss = {}, secs = {} }
  local extra = { lua = {}, rss = {} }
  for rep = 1, opt.reps do
    local b, err1 = run_child("mem_bare", N.memory)
    local t, err2 = run_child("mem_ums", N.memory)
    if not b or not t then
      io.stderr:write("bench_ums: memory: ", tostring(err1 or err2), "\n")
      failed = true
      break
    end
    table.insert(bare.lua, b.lua_kb * 1024 / b.n)
    table.insert(bare.rss, b.rss_kb * 1024 / b.n)
    table.insert(bare.secs, b.secs * 1e9 / b.n)
    table.insert(task.lua, t.lua_kb * 1024 / t.n)
    table.insert(task.rss, t.rss_kb * 1024 / t.n)
    table.insert(task.secs, t.secs * 1e9 / t.n)
    table.insert(extra.lua, t.lua_kb * 1024 / t.n - b.lua_kb * 1024 / b.n)
    table.insert(extra.rss, t.rss_kb * 1024 / t.n - b.rss_kb * 1024 / b.n)
    progress(fmt("  rep %d/%d done", rep, opt.reps))
  end
  add { id = "floor.mem_lua", group = "memory", kind = "floor",
        what = "bare coroutine parked in yield: Lua heap",
        n = N.memory, unit = "B/task", samples = bare.lua }
  add { id = "floor.mem_rss", group = "memory", kind = "floor",
        what = "bare coroutine parked in yield: RSS",
        n = N.memory, unit = "B/task", samples = bare.rss }
  add { id = "ums.mem_lua", group = "memory", kind = "ums",
        what = "task parked in ums.sleep: Lua heap",
        n = N.memory, unit = "B/task", samples = task.lua,
        floor = "floor.mem_lua", ratio_samples = ratios(task.lua, bare.lua) }
  add { id = "ums.mem_rss", group = "memory", kind = "ums",
        what = "task parked in ums.sleep: RSS",
        n = N.memory, unit = "B/task", samples = task.rss,
        floor = "floor.mem_rss", ratio_samples = ratios(task.rss, bare.rss) }
  add { id = "ums.mem_extra_lua", group = "memory", kind = "ums",
        what = "task - bare coroutine: Lua heap",
        n = N.memory, unit = "B/task", samples = extra.lua }
  local r = add { id = "ums.mem_extra_rss", group = "memory", kind = "ums",
        what = "task - bare coroutine: RSS",
        n = N.memory, unit = "B/task", samples = extra.rss,
        target = "<= 2048 B/task beyond a bare coroutine" }
  if r.median then r.pass = r.median <= 2048 end
  add { id = "ums.mem_park_time", group = "memory", kind = "ums",
        what = "spawn + run to the sleep, per task (in the child)",
        n = N.memory, unit = "ns/op", samples = task.secs,
        floor = "floor.mem_park_time",
        ratio_samples = ratios(task.secs, bare.secs) }
  add { id = "floor.mem_park_time", group = "memory", kind = "floor",
        what = "create + resume to the yield, per coroutine (in the child)",
        n = N.memory, unit = "ns/op", samples = bare.secs }
end

-- ---------------------------------------------------------------------
-- (e) the quantum's cost on CPU-bound Lua code
-- ---------------------------------------------------------------------

local function add_loop(n)
  local s = 0
  for i = 1, n do s = s + i end
  return s
end

local function fib(n)
  if n < 2 then return n end
  return fib(n - 1) + fib(n - 2)
end

-- Returns seconds spent in work() inside a task with quantum q.
local function in_task(q, work, arg1)
  return with_quantum(q, function()
    return in_run(function()
      local w0, c0 = now(), clock()
      work(arg1)
      return clock() - c0, now() - w0
    end)
  end)
end

local function plain(work, arg1)
  return function()
    local w0, c0 = now(), clock()
    work(arg1)
    return clock() - c0, now() - w0
  end
end

local function bench_quantum()
  progress(fmt("quantum: %d additions, fib(%d)", N.loop, N.fib))
  local s, sw = interleaved {
    {"loop_off", in_task(0, add_loop, N.loop)},
    {"loop_on", in_task(0.004, add_loop, N.loop)},
    {"loop_plain", plain(add_loop, N.loop)},
    {"fib_off", in_task(0, fib, N.fib)},
    {"fib_on", in_task(0.004, fib, N.fib)},
    {"fib_plain", plain(fib, N.fib)},
  }
  local function speed(off, on) return ratios(off, on) end
  for _, w in ipairs { {"loop", fmt("%d additions", N.loop), N.loop},
                       {"fib", fmt("fib(%d)", N.fib), 1} } do
    local k = w[1]
    add { id = "quantum." .. k .. "_plain", group = "quantum",
          kind = "floor", what = w[2] .. ", main thread, no task",
          n = w[3], unit = "s", samples = s[k .. "_plain"],
          wall_samples = sw[k .. "_plain"] }
    add { id = "quantum." .. k .. "_off", group = "quantum", kind = "ums",
          what = w[2] .. " in a task, quantum = 0",
          n = w[3], unit = "s", samples = s[k .. "_off"],
          wall_samples = sw[k .. "_off"],
          floor = "quantum." .. k .. "_plain",
          ratio_samples = ratios(s[k .. "_off"], s[k .. "_plain"]) }
    add { id = "quantum." .. k .. "_on", group = "quantum", kind = "ums",
          what = w[2] .. " in a task, quantum = 4 ms",
          n = w[3], unit = "s", samples = s[k .. "_on"],
          wall_samples = sw[k .. "_on"],
          floor = "quantum." .. k .. "_plain",
          ratio_samples = ratios(s[k .. "_on"], s[k .. "_plain"]) }
    local r = add { id = "quantum." .. k .. "_speed", group = "quantum",
          kind = "ums", what = w[2] .. ": speed quantum on / off",
          n = w[3], unit = "x", samples = speed(s[k .. "_off"],
                                                s[k .. "_on"]),
          target = ">= 0.97" }
    if r.median then r.pass = r.median >= 0.97 end
  end
end

-- ---------------------------------------------------------------------
-- Output
-- ---------------------------------------------------------------------

local function json_encode(v, out)
  local t = type(v)
  if t == "table" then
    if #v > 0 or next(v) == nil then
      out[#out + 1] = "["
      for i = 1, #v do
        if i > 1 then out[#out + 1] = "," end
        json_encode(v[i], out)
      end
      out[#out + 1] = "]"
    else
      local keys = {}
      for k in pairs(v) do keys[#keys + 1] = tostring(k) end
      table.sort(keys)
      out[#out + 1] = "{"
      for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = "," end
        json_encode(k, out)
        out[#out + 1] = ":"
        json_encode(v[k], out)
      end
      out[#out + 1] = "}"
    end
  elseif t == "string" then
    out[#out + 1] = '"' .. v:gsub('[%c"\\]', function(c)
      return fmt("\\u%04x", c:byte())
    end) .. '"'
  elseif t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then
      out[#out + 1] = "null"
    elseif math.type(v) == "integer" then
      out[#out + 1] = tostring(v)
    else
      out[#out + 1] = fmt("%.6g", v)
    end
  elseif t == "boolean" then
    out[#out + 1] = tostring(v)
  else
    out[#out + 1] = "null"
  end
  return out
end

local function num(v, unit)
  if v == nil then return "-" end
  if unit == "s" then return fmt("%.3f s", v) end
  if unit == "x" then return fmt("%.3f", v) end
  if math.abs(v) >= 100 then return fmt("%.0f", v) end
  return fmt("%.1f", v)
end

local function rate(v)
  if not v then return "" end
  if v >= 1e6 then return fmt("%.2f M/s", v / 1e6) end
  if v >= 1e3 then return fmt("%.1f k/s", v / 1e3) end
  return fmt("%.0f /s", v)
end

local function print_table(cmdline)
  print(fmt("bench_ums  %s  (%s)  reps=%d, medians%s", _VERSION,
    floor and "bench_floor loaded" or "bench_floor MISSING: no C floors",
    opt.reps, opt.quick and ", --quick: counts / 100" or ""))
  print("command: " .. cmdline)
  print()
  local h = fmt("%-22s %-50s %10s %10s %7s %11s %7s  %s", "figure", "what",
    "median", "wall", "unit", "ops/s", "ratio", "target")
  print(h)
  print(string.rep("-", #h + 10))
  local group
  for _, r in ipairs(results) do
    if r.group ~= group then
      if group then print() end
      group = r.group
    end
    local ratio = r.ratio and fmt("%.2f", r.ratio) or ""
    local target = ""
    if r.target then
      target = (r.pass == nil and "?" or r.pass and "PASS" or "MISS")
        .. " (" .. r.target .. ")"
    end
    print(fmt("%-22s %-50s %10s %10s %7s %11s %7s  %s", r.id, r.what,
      num(r.median, r.unit), num(r.wall_median, r.unit), r.unit,
      rate(r.ops_per_s), ratio, target))
  end
  print()
  print("median = process CPU time (os.clock), wall = wall-clock time; "
    .. "both medians.")
  print("ratio = CPU time of the figure / CPU time of its floor (median of "
    .. "per-repetition ratios);")
  print("  floors: spawn -> floor.spawn, switch -> floor.switch_lua, "
    .. "channel -> floor.message,")
  print("  sync -> floor.roundtrip,")
  print("  memory -> the bare coroutine, quantum.*_on/off -> the same work "
    .. "on the main thread.")
  local sc = by_id["ums.switch"]
  if sc and sc.ratio_c then
    print(fmt("ums.switch / floor.switch_c (lua_resume+lua_yield from C): "
      .. "%.2f", sc.ratio_c))
  end
end

-- ---------------------------------------------------------------------
-- Main
-- ---------------------------------------------------------------------

if opt.child then
  if opt.child == "mem_bare" then child_mem_bare(opt.child_n)
  elseif opt.child == "mem_ums" then child_mem_ums(opt.child_n)
  else error("unknown child " .. tostring(opt.child)) end
  os.exit(0)
end

local cmdline = {}
do
  local lo = 0
  while arg[lo - 1] do lo = lo - 1 end
  for i = lo, #arg do cmdline[#cmdline + 1] = arg[i] end
end
cmdline = table.concat(cmdline, " ")

local t_start = now()
local only_group, only_shape = nil, nil
if opt.only then
  only_group, only_shape = opt.only:match("^([%w_]+)%.?([%w_]*)$")
  if not only_group or (only_shape ~= "" and not SYNC[only_shape]) then
    io.stderr:write("bench_ums: --only: unknown " .. opt.only .. "\n")
    os.exit(2)
  end
  if only_shape == "" then only_shape = nil end
end
for _, b in ipairs{ {"spawn", bench_spawn}, {"switch", bench_switch},
    {"channel", bench_channel}, {"sync", bench_sync},
    {"memory", bench_memory}, {"quantum", bench_quantum} } do
  if not only_group or only_group == b[1] then b[2](only_shape) end
end

if opt.json then
  local clean = {}
  for i, r in ipairs(results) do
    local c = {}
    for k, v in pairs(r) do
      if k ~= "ratio_samples" then c[k] = v end
    end
    clean[i] = c
  end
  print(table.concat(json_encode({
    tool = "bench_ums", lua = _VERSION, quick = opt.quick, reps = opt.reps,
    command = cmdline, bench_floor = floor ~= nil,
    seconds = now() - t_start, failed = failed, results = clean,
  }, {})))
else
  print_table(cmdline)
  print(fmt("total %.1f s%s", now() - t_start,
    failed and "; SOME BENCHMARKS FAILED" or ""))
end
os.exit(failed and 1 or 0)
