-- Specs for ums.group (stdlib/ums/group.lua): spawn and wait, cancelling
-- the rest on the first error, <close> scopes (normal exit, exit by
-- error, a cancelled owner), tasks cancelled before they start, errors
-- never lost, and bad input. On the virtual clock unless a spec needs
-- real preemption.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")
local CANCELLED = ums.CANCELLED

local function run(body)
  return ums.test(body, { clock = "virtual" })
end

local function near(a, b) return math.abs(a - b) < 1e-6 end

local function fails(pattern, f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "no error")
  assert.matches(pattern, tostring(err))
  return err
end

describe("ums.group", function()
  it("runs tasks and waits for them all", function()
    run(function()
      local g = ums.group()
      local t0 = ums.now()
      local a = g:spawn(function(x) ums.sleep(1); return x * 2 end, 21)
      local b = g:spawn(function() ums.sleep(3); return "b" end)
      assert.equal(2, g:live())
      assert.is_true(g:wait())
      assert.is_true(near(ums.now() - t0, 3))
      assert.equal(0, g:live())
      assert.same({ true, 42 }, { a:join() })
      assert.same({ true, "b" }, { b:join() })
      assert.same({ a, b }, g:tasks())
      g:close()
    end)
  end)

  it("cancels the rest on the first error", function()
    run(function()
      local g = ums.group { name = "fetchers" }
      local t0 = ums.now()
      local slow1 = g:spawn(function() ums.sleep(10) end)
      local failing = g:spawn(function() ums.sleep(1); error("boom") end)
      local slow2 = g:spawn(function() ums.sleep(20) end)
      local ok, err, tb = g:wait()
      assert.is_false(ok)
      assert.matches("boom", err)
      assert.matches("stack traceback", tb)
      assert.is_true(near(ums.now() - t0, 1), "waited " .. ums.now() - t0)
      assert.equal("cancelled", slow1:status())
      assert.equal("cancelled", slow2:status())
      assert.equal("error", failing:status())
      assert.equal(1, #g:errors())
      g:close()  -- seen by wait: not raised again
    end)
  end)

  it("can let the others run on ({cancel_on_error = false})", function()
    run(function()
      local g = ums.group { cancel_on_error = false }
      local done = false
      g:spawn(function() ums.sleep(1); error("first") end)
      g:spawn(function() ums.sleep(2); error({ code = 2 }) end)
      g:spawn(function() ums.sleep(3); done = true end)
      local ok, err = g:wait()
      assert.is_false(ok)
      assert.matches("first", err)
      assert.is_true(done)
      local errs = g:errors()
      assert.equal(2, #errs)
      assert.equal(2, errs[2].err.code)  -- the value itself, not a string
      g:close()
    end)
  end)

  describe("as a <close> variable", function()
    it("waits for the tasks when the scope ends", function()
      run(function()
        local t0, finished = ums.now(), 0
        do
          local g <close> = ums.group()
          for i = 1, 3 do
            g:spawn(function() ums.sleep(i); finished = finished + 1 end)
          end
        end
        assert.equal(3, finished)
        assert.is_true(near(ums.now() - t0, 3))
      end)
    end)

    it("raises a failure nobody has seen when the scope ends", function()
      run(function()
        local other
        local err = fails("in the group", function()
          local g <close> = ums.group()
          other = g:spawn(function() ums.sleep(5) end)
          g:spawn(function() ums.sleep(1); error("in the group") end)
        end)
        -- With the failed task's traceback, and the rest cancelled.
        assert.matches("stack traceback", err)
        assert.equal("cancelled", other:status())
      end)
    end)

    it("cancels the tasks when the scope is left by an error, and the "
       .. "error goes on", function()
      run(function()
        local cleaned = 0
        local tasks
        local t0 = ums.now()
        local err = fails("scope failed", function()
          local g <close> = ums.group()
          for _ = 1, 3 do
            g:spawn(function()
              local c <close> = setmetatable({}, { __close = function()
                cleaned = cleaned + 1
              end })
              ums.sleep(100)
            end)
          end
          tasks = g:tasks()
          ums.sleep(1)
          error("scope failed")
        end)
        assert.is_string(err)
        -- The tasks were cancelled (their <close> ran) and waited for.
        assert.equal(3, cleaned)
        assert.is_true(near(ums.now() - t0, 1))
        for _, t in ipairs(tasks) do assert.equal("cancelled", t:status()) end
      end)
    end)

    it("in a cancelled task, cancels and waits for the group's tasks",
       function()
      run(function()
        local cleaned, owner_done = 0, false
        local owner = ums.spawn(function()
          local c <close> = setmetatable({}, { __close = function()
            owner_done = true
          end })
          local g <close> = ums.group()
          for _ = 1, 2 do
            g:spawn(function()
              local d <close> = setmetatable({}, { __close = function()
                cleaned = cleaned + 1
              end })
              ums.sleep(100)
            end)
          end
          ums.sleep(100)
        end)
        assert(ums.run_until_idle())
        owner:cancel()
        local ok, err = owner:join()
        assert.is_false(ok)
        assert.equal(CANCELLED, err)
        assert.is_true(owner_done)
        assert.equal(2, cleaned)
      end)
    end)
  end)

  describe("tasks cancelled before they start", function()
    it("do not keep the group waiting", function()
      run(function()
        local g = ums.group()
        local t = g:spawn(function() error("never runs") end)
        t:cancel()
        assert.is_true(g:wait())
        assert.equal("cancelled", t:status())
        g:close()
      end)
    end)

    it("a group cancelled before takes new tasks cancelled", function()
      run(function()
        local g = ums.group()
        g:cancel()
        local ran = false
        local t = g:spawn(function() ran = true end)
        assert.is_true(g:wait(1))
        assert.is_false(ran)
        assert.equal("cancelled", t:status())
        g:close()
      end)
    end)
  end)

  it("wait gives nil, 'timeout' after the timeout", function()
    run(function()
      local g = ums.group()
      g:spawn(function() ums.sleep(10) end)
      local t0 = ums.now()
      assert.same({ nil, "timeout" }, { g:wait(2.5) })
      assert.is_true(near(ums.now() - t0, 2.5))
      assert.same({ nil, "timeout" }, { g:wait(0) })
      assert.is_true(g:wait())
      g:close()
    end)
  end)

  it("never loses an error: a failure nobody waits for reaches on_error",
     function()
    local ok, err = pcall(ums.test, function()
      local g = ums.group()
      g:spawn(function() error("forgotten failure") end)
    end, { clock = "virtual" })
    assert.is_false(ok)
    assert.matches("nobody joined", err)
    assert.matches("forgotten failure", err)
  end)

  it("lets the quantum preempt a CPU-bound task (preempt = true)",
     function()
    -- Real clock: a loop that never waits ends only if another task runs
    -- meanwhile, which only preemption can arrange. (Bounded by the
    -- test's timeout: a hang fails, a slow machine does not.)
    ums.config{preempt = true}
    finally(function() ums.config{preempt = false} end)
    ums.test(function()
      local stop = false
      local g <close> = ums.group()
      g:spawn(function()
        local n = 0
        while not stop do n = n + 1 end
        return n
      end)
      g:spawn(function() ums.sleep(0.01); stop = true end)
    end, 20)
  end)

  describe("bad input", function()
    it("raises clear errors", function()
      run(function()
        fails("bad argument #1 to 'group' %(table expected, got number%)",
          ums.group, 5)
        fails("bad argument #1 to 'group' %(unknown field 'cancel'%)",
          ums.group, { cancel = true })
        fails("field 'cancel_on_error' must be a boolean, got string",
          ums.group, { cancel_on_error = "yes" })
        local g = ums.group()
        fails("bad argument #1 to 'spawn' %(function expected, got nil%)",
          function() local r = g:spawn(); return r end)
        local fake = setmetatable({}, { __index = require("ums.group").Group })
        fails("calling 'wait' on bad self %(ums.group expected, got table%)",
          function() local r = fake:wait(); return r end)
        fails("bad argument #1 to 'wait' %(timeout must be a non%-negative",
          function() local r = g:wait(-1); return r end)
        g:close()
        fails("ums.group:spawn: the group is closed", function()
          local r = g:spawn(print); return r end)
        local g2 = ums.group()
        local inner = g2:spawn(function() return g2:wait() end)
        local ok, err = inner:join()
        assert.is_false(ok)
        assert.matches("a task cannot wait for its own group", err)
        -- Its failure is the group's too: close would raise it, wait
        -- reports it.
        assert.is_false((g2:wait()))
        g2:close()
      end)
    end)
  end)
end)
