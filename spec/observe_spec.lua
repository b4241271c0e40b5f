-- Observability (docs/observability.md): ums.stats(), ums.tasks(), task:info(),
-- ums.waits(), ums.waits_reset(), ums.on_stall() and the stall_threshold
-- and stats settings. Each figure is checked to move as it should under a
-- workload that exercises it. Time bounds are generous (noisy 2-vCPU VMs,
-- sanitizer builds): a lower bound a wait cannot beat, an upper bound
-- only a hang would break. The stall report's delay (within twice the
-- threshold) is the one timing the issue asks for; its threshold (0.4 s,
-- 1 s under TSan, which slows everything down several times) leaves room
-- for a crowded machine.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")

local DEFAULTS = {
  schedulers = 1, max_workers = 0, quantum = 0.004, stack_size = 1024 * 1024,
  worker_idle_timeout = 10, idle_workers_kept = 16, io = "auto",
  io_threads = 0, preempt_threads = 0, stats = true, stall_threshold = 1,
  clock = "real", init = false,
}

local STALL_THRESHOLD = os.getenv("UMS_TSAN") and 1.0 or 0.4

local function restore()
  ums.config(DEFAULTS)
  ums.on_stall(nil)
end

local function run(body, limit)
  return ums.test(body, limit or 20)
end

local function row_of(id)
  for _, r in ipairs(ums.stats()) do
    if r.id == id then return r end
  end
end

local function pool_row(name)
  for _, r in ipairs(ums.stats()) do
    if r.hidden and r.name == name then return r end
  end
end

local function task_row(t)
  local id = t:id()
  for _, r in ipairs(ums.tasks()) do
    if r.id == id then return r end
  end
end

local function wait_row(type_)
  for _, r in ipairs(ums.waits()) do
    if r.type == type_ then return r end
  end
  return { type = type_, count = 0, total = 0, max = 0, signal = 0 }
end

-- Spins (no wait, no yield) until `seconds` of process CPU time went by:
-- wall time says little on a crowded machine.
local function spin_cpu(seconds)
  local c0 = os.clock()
  local x = 0
  while os.clock() - c0 < seconds do x = x + 1 end
  return x
end

describe("ums.stats", function()
  after_each(restore)

  it("has a row per scheduler and per hidden pool", function()
    ums.config { schedulers = 2 }
    run(function()
      local rows = ums.stats()
      assert.equal(4, #rows)
      for i = 1, 2 do
        assert.equal(i - 1, rows[i].id)
        assert.is_false(rows[i].hidden)
        for _, k in ipairs { "tasks", "runnable", "workers_active",
            "workers_idle", "pending", "io_pending", "timers",
            "context_switches", "yields", "idle_switches",
            "preemptive_switches", "preemptive_spun", "quantum_expiries",
            "stalls", "load_factor" } do
          assert.is_number(rows[i][k], k)
        end
      end
      assert.is_true(rows[3].hidden)
      assert.equal("preemptive", rows[3].name)
      assert.is_true(rows[4].hidden)
      assert.equal("io", rows[4].name)
      for i = 3, 4 do
        for _, k in ipairs { "pending", "threads", "workers_active",
            "workers_idle", "completed" } do
          assert.is_number(rows[i][k], k)
        end
      end
      -- The caller runs on scheduler 0: it is the running task.
      local me = ums.self()
      me:name("the-caller")
      local r = rows[1]
      r = row_of(0)
      assert.is_false(r.idle)
      assert.equal(me:id(), r.running)
      assert.equal("the-caller", r.running_name)
      assert.equal(r.tasks, r.load_factor)
    end)
  end)

  it("counts switches, yields and idle waits", function()
    run(function()
      local before = row_of(0)
      local function yielder() for _ = 1, 100 do ums.yield() end end
      local a, b = ums.spawn(yielder), ums.spawn(yielder)
      a:join()
      b:join()
      ums.sleep(0.02)                  -- nothing else to run: idle
      local after = row_of(0)
      assert.is_true(after.yields - before.yields >= 200)
      assert.is_true(after.context_switches - before.context_switches >= 200)
      assert.is_true(after.idle_switches - before.idle_switches >= 1)
      assert.is_true(after.tasks_spawned - before.tasks_spawned >= 2)
    end)
  end)

  it("counts quantum expiries of a task that computes (preempt = true)",
     function()
    ums.config { quantum = 0.004, preempt = true }
    finally(function() ums.config { preempt = false } end)
    run(function()
      local before = row_of(0).quantum_expiries
      local hog = ums.spawn(function() spin_cpu(0.1) end)
      local other = ums.spawn(function() for _ = 1, 50 do ums.yield() end end)
      hog:join()
      other:join()
      assert.is_true(row_of(0).quantum_expiries - before >= 3)
    end)
  end)

  it("counts preemptive calls and the C-call pool's work", function()
    run(function()
      ums.ffi.cdef "int usleep(unsigned int usec);"
      local s0 = row_of(0).preemptive_switches
      local p0 = pool_row("preemptive").completed
      for _ = 1, 5 do ums.ffi.C.usleep(1000) end
      assert.equal(s0 + 5, row_of(0).preemptive_switches)
      -- A pool thread counts its work done after it has woken the task,
      -- which may look first.
      for _ = 1, 1000 do
        if pool_row("preemptive").completed == p0 + 5 then break end
        ums.sleep(0.001)
      end
      assert.equal(p0 + 5, pool_row("preemptive").completed)
      assert.is_true(pool_row("preemptive").threads >= 1)
    end)
  end)

  it("shows work waiting beyond max_workers as pending", function()
    ums.config { max_workers = 2 }
    ums.run(function()
      -- This task and a sleeper take both workers; the third waits.
      local s = ums.spawn(function() ums.sleep(0.1) end)
      local p = ums.spawn(function() end)
      ums.sleep(0.01)
      assert.equal(1, row_of(0).pending)
      assert.equal("pending", task_row(p).state)
      assert.equal("pending_worker", task_row(p).wait_type)
      s:join()
      p:join()
      assert.equal(0, row_of(0).pending)
      assert.is_true(wait_row("pending_worker").count >= 1)
    end)
  end)

  it("returns nil and a message outside a run", function()
    for _, f in ipairs { "stats", "tasks", "waits", "waits_reset" } do
      local v, msg = ums[f]()
      assert.is_nil(v)
      assert.matches("not inside a run", msg)
    end
  end)
end)

describe("ums.tasks and task:info", function()
  after_each(restore)

  it("show a sleeping task with its wait, name and spawner", function()
    run(function()
      local t = ums.spawn(function() ums.sleep(0.3) end)
      t:name("napper")
      ums.sleep(0.1)
      local r = task_row(t)
      assert.equal("napper", r.name)
      assert.equal("suspended", r.state)
      assert.equal("sleep", r.wait_type)
      assert.is_true(r.wait_time >= 0.09 and r.wait_time < 5, r.wait_time)
      assert.equal(ums.self():id(), r.spawner)
      assert.equal(0, r.scheduler)
      assert.is_nil(r.wait_object)
      local i = t:info()
      assert.equal("napper", i.name)
      assert.equal("sleep", i.wait_type)
      assert.matches("in function 'ums[%w.]*sleep'", i.traceback)
      t:join()
    end)
  end)

  it("show a task blocked on a mutex, the mutex and its holder", function()
    run(function()
      local m = ums.mutex()
      local holder = ums.spawn(function()
        m:lock()
        ums.sleep(0.3)
        m:unlock()
      end)
      holder:name("holder")
      ums.sleep(0.01)
      local waiter = ums.spawn(function() m:lock(); m:unlock() end)
      waiter:name("waiter")
      ums.sleep(0.05)
      local r = task_row(waiter)
      assert.equal("suspended", r.state)
      assert.equal("mutex", r.wait_type)
      assert.equal(tostring(m), r.wait_object)
      assert.equal(holder:id(), r.blocker)
      local i = waiter:info()
      assert.equal(holder:id(), i.blocker)
      assert.matches("in method 'lock'", i.traceback, 1, true)
      holder:join()
      waiter:join()
      local w = wait_row("mutex")
      assert.equal(1, w.count)
      assert.is_true(w.total >= 0.2, w.total)
    end)
  end)

  it("show the holder of a shared mutex as its waiter's blocker", function()
    run(function()
      local m = ums.shared.mutex()
      local holder = ums.spawn(function()
        m:lock()
        ums.sleep(0.3)
        m:unlock()
      end)
      ums.sleep(0.01)
      local waiter = ums.spawn(function() m:lock(); m:unlock() end)
      ums.sleep(0.05)
      local r = task_row(waiter)
      assert.equal("suspended", r.state)
      assert.equal("mutex", r.wait_type)
      assert.equal(holder:id(), r.blocker)
      holder:join()
      assert(waiter:join())
    end)
  end)

  it("show a shared wait group's waiter as a waitgroup wait", function()
    run(function()
      local g = ums.shared.waitgroup()
      g:add(1)
      local w = ums.spawn(function() return g:wait() end)
      ums.sleep(0.02)
      assert.equal("waitgroup", task_row(w).wait_type)
      g:done()
      assert(w:join())
    end)
  end)

  it("show channel, join and semaphore waits with their objects", function()
    run(function()
      local ch = ums.channel()
      local sem = ums.semaphore(0)
      local r1 = ums.spawn(function() return ch:recv() end)
      local s1 = ums.spawn(function() return sem:acquire() end)
      local j = ums.spawn(function() return r1:join() end)
      ums.sleep(0.02)
      assert.equal("channel_recv", task_row(r1).wait_type)
      assert.equal(tostring(ch), task_row(r1).wait_object)
      assert.equal("semaphore", task_row(s1).wait_type)
      assert.equal(tostring(sem), task_row(s1).wait_object)
      assert.equal("join", task_row(j).wait_type)
      assert.equal(r1:id(), task_row(j).blocker)
      ch:send(1)
      sem:release()
      j:join()
      s1:join()
    end)
  end)

  it("tell running, runnable, suspended and pending apart", function()
    -- No quantum: its expiry could let the pending task start and end
    -- before it is looked at (a slow TSan build).
    ums.config { quantum = 0 }
    run(function()
      local me = ums.self()
      local y = ums.spawn(function() while true do ums.yield() end end)
      local s = ums.spawn(function() ums.sleep(10) end)
      ums.yield()                       -- y and s ran once
      local p = ums.spawn(function() end)  -- not started yet
      assert.equal("running", task_row(me).state)
      assert.equal("running", me:info().state)
      assert.equal("runnable", task_row(y).state)
      assert.equal("suspended", task_row(s).state)
      assert.equal("pending", task_row(p).state)
      y:cancel()
      s:cancel()
      y:join()
      s:join()
      p:join()
      -- Finished: what the handle knows.
      assert.equal("done", p:info().state)
      assert.equal("cancelled", y:info().state)
      local e = ums.spawn(function() error("boom") end)
      e:join()
      assert.equal("error", e:info().state)
    end)
  end)

  it("credit CPU time to the task that uses it", function()
    -- The main task looks while the hog computes: preemption lets it.
    ums.config { preempt = true }
    finally(function() ums.config { preempt = false } end)
    run(function()
      local hog = ums.spawn(function() spin_cpu(0.3) end)
      local sleeper = ums.spawn(function() ums.sleep(0.3) end)
      local seen = 0
      while hog:status() ~= "done" do
        local r = task_row(hog)
        if r then seen = math.max(seen, r.cpu_time) end
        ums.sleep(0.01)
      end
      sleeper:join()
      assert.is_true(seen >= 0.1, seen)
      assert.is_true(seen <= 2, seen)
    end)
  end)

  it("names set with task:name() reach the runtime", function()
    run(function()
      local t = ums.spawn(function() ums.sleep(1) end)
      t:name("first")
      assert.equal("first", task_row(t).name)
      t:name("second")
      assert.equal("second", task_row(t).name)
      t:cancel()
      t:join()
    end)
  end)
end)

describe("ums.waits", function()
  after_each(restore)

  it("time a sleep about right", function()
    run(function()
      ums.waits_reset()
      ums.sleep(0.1)
      local w = wait_row("sleep")
      -- ums.test's watchdog sleeps too, but does not wake up yet.
      assert.equal(1, w.count)
      assert.is_true(w.total >= 0.095 and w.total < 3, w.total)
      assert.equal(w.total, w.max)
      assert.is_true(w.signal >= 0 and w.signal <= w.total)
      assert.is_true(math.abs(w.resource + w.signal - w.total) < 1e-9)
    end)
  end)

  it("count every kind of wait under its name", function()
    run(function()
      ums.waits_reset()
      local ev, sem, wg = ums.event(), ums.semaphore(0), ums.waitgroup()
      local m, cond, ch = ums.mutex(), ums.cond(), ums.channel()
      local ready = false
      wg:add(1)
      local ts = {
        ums.spawn(function() ev:wait() end),
        ums.spawn(function() sem:acquire() end),
        ums.spawn(function() wg:wait() end),
        ums.spawn(function()
          m:lock()
          while not ready do cond:wait(m) end
          m:unlock()
        end),
        ums.spawn(function() ch:send(1) end),
        ums.spawn(function() ums.select { { ums.channel(), "recv" } ,
                                          { ums.channel(), "recv" } } end),
      }
      ums.sleep(0.02)
      ev:set()
      sem:release()
      wg:done()
      m:lock(); ready = true; cond:signal(); m:unlock()
      ch:recv()
      ts[6]:cancel()
      for i = 1, 5 do assert(ts[i]:join()) end
      ts[6]:join()
      ums.ffi.cdef "int usleep(unsigned int usec);"
      -- With another task runnable the call parks (a lone call may be
      -- waited for by spinning at the call site, which is no wait).
      local other = ums.spawn(function() ums.yield() end)
      ums.ffi.C.usleep(1000)
      assert(other:join())
      local path = os.tmpname()
      ums.fs.writefile(path, "x")
      os.remove(path)
      for _, ty in ipairs { "event", "semaphore", "waitgroup", "cond",
                            "channel_send", "select", "join", "sleep",
                            "preemptive", "file_io" } do
        assert.is_true(wait_row(ty).count >= 1, ty)
      end
    end)
  end)

  it("show a wake-up that waited for a busy scheduler as signal wait",
     function()
    ums.config { quantum = 0 }
    run(function()
      ums.waits_reset()
      local ev = ums.event()
      local w = ums.spawn(function() ev:wait() end)
      ums.sleep(0.01)
      ev:set()             -- w is runnable from here on...
      spin_cpu(0.2)        -- ...but this task keeps the scheduler
      w:join()
      local r = wait_row("event")
      assert.equal(1, r.count)
      assert.is_true(r.signal >= 0.1, r.signal)
      assert.is_true(r.signal <= r.total)
    end)
  end)

  it("do not time yields", function()
    run(function()
      ums.waits_reset()
      local function y() for _ = 1, 200 do ums.yield() end end
      local a, b = ums.spawn(y), ums.spawn(y)
      a:join()
      b:join()
      for _, r in ipairs(ums.waits()) do
        assert.equal("join", r.type)
      end
    end)
  end)

  it("start afresh after waits_reset", function()
    run(function()
      ums.sleep(0.01)
      assert.is_true(wait_row("sleep").count >= 1)
      assert.is_true(ums.waits_reset())
      assert.equal(0, #ums.waits())
      ums.sleep(0.01)
      assert.equal(1, wait_row("sleep").count)
    end)
  end)

  it("are not timed with stats = false", function()
    ums.config { stats = false }
    run(function()
      local t = ums.spawn(function() ums.sleep(0.2) end)
      ums.sleep(0.05)
      local r = task_row(t)
      assert.equal("sleep", r.wait_type)
      assert.is_nil(r.wait_time)
      assert.is_nil(r.cpu_time)
      t:join()
      assert.equal(0, #ums.waits())
    end)
  end)

  it("are timed to the nanosecond with stats = \"precise\"", function()
    ums.config { stats = "precise" }
    assert.equal("precise", ums.config().stats)
    run(function()
      -- Channel waits far shorter than the default wait clock's 1 ms tick
      -- are timed one by one.
      local ch = ums.channel()
      local p = ums.spawn(function()
        for i = 1, 200 do ch:send(i) end
      end)
      for _ = 1, 200 do ch:recv() end
      p:join()
      local r, s = wait_row("channel_recv"), wait_row("channel_send")
      local n = (r and r.count or 0) + (s and s.count or 0)
      local total = (r and r.total or 0) + (s and s.total or 0)
      assert.is_true(n > 0)
      assert.is_true(total > 0 and total / n < 0.001, total / n)
      ums.sleep(0.03)
      assert.is_true(wait_row("sleep").max >= 0.029)
    end)
  end)

  it("refuses a stats setting that is neither a boolean nor \"precise\"",
     function()
    local ok, err = pcall(ums.config, { stats = "fast" })
    assert.is_false(ok)
    assert.matches('stats', err)
    assert.matches('"precise"', err, 1, true)
  end)

  it("are timed on the virtual clock of a virtual-clock run", function()
    ums.test(function()
      local t0 = ums.now()
      ums.sleep(10)                     -- 10 virtual seconds, no real ones
      assert.equal(10, ums.now() - t0)
      local w = wait_row("sleep")
      assert.is_true(w.count >= 1)
      assert.is_true(w.max >= 10 and w.max < 10.5, w.max)
    end, { clock = "virtual" })
  end)

  it("can be described by the park API for primitives of one's own",
     function()
    run(function()
      local core = require "ums.core"
      local obj = {}
      local me = ums.self()
      local t = ums.spawn(function()
        local seq = core.park_begin(nil, false, core.WAIT.event, obj, me)
        return seq, core.park_wait()
      end)
      ums.sleep(0.01)
      local r = task_row(t)
      assert.equal("event", r.wait_type)
      assert.equal(me:id(), r.blocker)
      assert.matches(("%p"):format(obj):sub(3), r.wait_object, 1, true)
      assert.is_true(core.unpark(t, 1))
      assert(t:join())
      assert.has_error(function() core.park_begin(nil, false, 99) end)
    end)
  end)
end)

describe("the scheduler monitor", function()
  after_each(restore)

  it("reports a stalled scheduler once, in time, with the task's name "
     .. "and traceback", function()
    ums.config { quantum = 0, stall_threshold = STALL_THRESHOLD }
    local reports = {}
    ums.on_stall(function(info)
      info.at = ums.now()
      reports[#reports + 1] = info
    end)
    local hog, began
    ums.run(function()
      local function crunch()
        began = ums.now()
        spin_cpu(3 * STALL_THRESHOLD)
      end
      hog = ums.spawn(crunch)
      hog:name("cruncher")
      hog:join()
      assert.equal(1, row_of(0).stalls)
    end)
    assert.equal(1, #reports)
    local r = reports[1]
    assert.equal("cruncher", r.name)
    assert.equal(hog:id(), r.id)
    assert.equal(hog, r.task)
    assert.equal(0, r.scheduler)
    assert.is_true(r.duration >= STALL_THRESHOLD, r.duration)
    assert.matches("in upvalue 'spin_cpu'", r.traceback, 1, true)
    local delay = r.at - began
    assert.is_true(delay >= STALL_THRESHOLD - 0.01
                   and delay <= 2 * STALL_THRESHOLD,
      ("reported %.3f s after the stall began (threshold %.1f s)"):format(
        delay, STALL_THRESHOLD))
  end)

  it("reports a task blocked in a C call when it is back in Lua", function()
    -- No quantum: its signal would end the sleep early (EINTR), and the
    -- hook it leaves would make the task yield right after. The stall
    -- report's own signal may end it early too; the loop sleeps on.
    ums.config { quantum = 0, stall_threshold = 0.2 }
    local reports = {}
    ums.on_stall(function(info) reports[#reports + 1] = info end)
    ums.run(function()
      ums.ffi.cdef [[UMS_INLINE int blocking_usleep(unsigned int usec)
                       __asm__("usleep");]]
      local t = ums.spawn(function()
        local t0 = ums.now()
        repeat                          -- blocks the scheduler's thread
          ums.ffi.C.blocking_usleep(600000)
        until ums.now() - t0 >= 0.6
        -- Some Lua after the call, for TSan builds, whose hook looks for
        -- the report every 1000 instructions (elsewhere it fires at once).
        local x = 0
        for i = 1, 10000 do x = x + i end
        return x > 0
      end)
      t:name("blocker")
      assert(t:join())
      assert.equal(1, row_of(0).stalls)
    end)
    assert.equal(1, #reports)
    assert.equal("blocker", reports[1].name)
    assert.is_string(reports[1].traceback)
  end)

  it("does not report a scheduler that is idle or busy with tasks that "
     .. "yield", function()
    ums.config { stall_threshold = 0.3 }
    local n = 0
    ums.on_stall(function() n = n + 1 end)
    ums.run(function()
      ums.sleep(1)                      -- idle
      -- Busy for a second: computing in slices of 1 ms, yielding between
      -- them, and sleeping.
      local stop = false
      local y = ums.spawn(function()
        while not stop do spin_cpu(0.001); ums.yield() end
      end)
      local s = ums.spawn(function()
        while not stop do ums.sleep(0.001) end
      end)
      ums.sleep(1)
      stop = true
      y:join()
      s:join()
      assert.equal(0, row_of(0).stalls)
    end)
    assert.equal(0, n)
  end)

  it("reports a stall on another VM's scheduler there", function()
    ums.config { schedulers = 2, quantum = 0, stall_threshold = 0.3 }
    local n = 0
    ums.on_stall(function() n = n + 1 end)  -- this VM's handler only
    ums.run(function()
      -- Scheduler 0 stays busy (yielding), so it does not steal the work.
      -- (A bounded number of yields: see the "busy with tasks that yield"
      -- case above.)
      local stop = false
      local busy = ums.spawn(function()
        while not stop do spin_cpu(0.001); ums.yield() end
      end)
      -- Scheduler 1's VM is set up first: a set-up that outlasts the
      -- threshold (a loaded machine, a sanitizer build) is a stall of its
      -- own, and not the one this test is about. It is reported once the
      -- scheduler is back in Lua, so the first work runs some Lua (TSan
      -- builds look for the report every 1000 instructions).
      assert(ums.submit_on(1, function()
        local x = 0
        for i = 1, 10000 do x = x + i end
        return x > 0
      end):join(30))
      local before = row_of(1).stalls
      local w = ums.submit_on(1, function()
        require("ums").self():name("far-cruncher")
        local c0 = os.clock()
        while os.clock() - c0 < 1 do end
        return true
      end)
      assert(w:join(30))
      stop = true
      busy:join()
      assert.equal(0, row_of(0).stalls)
      assert.equal(before + 1, row_of(1).stalls)
    end)
    -- Reported in the far VM, which has no handler: the default line.
    assert.equal(0, n)
  end)

  it("calls the handler of the stalled VM, set by its init module",
     function()
    ums.config { schedulers = 2, quantum = 0, stall_threshold = 0.3,
                 init = "observe_init" }
    local n = 0
    ums.on_stall(function() n = n + 1 end)
    ums.run(function()
      local stop = false
      local busy = ums.spawn(function()
        while not stop do spin_cpu(0.001); ums.yield() end
      end)
      local ok, seen = ums.submit_on(1, function()
        local u = require("ums")
        u.self():name("far-cruncher")
        -- 1.5 s of wall time, five thresholds: the report must come while
        -- this still runs (os.clock, the process's CPU time, ran out after
        -- ~0.5 s with the other scheduler busy too, and a loaded machine
        -- could delay the monitor past that).
        local t0 = u.now()
        while u.now() - t0 < 1.5 do end
        return _G.last_stall
      end):join(30)
      stop = true
      busy:join()
      assert.is_true(ok)
      assert.equal("far-cruncher", seen.name)
      assert.equal(1, seen.scheduler)
      assert.is_string(seen.traceback)
    end)
    assert.equal(0, n)
  end)

  it("is off with stall_threshold = 0", function()
    ums.config { quantum = 0, stall_threshold = 0 }
    local n = 0
    ums.on_stall(function() n = n + 1 end)
    ums.run(function() spin_cpu(0.3) end)
    assert.equal(0, n)
  end)
end)

describe("the readers", function()
  after_each(restore)

  it("are safe from any task while others run", function()
    ums.config { schedulers = 2 }
    run(function()
      -- Loops are bounded (N rounds) as well as timed.
      local stop, N = false, 3000
      local ch, m = ums.channel(), ums.mutex()
      ums.ffi.cdef "int usleep(unsigned int usec);"
      local workers = {
        ums.spawn(function()
          for _ = 1, N do if stop then break end ch:send(1) end
          ch:close()
        end),
        ums.spawn(function() while ch:recv() do end end),
        ums.spawn(function()
          while not stop do m:lock(); ums.sleep(0.001); m:unlock() end
        end),
        ums.spawn(function()
          for _ = 1, N do
            if stop then break end
            m:lock(); ums.yield(); m:unlock()
          end
        end),
        ums.spawn(function()
          while not stop do ums.ffi.C.usleep(500) end
        end),
        ums.spawn(function()
          for _ = 1, N // 10 do
            if stop then break end
            local kids = {}
            for i = 1, 5 do kids[i] = ums.spawn(function() end) end
            for _, k in ipairs(kids) do k:join() end
          end
        end),
      }
      local readers, rounds = {}, {0, 0, 0}
      for i = 1, 3 do
        readers[i] = ums.spawn(function()
          local n = 0
          while not stop and n < N do
            rounds[i] = n
            assert(#ums.stats() == 4)
            for _, t in ipairs(ums.tasks()) do assert(t.id and t.state) end
            assert(ums.waits())
            for _, w in ipairs(workers) do assert(w:info().state) end
            if n % 7 == 0 then ums.waits_reset() end
            n = n + 1
            ums.yield()
          end
          return n
        end)
      end
      -- Half a second of it, and a few rounds of every reader however
      -- slowly a loaded machine runs them (the test's timeout is the bound).
      local function short_of_rounds()
        for i, r in ipairs(readers) do
          local st = r:status()
          if rounds[i] < 4 and st ~= "error" and st ~= "done" then
            return true
          end
        end
      end
      ums.sleep(0.5)
      while short_of_rounds() do ums.sleep(0.01) end
      stop = true
      for _, w in ipairs(workers) do assert(w:join()) end
      for _, r in ipairs(readers) do
        local ok, n = r:join()
        assert(ok, n)
        assert.is_true(n > 3, n)
      end
    end)
  end)
end)
