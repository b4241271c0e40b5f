-- Clean exit: os.exit(code[, true]) from inside a task with other tasks
-- parked, timers pending and runtime threads running, and lua_close at the
-- end of a script, keep the exit code and neither crash nor hang. Every
-- case runs in a subprocess (under `timeout`), REPEAT times, to catch
-- races between the exit and the runtime's threads.
local sp = require "subprocess"
local it = sp.guard(it, pending)

local REPEAT = tonumber(os.getenv("UMS_EXIT_REPEAT")) or 5

-- Puts the run into the state the exit must survive: tasks sleeping with
-- far timers, a task waiting in join, tasks parked where Lua cannot yield
-- (a bound worker), a task yielding in a loop, a CPU hog preempted by the
-- quantum (check asks for preemption), join timeouts pending, and (when ums.sync is there) tasks
-- parked on a channel and a mutex. busy{hog = false} leaves out the hog
-- (for runs without a quantum, and for runs that must cancel everything).
local BUSY = [[
local ums = require "ums"
local function busy(opts)
  opts = opts or {}
  local sleepers = {}
  for i = 1, 50 do sleepers[i] = ums.spawn(function() ums.sleep(1000 + i) end) end
  ums.spawn(function() return sleepers[1]:join() end)
  ums.spawn(function() return sleepers[2]:join(500) end)
  for _ = 1, 3 do
    ums.spawn(function()
      table.sort({5, 3, 1, 4, 2}, function(a, b) ums.sleep(1000); return a < b end)
    end)
  end
  ums.spawn(function() while true do ums.yield() end end)
  if opts.hog ~= false then
    ums.spawn(function() local x = 0; while true do x = x + 1 end end)
  end
  ums.spawn(function() while true do ums.sleep(0.001) end end)
  if ums.channel then
    local ch, m = ums.channel(), ums.mutex()
    ums.spawn(function() ch:recv() end)
    m:lock()
    ums.spawn(function() m:lock() end)
  end
  ums.sleep(0.02)  -- let every task reach its wait
end
]]

local function script(body)
  return sp.temp(BUSY .. body, ".lua")
end

-- Runs the script REPEAT times with lua5.4 (or the ums command) and checks
-- each exit. The runs ask for preemption (UMS_PREEMPT=1): busy()'s hog
-- never calls anything that can wait, so without it nothing else would
-- run once the hog is stepped.
local function check(body, code, opts)
  opts = opts or {}
  local s = script(body)
  local env = {UMS_PREEMPT = "1"}
  for k, v in pairs(opts.env or {}) do env[k] = v end
  local run_opts = {env = env, timeout = opts.timeout}
  for _ = 1, opts.times or REPEAT do
    local r = opts.ums and sp.ums({s}, run_opts) or sp.lua_run({s}, run_opts)
    sp.assert_exit(r, code)
    if opts.stdout then
      assert.equal(opts.stdout, r.stdout, sp.describe(r))
    end
  end
end

describe("clean exit", function()
  after_each(sp.cleanup)

  for _, close in ipairs{true, false} do
    local exit = ("os.exit(%%d%s)"):format(close and ", true" or "")
    local function ex(code) return exit:format(code) end

    describe(exit:format(7), function()
      it("from the main task, with every kind of task parked", function()
        check(([[
          ums.run(function()
            busy()
            io.stdout:write("exiting\n")
            %s
          end)
          print("not reached")
        ]]):format(ex(7)), 7, {stdout = "exiting\n"})
      end)

      it("from a spawned task while the main task joins it", function()
        check(([[
          ums.run(function()
            busy()
            local t = ums.spawn(function() ums.sleep(0.005); %s end)
            t:join()
          end)
        ]]):format(ex(7)), 7)
      end)

      it("from where Lua cannot yield (a bound worker)", function()
        check(([[
          ums.run(function()
            busy()
            table.sort({2, 1, 3}, function(a, b)
              ums.sleep(0.001)
              %s
            end)
          end)
        ]]):format(ex(7)), 7)
      end)

      it("from a task's <close> handler during cancellation", function()
        check(([[
          ums.run(function()
            busy()
            local armed = false
            local t = ums.spawn(function()
              local _ <close> = setmetatable({}, {__close = function() %s end})
              armed = true
              ums.sleep(1000)
            end)
            -- Cancel only once the <close> variable exists: a task
            -- cancelled before it starts never runs.
            repeat ums.sleep(0.001) until armed
            t:cancel()
            t:join()
          end)
        ]]):format(ex(7)), 7)
      end)

      it("with two schedulers", function()
        check(([[
          ums.config{schedulers = 2}
          ums.run(function()
            busy()
            %s
          end)
        ]]):format(ex(7)), 7)
      end)

      it("with the quantum off", function()
        check(([[
          ums.config{quantum = 0}
          ums.run(function()
            busy{hog = false}
            %s
          end)
        ]]):format(ex(7)), 7)
      end)

      it("with finalizers that run at the close", function()
        check(([[
          G = setmetatable({}, {__gc = function() io.stdout:write("gc\n") end})
          ums.run(function()
            busy()
            %s
          end)
        ]]):format(ex(7)), 7, {stdout = close and "gc\n" or ""})
      end)

      it("through the ums command", function()
        check(([[
          busy()
          io.stdout:write("exiting\n")
          %s
        ]]):format(ex(7)), 7, {ums = true, stdout = "exiting\n"})
      end)

      it("in the second run of a process", function()
        check(([[
          ums.run(function()
            for i = 1, 10 do ums.spawn(function() ums.sleep(0.001 * i) end) end
          end)
          ums.run(function()
            busy()
            %s
          end)
        ]]):format(ex(7)), 7)
      end)
    end)
  end

  it("os.exit(true) and os.exit(false) keep their meaning", function()
    check([[ums.run(function() busy(); os.exit(true, true) end)]], 0)
    check([[ums.run(function() busy(); os.exit(false, true) end)]], 1)
    check([[ums.run(function() busy(); os.exit(false) end)]], 1)
  end)

  it("os.exit(0) inside a task ends the process with 0", function()
    check([[ums.run(function() busy(); os.exit(0) end)]], 0)
  end)

  describe("after the run", function()
    it("lua_close at a normal end of a script is clean", function()
      check([[
        for _ = 1, 3 do
          ums.run(function()
            for i = 1, 20 do ums.spawn(function() ums.sleep(0.001 * i) end) end
            ums.spawn(function() for _ = 1, 1e5 do end end)
            table.sort({3, 1, 2}, function(a, b) ums.yield(); return a < b end)
          end)
        end
        print("done")
      ]], 0, {stdout = "done\n"})
    end)

    it("busted-style os.exit(0, true) after a run is clean", function()
      check([[
        ums.run(function()
          for i = 1, 20 do ums.spawn(function() ums.sleep(0.001 * i) end) end
        end)
        os.exit(0, true)
      ]], 0)
    end)

    it("os.exit(3, true) after a run that failed keeps 3", function()
      check([[
        local ok = pcall(ums.run, function()
          busy{hog = false}
          error("failed")
        end)
        assert(not ok)
        io.stdout:write("caught\n")
        os.exit(3, true)
      ]], 3, {stdout = "caught\n"})
    end)

    -- A failed run cancels its other tasks; a CPU-bound one that never
    -- waits must be cancelled at its next preemption, or the run (and the
    -- process) never ends.
    it("a run that failed ends even with a CPU-bound task", function()
      check([[
        local ok = pcall(ums.run, function() busy(); error("failed") end)
        io.stdout:write("caught\n")
        os.exit(3, true)
      ]], 3, {stdout = "caught\n", timeout = 5, times = 1})
    end)

    it("lua_close with a task object kept past its run is clean", function()
      check([[
        KEEP = {}
        ums.run(function()
          KEEP.t = ums.spawn(function() return 1 end)
          KEEP.c = ums.self()
          KEEP.t:join()
        end)
        KEEP.t:status(); KEEP.t:join()
      ]], 0)
    end)

    it("the ums command ends with 0 after its tasks finish", function()
      check([[
        for i = 1, 20 do ums.spawn(function() ums.sleep(0.001 * i) end) end
        ums.spawn(function() for _ = 1, 1e5 do end end)
      ]], 0, {ums = true})
    end)
  end)
end)
