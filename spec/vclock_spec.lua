-- Specs for deterministic time: ums.config{clock = "virtual"} (the
-- runtime's virtual clock, runtime/include/ums.h "Virtual clock"),
-- ums.run_until_idle, and ums.test's clock option.
--
-- Real time is measured only against bounds a hang breaks and a slow
-- machine does not: a virtual hour must take less than a real second
-- (it takes milliseconds; run for real it would take the hour).

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")

local function run(body)
  return ums.test(body, { clock = "virtual" })
end

-- Real seconds f takes (ums.now() outside a run reads the real clock).
local function real_time(f)
  local t0 = ums.now()
  f()
  return ums.now() - t0
end

local function with_config(cfg, f)
  local prev = ums.config()
  local ok, err = pcall(function()
    ums.config(cfg)
    f()
  end)
  ums.config { clock = prev.clock, schedulers = prev.schedulers,
               io = prev.io }
  if not ok then error(err, 0) end
end

-- A schedule of `ntasks` tasks, each sleeping pseudo-random whole and
-- fractional seconds until an hour has passed, logging every wake-up.
local function hour_schedule(ntasks)
  local log = {}
  run(function()
    assert.equal(0, ums.now())  -- a virtual run starts at 0
    local x = 12345
    local function rand(n)
      x = (x * 1103515245 + 12345) % 2147483648
      return x % n
    end
    for i = 1, ntasks do
      local naps = {}
      local total = 0
      while total < 3600 do
        local s = rand(600) + rand(1000) / 1000
        naps[#naps + 1] = s
        total = total + s
      end
      ums.spawn(function()
        for _, s in ipairs(naps) do
          ums.sleep(s)
          log[#log + 1] = ("%d@%.3f"):format(i, ums.now())
        end
      end)
    end
  end)
  return log
end

describe("the virtual clock", function()
  it("runs a one-hour schedule in under a second, the same every run",
     function()
    local first
    local took = real_time(function() first = hour_schedule(40) end)
    assert.is_true(took < 1, "took " .. took .. " s of real time")
    assert.is_true(#first > 200)
    local last = tonumber(first[#first]:match("@(.*)"))
    assert.is_true(last >= 3600, "the schedule ended at " .. last)
    for _ = 1, 3 do assert.same(first, hour_schedule(40)) end
  end)

  it("advances ums.now() by exactly the time slept", function()
    run(function()
      local t0 = ums.now()
      ums.sleep(3600)
      assert.equal(3600, ums.now() - t0)
      ums.sleep(0.25)
      assert.equal(3600.25, ums.now() - t0)
    end)
  end)

  it("makes every timeout instant and exact", function()
    run(function()
      local t0 = ums.now()
      assert.same({ nil, "timeout" }, { ums.event():wait(10) })
      assert.equal(10, ums.now() - t0)
      local m = ums.mutex()
      local holder = ums.spawn(function()
        m:lock(); ums.sleep(100); m:unlock()
      end)
      assert(ums.run_until_idle())
      assert.same({ nil, "timeout" }, { m:lock(5) })
      assert.equal(15, ums.now() - t0)
      assert.same({ nil, "timeout" }, { ums.channel():recv(2) })
      assert.same({ nil, "timeout" }, { ums.semaphore(0):acquire(3) })
      assert.same({ nil, "timeout" }, { holder:join(1) })
      assert.equal(21, ums.now() - t0)
      assert(holder:join())
      assert.equal(110, ums.now() - t0)  -- it started sleeping at 10
    end)
  end)

  it("wakes tasks in deadline order, ties in the order they slept",
     function()
    local order = {}
    run(function()
      local delays = { 5, 1, 3, 1, 5, 2, 1 }
      for i, d in ipairs(delays) do
        ums.spawn(function() ums.sleep(d); order[#order + 1] = i end)
      end
    end)
    assert.same({ 2, 4, 7, 6, 3, 1, 5 }, order)
  end)

  describe("with real work in flight", function()
    local ffi = ums.ffi
    ffi.cdef [[ int usleep(unsigned int usec); ]]

    it("stands still during a preemptive C call", function()
      run(function()
        local woke = false
        ums.spawn(function() ums.sleep(0.001); woke = true end)
        local t0 = ums.now()
        assert.equal(0, ffi.C.usleep(50000))  -- 50 ms of real time
        assert.equal(t0, ums.now())
        assert.is_false(woke)
        -- A virtual deadline cannot pass while the call runs.
        local timed = ffi.timeout(ffi.C.usleep, 0.01)
        assert.equal(0, timed(50000))
        assert.equal(t0, ums.now())
        ums.sleep(1)
        assert.is_true(woke)
      end)
    end)

    for _, backend in ipairs { "auto", "pool" } do
      it("stands still during file I/O (io = " .. backend .. ")", function()
        local path = os.tmpname()
        local f = assert(io.open(path, "wb"))
        f:write(("x"):rep(1 << 20))
        f:close()
        with_config({ io = backend }, function()
          run(function()
            local woke = false
            ums.spawn(function() ums.sleep(1e-9); woke = true end)
            local t0 = ums.now()
            local data = assert(ums.fs.readfile(path))
            assert.equal(1 << 20, #data)
            assert.equal(t0, ums.now())
            assert.is_false(woke)
            ums.sleep(0.5)
            assert.is_true(woke)
          end)
        end)
        os.remove(path)
      end)
    end
  end)

  describe("configuration", function()
    it("is chosen with ums.config and needs one scheduler", function()
      local prev = ums.config()
      assert.equal("real", prev.clock)
      local ok, err = pcall(ums.config, { clock = "virtual",
                                          schedulers = 2 })
      assert.is_false(ok)
      assert.matches('clock = "virtual" needs schedulers = 1, got 2', err)
      ok, err = pcall(ums.config, { clock = "warp" })
      assert.is_false(ok)
      assert.matches("'clock' must be \"real\" or \"virtual\", got warp", err)
      ums.config { schedulers = 2 }
      ok, err = pcall(ums.config, { clock = "virtual" })
      assert.is_false(ok)
      assert.matches("needs schedulers = 1, got 2", err)
      ums.config { schedulers = prev.schedulers }
      with_config({ clock = "virtual" }, function()
        assert.equal("virtual", ums.config().clock)
        local took = real_time(function()
          ums.run(function() ums.sleep(7200) end)
        end)
        assert.is_true(took < 1, "took " .. took)
      end)
      assert.equal("real", ums.config().clock)
    end)
  end)
end)

describe("ums.run_until_idle", function()
  it("returns once every other task is blocked, before the clock moves",
     function()
    run(function()
      local steps, t0 = { 0, 0, 0 }, ums.now()
      local ev = ums.event(true)
      for i = 1, 3 do
        ums.spawn(function()
          for _ = 1, 10 * i do
            steps[i] = steps[i] + 1
            ums.yield()
          end
          ev:wait()
        end)
      end
      local sleeper_done = false
      ums.spawn(function() ums.sleep(5); sleeper_done = true end)
      assert.is_true(ums.run_until_idle())
      assert.same({ 10, 20, 30 }, steps)
      assert.is_false(sleeper_done)
      assert.equal(t0, ums.now())
      ev:set()
      ums.sleep(6)
      assert.is_true(sleeper_done)
    end)
  end)

  it("works on the real clock too", function()
    ums.test(function()
      local n = 0
      ums.spawn(function()
        for _ = 1, 50 do n = n + 1; ums.yield() end
      end)
      assert.is_true(ums.run_until_idle())
      assert.equal(50, n)
    end)
  end)

  it("times out while a task keeps running", function()
    ums.test(function()
      local stop = false
      ums.spawn(function() while not stop do ums.yield() end end)
      assert.same({ nil, "timeout" }, { ums.run_until_idle(0.01) })
      stop = true
    end)
  end)

  it("raises outside a task and for a bad timeout", function()
    local ok, err = pcall(ums.run_until_idle)
    assert.is_false(ok)
    assert.matches("ums.run_until_idle: not inside a task", err)
    run(function()
      local ok2, err2 = pcall(ums.run_until_idle, -1)
      assert.is_false(ok2)
      assert.matches("bad argument #1 to '[%w_.]*run_until_idle' %(timeout "
        .. "must not be negative%)", err2)
    end)
  end)
end)

describe("ums.test with clock = 'virtual'", function()
  it("fails a deadlocked test at once, at the virtual limit", function()
    local ok, err
    local took = real_time(function()
      ok, err = pcall(ums.test, function()
        ums.channel():recv()  -- nobody will ever send
      end, { clock = "virtual", limit = 3600 })
    end)
    assert.is_false(ok)
    assert.matches("ums.test: timed out after 3600 s of virtual time", err)
    assert.is_true(took < 5, "took " .. took)
  end)

  it("fails a test that never blocks at its real-time timeout "
     .. "(preempt = true)", function()
    ums.config{preempt = true}
    finally(function() ums.config{preempt = false} end)
    -- A loop that computes: virtual time stands still, only the quantum
    -- interrupts it.
    local ok, err = pcall(ums.test, function()
      local n = 0
      while true do n = n + 1 end
    end, { clock = "virtual", timeout = 0.5 })
    assert.is_false(ok)
    assert.matches("ums.test: timed out after 0.5 s$", err)
  end)

  it("waits for the tasks fn started, also when they end just before the "
     .. "limit", function()
    local ended_at
    ums.test(function()
      ums.spawn(function() ums.sleep(900); ended_at = ums.now() end)
    end, { clock = "virtual", limit = 1000 })
    assert.equal(900, ended_at)
  end)

  it("reports the test's own error, not a timeout", function()
    local ok, err = pcall(ums.test, function()
      ums.spawn(function() ums.sleep(100) end)
      error("the real failure")
    end, { clock = "virtual" })
    assert.is_false(ok)
    assert.matches("the real failure", err)
  end)

  it("restores the settings it changed", function()
    local before = ums.config()
    run(function() assert.equal("virtual", ums.config().clock) end)
    assert.same(before, ums.config())
  end)

  it("checks its options", function()
    for _, case in ipairs {
      { { clock = "fast" }, 'clock must be "real" or "virtual"' },
      { { limit = 0 }, "limit must be a positive number" },
      { { timeout = -1 }, "the timeout must be a positive number" },
      { { tick = 1 }, "unknown option 'tick'" },
    } do
      local ok, err = pcall(ums.test, function() end, case[1])
      assert.is_false(ok)
      local want = case[2]:gsub("%p", "%%%0")
      assert.matches("bad argument #2 to 'test' %(" .. want, err)
    end
  end)
end)
