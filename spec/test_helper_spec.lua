-- ums.test(fn [, timeout]): runs fn as a task in a fresh run and raises on
-- fn's error, on timeout and on an error of a task nobody joined.
local ums = require "ums"

local function current_on_error()
  return debug.getregistry()["ums.on_error"]
end

describe("ums.test", function()
  it("passes: runs fn as a task and returns its results", function()
    local r = table.pack(ums.test(function()
      assert(ums.self(), "not inside a task")
      ums.sleep(0.001)
      local ok, v = ums.spawn(function() ums.yield(); return 21 end):join()
      assert(ok)
      return v * 2, nil, "x"
    end))
    assert.equal(3, r.n)
    assert.equal(42, r[1])
    assert.is_nil(r[2])
    assert.equal("x", r[3])
  end)

  it("can be used as an it body, many times in a row", function()
    for i = 1, 50 do
      assert.equal(i, ums.test(function() ums.yield(); return i end))
    end
  end)

  it("ends promptly when fn finishes early (the watchdog is cancelled)",
     function()
    local t0 = ums.now()
    ums.test(function() ums.sleep(0.01) end, 5)
    assert.is_true(ums.now() - t0 < 1, "took " .. (ums.now() - t0) .. " s")
  end)

  it("waits for the tasks fn started", function()
    local finished = false
    ums.test(function()
      ums.spawn(function() ums.sleep(0.02); finished = true end)
    end, 5)
    assert.is_true(finished)
  end)

  describe("fails when fn raises", function()
    it("a string: the message with fn's traceback", function()
      local function failing_test_body() error("expected failure") end
      local ok, err = pcall(ums.test, function() failing_test_body() end)
      assert.is_false(ok)
      assert.equal("string", type(err))
      assert.matches("test_helper_spec%.lua:%d+: expected failure", err)
      assert.matches("stack traceback", err)
      assert.matches("failing_test_body", err)
    end)

    it("after a wait", function()
      local ok, err = pcall(ums.test, function()
        ums.sleep(0.001)
        error("late failure")
      end)
      assert.is_false(ok)
      assert.matches("late failure", err)
    end)

    it("a table: the same table", function()
      local e = {code = 1}
      local ok, err = pcall(ums.test, function() error(e) end)
      assert.is_false(ok)
      assert.is_true(rawequal(e, err))
    end)

    it("nil or false: still fails, with a message", function()
      for _, v in ipairs{false} do
        local ok, err = pcall(ums.test, function() error(v) end)
        assert.is_false(ok)
        assert.equal("string", type(err))
        assert.matches("ums.test", err)
      end
      local ok, err = pcall(ums.test, function() error(nil) end)
      assert.is_false(ok)
      assert.equal("string", type(err))
      assert.matches("ums.test: the test task raised nil", err)
    end)

    it("a failed busted assertion inside fn", function()
      local ok, err = pcall(ums.test, function() assert.equal(1, 2) end)
      assert.is_false(ok)
      assert.is_not_nil(err)
    end)

    it("and cancels the other tasks", function()
      local closed_with
      pcall(ums.test, function()
        ums.spawn(function()
          local c <close> = setmetatable({}, {__close = function(_, e)
            closed_with = e
          end})
          ums.sleep(100)
        end)
        ums.yield()
        error("stop")
      end, 5)
      assert.is_true(rawequal(ums.CANCELLED, closed_with))
    end)
  end)

  describe("fails on timeout", function()
    it("with 'ums.test: timed out after N s', promptly", function()
      local t0 = ums.now()
      local ok, err = pcall(ums.test, function() ums.sleep(100) end, 0.2)
      local took = ums.now() - t0
      assert.is_false(ok)
      assert.equal("ums.test: timed out after 0.2 s", err)
      assert.is_true(took >= 0.19, tostring(took))
      assert.is_true(took < 2, tostring(took))
    end)

    it("writes whole seconds without a fraction", function()
      local ok, err = pcall(ums.test, function() ums.sleep(100) end, 1)
      assert.is_false(ok)
      assert.equal("ums.test: timed out after 1 s", err)
    end)

    it("cancels fn and every other task", function()
      local log = {}
      local function closer(name)
        return setmetatable({}, {__close = function(_, e)
          log[name] = e
        end})
      end
      local ok, err = pcall(ums.test, function()
        local c <close> = closer("fn")
        ums.spawn(function()
          local c2 <close> = closer("child")
          ums.sleep(100)
        end)
        ums.spawn(function()
          ums.spawn(function()
            local c3 <close> = closer("grandchild")
            ums.sleep(100)
          end)
        end)
        ums.sleep(100)
      end, 0.1)
      assert.is_false(ok)
      assert.matches("timed out", err)
      assert.is_true(rawequal(ums.CANCELLED, log.fn))
      assert.is_true(rawequal(ums.CANCELLED, log.child))
      assert.is_true(rawequal(ums.CANCELLED, log.grandchild))
    end)

    it("when fn returned but a task it started is still running", function()
      local t0 = ums.now()
      local ok, err = pcall(ums.test, function()
        ums.spawn(function() ums.sleep(100) end)
        return "returned"
      end, 0.2)
      assert.is_false(ok)
      assert.equal("ums.test: timed out after 0.2 s", err)
      assert.is_true(ums.now() - t0 < 2)
    end)

    it("when fn stays busy, only yielding now and then", function()
      local ok, err = pcall(ums.test, function()
        while true do
          local t0 = ums.now()
          while ums.now() - t0 < 0.01 do end
          ums.yield()
        end
      end, 0.2)
      assert.is_false(ok)
      assert.matches("timed out", err)
    end)

    it("when fn computes without ever waiting (with preempt = true the "
       .. "quantum lets the watchdog run, the cancel reaches the loop)",
       function()
      ums.config{preempt = true}
      finally(function() ums.config{preempt = false} end)
      local t0 = ums.now()
      local ok, err = pcall(ums.test, function()
        local x = 0
        while true do x = x + 1 end
      end, 0.2)
      assert.is_false(ok)
      assert.equal("ums.test: timed out after 0.2 s", err)
      assert.is_true(ums.now() - t0 < 3)
    end)

    it("defaults to 10 s", function()
      local t0 = ums.now()
      local ok, err = pcall(ums.test, function() ums.sleep(100) end)
      local took = ums.now() - t0
      assert.is_false(ok)
      assert.equal("ums.test: timed out after 10 s", err)
      assert.is_true(took >= 9.9 and took < 15, tostring(took))
    end)
  end)

  describe("fails on an unjoined task error", function()
    it("naming the error, its traceback and the task", function()
      local ok, err = pcall(ums.test, function()
        local t = ums.spawn(function()
          local function background_failure() error("lost in background") end
          background_failure()
        end)
        t:name("bg-task")
        ums.yield()
      end)
      assert.is_false(ok)
      assert.equal("string", type(err))
      assert.matches("nobody joined", err)
      assert.matches("lost in background", err)
      assert.matches("background_failure", err)
      assert.matches("bg%-task", err)
    end)

    it("also for a non-string error", function()
      local ok, err = pcall(ums.test, function()
        ums.spawn(function() error(setmetatable({}, {__tostring = function()
          return "custom error object" end})) end)
      end)
      assert.is_false(ok)
      assert.matches("custom error object", err)
    end)

    it("but not for a joined one nor a cancelled one", function()
      local r = ums.test(function()
        local j = ums.spawn(function() error("joined") end)
        local c = ums.spawn(function() ums.sleep(100) end)
        ums.yield()
        c:cancel()
        assert(not j:join())
        assert(not c:join())
        -- cancelled and never joined
        local c2 = ums.spawn(function() ums.sleep(100) end)
        ums.yield()
        c2:cancel()
        return "fine"
      end)
      assert.equal("fine", r)
    end)
  end)

  describe("collects garbage", function()
    -- With the collector stopped, only an explicit collection runs
    -- finalizers: whether one ran says whether ums.test collected.
    local function finalized_after(opts)
      local flag = {done = false}
      collectgarbage("stop")
      local ok, err = pcall(ums.test, function()
        setmetatable({}, {__gc = function() flag.done = true end})
        ums.yield()
      end, opts)
      collectgarbage("restart")
      assert(ok, err)
      return flag.done
    end

    it("not by default: a test does not pay for the heap's size",
       function()
      assert.is_false(finalized_after(nil))
      assert.is_false(finalized_after({}))
    end)

    it("when asked (gc = true)", function()
      assert.is_true(finalized_after({gc = true}))
    end)

    it("when a failed work queue item nobody looked at may be garbage, "
       .. "so that its error fails the test", function()
      local ok, err = pcall(ums.test, function()
        local q = ums.workqueue{}
        local item = q:post(function() error("queue item failed") end)
        while item:status() ~= "error" do ums.sleep(0.001) end
      end)
      assert.is_false(ok)
      assert.matches("nobody joined", err)
      assert.matches("queue item failed", err)
    end)
  end)

  describe("leaves things as they were", function()
    it("restores the error handler, after a pass and after a failure",
       function()
      local prev = current_on_error()
      local calls = 0
      local mine = function() calls = calls + 1 end
      ums.on_error(mine)
      local ok1 = pcall(ums.test, function() end)
      local ok2 = pcall(ums.test, function()
        ums.spawn(function() error("x") end)
      end)
      local ok3 = pcall(ums.test, function() ums.sleep(100) end, 0.05)
      local after = current_on_error()
      ums.run(function() ums.spawn(function() error("after") end) end)
      ums.on_error(prev)
      assert.is_true(ok1)
      assert.is_false(ok2)
      assert.is_false(ok3)
      assert.is_true(rawequal(mine, after))
      assert.equal(1, calls)  -- only the run after the tests
    end)

    it("restores ums.spawn", function()
      local spawn = ums.spawn
      ums.test(function() end)
      pcall(ums.test, function() error("x") end)
      assert.is_true(rawequal(spawn, ums.spawn))
    end)

    -- A test's state lives in the helper, not in closures and tables
    -- made per call, and the run keeps its thread and task (rerun_spec):
    -- on a large heap, whatever a test allocates is traced again by the
    -- collector, test after test.
    it("allocates little from the Lua heap", function()
      local function empty() end
      ums.test(empty)
      ums.test(empty, {clock = "virtual"})
      collectgarbage()
      collectgarbage("stop")
      local ok, per_test = pcall(function()
        local before = collectgarbage("count")
        for _ = 1, 100 do ums.test(empty) end
        return (collectgarbage("count") - before) * 1024 / 100
      end)
      collectgarbage("restart")
      assert(ok, per_test)
      assert.is_true(per_test < 512, ("%.0f bytes per test"):format(per_test))
    end)

    it("forgets a failed test's tasks and errors", function()
      local ok, err = pcall(ums.test, function()
        ums.spawn(function() error("first") end)
      end)
      assert.is_false(ok)
      assert.matches("1 task%(s%) failed", err)
      local ok2, err2 = pcall(ums.test, function()
        ums.spawn(function() error("second") end)
      end)
      assert.is_false(ok2)
      assert.matches("1 task%(s%) failed", err2)
      assert.is_nil(err2:find("first", 1, true))
      assert.equal(3, ums.test(function() return 3 end))
    end)

    it("a later run works normally", function()
      pcall(ums.test, function() ums.sleep(100) end, 0.05)
      assert.equal(5, ums.run(function()
        return select(2, ums.spawn(function() return 5 end):join())
      end))
    end)
  end)

  describe("checks its arguments", function()
    it("fn must be a function", function()
      for _, v in ipairs{1, "f", {}, true} do
        local ok, err = pcall(ums.test, v)
        assert.is_false(ok)
        assert.matches("bad argument #1 to 'test'", err)
      end
      local ok, err = pcall(ums.test)
      assert.is_false(ok)
      assert.matches("bad argument #1 to 'test'", err)
    end)

    it("timeout must be a positive number", function()
      for _, v in ipairs{0, -1, 0 / 0, "1", true, {timeout = 0},
                         {timeout = "1"}} do
        local ok, err = pcall(ums.test, function() end, v)
        assert.is_false(ok, tostring(v))
        assert.matches("bad argument #2 to 'test'", err)
      end
      -- A table is the options form: {} takes every default.
      assert.is_nil(ums.test(function() end, {}))
    end)

    it("cannot be called inside a run", function()
      local ok, err
      ums.run(function()
        ok, err = pcall(ums.test, function() end)
      end)
      assert.is_false(ok)
      assert.matches("ums.test: cannot be called inside a task", err)
    end)
  end)
end)

describe("ums.test with submitted work (ums.submit)", function()
  local prev
  before_each(function()
    prev = ums.config().schedulers
    ums.config{schedulers = 2}
  end)
  after_each(function() ums.config{schedulers = prev} end)

  it("fails on timeout when the work never ends, and cancels it", function()
    local ok, err = pcall(ums.test, function()
      ums.submit(function() require("ums").sleep(1000) end)
    end, 0.5)
    assert.is_false(ok)
    assert.equal("ums.test: timed out after 0.5 s", err)
  end)

  it("fails when work nobody joined failed", function()
    local ok, err = pcall(ums.test, function()
      ums.submit(function() error("lost in another VM") end)
    end)
    assert.is_false(ok)
    assert.matches("1 task%(s%) failed and nobody joined them", err)
    assert.matches("lost in another VM", err)
  end)
end)

describe("ums.test's blocks (test.block)", function()
  local test = require "ums.test"

  it("waits for a block's tasks and reports its unjoined failures at "
     .. "its end, once", function()
    local log = {}
    local ok, err = pcall(ums.test, function()
      local t
      local ok1, err1 = pcall(test.block, function()
        t = ums.spawn(function()
          ums.sleep(0.01)
          error("lost in a block")
        end)
      end)
      log[#log + 1] = t:status()
      assert.is_false(ok1)
      assert.matches("1 task%(s%) failed and nobody joined them", err1)
      assert.matches("lost in a block", err1)
      -- Joined by the report: the run's end does not report it again.
      assert.equal(21, test.block(function()
        local joined = ums.spawn(function() error("joined") end)
        assert.is_false((joined:join()))
        return 21
      end))
    end)
    assert.is_true(ok, err)
    assert.same({"error"}, log)
  end)

  it("cancels a block's tasks when it raises", function()
    local t
    local ok, err = pcall(ums.test, function()
      test.block(function()
        t = ums.spawn(function() ums.sleep(3600) end)
        error("the block failed", 0)
      end)
    end)
    assert.is_false(ok)
    assert.matches("the block failed", err)
    assert.equal("cancelled", t:status())
  end)

  it("only in the test task of a ums.test run", function()
    assert.has_error(function() test.block(function() end) end,
      "ums.test.block: only in the test task of a ums.test run")
  end)
end)
