--[[
bench_cores.lua: Lua on every core (issue 6's benchmark). One Lua VM per
scheduler, work submitted by value with ums.submit, placement and
stealing, and shared channels between VMs, in one run.

usage: lua5.4 bench/lua/bench_cores.lua [--quick] [--reps N] [--json]

  cpu_1sched     64 work requests counting primes by trial division (the
                 number line up to LIMIT cut into 64 ranges), submitted
                 with ums.submit on 1 scheduler: wall time
  cpu_2sched     the same on 2 schedulers, ums.submit's placement (the
                 least-loaded scheduler)
  cpu_2sched_on1 2 schedulers, all 64 submitted to scheduler 1 with
                 submit_on: only stealing puts work on scheduler 2
  cpu_2sched_on2 the same, all submitted to scheduler 2
  floor          the same count in a plain Lua loop, no ums (one core)
  floor_2proc    the same split over two plain lua5.4 processes (every
                 other range each), started together: what two cores give
                 plain Lua at this moment on this machine
  speedup        cpu_1sched / cpu_2sched..., per repetition, median
  speedup_floor  floor / floor_2proc: the speedup two processes get;
                 on a machine busy with other work it falls below 2, and
                 the ums speedups with it
  cpu_util_*     process CPU time / wall time of the 2-scheduler runs
                 (2.0: both schedulers had a CPU all the time)
  chan_*         messages per second through a channel between two tasks:
                 same_vm (ums.channel, both tasks in one VM), shared_same
                 (ums.shared.channel, both in one VM), shared_cross (the
                 sender on scheduler 2, the receiver on scheduler 1:
                 every value is copied across VMs), unbuffered and with a
                 buffer of 64
  submit_join    one empty work request submitted and joined at a time:
                 microseconds per round trip

Wall time, medians of --reps repetitions (5; 2 with --quick, which also
scales every count down about 30x: the ctest smoke run). The speedups
compare runs measured back to back within one repetition. The machine
this was written on is a noisy 2-vCPU VM: read the load next to the
figures (printed at the start and the end), and compare ratios.
]]

local ums = require "ums"
local fmt = string.format

local opt = { quick = false, reps = 5, json = false }
do
  local i = 1
  while i <= #arg do
    if arg[i] == "--child" then
      -- A floor_2proc child: every n-th range from k, no ums run.
      opt.child = { tonumber(arg[i + 1]), tonumber(arg[i + 2]) }
      i = i + 2
    elseif arg[i] == "--quick" then opt.quick = true
    elseif arg[i] == "--json" then opt.json = true
    elseif arg[i] == "--reps" then
      i = i + 1
      opt.reps = math.tointeger(tonumber(arg[i]))
      if not opt.reps or opt.reps < 1 then
        io.stderr:write("bench_cores: --reps needs a positive integer\n")
        os.exit(2)
      end
    else
      io.stderr:write("bench_cores: unknown option " .. arg[i] .. "\n")
      os.exit(2)
    end
    i = i + 1
  end
end
if opt.quick then opt.reps = math.min(opt.reps, 2) end

local REQUESTS = 64
local LIMIT = opt.quick and 60000 or 1800000
local MSGS = opt.quick and 3000 or 100000
local MSGS_CROSS = opt.quick and 1000 or 20000
local ROUND_TRIPS = opt.quick and 200 or 5000

local now = ums.now

local function median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n = #s
  if n % 2 == 1 then return s[(n + 1) // 2] end
  return (s[n // 2] + s[n // 2 + 1]) / 2
end

local function loadavg()
  local f = io.open("/proc/loadavg")
  if not f then return "?" end
  local l = f:read("l")
  f:close()
  return l:match("^(%S+ %S+ %S+)") or "?"
end

-- The work: primes in [lo, hi), and the scheduler it ran on. No upvalues
-- (it is copied into the VM that runs it).
local function count_primes(lo, hi)
  local n = 0
  for x = lo, hi - 1 do
    if x == 2 then
      n = n + 1
    elseif x > 2 and x % 2 == 1 then
      local d, p = 3, true
      while d * d <= x do
        if x % d == 0 then
          p = false
          break
        end
        d = d + 2
      end
      if p then n = n + 1 end
    end
  end
  local ums = require "ums"
  return n, ums.scheduler and ums.scheduler()
end

local function chunk(i)
  return (i - 1) * LIMIT // REQUESTS, i * LIMIT // REQUESTS
end

local function floor()
  local t0 = now()
  local total = 0
  for i = 1, REQUESTS do total = total + count_primes(chunk(i)) end
  return now() - t0, total
end

if opt.child then
  local k, n = opt.child[1], opt.child[2]
  local total = 0
  for i = k, REQUESTS, n do total = total + count_primes(chunk(i)) end
  print(total)
  os.exit(0)
end

-- Two plain lua5.4 processes, each with every other range.
local function floor_2proc()
  local lua = arg[-1] or "lua5.4"
  local me = debug.getinfo(1, "S").source:match("^@(.*)$")
  local cmd = string.format("'%s' '%s' --child %%d 2%s", lua, me,
    opt.quick and " --quick" or "")
  local t0 = now()
  local a = assert(io.popen(cmd:format(1)))
  local b = assert(io.popen(cmd:format(2)))
  local total = tonumber(a:read("a")) + tonumber(b:read("a"))
  a:close()
  b:close()
  return now() - t0, total
end

-- One run with `scheds` schedulers; `on` nil: ums.submit's placement,
-- else every request on the on-th scheduler (submit_on(on - 1): the
-- rows below count schedulers from 1). Returns the wall time, the count
-- and how many requests the first and second scheduler ran.
local function cpu(scheds, on)
  ums.config { schedulers = scheds, quantum = 0.004 }
  local t0, c0 = now(), os.clock()
  local total, ran = ums.run(function()
    local ws = {}
    for i = 1, REQUESTS do
      local lo, hi = chunk(i)
      ws[i] = on and ums.submit_on(on - 1, count_primes, lo, hi)
                 or ums.submit(count_primes, lo, hi)
    end
    local sum, per = 0, {}
    for i = 1, REQUESTS do
      local ok, n, s = ws[i]:join()
      assert(ok, n)
      sum = sum + n
      per[s + 1] = (per[s + 1] or 0) + 1
    end
    return sum, per
  end)
  local wall = now() - t0
  return wall, total, ran, (os.clock() - c0) / wall
end

-- Starts fn(...) as work on scheduler 2 for sure: the calling task keeps
-- scheduler 1 busy (the run has quantum 0) until it has started, so that
-- scheduler 1 cannot steal it.
local function on2(fn, ...)
  local started = ums.shared.event(true)
  local w = ums.submit_on(1, function(started, fn, ...)
    started:set()
    return fn(...)
  end, started, fn, ...)
  while not started:is_set() do end
  return w
end

local function sender(ch, n)
  for i = 1, n do ch:send(i) end
  return n
end

-- n messages from one task to another; `kind` "plain" (ums.channel),
-- "shared" (both tasks in the main VM) or "cross" (sender on scheduler
-- 2). Returns messages per second.
local function chan(kind, size, n)
  ums.config { schedulers = 2, quantum = 0 }
  return ums.run(function()
    local ch
    if kind == "plain" then ch = ums.channel(size)
    else ch = ums.shared.channel(size) end
    local w
    local t0 = now()
    if kind == "cross" then
      w = on2(sender, ch, n)
    else
      w = ums.spawn(sender, ch, n)
    end
    local sum = 0
    for _ = 1, n do sum = sum + ch:recv() end
    local dt = now() - t0
    assert(select(2, w:join()) == n and sum == n * (n + 1) // 2)
    return n / dt
  end)
end

local function submit_join()
  ums.config { schedulers = 2, quantum = 0.004 }
  return ums.run(function()
    local function empty() return true end
    local t0 = now()
    for _ = 1, ROUND_TRIPS do assert(ums.submit(empty):join()) end
    return (now() - t0) / ROUND_TRIPS
  end)
end

local load_start = loadavg()
io.stderr:write(fmt("bench_cores: load %s; %d repetitions\n", load_start,
  opt.reps))

local samples = { floor = {}, floor_2proc = {}, speedup_floor = {},
                  cpu_1sched = {}, cpu_2sched = {},
                  cpu_2sched_on1 = {}, cpu_2sched_on2 = {},
                  speedup = {}, speedup_on1 = {}, speedup_on2 = {},
                  cpu_util_2sched = {}, cpu_util_on1 = {},
                  cpu_util_on2 = {} }
local spread = {}
local expect
for rep = 1, opt.reps do
  io.stderr:write(fmt("bench_cores: cpu, repetition %d\n", rep))
  local f, total = floor()
  expect = expect or total
  assert(total == expect)
  local f2, total2 = floor_2proc()
  assert(total2 == expect, "floor_2proc: wrong count")
  local t1, n1 = cpu(1)
  local t2, n2, ran2, u2 = cpu(2)
  local t3, n3, ran3, u3 = cpu(2, 1)
  local t4, n4, ran4, u4 = cpu(2, 2)
  assert(n1 == expect and n2 == expect and n3 == expect and n4 == expect,
    "wrong count")
  table.insert(samples.floor, f)
  table.insert(samples.floor_2proc, f2)
  table.insert(samples.speedup_floor, f / f2)
  table.insert(samples.cpu_util_2sched, u2)
  table.insert(samples.cpu_util_on1, u3)
  table.insert(samples.cpu_util_on2, u4)
  table.insert(samples.cpu_1sched, t1)
  table.insert(samples.cpu_2sched, t2)
  table.insert(samples.cpu_2sched_on1, t3)
  table.insert(samples.cpu_2sched_on2, t4)
  table.insert(samples.speedup, t1 / t2)
  table.insert(samples.speedup_on1, t1 / t3)
  table.insert(samples.speedup_on2, t1 / t4)
  spread[#spread + 1] = fmt("%d/%d, %d/%d, %d/%d", ran2[1] or 0, ran2[2] or 0,
    ran3[1] or 0, ran3[2] or 0, ran4[1] or 0, ran4[2] or 0)
end

local chans = {
  { "chan_same_vm", "plain", 0, MSGS },
  { "chan_shared_same", "shared", 0, MSGS },
  { "chan_shared_cross", "cross", 0, MSGS_CROSS },
  { "chan_same_vm_buf64", "plain", 64, MSGS },
  { "chan_shared_same_buf64", "shared", 64, MSGS },
  { "chan_shared_cross_buf64", "cross", 64, MSGS },
}
for _, c in ipairs(chans) do
  io.stderr:write(fmt("bench_cores: %s\n", c[1]))
  local s = {}
  for rep = 1, opt.reps do s[rep] = chan(c[2], c[3], c[4]) end
  samples[c[1]] = s
end
io.stderr:write("bench_cores: submit_join\n")
samples.submit_join = {}
for rep = 1, opt.reps do samples.submit_join[rep] = submit_join() end
local load_end = loadavg()

local m = {}
for k, v in pairs(samples) do m[k] = median(v) end
local function range(k)
  local lo, hi = math.huge, -math.huge
  for _, v in ipairs(samples[k]) do
    lo, hi = math.min(lo, v), math.max(hi, v)
  end
  return lo, hi
end

if opt.json then
  local parts = {}
  for k, v in pairs(m) do
    local lo, hi = range(k)
    parts[#parts + 1] = fmt('"%s": {"median": %.6g, "min": %.6g, "max": %.6g}',
      k, v, lo, hi)
  end
  table.sort(parts)
  print("{" .. table.concat(parts, ", ") .. fmt(', "reps": %d, '
    .. '"load_start": "%s", "load_end": "%s"}', opt.reps, load_start,
    load_end))
  return
end

print(fmt("%-26s %-52s %12s %22s", "figure", "what", "median",
  "range"))
local function line(k, what, unit, scale)
  local lo, hi = range(k)
  print(fmt("%-26s %-52s %10.3f %-2s %9.3f - %-9.3f", k, what, m[k] * scale,
    unit, lo * scale, hi * scale))
end
line("floor", "64 prime counts in a plain Lua loop", "s", 1)
line("floor_2proc", "the same in two plain lua5.4 processes", "s", 1)
line("speedup_floor", "plain Lua, 1 -> 2 processes", "x", 1)
line("cpu_1sched", "64 requests, 1 scheduler", "s", 1)
line("cpu_2sched", "64 requests, 2 schedulers, ums.submit", "s", 1)
line("cpu_2sched_on1", "64 requests, 2 schedulers, all submit_on(1)", "s", 1)
line("cpu_2sched_on2", "64 requests, 2 schedulers, all submit_on(2)", "s", 1)
line("speedup", "1 -> 2 schedulers, ums.submit (target >= 1.8)", "x", 1)
line("speedup_on1", "1 -> 2 schedulers, all on 1 (target >= 1.8)", "x", 1)
line("speedup_on2", "1 -> 2 schedulers, all on 2 (target >= 1.8)", "x", 1)
line("cpu_util_2sched", "CPU time / wall, 2 schedulers, ums.submit", "", 1)
line("cpu_util_on1", "CPU time / wall, 2 schedulers, all on 1", "", 1)
line("cpu_util_on2", "CPU time / wall, 2 schedulers, all on 2", "", 1)
line("chan_same_vm", "ums.channel, unbuffered, one VM", "k/s", 1e-3)
line("chan_shared_same", "ums.shared.channel, unbuffered, one VM", "k/s",
  1e-3)
line("chan_shared_cross", "ums.shared.channel, unbuffered, across VMs",
  "k/s", 1e-3)
line("chan_same_vm_buf64", "ums.channel(64), one VM", "k/s", 1e-3)
line("chan_shared_same_buf64", "ums.shared.channel(64), one VM", "k/s", 1e-3)
line("chan_shared_cross_buf64", "ums.shared.channel(64), across VMs", "k/s",
  1e-3)
line("submit_join", "submit + join of an empty function, one at a time",
  "us", 1e6)
print(fmt("requests run on scheduler 1/2 (submit, on1, on2) per repetition: "
  .. "%s", table.concat(spread, "; ")))
print(fmt("the floor / 1 scheduler: %.2f (ums's cost on one core)",
  m.floor / m.cpu_1sched))
print(fmt("ums speedup / two-process speedup: %.2f (submit), %.2f (all on "
  .. "1), %.2f (all on 2)", m.speedup / m.speedup_floor,
  m.speedup_on1 / m.speedup_floor, m.speedup_on2 / m.speedup_floor))
print(fmt("load average at the start: %s; at the end: %s; %d repetitions, "
  .. "medians of wall time", load_start, load_end, opt.reps))
