-- Specs for ums.applock (stdlib/ums/applock.lua): SQL Server's lock
-- modes and compatibility matrix cell by cell, timeouts, FIFO fairness,
-- conversions, owners (task, group), deadlock detection, and bad input.
--
-- Run through the Busted helper (`busted --helper=ums.busted`, as ctest
-- does): every test is a task of a fresh run, on the virtual clock (the
-- #virtual tag below), so timeouts are checked to the nanosecond's worth
-- of float, without real waiting, and ums.run_until_idle lets every other
-- task reach its wait.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")
local applock = ums.applock

local function idle() assert(ums.run_until_idle()) end

-- Runs f and returns the virtual seconds it took, then its results.
local function timed(f, ...)
  local t0 = ums.now()
  local r = table.pack(f(...))
  return ums.now() - t0, table.unpack(r, 1, r.n)
end

local function near(a, b) return math.abs(a - b) < 1e-6 end

-- SQL Server's documented lock compatibility matrix ("Lock compatibility
-- (Database Engine)", SQL Server Transaction Locking and Row Versioning
-- Guide), typed in here independently of the module: rows are the
-- requested mode, columns the mode granted to another owner.
local MODES = { "IS", "S", "U", "IX", "SIX", "X" }
local DOC = {
  --        IS     S      U      IX     SIX    X
  IS  = { true,  true,  true,  true,  true,  false },
  S   = { true,  true,  true,  false, false, false },
  U   = { true,  true,  false, false, false, false },
  IX  = { true,  false, false, true,  false, false },
  SIX = { true,  false, false, false, false, false },
  X   = { false, false, false, false, false, false },
}
local function expected(requested, granted)
  for j, m in ipairs(MODES) do
    if m == granted then return DOC[requested][j] end
  end
end

describe("ums.applock #virtual", function()
  describe("compatibility matrix, cell by cell", function()
    for _, granted in ipairs(MODES) do
      for _, requested in ipairs(MODES) do
        local want = expected(requested, granted)
        it(("%s requested while another task holds %s: %s"):format(
             requested, granted, want and "granted" or "waits"), function()
          local name = "cell " .. granted .. "/" .. requested
          local holding = ums.spawn(function()
            local l = assert(applock.acquire(name, granted))
            ums.sleep(10)
            l:release()
          end)
          idle()
          assert.equal(want, applock.compatible(requested, granted))
          assert.equal(want, applock.test(name, requested))
          local l, err = applock.acquire(name, requested, 0)
          if want then
            assert.equal("ums.applock.lock", getmetatable(l).__name)
            assert.equal(requested, l:mode())
            l:release()
          else
            assert.is_nil(l)
            assert.equal("timeout", err)
            -- It is granted once the holder lets go, not before.
            local took, l2 = timed(applock.acquire, name, requested, -1)
            assert.is_true(near(took, 10), "took " .. took)
            l2:release()
          end
          assert(holding:join())
        end)
      end
    end

    it("is symmetric", function()
      for _, a in ipairs(MODES) do
        for _, b in ipairs(MODES) do
          assert.equal(applock.compatible(a, b), applock.compatible(b, a))
        end
      end
    end)

    it("takes sp_getapplock's mode names too", function()
      local long = { IntentShared = "IS", Shared = "S", Update = "U",
        IntentExclusive = "IX", SharedIntentExclusive = "SIX",
        Exclusive = "X" }
      for l, s in pairs(long) do
        for _, m in ipairs(MODES) do
          assert.equal(applock.compatible(s, m), applock.compatible(l, m))
        end
      end
      local l = assert(applock.acquire("long", "IntentExclusive"))
      assert.equal("IX", l:mode())
      l:release()
    end)
  end)

  describe("one owner", function()
    it("never conflicts with itself; each grant is released on its own",
       function()
      local x = assert(applock.acquire("own", "X", 0))
      local s = assert(applock.acquire("own", "S", 0))
      local x2 = assert(applock.acquire("own", "X", 0))
      assert.equal("X", applock.mode("own"))
      x:release()
      x2:release()
      assert.equal("S", applock.mode("own"))
      local other = ums.spawn(function()
        return applock.acquire("own", "X", 0)
      end)
      local _, l, err = other:join()
      assert.is_nil(l)
      assert.equal("timeout", err)
      s:release()
      assert.equal("NoLock", applock.mode("own"))
      assert.same({}, applock.locks("own"))
    end)
  end)

  describe("timeouts", function()
    it("gives nil, 'timeout' after the timeout, and only then", function()
      local holder = ums.spawn(function()
        local l <close> = assert(applock.acquire("t", "X"))
        ums.sleep(100)
      end)
      idle()
      local took, l, err = timed(applock.acquire, "t", "S", 2.5)
      assert.is_nil(l)
      assert.equal("timeout", err)
      assert.is_true(near(took, 2.5), "took " .. took)
      -- 0 tries once: no time passes.
      took, l, err = timed(applock.acquire, "t", "IS", 0)
      assert.equal(0, took)
      assert.is_nil(l)
      assert.equal("timeout", err)
      -- -1 waits as long as it takes.
      took, l = timed(applock.acquire, "t", "X", -1)
      assert.is_true(near(took, 97.5), "took " .. took)
      l:release()
      assert(holder:join())
    end)

    it("a waiter that times out lets the ones behind it through", function()
      local holder = ums.spawn(function()
        local s <close> = assert(applock.acquire("q", "S"))
        ums.sleep(10)
      end)
      idle()
      local x = ums.spawn(function() return applock.acquire("q", "X", 1) end)
      idle()
      -- Behind the waiting X, an IS must wait (FIFO), until X gives up.
      local took, is = timed(applock.acquire, "q", "IS", 5)
      assert.is_true(near(took, 1), "took " .. took)
      local _, l, err = x:join()
      assert.is_nil(l)
      assert.equal("timeout", err)
      is:release()
      assert(holder:join())
    end)
  end)

  describe("fairness", function()
    it("does not starve X behind a stream of S", function()
      local events = {}
      local release_first = ums.event()
      local first = ums.spawn(function()
        local l <close> = assert(applock.acquire("f", "S"))
        release_first:wait()
      end)
      idle()
      local writer = ums.spawn(function()
        local l <close> = assert(applock.acquire("f", "X"))
        events[#events + 1] = "X at " .. ums.now() // 1 % 1000
        ums.sleep(1)
      end)
      idle()
      -- A stream of readers, one every second, each holding S for 2 s:
      -- without FIFO they would overlap forever and X would never run.
      local readers = {}
      local t0 = ums.now()
      for i = 1, 5 do
        readers[i] = ums.spawn(function()
          local l <close> = assert(applock.acquire("f", "S"))
          events[#events + 1] = ("S%d at %d"):format(i,
            (ums.now() - t0 + 0.5) // 1)
          ums.sleep(2)
        end)
        ums.sleep(1)
        assert.is_false(applock.test("f", "S"))
      end
      release_first:set()
      assert(first:join())
      assert(writer:join())
      for i = 1, 5 do assert(readers[i]:join()) end
      -- The writer went first; the readers queued behind it went
      -- together after it.
      assert.matches("^X at", events[1])
      for i = 2, 6 do assert.matches("^S%d at 6$", events[i]) end
    end)

    it("lets a conversion go before the queue", function()
      local s = assert(applock.acquire("c", "S"))
      local waiter = ums.spawn(function()
        return applock.acquire("c", "X")
      end)
      idle()
      -- The X waiter waits for our S; our own S -> X needs nobody else.
      local x = assert(applock.acquire("c", "X", 0))
      x:release()
      s:release()
      local _, l = waiter:join()
      assert.equal("X", l:mode())
      l:release()
    end)
  end)

  describe("acquire_now", function()
    it("grants what acquire(name, mode, 0) grants, and never waits",
       function()
      local other = ums.spawn(function()
        local x <close> = assert(applock.acquire("now", "X"))
        ums.sleep(1)
      end)
      idle()
      local t0 = ums.now()
      assert.same({ nil, "timeout" }, { applock.acquire_now("now", "S") })
      assert.equal(t0, ums.now())
      assert(other:join())
      local l = assert(applock.acquire_now("now", "S"))
      assert.equal("S", l:mode())
      -- A conversion goes before the queue, as in acquire.
      local u = assert(applock.acquire_now("now", "X"))
      u:release()
      l:release()
      assert.equal("NoLock", applock.mode("now"))
    end)

    it("does not yield, also past the quantum", function()
      -- The virtual clock stands still while tasks compute; the quantum
      -- counts real time, so a busy loop puts this task past it.
      local ran = false
      local t = ums.spawn(function() ran = true end)
      local c = os.clock()
      while os.clock() - c < 0.02 do end
      local l = assert(applock.acquire_now("busy", "X"))
      assert.is_false(ran)
      l:release()
      t:join()
      assert.is_true(ran)
    end)
  end)

  describe("deadlocks", function()
    it("detects two tasks waiting for each other: the second one is the "
       .. "victim", function()
      local a = ums.spawn(function()
        ums.self():name("A")
        local la <close> = assert(applock.acquire("res a", "X"))
        ums.sleep(1)
        local lb, err = applock.acquire("res b", "X")
        return lb and lb:mode(), err
      end)
      local b = ums.spawn(function()
        ums.self():name("B")
        local lb <close> = assert(applock.acquire("res b", "X"))
        ums.sleep(2)
        local la, err, why = applock.acquire("res a", "X")
        return la, err, why, ums.now()
      end)
      local t0 = ums.now()
      local okb, la, err, why, when = b:join()
      assert.is_true(okb)
      assert.is_nil(la)
      assert.equal("deadlock", err)
      assert.matches("victim", why)
      assert.matches("'res a' %(X%), held by task 'A'", why)
      assert.matches("task 'A' waits for 'res b' %(X%), held by task 'B'",
        why)
      -- Reported at once, not after a wait.
      assert.is_true(near(when - t0, 2))
      -- The victim let go of res b: A gets it.
      local oka, mode, aerr = a:join()
      assert.is_true(oka)
      assert.equal("X", mode)
      assert.is_nil(aerr)
    end)

    it("detects a cycle of three", function()
      local names = { "r1", "r2", "r3" }
      local tasks = {}
      for i = 1, 3 do
        tasks[i] = ums.spawn(function()
          local mine <close> = assert(applock.acquire(names[i], "U"))
          ums.sleep(i)
          local l, err = applock.acquire(names[i % 3 + 1], "U")
          if l then l:release() end
          return l ~= nil, err
        end)
      end
      local got = {}
      for i = 1, 3 do
        local _, ok, err = tasks[i]:join()
        got[i] = ok and "granted" or err
      end
      -- The third closes the cycle and is the victim; then 2, then 1
      -- get what they waited for.
      assert.same({ "granted", "granted", "deadlock" }, got)
    end)

    it("does not report a wait behind a task that can still go on",
       function()
      local holder = ums.spawn(function()
        local l <close> = assert(applock.acquire("chain1", "X"))
        ums.sleep(5)
      end)
      local middle = ums.spawn(function()
        local l2 <close> = assert(applock.acquire("chain2", "X"))
        local l1, err = applock.acquire("chain1", "X")
        if l1 then l1:release() end
        return err
      end)
      idle()
      local l, err = applock.acquire("chain2", "S")
      assert.is_nil(err)
      l:release()
      assert.same({ true }, { middle:join() })
      assert(holder:join())
    end)

    it("does not count a granted request whose task has not run yet",
       function()
      local l = assert(applock.acquire("granted", "S"))
      local order = {}
      local b = ums.spawn(function()
        ums.self():name("B")
        local ix <close> = assert(applock.acquire("granted", "IX"))
        order[#order + 1] = "B"
        ums.sleep(1)
      end)
      idle()
      -- B is granted IX here but has not run yet: A's S waits behind that
      -- grant, and B's request, off the queue, waits for nothing.
      l:release()
      local t0 = ums.now()
      local again, err, why = applock.acquire("granted", "S")
      assert.is_nil(err, why)
      order[#order + 1] = "A"
      assert.is_true(near(ums.now() - t0, 1))
      assert.same({ "B", "A" }, order)
      again:release()
      assert(b:join())
    end)

    it("reports a cycle also when the request has a timeout", function()
      local other = ums.spawn(function()
        local b <close> = assert(applock.acquire("tb", "X"))
        ums.sleep(1)
        local a <close> = assert(applock.acquire("ta", "X"))
      end)
      local a = assert(applock.acquire("ta", "X"))
      ums.sleep(2)
      -- SQL Server's rule: a timeout does not exempt a request.
      local took, l, err = timed(applock.acquire, "tb", "X", 5)
      assert.equal(0, took)
      assert.is_nil(l)
      assert.equal("deadlock", err)
      a:release()
      assert(other:join())
    end)
  end)

  describe("ended owners", function()
    it("release what their task held, as a session's locks are released "
       .. "when it ends", function()
      local leaver = ums.spawn(function()
        local l = assert(applock.acquire("orphan", "X"))
        return l  -- never released
      end)
      local _, l = leaver:join()
      assert.is_true(l:held())
      local mine = assert(applock.acquire("orphan", "X", 0))
      assert.is_false(l:held())
      local ok, err = pcall(l.release, l)
      assert.is_false(ok)
      assert.matches("its task has ended", err)
      mine:release()
      -- A failed task's locks too.
      local failing = ums.spawn(function()
        assert(applock.acquire("orphan2", "X"))
        error("oops")
      end)
      assert.is_false((failing:join()))
      assert(applock.acquire("orphan2", "S", 0)):release()
      assert.same({}, applock.locks())
    end)
  end)

  describe("group owners", function()
    it("share one grant among the group's tasks and release it when the "
       .. "group closes", function()
      local outside
      do
        local g <close> = ums.group()
        for _ = 1, 2 do
          g:spawn(function()
            -- Both tasks take X for the group: one owner, no conflict.
            local l = assert(applock.acquire("gx", "X", 0, g))
            assert.equal(g, l:owner())
            ums.sleep(1)
          end)
        end
        idle()
        outside = ums.spawn(function()
          local t0 = ums.now()
          local l = assert(applock.acquire("gx", "S"))
          l:release()
          return ums.now() - t0
        end)
        idle()
        assert.equal(2, #applock.locks("gx")[1].granted)
      end
      -- The group's tasks ended at 1 s without releasing: the group's
      -- close did.
      local _, took = outside:join()
      assert.is_true(near(took, 1), "took " .. took)
      assert.same({}, applock.locks("gx"))
    end)

    it("counts the group's creator in the deadlock check", function()
      local g = ums.group()
      g:spawn(function() assert(applock.acquire("gd", "X", 0, g)) end)
      assert(g:wait())
      -- Only this task can release the group's lock: waiting for it
      -- for itself would never end.
      local l, err = applock.acquire("gd", "X")
      assert.is_nil(l)
      assert.equal("deadlock", err)
      assert.is_true(applock.release("gd", g))
      g:close()
    end)
  end)

  describe("releasing", function()
    it("a <close> variable releases at the end of its scope", function()
      do
        local l <close> = assert(applock.acquire("cl", "X"))
        assert.equal("X", applock.mode("cl"))
      end
      assert.equal("NoLock", applock.mode("cl"))
      assert.same({}, applock.locks())
    end)

    it("by name releases the owner's latest grant (sp_releaseapplock)",
       function()
      assert(applock.acquire("byname", "S"))
      assert(applock.acquire("byname", "X"))
      assert.is_true(applock.release("byname"))
      assert.equal("S", applock.mode("byname"))
      assert.is_true(applock.release("byname"))
      assert.equal("NoLock", applock.mode("byname"))
    end)

    it("raises for a lock that is not held", function()
      local l = assert(applock.acquire("twice", "X"))
      assert.is_true(l:release())
      assert.is_false(l:held())
      local ok, err = pcall(l.release, l)
      assert.is_false(ok)
      assert.matches("lock:release: the lock on 'twice' %(X%) is not held",
        err)
      ok, err = pcall(applock.release, "never")
      assert.is_false(ok)
      assert.matches("bad argument #1 to 'release' %(no lock on 'never' "
        .. "is held by this task%)", err)
    end)
  end)

  describe("bad input", function()
    local function fails(pattern, f, ...)
      local ok, err = pcall(f, ...)
      assert.is_false(ok, "no error")
      assert.matches(pattern, err)
    end

    it("unknown lock modes", function()
      fails("bad argument #2 to 'acquire' %(unknown lock mode 'Z'; "
        .. "expected IS, S, U, IX, SIX or X%)", applock.acquire, "n", "Z")
      fails("unknown lock mode 's'", applock.acquire, "n", "s")
      fails("bad argument #2 to 'acquire' %(lock mode expected, got "
        .. "number%)", applock.acquire, "n", 5)
      fails("bad argument #2 to 'acquire' %(lock mode expected, got nil%)",
        applock.acquire, "n")
      fails("bad argument #1 to 'compatible' %(unknown lock mode 'XX'",
        applock.compatible, "XX", "S")
      fails("bad argument #2 to 'test'", applock.test, "n", "shared")
    end)

    it("names, timeouts and owners", function()
      fails("bad argument #1 to 'acquire' %(string expected, got number%)",
        applock.acquire, 1, "S")
      fails("bad argument #1 to 'acquire' %(name must not be empty%)",
        applock.acquire, "", "S")
      fails("bad argument #3 to 'acquire' %(timeout must be %-1",
        applock.acquire, "n", "S", -2)
      fails("bad argument #3 to 'acquire' %(timeout is NaN, not a number "
        .. "of seconds%)", applock.acquire, "n", "S", 0 / 0)
      fails("bad argument #3 to 'acquire' %(number expected, got string%)",
        applock.acquire, "n", "S", "1")
      fails("bad argument #4 to 'acquire' %(ums.group expected, got "
        .. "string%)", applock.acquire, "n", "S", 0, "Session")
      fails("bad argument #1 to 'acquire_now' %(name must not be empty%)",
        applock.acquire_now, "", "S")
      fails("bad argument #2 to 'acquire_now' %(unknown lock mode 'Q'",
        applock.acquire_now, "n", "Q")
      fails("bad argument #3 to 'acquire_now' %(ums.group expected, got "
        .. "number%)", applock.acquire_now, "n", "S", 3)
      fails("bad argument #1 to 'release' %(ums.applock.lock expected, "
        .. "got table%)", applock.Lock.release, {})
      -- A method call on something else than a lock.
      local fake = setmetatable({}, { __index = applock.Lock })
      -- (Not tail calls: those lose the name of the method.)
      fails("calling 'release' on bad self %(ums.applock.lock expected, "
        .. "got table%)", function() local r = fake:release(); return r end)
      fails("calling 'mode' on bad self", function()
        local r = fake:mode(); return r end)
    end)

    it("outside a task #notask", function()
      fails("ums.applock.acquire: not inside a task", applock.acquire, "n",
        "S")
      fails("ums.applock.acquire_now: not inside a task",
        applock.acquire_now, "n", "S")
    end)
  end)
end)
