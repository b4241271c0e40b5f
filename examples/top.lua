-- top.lua: a live view of a ums run, like top(1): the schedulers and the
-- hidden pools (ums.stats), the busiest tasks (ums.tasks) and the top waits
-- (ums.waits), refreshed while a demo workload runs. Plain ANSI, nothing
-- to install.
--
--   lua5.4 examples/top.lua              live view for 10 s in a terminal;
--                                        one table when stdout is not one
--   lua5.4 examples/top.lua --once       run the workload 1 s, print once
--   lua5.4 examples/top.lua --seconds 30 --interval 0.5
--
-- The demo workload: CPU-bound tasks (each calls ums.yield() between two
-- computations, the cooperative recipe, so that the others get turns),
-- a channel ping-pong, tasks fighting over a mutex, sleepers, blocking C
-- calls sent to the C-call pool (ums.ffi), file reads (ums.fs) and a
-- spawner of short-lived tasks.
local ums = require "ums"

local opt = { once = false, seconds = nil, interval = 0.5, live = nil }
do
  local i = 1
  while arg and i <= #arg do
    local a = arg[i]
    if a == "--once" then opt.once = true
    elseif a == "--live" then opt.live = true
    elseif a == "--seconds" or a == "--interval" then
      local v = tonumber(arg[i + 1])
      if not v or v <= 0 then
        io.stderr:write("top.lua: ", a, " needs a positive number\n")
        os.exit(2)
      end
      opt[a:sub(3)] = v
      i = i + 1
    elseif a == "-h" or a == "--help" then
      print("usage: lua5.4 examples/top.lua [--once] [--live] "
        .. "[--seconds S] [--interval S]")
      os.exit(0)
    else
      io.stderr:write("top.lua: unknown option ", a, "\n")
      os.exit(2)
    end
    i = i + 1
  end
end

-- A live view only on a terminal (isatty through ums.ffi, called directly
-- outside a run); a pipe or a file gets the one-shot table.
if opt.live == nil and not opt.once then
  local ok, tty = pcall(function()
    ums.ffi.cdef "int isatty(int fd);"
    return ums.ffi.C.isatty(1) == 1
  end)
  opt.live = ok and tty and os.getenv("TERM") ~= "dumb"
end
if opt.once or not opt.live then
  opt.live, opt.once = false, true
  opt.seconds = opt.seconds or 1
end
opt.seconds = opt.seconds or 10

local fmt = string.format

-- ---------------------------------------------------------------------
-- The workload
-- ---------------------------------------------------------------------

local stop = false

local function fib(n) if n < 2 then return n end return fib(n - 1) + fib(n - 2) end

local function workload()
  local tasks = {}
  local function add(name, fn)
    local t = ums.spawn(fn)
    t:name(name)
    tasks[#tasks + 1] = t
  end
  for i = 1, 2 do
    add("cruncher-" .. i, function()
      while not stop do
        fib(22)
        ums.yield()
      end
    end)
  end
  local ping, pong = ums.channel(), ums.channel()
  add("ping", function()
    while not stop do
      ping:send("ping")
      pong:recv()
      ums.sleep(0.0005)
    end
    ping:close()
  end)
  add("pong", function()
    while true do
      local v = ping:recv()
      if v == nil then break end
      pong:send("pong")
    end
  end)
  local m = ums.mutex()
  for i = 1, 3 do
    add("locker-" .. i, function()
      while not stop do
        m:lock()
        ums.sleep(0.002)          -- holds the mutex while it sleeps
        m:unlock()
        ums.yield()
      end
    end)
  end
  add("sleeper", function()
    while not stop do ums.sleep(0.05) end
  end)
  ums.ffi.cdef "int usleep(unsigned int usec);"
  add("c-caller", function()
    while not stop do ums.ffi.C.usleep(3000) end   -- on the C-call pool
  end)
  local me = debug.getinfo(1, "S").source:match("^@(.*)$")
  add("reader", function()
    while not stop do
      if me then ums.fs.readfile(me) end
      ums.sleep(0.01)
    end
  end)
  local ev = ums.event()
  add("waiter", function()
    while not stop do ev:wait(0.1) end
  end)
  add("spawner", function()
    while not stop do
      local kids = {}
      for i = 1, 10 do
        kids[i] = ums.spawn(function() ums.sleep(0.001 * i) end)
      end
      for _, k in ipairs(kids) do k:join() end
      ev:set()
    end
  end)
  return tasks
end

-- ---------------------------------------------------------------------
-- The view
-- ---------------------------------------------------------------------

local function secs(v)
  if v == nil then return "-" end
  if v >= 100 then return fmt("%.0fs", v) end
  if v >= 1 then return fmt("%.2fs", v) end
  if v >= 0.001 then return fmt("%.1fms", v * 1e3) end
  return fmt("%.0fus", v * 1e6)
end

local function count(v)
  if v == nil then return "-" end
  if v >= 1e7 then return fmt("%.0fM", v / 1e6) end
  if v >= 1e4 then return fmt("%.0fk", v / 1e3) end
  return fmt("%d", math.floor(v + 0.5))
end

local function rate(now, before, key, dt)
  if not before or dt <= 0 or now[key] == nil or before[key] == nil then
    return "-"
  end
  return count((now[key] - before[key]) / dt)
end

local prev, prev_at = nil, nil

local function render(started)
  local out = {}
  local function line(...) out[#out + 1] = fmt(...) end
  local now = ums.now()
  local stats, tasks, waits = ums.stats(), ums.tasks(), ums.waits()
  local dt = prev_at and now - prev_at or 0

  local nsched = 0
  for _, r in ipairs(stats) do if not r.hidden then nsched = nsched + 1 end end
  line("ums top: %.1f s, %d tasks, %d scheduler%s, %d hidden pools%s",
    now - started, #tasks, nsched, nsched == 1 and "" or "s",
    #stats - nsched, dt > 0 and fmt(" (rates per s over %.1f s)", dt) or "")
  line("")
  line("%-12s %4s %5s %5s %9s %5s %4s %5s %8s %8s %6s %7s %5s %5s %4s  %s",
    "SCHEDULER", "IDLE", "TASKS", "RUNQ", "WORKERS", "PEND", "IO", "TIMER",
    "SWITCH/s", "YIELD/s", "IDLE/s", "PREEMPT", "QEXP", "STALL", "LOAD",
    "RUNNING")
  local by_id = {}
  if prev then for _, r in ipairs(prev) do by_id[r.id] = r end end
  for _, r in ipairs(stats) do
    local p = by_id[r.id]
    if r.hidden then
      line("%-12s %4s %5s %5s %9s %5s   threads %d, completed %s (%s/s)",
        "  " .. r.name, r.idle and "yes" or "", "", "",
        fmt("%d/%d", r.workers_active, r.workers_idle), count(r.pending),
        r.threads, count(r.completed), rate(r, p, "completed", dt))
    else
      local running = r.running and fmt("%d %s", r.running,
        r.running_name or "") or ""
      line("%-12s %4s %5d %5d %9s %5d %4d %5d %8s %8s %6s %7s %5s %5d %4d  %s",
        "  " .. r.id, r.idle and "yes" or "", r.tasks, r.runnable,
        fmt("%d/%d", r.workers_active, r.workers_idle), r.pending,
        r.io_pending, r.timers, rate(r, p, "context_switches", dt),
        rate(r, p, "yields", dt), rate(r, p, "idle_switches", dt),
        count(r.preemptive_switches), count(r.quantum_expiries), r.stalls,
        r.load_factor, running)
    end
  end
  prev, prev_at = stats, now

  line("")
  line("%-12s %-14s %5s %-9s %8s  %-14s %8s  %s", "TASK", "NAME", "SCHED",
    "STATE", "CPU", "WAITING ON", "WAITED", "OBJECT / BLOCKER")
  table.sort(tasks, function(a, b)
    local ca, cb = a.cpu_time or 0, b.cpu_time or 0
    if ca ~= cb then return ca > cb end
    return (a.wait_time or 0) > (b.wait_time or 0)
  end)
  for i = 1, math.min(#tasks, 12) do
    local t = tasks[i]
    local obj = t.wait_object or ""
    if t.blocker then obj = obj .. " held by " .. t.blocker end
    line("%-12d %-14s %5d %-9s %8s  %-14s %8s  %s", t.id,
      (t.name ~= "" and t.name or "-"):sub(1, 14), t.scheduler, t.state,
      secs(t.cpu_time), t.wait_type or "", t.wait_type and
      secs(t.wait_time) or "", obj)
  end
  if #tasks > 12 then line("  ... %d more", #tasks - 12) end

  line("")
  line("%-15s %8s %9s %9s %9s %8s", "WAIT TYPE", "COUNT", "TOTAL", "AVERAGE",
    "MAX", "SIGNAL")
  for i = 1, math.min(#waits, 10) do
    local w = waits[i]
    line("%-15s %8s %9s %9s %9s %7.1f%%", w.type, count(w.count),
      secs(w.total), secs(w.average), secs(w.max),
      w.total > 0 and 100 * w.signal / w.total or 0)
  end
  return table.concat(out, "\n")
end

-- ---------------------------------------------------------------------
-- Main
-- ---------------------------------------------------------------------

ums.run(function()
  ums.self():name("top")
  local started = ums.now()
  local work = workload()
  if opt.live then
    io.write("\27[?25l")                         -- hide the cursor
    local frames = math.max(1, math.floor(opt.seconds / opt.interval))
    for _ = 1, frames do
      ums.sleep(opt.interval)
      io.write("\27[H\27[2J", render(started), "\n")
      io.flush()
    end
    io.write("\27[?25h")
  else
    -- One look to have rates over the last part, then the table.
    ums.sleep(math.max(opt.seconds - 0.2, 0.05))
    render(started)
    ums.sleep(0.2)
    print(render(started))
  end
  stop = true
  for _, t in ipairs(work) do
    local ok, err = t:join(5)
    if not ok and err ~= "timeout" then error(err) end
    if ok == nil then t:cancel(); t:join() end
  end
  print("top done")
end)
