-- Cooperative by default: a task is switched out only inside a ums call
-- that can wait, never between two Lua instructions; preemption there is
-- an opt-in (preempt = true). The user's debug hooks survive everything
-- ums does, and nothing ums does per preemption grows with stack depth.
local ums = require "ums"
local sp = require "subprocess"

local function restore_config()
  ums.config{quantum = 0.004, preempt = false, stall_threshold = 1}
  ums.on_stall(nil)
end

local function spin(seconds)
  local t0 = ums.now()
  local x = 0
  while ums.now() - t0 < seconds do x = x + 1 end
  return x
end

-- Runs fn as a task with a 1 ms quantum and preemption on (the run
-- bounded by `limit` seconds) and returns what it returned, once it
-- returned without an error.
local function in_preempted_task(fn, limit)
  ums.config{quantum = 0.001, preempt = true}
  local res
  ums.test(function() res = table.pack(ums.spawn(fn):join()) end, limit)
  assert.is_true(res[1], res[2])
  return table.unpack(res, 2, res.n)
end

-- Four tasks do read -> compute -> write on a shared table, 50 times
-- each, yielding between updates. The computation lasts a few quanta (of
-- the 1 ms the callers set), so that a preemption has room to fall in it
-- even when the monitor thread is late. Returns the final count (200
-- when no update was lost).
local function lost_updates()
  local t = {n = 0}
  ums.test(function()
    local ws = {}
    for i = 1, 4 do
      ws[i] = ums.spawn(function()
        for _ = 1, 50 do
          local v = t.n
          spin(0.003)
          t.n = v + 1
          ums.yield()
        end
      end)
    end
    for i = 1, 4 do assert(ws[i]:join()) end
  end, 60)
  return t.n
end

describe("cooperative by default", function()
  after_each(restore_config)

  it("keeps every update of read-compute-write tasks", function()
    assert.is_false(ums.config().preempt)
    ums.config{quantum = 0.001}
    assert.equal(200, lost_updates())
  end)

  it("loses some with preempt = true", function()
    ums.config{quantum = 0.001, preempt = true}
    local n
    for _ = 1, 5 do
      n = lost_updates()
      if n < 200 then break end
    end
    assert.is_true(n < 200, "no update lost with preempt = true")
  end)

  -- Each case makes a call that need not wait. A task past its quantum
  -- yields there, so a runnable task runs before the call returns, and
  -- never before it (no switch between two instructions).
  -- The hog tries again (with a fresh call) while the monitor has not
  -- found it past its quantum yet, which a loaded machine may delay.
  local cases = {
    {"ums.yield", function() return function() ums.yield() end end},
    {"channel:send with room", function()
      local ch = ums.channel(10)
      return function() ch:send(1) end
    end},
    {"channel:send where Lua cannot yield (a sort comparator)", function()
      local ch = ums.channel(100)
      return function()
        table.sort({2, 1}, function(a, b)
          ch:send(1)
          return a < b
        end)
      end
    end},
    {"channel:recv with a value", function()
      local ch = ums.channel(10)
      ch:send(1)
      return function() ch:recv() end
    end},
    {"ums.select with a ready case", function()
      local ch = ums.channel(10)
      ch:send(1)
      return function() ums.select({{ch, "recv"}}) end
    end},
    {"mutex:lock of a free mutex", function()
      local m = ums.mutex()
      return function() m:lock() end
    end},
    {"semaphore:acquire with a unit", function()
      local s = ums.semaphore(1)
      return function() s:acquire() end
    end},
    {"event:wait on a set event", function()
      local e = ums.event(true)
      e:set()
      return function() e:wait() end
    end},
    {"task:join of an ended task", function()
      local d = ums.spawn(function() return 1 end)
      d:join()
      return function() d:join() end
    end},
    {"shared channel send with room", function()
      local ch = ums.shared.channel(10)
      return function() ch:send(1) end
    end},
    {"shared mutex lock", function()
      local m = ums.shared.mutex()
      return function() m:lock() end
    end},
    {"group:wait of an ended group", function()
      local g = ums.group()
      g:spawn(function() end)
      g:wait()
      return function() g:wait() end
    end},
    {"workqueue:wait with nothing queued", function()
      local q = ums.workqueue()
      return function() q:wait() end
    end},
    {"item:result of a done item", function()
      local q = ums.workqueue()
      local item = q:post(function() return 1 end)
      item:result()
      return function() item:result() end
    end},
    {"applock.acquire of a free name", function()
      local n = 0
      return function()
        n = n + 1
        local lock = ums.applock.acquire("coop" .. n, "X")
        lock:release()
      end
    end},
    {"work:join of ended work", function()
      local w = ums.submit(function() return 1 end)
      w:join()
      return function() w:join() end
    end},
    {"file:read served from the buffer", function()
      local path = os.tmpname()
      local out = assert(io.open(path, "w"))
      out:write(("line\n"):rep(100))
      out:close()
      local f = assert(ums.fs.open(path))
      assert(f:read("l"))
      os.remove(path)
      return function() assert(f:read("l")) end
    end},
    -- Socket calls the kernel answers at once (a ready socket), which
    -- make no park at all.
    {"conn:send with room", function()
      local srv = assert(ums.net.listen("127.0.0.1", 0))
      local _, port = srv:getsockname()
      local c = assert(ums.net.connect("127.0.0.1", port))
      local peer = assert(srv:accept(5))
      return function() assert.equal(1, c:send("x")) end, peer
    end},
    {"conn:recv at the end of the stream", function()
      local srv = assert(ums.net.listen("127.0.0.1", 0))
      local _, port = srv:getsockname()
      local c = assert(ums.net.connect("127.0.0.1", port))
      assert(srv:accept(5)):close()
      return function() assert.is_nil(c:recv()) end
    end},
    {"udp:send with room", function()
      local a = ums.net.udp()
      assert(a:bind("127.0.0.1", 0))
      local _, port = a:getsockname()
      local b = ums.net.udp()
      assert(b:connect("127.0.0.1", port))
      return function() assert.equal(1, b:send("x")) end, a
    end},
  }
  for _, case in ipairs(cases) do
    it("a task past its quantum yields at " .. case[1], function()
      ums.config{quantum = 0.002}
      ums.test(function()
        local calls, keep = {}, {}
        for i = 1, 10 do calls[i], keep[i] = case[2]() end
        local ran = false
        local go = ums.event()
        local light = ums.spawn(function()
          go:wait()
          ran = true
        end)
        local hog = ums.spawn(function()
          local before
          go:set()  -- light is runnable from here on
          for i = 1, #calls do
            spin(0.05)
            before = ran
            if before then break end
            calls[i]()
            if ran then break end
          end
          return before, ran
        end)
        local ok, before, after = hog:join()
        assert.is_true(ok, before)
        assert.is_false(before)
        assert.is_true(after)
        light:join()
      end, 30)
    end)
  end

  -- The runtime's monitor thread drives the quantum: a run has one
  -- monitor thread, with or without a quantum, preempting or not, once
  -- a second task exists (a lone task has nobody to yield to, and the
  -- quantum's looks start with the second).
  for _, preempt in ipairs({false, true}) do
    it("adds no thread for the quantum with preempt = " ..
       tostring(preempt), function()
      local function threads()
        local f = assert(io.open("/proc/self/status"))
        local n = tonumber(f:read("a"):match("\nThreads:%s*(%d+)"))
        f:close()
        return n
      end
      local counts = {}
      for _, quantum in ipairs({0, 0.004}) do
        ums.config{quantum = quantum, preempt = preempt}
        ums.test(function()
          local t = ums.spawn(function() ums.sleep(0.01) end)
          t:join()
          counts[#counts + 1] = threads()
        end, 30)
      end
      assert.equal(counts[1], counts[2])
    end)
  end

  -- Context switches of every thread of this process, read without a
  -- ums call (io.open on /proc never waits long), for the threads listed
  -- in tids.
  local function switches(tids)
    local n = 0
    for _, tid in ipairs(tids) do
      local f = io.open("/proc/self/task/" .. tid .. "/status")
      if f then
        local text = f:read("a")
        f:close()
        for v in text:gmatch("ctxt_switches:%s*(%d+)") do
          n = n + tonumber(v)
        end
      end
    end
    return n
  end

  -- Once a run has two tasks the monitor watches it; when every task then
  -- waits (a long sleep), the monitor must sleep too rather than look
  -- every half quantum (250 wake-ups in this half second).
  it("the quantum's monitor sleeps while every task waits", function()
    local during
    ums.run(function()
      ums.spawn(function() ums.sleep(0.01) end):join()
      local tids = {}
      for tid in ums.fs.dir("/proc/self/task") do
        if tid:match("^%d+$") then tids[#tids + 1] = tid end
      end
      ums.sleep(0.05)  -- the monitor has seen the run idle
      local before = switches(tids)
      ums.sleep(0.5)
      during = switches(tids) - before
    end)
    assert.is_true(during < 60, ("%d context switches in 0.5 s of an idle "
                                 .. "run"):format(during))
  end)

  -- After such a sleep the first step wakes the monitor again: a task
  -- past its quantum still yields at its next call that can wait, and
  -- with preempt = true a pure Lua loop is still interrupted.
  it("a task past its quantum still yields after the run was idle",
     function()
    ums.config{quantum = 0.002}
    local before, after
    ums.run(function()
      ums.spawn(function() ums.sleep(0.01) end):join()
      ums.sleep(0.2)  -- the monitor sleeps
      local ch = ums.shared.channel(100)
      local ran = false
      local go = ums.event()
      local light = ums.spawn(function() go:wait(); ran = true end)
      local hog = ums.spawn(function()
        go:set()
        for _ = 1, 20 do
          spin(0.05)
          before = ran
          if before then break end
          ch:send(1)
          if ran then break end
        end
        after = ran
      end)
      assert(hog:join())
      light:join()
    end)
    assert.is_false(before)
    assert.is_true(after)
  end)

  it("preempt = true interrupts a pure Lua loop after the run was idle",
     function()
    ums.config{quantum = 0.002, preempt = true}
    local BOUND = 300000000  -- a few seconds: ends the spec if never preempted
    local stopped_by_flag
    ums.run(function()
      ums.spawn(function() ums.sleep(0.01) end):join()
      ums.sleep(0.2)  -- the monitor sleeps
      local flag = false
      local hog = ums.spawn(function()
        local x, i = 0, 0
        while not flag and i < BOUND do
          i = i + 1
          x = x + i % 7
        end
        return i
      end)
      ums.spawn(function() flag = true end)
      local ok, i = hog:join()
      assert(ok)
      stopped_by_flag = i < BOUND
    end)
    assert.is_true(stopped_by_flag)
  end)

  -- A subprocess: pending where subprocesses cannot run (TSan).
  sp.guard(it, pending)("UMS_PREEMPT=1 in the environment sets the default",
                        function()
    local r = sp.lua_run({"-e", 'print(require("ums").config().preempt)'},
                         {env = {UMS_PREEMPT = "1"}})
    sp.cleanup()
    assert.equal("true\n", r.stdout, sp.describe(r))
  end)
end)

describe("the user's hooks", function()
  after_each(restore_config)

  -- Runs body in a task with a line-counting hook; body gets a function
  -- returning the count so far. Asserts the hook is still the user's
  -- afterwards.
  local function with_line_hook(body)
    ums.test(function()
      local t = ums.spawn(function()
        local lines = 0
        local function hook() lines = lines + 1 end
        debug.sethook(hook, "l")
        body(function() return lines end)
        local h, mask = debug.gethook()
        debug.sethook()
        return h == hook, mask
      end)
      local ok, same, mask = t:join()
      assert.is_true(ok, same)
      assert.is_true(same, "debug.gethook returns another hook")
      assert.equal("l", mask)
    end, 30)
  end

  it("keeps counting across sleeps", function()
    with_line_hook(function(count)
      for _ = 1, 5 do
        local c = count()
        ums.sleep(0.001)
        local x = 1
        x = x + 1
        assert.is_true(count() > c, "no line counted after a sleep")
      end
    end)
  end)

  it("keeps counting across quantum expiries (preempt = true)", function()
    ums.config{quantum = 0.001, preempt = true}
    with_line_hook(function(count)
      -- Spins until preempted at least a few times (a loaded machine may
      -- delay the monitor), for 30 s at most.
      local p0 = ums.stats()[1].quantum_expiries
      local give_up = ums.now() + 30
      repeat
        local c = count()
        local x = 0
        for _ = 1, 20000 do x = x + 1 end
        assert.is_true(count() > c + 100, "lines not counted while spinning")
      until ums.stats()[1].quantum_expiries > p0 + 2 or ums.now() > give_up
      assert.is_true(ums.stats()[1].quantum_expiries > p0,
                     "never preempted")
    end)
  end)

  -- Where a preempted task cannot yield (a table.sort comparator), ums's
  -- hook stays on it and retries: debug.gethook still gives the user's.
  it("debug.gethook gives the user's hook while ums's waits to yield",
     function()
    local seen, preempted = in_preempted_task(function()
      local function hook() end
      debug.sethook(hook, "l")
      local p0 = ums.stats()[1].quantum_expiries
      local seen = {}
      table.sort({2, 1}, function(a, b)
        for _ = 1, 50 do
          spin(0.01)
          local h, mask = debug.gethook()
          if h ~= hook or mask ~= "l" then
            seen[#seen + 1] = tostring(h) .. " " .. tostring(mask)
          end
        end
        return a < b
      end)
      local x = 1
      x = x + 1
      debug.sethook()
      return table.concat(seen, ", "),
             ums.stats()[1].quantum_expiries > p0
    end, 30)
    assert.equal("", seen)
    assert.is_true(preempted, "never preempted")
  end)

  -- A hook set while a preemption waits for a point where it may yield
  -- becomes the user's hook, and the preemption still comes.
  it("debug.sethook keeps a pending preemption", function()
    local same, preempted = in_preempted_task(function()
      debug.sethook(function() end, "l")
      local p0 = ums.stats()[1].quantum_expiries
      local function hook2() end
      table.sort({2, 1}, function(a, b)
        spin(0.5)
        debug.sethook(hook2, "l")
        return a < b
      end)
      spin(0.2)
      local h = debug.gethook()
      debug.sethook()
      return h == hook2, ums.stats()[1].quantum_expiries > p0
    end, 30)
    assert.is_true(same, "debug.gethook does not give the hook set")
    assert.is_true(preempted, "the preemption was lost")
  end)

  -- A task that keeps setting and reading hooks spends most of its time
  -- inside debug.sethook and debug.gethook, where the quantum's signal
  -- falls; the preemption it brings must survive the call.
  it("preempts a task that keeps setting hooks", function()
    ums.config{quantum = 0.001, preempt = true}
    ums.test(function()
      local turns, bad = 0, {}
      local other = ums.spawn(function()
        for _ = 1, 200 do
          turns = turns + 1
          ums.yield()
        end
      end)
      local setter = ums.spawn(function()
        local function ha() end
        local function hb() end
        -- os.clock, not ums.now (a yield point): the preemption must
        -- come through the hook.
        local t0 = os.clock()
        while turns < 200 and os.clock() - t0 < 20 do
          debug.sethook(ha, "c")
          local h, m = debug.gethook()
          if h ~= ha or m ~= "c" then bad[#bad + 1] = tostring(m) end
          debug.sethook(hb, "l", 0)
          h, m = debug.gethook()
          if h ~= hb or m ~= "l" then bad[#bad + 1] = tostring(m) end
        end
        debug.sethook()
      end)
      assert(setter:join())
      assert(other:join())
      assert.equal(200, turns, "the other task ran " .. turns .. " times")
      assert.equal("", table.concat(bad, ", "))
    end, 60)
  end)

  -- A coroutine made while ums's hook is on the task inherits the hook
  -- the task would have without ums (plain Lua copies a thread's hook,
  -- mask and count into the threads it makes).
  it("a coroutine made meanwhile inherits the user's hook", function()
    ums.config{quantum = 0.001, preempt = true}
    ums.test(function()
      local t = ums.spawn(function()
        debug.sethook(function() end, "l")
        local masks = {}
        table.sort({2, 1}, function(a, b)
          for _ = 1, 50 do
            spin(0.01)
            local co = coroutine.create(function()
              local x = 1
              x = x + 1
              return select(2, debug.gethook())
            end)
            local _, mask = coroutine.resume(co)
            if mask ~= "l" then masks[#masks + 1] = tostring(mask) end
          end
          return a < b
        end)
        debug.sethook()
        return table.concat(masks, ", ")
      end)
      local ok, masks = t:join()
      assert.is_true(ok, masks)
      assert.equal("", masks)
    end, 30)
  end)

  it("keeps counting across a stall report", function()
    ums.config{stall_threshold = 0.05}
    local reports = 0
    ums.on_stall(function() reports = reports + 1 end)
    with_line_hook(function(count)
      spin(0.3)
      local c = count()
      local x = 0
      for _ = 1, 1000 do x = x + 1 end
      assert.is_true(count() > c + 100, "lines not counted past the stall")
      ums.sleep(0.001)
    end)
    assert.is_true(reports >= 1, "no stall reported")
  end)

  it("a count hook fires at its own count while ums preempts", function()
    ums.config{quantum = 0.001, preempt = true}
    ums.test(function()
      local t = ums.spawn(function()
        local n = 0
        debug.sethook(function() n = n + 1 end, "", 1000)
        local c0 = n
        spin(0.05)
        local x = 0
        for _ = 1, 100000 do x = x + 1 end
        local _, mask, count = debug.gethook()
        debug.sethook()
        return n - c0, mask, count
      end)
      local ok, fired, mask, count = t:join()
      assert.is_true(ok, fired)
      assert.is_true(fired > 10, "count hook fired " .. tostring(fired))
      assert.equal("", mask)
      assert.equal(1000, count)
    end, 30)
  end)

  -- Lua gives no hook to an instruction run again after a yield from a
  -- hook: a preemption must not cost the user's line hook the line that
  -- instruction starts, at the yield or later.
  it("a line hook sees every line of a task preempted meanwhile", function()
    local n, a, b, c, preempted = in_preempted_task(function()
      local counts = {}
      local function hook(_, line) counts[line] = (counts[line] or 0) + 1 end
      local p0, n, x = ums.stats()[1].quantum_expiries, 0, 0
      local give_up = ums.now() + 30
      local base = debug.getinfo(1, "l").currentline
      debug.sethook(hook, "l")
      repeat
        n = n + 1
        x = n * 2
        x = x + 1
      until ums.stats()[1].quantum_expiries > p0 + 20 or ums.now() > give_up
      debug.sethook()
      return n, counts[base + 3], counts[base + 4], counts[base + 5],
             ums.stats()[1].quantum_expiries > p0
    end, 60)
    assert.is_true(preempted, "never preempted")
    assert.same({n, n, n}, {a, b, c})
  end)

  it("a line hook set after a preemption sees its first line", function()
    local lost, preempted = in_preempted_task(function()
      local p0, lost = ums.stats()[1].quantum_expiries, 0
      local give_up = ums.now() + 30
      repeat
        local first
        local function hook(_, line) first = first or line end
        local base = debug.getinfo(1, "l").currentline
        debug.sethook(hook, "l")
        local y = 0
        debug.sethook()
        if first ~= base + 2 then lost = lost + 1 end
        local x = 0
        for _ = 1, 5000 do x = x + y end
      until ums.stats()[1].quantum_expiries > p0 + 20 or ums.now() > give_up
      return lost, ums.stats()[1].quantum_expiries > p0
    end, 60)
    assert.is_true(preempted, "never preempted")
    assert.equal(0, lost)
  end)

  it("debug.gethook reads the user's hook while the quantum's signal fires", function()
    ums.config{quantum = 0.0002, preempt = true}
    ums.test(function()
      local t = ums.spawn(function()
        local function user() end
        debug.sethook(user, "", 1000)
        local bad, reads = 0, 0
        local t0 = os.clock()
        while os.clock() - t0 < 0.5 do
          local fn, mask, count = debug.gethook()
          reads = reads + 1
          if fn ~= user or mask ~= "" or count ~= 1000 then bad = bad + 1 end
        end
        debug.sethook()
        return bad, reads
      end)
      local ok, bad, reads = t:join()
      assert.is_true(ok, bad)
      assert.is_true(reads > 1000, "only " .. tostring(reads) .. " reads")
      assert.equal(0, bad)
    end, 30)
  end)
end)

describe("deep recursion", function()
  after_each(restore_config)

  local function deep(n)
    if n == 0 then return spin(0.05) and 0 end
    return 1 + deep(n - 1)
  end

  for _, preempt in ipairs({false, true}) do
    it("to depth 100,000 runs with preempt = " .. tostring(preempt),
       function()
      ums.config{quantum = 0.001, preempt = preempt}
      ums.test(function()
        local other = ums.spawn(function()
          for _ = 1, 20 do ums.sleep(0.001) end
        end)
        local t = ums.spawn(function() return deep(100000) end)
        local ok, v = t:join()
        assert.is_true(ok, v)
        assert.equal(100000, v)
        other:join()
      end, 60)
    end)
  end

  it("an xpcall stack overflow ends with preempt = true", function()
    ums.config{quantum = 0.001, preempt = true}
    ums.test(function()
      local t = ums.spawn(function()
        local function g(n) return 1 + g(n + 1) end
        return xpcall(g, debug.traceback, 1)
      end)
      local ok, xok, msg = t:join()
      assert.is_true(ok, xok)
      assert.is_false(xok)
      assert.matches("stack overflow", msg)
    end, 60)
  end)
end)
