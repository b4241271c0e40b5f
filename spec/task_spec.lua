-- Tasks: spawn, join, errors, cancellation, status, names, locals, yield
-- and sleep ordering, the error handler, runs and configuration.
local ums = require "ums"

-- ums.on_error replaces the handler and has no getter: keep the one in
-- force (ums.core stores it in the registry) and put it back after a spec
-- that changes it.
local function current_on_error()
  return debug.getregistry()["ums.on_error"]
end

local function with_on_error(handler, body)
  local prev = current_on_error()
  ums.on_error(handler)
  local ok, err = pcall(body)
  ums.on_error(prev)
  if not ok then error(err, 0) end
end

local DEFAULTS = {
  schedulers = 1, max_workers = 0, quantum = 0.004, preempt = false,
  stack_size = 1024 * 1024,
  worker_idle_timeout = 10, idle_workers_kept = 16, io = "auto",
  io_threads = 0, preempt_threads = 0, clock = "real", deadlock = true,
  init = false,
  stats = true, stall_threshold = 1,
}

local function restore_config() ums.config(DEFAULTS) end

describe("ums.spawn and task:join", function()
  it("returns true and every result, nil in the middle included", function()
    ums.run(function()
      local t = ums.spawn(function(a, b) return a, nil, b, nil end, 1, 2)
      local r = table.pack(t:join())
      assert.equal(5, r.n)
      assert.is_true(r[1])
      assert.equal(1, r[2])
      assert.is_nil(r[3])
      assert.equal(2, r[4])
      assert.is_nil(r[5])
    end)
  end)

  it("passes arguments, nil in the middle included", function()
    ums.run(function()
      local t = ums.spawn(function(...)
        return select("#", ...), ...
      end, "a", nil, "c")
      local ok, n, a, b, c = t:join()
      assert.is_true(ok)
      assert.equal(3, n)
      assert.equal("a", a)
      assert.is_nil(b)
      assert.equal("c", c)
    end)
  end)

  it("returns just true for a task without results", function()
    ums.run(function()
      local r = table.pack(ums.spawn(function() end):join())
      assert.equal(1, r.n)
      assert.is_true(r[1])
    end)
  end)

  it("returns exactly one result, nil included, again on every join and "
     .. "after a collection", function()
    ums.run(function()
      local tbl = {}
      for _, v in ipairs{"one", false, tbl} do
        local t = ums.spawn(function() return v end)
        for _ = 1, 2 do
          local r = table.pack(t:join())
          assert.equal(2, r.n)
          assert.is_true(r[1])
          assert.is_true(rawequal(v, r[2]))
        end
        collectgarbage("collect")
        assert.is_true(rawequal(v, select(2, t:join())))
      end
      local t = ums.spawn(function() return nil end)
      local r = table.pack(t:join())
      assert.equal(2, r.n)
      assert.is_true(r[1])
      assert.is_nil(r[2])
      -- A named task keeps its one result beside its name.
      local named = ums.spawn(function() return 7 end)
      named:name("seven")
      assert.same({true, 7}, {named:join()})
      assert.equal("seven", named:name())
    end)
  end)

  it("returns one number, boolean or nil exactly, integer and float kept "
     .. "apart", function()
    ums.run(function()
      local cases = {0, 1, -1, math.maxinteger, math.mininteger, 1.0, -0.0,
                     0.5, math.huge, -math.huge, true, false}
      local tasks = {}
      for i, v in ipairs(cases) do
        tasks[i] = ums.spawn(function() return v end)
      end
      local nan = ums.spawn(function() return 0 / 0 end)
      local none = ums.spawn(function() return nil end)
      collectgarbage("collect")
      for i, v in ipairs(cases) do
        local r = table.pack(tasks[i]:join())
        assert.equal(2, r.n)
        assert.is_true(r[1])
        assert.equal(math.type(v), math.type(r[2]))
        assert.is_true(rawequal(v, r[2]))
        if v == 0 then assert.equal(1 / v, 1 / r[2]) end  -- -0.0 stays
      end
      local ok, v = nan:join()
      assert.is_true(ok)
      assert.is_true(v ~= v)
      local r = table.pack(none:join())
      assert.equal(2, r.n)
      assert.is_nil(r[2])
    end)
  end)

  it("keeps a handle's name, locals and collectable result as long as the "
     .. "handle, and no longer", function()
    -- Weak in its values: what is still in it after a full collection is
    -- kept by something.
    local results = setmetatable({}, {__mode = "v"})
    ums.run(function()
      local kept = {}
      for i = 1, 100 do
        local t = ums.spawn(function()
          local r = {i}
          results[i] = r
          return r
        end)
        t:name("t" .. i)
        t:locals().i = i
        if i % 10 == 0 then kept[#kept + 1] = t end
      end
      for _, t in ipairs(kept) do t:join() end
      collectgarbage("collect")
      collectgarbage("collect")
      local n = 0
      for _ in pairs(results) do n = n + 1 end
      assert.equal(#kept, n)
      for j, t in ipairs(kept) do
        local ok, v = t:join()
        assert.is_true(ok)
        assert.equal(10 * j, v[1])
        assert.equal("t" .. 10 * j, t:name())
        assert.equal(10 * j, t:locals().i)
        assert.equal("ums.task", getmetatable(t).__name)
      end
    end)
  end)

  it("collects a handle whose results and locals refer to itself",
     function()
    local handles = setmetatable({}, {__mode = "k"})
    ums.run(function()
      for i = 1, 50 do
        local t = ums.spawn(function()
          local me = ums.self()
          me:locals().me = me
          if i % 2 == 0 then return me, {me} end
          return me
        end)
        handles[t] = true
      end
      ums.yield()
      for t in pairs(handles) do assert.equal("done", t:status()) end
      collectgarbage("collect")
      collectgarbage("collect")
      assert.is_nil(next(handles))
    end)
  end)

  it("passes tables by identity", function()
    ums.run(function()
      local arg = {}
      local ok, back = ums.spawn(function(x) return x end, arg):join()
      assert.is_true(ok)
      assert.is_true(rawequal(arg, back))
    end)
  end)

  it("returns nil, 'timeout' when the task is still running, and a later "
     .. "join works", function()
    ums.run(function()
      -- The task waits until told, not for a time a loaded machine (or
      -- injected EINTR) could let pass before the checks below.
      local go = ums.event()
      local t = ums.spawn(function() go:wait(); return "late" end)
      local t0 = ums.now()
      local r = table.pack(t:join(0.01))
      assert.equal(2, r.n)
      assert.is_nil(r[1])
      assert.equal("timeout", r[2])
      assert.is_true(ums.now() - t0 >= 0.009)
      -- (that it returned "timeout" shows it did not wait for the task;
      -- the upper bound only catches a hang, not a slow machine)
      assert.is_true(ums.now() - t0 < 5)
      assert.equal("suspended", t:status())
      -- a zero timeout polls
      assert.same({nil, "timeout"}, {t:join(0)})
      go:set()
      local ok, v = t:join()
      assert.is_true(ok)
      assert.equal("late", v)
    end)
  end)

  it("polling join with a timeout many times does not disturb the task",
     function()
    ums.run(function()
      -- The task sleeps, then waits until the poller has timed out 20
      -- times: the count of polls does not hang on how fast the machine
      -- is (a loaded sanitizer run may take several ms per poll).
      local gate = ums.channel()
      local t = ums.spawn(function()
        local t0 = ums.now()
        ums.sleep(0.02)
        local slept = ums.now() - t0
        return gate:recv(), slept
      end)
      local polls, ok, v, slept = 0, nil, nil, nil
      while true do
        ok, v, slept = t:join(0.001)
        if ok then break end
        assert.is_nil(ok)
        assert.equal("timeout", v)
        polls = polls + 1
        if polls == 20 then gate:send("opened") end
        assert.is_true(polls < 100000)
      end
      assert.is_true(polls >= 20)
      assert.equal("opened", v)
      -- the joiner's timeouts did not cut the task's sleep short
      assert.is_true(slept >= 0.0195)
    end)
  end)

  it("join of a finished task returns the same results again", function()
    ums.run(function()
      local tbl = {}
      local t = ums.spawn(function() return 1, tbl, "x" end)
      local a = table.pack(t:join())
      local b = table.pack(t:join())
      local c = table.pack(t:join(0))
      for _, r in ipairs{b, c} do
        assert.equal(a.n, r.n)
        for i = 1, a.n do assert.is_true(rawequal(a[i], r[i])) end
      end
      assert.is_true(rawequal(tbl, b[3]))
      local e = ums.spawn(function() error("again") end)
      local ok1, err1, tb1 = e:join()
      local ok2, err2, tb2 = e:join()
      assert.is_false(ok1)
      assert.is_false(ok2)
      assert.equal(err1, err2)
      assert.equal(tb1, tb2)
    end)
  end)

  it("several tasks can join the same task", function()
    ums.run(function()
      local t = ums.spawn(function() ums.sleep(0.01); return "v" end)
      local js = {}
      for i = 1, 5 do js[i] = ums.spawn(function() return t:join() end) end
      for i = 1, 5 do
        local ok, ok2, v = js[i]:join()
        assert.is_true(ok)
        assert.is_true(ok2)
        assert.equal("v", v)
      end
    end)
  end)

  -- Each joiner waits on the joined task's queue with its own wait node;
  -- one whose join timed out or was cancelled takes its node off before
  -- it goes on. The ended joiners' records then serve tasks that wait on
  -- a channel with the same node: a node left behind on the joined
  -- task's queue would get those tasks woken by its end, or its queue
  -- walked into the channel's.
  it("1,000 joiners of one task, half timed out and a quarter cancelled "
     .. "before its end: each of the rest gets its results", function()
    ums.run(function()
      local n = 1000
      local go = ums.event()
      local t = ums.spawn(function() go:wait(); return "v", 2 end)
      local js = {}
      for i = 1, n do
        if i % 2 == 0 then
          js[i] = ums.spawn(function() return t:join(0.001) end)
        else
          js[i] = ums.spawn(function() return t:join() end)
        end
      end
      for i = 2, n, 2 do
        local r = table.pack(js[i]:join())
        assert.same({n = 3, true, nil, "timeout"}, r)
      end
      for i = 1, n, 4 do assert.is_true(js[i]:cancel()) end
      for i = 1, n, 4 do
        local ok, err = js[i]:join()
        assert.is_false(ok)
        assert.is_true(rawequal(ums.CANCELLED, err))
      end
      local ch = ums.channel()
      local rs = {}
      for i = 1, n // 2 do
        rs[i] = ums.spawn(function() return ch:recv() end)
      end
      ums.yield()
      go:set()
      for i = 3, n, 4 do
        local r = table.pack(js[i]:join())
        assert.same({n = 4, true, true, "v", 2}, r)
      end
      assert.same({true, "v", 2}, {t:join()})
      -- Each receiver gets one of the values (which one depends on the
      -- order the receivers reached the channel), none twice.
      for i = 1, n // 2 do ch:send(i) end
      local got = {}
      for i = 1, n // 2 do
        local ok, v = rs[i]:join()
        assert.is_true(ok)
        assert.is_nil(got[v])
        got[v] = true
      end
      for i = 1, n // 2 do assert.is_true(got[i]) end
    end)
  end)

  it("a join that timed out leaves nothing behind for a later join, "
     .. "wait or end of the task", function()
    ums.run(function()
      local go = ums.event()
      local t = ums.spawn(function() go:wait(); return "late" end)
      -- The same task joins with a timeout, then waits on a channel (the
      -- same wait node), then joins again.
      local ch = ums.channel()
      local j = ums.spawn(function()
        local r1 = table.pack(t:join(0.001))
        local v = ch:recv()
        return r1, v, t:join()
      end)
      ums.sleep(0.01)
      go:set()
      ums.yield()
      assert.equal("done", t:status())
      ch:send("sent")
      local ok, r1, v, ok2, late = j:join()
      assert.is_true(ok)
      assert.same({n = 2, nil, "timeout"}, r1)
      assert.equal("sent", v)
      assert.is_true(ok2)
      assert.equal("late", late)
    end)
  end)

  it("join of a finished task works after its run ended", function()
    local t = ums.run(function()
      local t = ums.spawn(function() return 7 end)
      t:join()
      return t
    end)
    local ok, v = t:join()
    assert.is_true(ok)
    assert.equal(7, v)
    assert.equal("done", t:status())
  end)

  -- Each task used to keep its runtime slot (~350 bytes of C memory) until
  -- the run ended; a long-running program that spawns forever grew
  -- without bound. The resident size must not grow with the number of
  -- tasks once they have ended.
  -- (Not under a sanitizer: ASan keeps freed memory in quarantine.)
  local sanitized = (os.getenv("LD_PRELOAD") or ""):find("san") ~= nil
  ;(sanitized and pending or it)(
    "finished tasks give their memory back during the run", function()
    local function rss_kb()
      local f = assert(io.open("/proc/self/statm"))
      local pages = f:read("n") and f:read("n")
      f:close()
      return pages * 4
    end
    ums.run(function()
      local function batch(n)
        local ts = {}
        for i = 1, n do ts[i] = ums.spawn(function() end) end
        for i = 1, n do ts[i]:join() end
      end
      for _ = 1, 20 do batch(1000) end  -- warm up pools and the heap
      collectgarbage()
      local before = rss_kb()
      for _ = 1, 300 do batch(1000) end
      collectgarbage()
      local grown = rss_kb() - before
      assert(grown < 16 * 1024, ("RSS grew by %d KiB over 300,000 tasks")
        :format(grown))
    end)
  end)

  -- More tasks live at once than the pool of finished coroutines keeps:
  -- those ending beyond it are freed at once, with their joiners and
  -- failed outcomes (a sanitizer build reports anything left behind).
  it("tasks ending while the pool is full keep their outcomes for every "
     .. "joiner", function()
    -- spec/pool_full.lua holds the scenario (ctest also runs it strictly,
    -- with leak detection under ASan).
    require("pool_full").run(ums, false)
  end)

  -- Arguments and results move between stacks that lua_xmove does not
  -- grow: a new coroutine's, one that a failed task's end shrank, the
  -- scheduler's own.
  it("passes and returns more values than a new or reused coroutine holds",
     function()
    local vals = {}
    for i = 1, 480 do vals[i] = i end
    local function echo(...) return ... end
    ums.run(function()
      for round = 1, 3 do
        -- Failed tasks leave shrunk coroutines in the pool.
        local fails = {}
        for i = 1, 8 do fails[i] = ums.spawn(error, "boom", 0) end
        for i = 1, 8 do assert.is_false((fails[i]:join())) end
        local hs = {}
        for i = 1, 8 do
          hs[i] = ums.spawn(echo, table.unpack(vals, 1, 20 * i * round))
        end
        for i = 1, 8 do
          local r = table.pack(hs[i]:join())
          assert.equal(1 + 20 * i * round, r.n)
          assert.is_true(r[1])
          assert.equal(20 * i * round, r[r.n])
        end
      end
    end)
  end)

  -- A task spawned while no finished coroutine is pooled gets its
  -- coroutine when it first runs: until then it holds its function and
  -- arguments only, far less than a coroutine.
  it("tasks spawned before any runs hold no coroutine until they start, "
     .. "and get their arguments", function()
    local N = 2000
    local function lua_bytes()
      collectgarbage()
      collectgarbage()
      return collectgarbage("count") * 1024
    end
    local function body(...) return select("#", ...), ... end
    local many = {}
    for i = 1, 60 do many[i] = i end
    local keep = {}
    local base = lua_bytes()
    for i = 1, N do keep[i] = coroutine.create(body) end
    local per_co = (lua_bytes() - base) / N
    keep = nil
    ums.config{stall_threshold = 0}
    local ok, err = pcall(ums.run, function()
      local hs = {}
      base = lua_bytes()
      for i = 1, N do
        if i % 4 == 0 then
          hs[i] = ums.spawn(body)
        elseif i % 4 == 1 then
          hs[i] = ums.spawn(body, i)
        elseif i % 4 == 2 then
          hs[i] = ums.spawn(body, i, nil, "x")
        else
          hs[i] = ums.spawn(body, table.unpack(many))
        end
      end
      local per_task = (lua_bytes() - base) / N
      assert(per_task < per_co / 2, ("%.0f bytes a pending task, %.0f a "
        .. "coroutine"):format(per_task, per_co))
      -- One pending task cancelled, one asked about: neither has run.
      assert.equal("pending", hs[N - 1]:status())
      assert.equal("stack traceback:", hs[N - 2]:info().traceback)
      assert.is_true(hs[N - 1]:cancel())
      for i = 1, N do
        local r = table.pack(hs[i]:join())
        if i == N - 1 then
          assert.is_false(r[1])
          assert.is_true(rawequal(ums.CANCELLED, r[2]))
        elseif i % 4 == 0 then
          assert.same({n = 2, true, 0}, r)
        elseif i % 4 == 1 then
          assert.same({n = 3, true, 1, i}, r)
        elseif i % 4 == 2 then
          assert.same({n = 5, true, 3, i, nil, "x"}, r)
        else
          assert.equal(62, r.n)
          assert.equal(60, r[2])
          for k = 1, 60 do assert.equal(k, r[k + 2]) end
        end
      end
    end)
    restore_config()
    assert(ok, err)
  end)

  it("does not pass a task's debug hook on to the next task on its coroutine",
     function()
    -- No quantum and no stall detection: under TSan either would set a
    -- polling hook for every step.
    ums.config{quantum = 0, stall_threshold = 0}
    local ok, err = pcall(ums.run, function()
      local function hooked() debug.sethook(function() end, "", 1000) end
      local function look() return (debug.gethook()) end
      for _ = 1, 3 do
        assert.is_true(ums.spawn(hooked):join())
        -- Finished coroutines are pooled last in, first out: this task
        -- runs on the coroutine the one before left its hook on.
        local jok, hook = ums.spawn(look):join()
        assert.is_true(jok)
        assert.is_nil(hook)
      end
    end)
    restore_config()
    assert(ok, err)
  end)

  it("a task cannot join itself", function()
    ums.run(function()
      local ok, err = pcall(function() return ums.self():join() end)
      assert.is_false(ok)
      assert.matches("cannot join itself", err)
    end)
  end)
end)

describe("errors through join", function()
  local function explode(v) error(v, 0) end

  -- Every kind of error value; error(nil) and error(false) included.
  local values = {
    {"a table", {}},
    {"an integer", 42},
    {"a large integer", math.maxinteger},
    {"a float", 2.5},
    {"true", true},
    {"false", false},
    {"nil", nil},
    {"a function", function() end},
    {"a coroutine", coroutine.create(function() end)},
    {"a string without position", "plain"},
  }
  for _, case in ipairs(values) do
    it("keeps the identity of " .. case[1], function()
      local v = case[2]
      ums.run(function()
        local t = ums.spawn(function() explode(v) end)
        local r = table.pack(t:join())
        assert.equal(3, r.n)
        assert.is_false(r[1])
        assert.equal(type(v), type(r[2]))
        assert.equal(math.type(v), math.type(r[2]))
        assert.is_true(rawequal(v, r[2]),
          ("got %s (%s)"):format(tostring(r[2]), type(r[2])))
        assert.equal("string", type(r[3]))
        assert.matches("stack traceback", r[3])
        assert.matches("explode", r[3])
        assert.equal("error", t:status())
      end)
    end)
  end

  it("a string error keeps its position and the traceback names the "
     .. "functions", function()
    ums.run(function()
      local function inner_failing_function() error("boom") end
      local t = ums.spawn(function() inner_failing_function() end)
      local ok, err, tb = t:join()
      assert.is_false(ok)
      assert.matches("^.-task_spec%.lua:%d+: boom$", err)
      assert.matches("inner_failing_function", tb)
      assert.matches("task_spec%.lua:%d+", tb)
    end)
  end)

  it("an error after a wait is reported the same way", function()
    ums.run(function()
      local e = {}
      local t = ums.spawn(function() ums.sleep(0.001); ums.yield(); error(e) end)
      local ok, err, tb = t:join()
      assert.is_false(ok)
      assert.is_true(rawequal(e, err))
      assert.matches("task_spec%.lua", tb)
    end)
  end)
end)

describe("task:cancel", function()
  it("a sleeping task's join gives false, ums.CANCELLED, traceback", function()
    ums.run(function()
      local reached = false
      local t = ums.spawn(function() ums.sleep(100); reached = true end)
      ums.yield()
      assert.equal("suspended", t:status())
      local t0 = ums.now()
      assert.is_true(t:cancel())
      local ok, err, tb = t:join()
      assert.is_true(ums.now() - t0 < 1)
      assert.is_false(ok)
      assert.is_true(rawequal(ums.CANCELLED, err))
      assert.equal("task cancelled", tostring(err))
      assert.equal("string", type(tb))
      assert.is_false(reached)
      assert.equal("cancelled", t:status())
    end)
  end)

  it("a task cancelled before it started never runs", function()
    ums.run(function()
      local ran = false
      local t = ums.spawn(function() ran = true end)
      assert.equal("pending", t:status())
      assert.is_true(t:cancel())
      local ok, err = t:join()
      assert.is_false(ok)
      assert.is_true(rawequal(ums.CANCELLED, err))
      assert.is_false(ran)
      assert.equal("cancelled", t:status())
    end)
    -- nor after its run ended
  end)

  it("cancelling a finished task returns false and changes nothing",
     function()
    ums.run(function()
      local t = ums.spawn(function() return 1 end)
      t:join()
      assert.is_false(t:cancel())
      assert.equal("done", t:status())
      local ok, v = t:join()
      assert.is_true(ok)
      assert.equal(1, v)
    end)
  end)

  it("a task sees ums.CANCELLED at its wait and can catch it", function()
    ums.run(function()
      local seen
      local t = ums.spawn(function()
        local _, err = pcall(ums.sleep, 100)
        seen = err
        -- every later wait fails the same way
        local ok2, err2 = pcall(ums.yield)
        assert(not ok2 and rawequal(err2, ums.CANCELLED))
        return "caught"
      end)
      ums.yield()
      t:cancel()
      local ok, v = t:join()
      assert.is_true(ok)
      assert.equal("caught", v)
      assert.is_true(rawequal(ums.CANCELLED, seen))
      assert.equal("done", t:status())
    end)
  end)

  it("cancels a task waiting in join", function()
    ums.run(function()
      local long = ums.spawn(function() ums.sleep(100) end)
      local j = ums.spawn(function() return long:join() end)
      ums.yield()
      j:cancel()
      local ok, err = j:join()
      assert.is_false(ok)
      assert.is_true(rawequal(ums.CANCELLED, err))
      assert.equal("suspended", long:status())
      long:cancel()
      long:join()
    end)
  end)

  it("cancels a task that only yields", function()
    ums.run(function()
      local n = 0
      local t = ums.spawn(function() while true do n = n + 1; ums.yield() end end)
      for _ = 1, 3 do ums.yield() end
      t:cancel()
      local ok, err = t:join()
      assert.is_false(ok)
      assert.is_true(rawequal(ums.CANCELLED, err))
      assert.is_true(n >= 1)
    end)
  end)
end)

describe("<close> variables", function()
  local function closer(log, name)
    return setmetatable({}, {__close = function(_, err)
      log[#log + 1] = {name, err}
    end})
  end

  it("run when a task is cancelled, innermost first, with ums.CANCELLED",
     function()
    ums.run(function()
      local log = {}
      local t = ums.spawn(function()
        local a <close> = closer(log, "a")
        do
          local b <close> = closer(log, "b")
          ums.sleep(100)
        end
      end)
      ums.yield()
      t:cancel()
      t:join()
      assert.equal(2, #log)
      assert.equal("b", log[1][1])
      assert.equal("a", log[2][1])
      assert.is_true(rawequal(ums.CANCELLED, log[1][2]))
      assert.is_true(rawequal(ums.CANCELLED, log[2][2]))
    end)
  end)

  it("run before join returns", function()
    ums.run(function()
      local closed = false
      local t = ums.spawn(function()
        local c <close> = setmetatable({}, {__close = function()
          closed = true
        end})
        ums.sleep(100)
      end)
      ums.yield()
      t:cancel()
      t:join()
      assert.is_true(closed)
    end)
  end)

  it("run when a task errors, with the error", function()
    ums.run(function()
      local log = {}
      local e = {}
      local t = ums.spawn(function()
        local a <close> = closer(log, "a")
        ums.yield()
        error(e)
      end)
      local ok, err = t:join()
      assert.is_false(ok)
      assert.is_true(rawequal(e, err))
      assert.equal(1, #log)
      assert.is_true(rawequal(e, log[1][2]))
    end)
  end)

  it("may wait when the task errors (the wait parks only that task)",
     function()
    ums.run(function()
      local n, stop = 0, false
      local counter = ums.spawn(function()
        while not stop do n = n + 1; ums.yield() end
      end)
      local progress
      local t = ums.spawn(function()
        local a <close> = setmetatable({}, {__close = function()
          local n0 = n
          ums.sleep(0.01)
          progress = n - n0
        end})
        error("x")
      end)
      local ok = t:join()
      stop = true
      counter:join()
      assert.is_false(ok)
      assert.is_true(progress and progress > 0)
    end)
  end)

  it("an error raised by a <close> handler of a failing task is not lost",
     function()
    -- Lua's own rule: the error of a __close handler replaces the error
    -- being propagated. Either the join shows it or the error handler gets
    -- it; it must not vanish.
    local reported = {}
    with_on_error(function(err) reported[#reported + 1] = err end, function()
      ums.run(function()
        local t = ums.spawn(function()
          local a <close> = setmetatable({}, {__close = function()
            error("from close", 0)
          end})
          error("first", 0)
        end)
        local ok, err = t:join()
        assert.is_false(ok)
        local seen = err == "from close"
        for _, r in ipairs(reported) do
          if r == "from close" then seen = true end
        end
        assert.is_true(seen, "the __close error was lost (join gave "
                              .. tostring(err) .. ")")
      end)
    end)
  end)
end)

describe("task:status", function()
  it("goes pending, running, suspended, done", function()
    ums.run(function()
      local inside
      local t = ums.spawn(function()
        inside = ums.self():status()
        ums.sleep(0.01)
      end)
      assert.equal("pending", t:status())
      ums.yield()
      assert.equal("running", inside)
      assert.equal("suspended", t:status())
      t:join()
      assert.equal("done", t:status())
      assert.equal("running", ums.self():status())
    end)
  end)

  it("is suspended for a task that yielded", function()
    ums.run(function()
      local t = ums.spawn(function() for _ = 1, 5 do ums.yield() end end)
      ums.yield()
      assert.equal("suspended", t:status())
      t:join()
    end)
  end)

  it("is error and cancelled for those outcomes", function()
    ums.run(function()
      local e = ums.spawn(function() error("x") end)
      local c = ums.spawn(function() ums.sleep(100) end)
      ums.yield()
      c:cancel()
      e:join()
      c:join()
      assert.equal("error", e:status())
      assert.equal("cancelled", c:status())
    end)
  end)

  it("is error, not cancelled, for a task that raised another value after "
     .. "being cancelled", function()
    ums.run(function()
      local c = ums.spawn(function()
        pcall(ums.sleep, 100)
        error("mine")
      end)
      ums.yield()
      c:cancel()
      local ok, err = c:join()
      assert.is_false(ok)
      assert.matches("mine", err)
      assert.equal("error", c:status())
    end)
  end)
end)

describe("task names and ids", function()
  it("names a task, read inside and outside", function()
    ums.run(function()
      local t = ums.spawn(function()
        ums.yield()
        return ums.self():name()
      end)
      assert.equal("", t:name())
      assert.equal("worker-1", t:name("worker-1"))
      assert.equal("worker-1", t:name())
      assert.matches("worker%-1", tostring(t))
      local ok, name = t:join()
      assert.is_true(ok)
      assert.equal("worker-1", name)
      -- a task may rename itself
      local ok2, n2 = ums.spawn(function()
        ums.self():name("self-named")
        return ums.self():name()
      end):join()
      assert.is_true(ok2)
      assert.equal("self-named", n2)
    end)
  end)

  it("refuses names that are too long or not strings", function()
    ums.run(function()
      local t = ums.spawn(function() end)
      assert.has_error(function() t:name(string.rep("x", 32)) end)
      assert.has_error(function() t:name({}) end)
      assert.equal(string.rep("y", 31), t:name(string.rep("y", 31)))
      t:join()
    end)
  end)

  it("gives every task a distinct integer id", function()
    ums.run(function()
      local seen = {[ums.self():id()] = true}
      assert.equal("integer", math.type(ums.self():id()))
      local ts = {}
      for i = 1, 50 do ts[i] = ums.spawn(function() end) end
      for i = 1, 50 do
        local id = ts[i]:id()
        assert.equal("integer", math.type(id))
        assert.is_nil(seen[id])
        seen[id] = true
        ts[i]:join()
      end
    end)
  end)
end)

describe("ums.self", function()
  it("is the task object spawn returned", function()
    ums.run(function()
      local me
      local t = ums.spawn(function() me = ums.self() end)
      t:join()
      assert.is_true(rawequal(t, me))
      assert.is_not_nil(ums.self())
      assert.is_false(rawequal(t, ums.self()))
    end)
  end)

  it("is nil outside tasks", function()
    assert.is_nil(ums.self())
  end)
end)

describe("task-local storage", function()
  it("is per task and survives waits", function()
    ums.run(function()
      local function body(v)
        ums.locals().v = v
        ums.sleep(0.005)
        ums.yield()
        return ums.locals().v, rawequal(ums.locals(), ums.self():locals())
      end
      local ts = {}
      for i = 1, 5 do ts[i] = ums.spawn(body, i) end
      ums.locals().v = "main"
      for i = 1, 5 do
        local ok, v, same = ts[i]:join()
        assert.is_true(ok)
        assert.equal(i, v)
        assert.is_true(same)
        assert.equal(i, ts[i]:locals().v)
      end
      assert.equal("main", ums.locals().v)
    end)
  end)

  it("a new task starts with an empty table (also on a reused coroutine)",
     function()
    ums.run(function()
      for _ = 1, 20 do
        local ok, empty = ums.spawn(function()
          local e = next(ums.locals()) == nil
          ums.locals().x = 1
          return e
        end):join()
        assert.is_true(ok)
        assert.is_true(empty)
      end
    end)
  end)

  it("ums.locals raises outside a task", function()
    local ok, err = pcall(ums.locals)
    assert.is_false(ok)
    assert.matches("not inside a task", err)
  end)
end)

describe("ordering", function()
  -- Three tasks that each log three rounds and let the others run with
  -- pass(i) between rounds: the log of a fair round-robin.
  local function rounds(pass)
    local log = {}
    ums.run(function()
      local ts = {}
      for i = 1, 3 do
        ts[i] = ums.spawn(function()
          for r = 1, 3 do
            log[#log + 1] = i .. ":" .. r
            pass(i)
          end
        end)
      end
      for i = 1, 3 do ts[i]:join() end
    end)
    assert.same({"1:1", "2:1", "3:1", "1:2", "2:2", "3:2", "1:3", "2:3",
                 "3:3"}, log)
  end

  it("ums.yield runs the ready tasks round-robin", function()
    rounds(function() ums.yield() end)
  end)

  it("a sleep shorter than a switch lets the others run, as ums.yield does",
     function()
    -- Its timer is due when it is armed: the task must queue as a yield
    -- does, not ahead of the run queue.
    rounds(function(i)
      if i == 2 then ums.yield() else ums.sleep(1e-9) end
    end)
  end)

  it("ums.yield lets a task started later run before the yielder resumes",
     function()
    local log = {}
    ums.run(function()
      ums.spawn(function() log[#log + 1] = "child" end)
      log[#log + 1] = "before"
      ums.yield()
      log[#log + 1] = "after"
    end)
    assert.same({"before", "child", "after"}, log)
  end)

  it("ums.sleep wakes tasks in deadline order", function()
    local log = {}
    ums.run(function()
      local ts = {}
      for i, d in ipairs{0.08, 0.02, 0.05, 0, 0.035} do
        ts[i] = ums.spawn(function()
          ums.sleep(d)
          log[#log + 1] = d
        end)
      end
      for i = 1, #ts do ts[i]:join() end
    end)
    assert.same({0, 0.02, 0.035, 0.05, 0.08}, log)
  end)

  it("ums.sleep waits at least the time asked", function()
    ums.run(function()
      for _, d in ipairs{0, 0.001, 0.02} do
        local t0 = ums.now()
        ums.sleep(d)
        assert.is_true(ums.now() - t0 >= d * 0.99)
      end
    end)
  end)

  it("ums.now is monotonic seconds", function()
    local a = ums.now()
    assert.equal("number", type(a))
    ums.run(function() ums.sleep(0.01) end)
    assert.is_true(ums.now() - a >= 0.0099)
  end)
end)

describe("ums.on_error", function()
  it("gets (err, traceback, task) for every failed task nobody joined, "
     .. "and nothing else", function()
    local calls = {}
    local unjoined_str, unjoined_tbl, joined, cancelled
    local tbl_err = {}
    with_on_error(function(err, tb, task)
      calls[#calls + 1] = {err = err, tb = tb, task = task}
    end, function()
      ums.run(function()
        unjoined_str = ums.spawn(function() error("lost one") end)
        unjoined_tbl = ums.spawn(function() ums.yield(); error(tbl_err) end)
        joined = ums.spawn(function() error("joined one") end)
        cancelled = ums.spawn(function() ums.sleep(100) end)
        ums.spawn(function() return "fine" end)
        ums.yield()
        cancelled:cancel()
        joined:join()
        -- the handler runs at the end of the run, not before
        assert.equal(0, #calls)
      end)
    end)
    assert.equal(2, #calls)
    local by_task = {}
    for _, c in ipairs(calls) do by_task[c.task] = c end
    local s = by_task[unjoined_str]
    assert.is_not_nil(s)
    assert.matches("lost one", s.err)
    assert.equal("string", type(s.tb))
    assert.matches("task_spec%.lua", s.tb)
    local t = by_task[unjoined_tbl]
    assert.is_not_nil(t)
    assert.is_true(rawequal(tbl_err, t.err))
    assert.equal("string", type(t.tb))
    assert.is_nil(by_task[joined])
    assert.is_nil(by_task[cancelled])
  end)

  -- A server's run may never end: an error of a task whose handle is
  -- dropped must not wait for the end of the run to be seen.
  it("reports a dropped failed task as soon as its handle is collected",
     function()
    local calls = {}
    with_on_error(function(err) calls[#calls + 1] = err end, function()
      ums.run(function()
        ums.spawn(function() error("dropped") end)
        ums.yield()  -- it fails; nobody holds its handle
        collectgarbage()
        collectgarbage()
        assert.equal(1, #calls)
        assert.matches("dropped", calls[1])
      end)
    end)
    assert.equal(1, #calls)  -- and not a second time at the end
  end)

  it("reports a dropped failed task that was named before or after it "
     .. "failed, once", function()
    local calls = {}
    with_on_error(function(err, _, task)
      calls[#calls + 1] = task:name() .. ": " .. tostring(err)
    end, function()
      ums.run(function()
        ums.spawn(function()
          ums.self():name("before")
          ums.self():locals().x = 1
          error("first")
        end)
        local after = ums.spawn(function() error("second") end)
        ums.yield()  -- both fail
        after:name("after")
        after = nil
        collectgarbage()
        collectgarbage()
        table.sort(calls)
        assert.equal(2, #calls)
        assert.matches("^after: .*second", calls[1])
        assert.matches("^before: .*first", calls[2])
      end)
    end)
    assert.equal(2, #calls)  -- and not again at the end
  end)

  it("is not given the first task's error: ums.run raises it", function()
    local calls = 0
    with_on_error(function() calls = calls + 1 end, function()
      assert.has_error(function()
        ums.run(function() error("main fails") end)
      end)
      -- nor when its handle is collected (it was reported by raising)
      collectgarbage()
      collectgarbage()
    end)
    assert.equal(0, calls)
  end)

  it("reports an unjoined error once, not again in the next run", function()
    local calls = 0
    with_on_error(function() calls = calls + 1 end, function()
      ums.run(function() ums.spawn(function() error("x") end) end)
      ums.run(function() end)
    end)
    assert.equal(1, calls)
  end)

  it("an error inside the handler does not stop the others", function()
    local calls = 0
    with_on_error(function()
      calls = calls + 1
      error("handler fails")
    end, function()
      ums.run(function()
        ums.spawn(function() error("a") end)
        ums.spawn(function() error("b") end)
      end)
    end)
    assert.equal(2, calls)
  end)

  it("requires a function", function()
    assert.has_error(function() ums.on_error(nil) end)
    assert.has_error(function() ums.on_error("x") end)
  end)
end)

describe("waits outside a task", function()
  local cases = {
    {"sleep", function() return ums.sleep(0) end},
    {"yield", function() return ums.yield() end},
    {"spawn", function() return ums.spawn(function() end) end},
    {"park_begin", function() return ums.park_begin() end},
    {"park_wait", function() return ums.park_wait() end},
  }
  for _, c in ipairs(cases) do
    it("ums." .. c[1] .. " raises 'not inside a task'", function()
      local ok, err = pcall(c[2])
      assert.is_false(ok)
      assert.equal("string", type(err))
      assert.matches("not inside a task", err)
    end)
  end

  it("join of a finished task works outside any run", function()
    local t
    ums.run(function()
      t = ums.spawn(function() ums.sleep(100) end)
      ums.yield()
      t:cancel()
    end)
    local ok, err = t:join()
    assert.is_false(ok)
    assert.is_true(rawequal(ums.CANCELLED, err))
  end)
end)

describe("ums.run", function()
  it("returns the first task's results", function()
    local r = table.pack(ums.run(function(a, b) return b, nil, a end, 1, 2))
    assert.equal(3, r.n)
    assert.equal(2, r[1])
    assert.is_nil(r[2])
    assert.equal(1, r[3])
  end)

  it("waits for every task of the run", function()
    local done = 0
    ums.run(function()
      for i = 1, 10 do
        ums.spawn(function() ums.sleep(0.001 * i); done = done + 1 end)
      end
    end)
    assert.equal(10, done)
  end)

  it("called from a task, runs fn as a task of the same run and waits "
     .. "for it", function()
    local got = {}
    ums.run(function()
      local outer = ums.self()
      got.results = table.pack(ums.run(function(a, b)
        got.inner = ums.self()
        ums.sleep(0.001)
        return a + b, "sum"
      end, 20, 22))
      got.outer = outer
      -- Its error comes back as ums.run's own: a string with the
      -- traceback, any other value as it is.
      got.ok, got.err = pcall(ums.run, function() error("inner boom") end)
      local e = {}
      got.same = select(2, pcall(ums.run, function() error(e) end)) == e
    end)
    assert.same({n = 2, 42, "sum"}, got.results)
    assert.is_not_nil(got.inner)
    assert.are_not.equal(got.outer, got.inner)
    assert.is_false(got.ok)
    assert.matches("inner boom\nstack traceback:", got.err)
    assert.is_true(got.same)
  end)

  it("is a coroutine: not the main thread, and a bare coroutine.yield "
     .. "yields to the scheduler", function()
    local got = {}
    ums.run(function()
      got.co, got.main = coroutine.running()
      got.yieldable = coroutine.isyieldable()
      local other = ums.spawn(function() got.other_ran = true end)
      got.yielded = table.pack(coroutine.yield(1, 2))
      got.other = other:status()
    end)
    assert.equal("thread", type(got.co))
    assert.is_false(got.main)
    assert.is_true(got.yieldable)
    assert.same({n = 0}, got.yielded)
    assert.is_true(got.other_ran)
    assert.equal("done", got.other)
  end)

  it("called from a task that is cancelled, cancels the inner task",
     function()
    local inner_status
    ums.run(function()
      local inner
      local outer = ums.spawn(function()
        ums.run(function()
          inner = ums.self()
          ums.sleep(60)
        end)
      end)
      for _ = 1, 10000 do
        if inner ~= nil then break end
        ums.sleep(0.001)
      end
      assert(inner, "the inner task never started")
      outer:cancel()
      outer:join()
      inner:join()
      inner_status = inner:status()
    end)
    assert.equal("cancelled", inner_status)
  end)

  it("re-raises the first task's string error with its traceback", function()
    local function failing_main() error("main boom") end
    local ok, err = pcall(ums.run, function() failing_main() end)
    assert.is_false(ok)
    assert.equal("string", type(err))
    assert.matches("^.-task_spec%.lua:%d+: main boom", err)
    assert.matches("stack traceback", err)
    assert.matches("failing_main", err)
  end)

  for _, case in ipairs{{"a table", {}}, {"an integer", 7},
                        {"a float", 0.5}, {"false", false}} do
    it("re-raises the first task's error, " .. case[1] .. ", by identity",
       function()
      local v = case[2]
      local ok, err = pcall(ums.run, function() error(v) end)
      assert.is_false(ok)
      assert.is_true(rawequal(v, err),
        ("got %s (%s)"):format(tostring(err), type(err)))
    end)
  end

  it("cancels the other tasks when the first task fails", function()
    local log = {}
    local ok = pcall(ums.run, function()
      ums.spawn(function()
        local c <close> = setmetatable({}, {__close = function(_, e)
          log[#log + 1] = e
        end})
        ums.sleep(100)
      end)
      ums.yield()
      error("stop")
    end)
    assert.is_false(ok)
    assert.equal(1, #log)
    assert.is_true(rawequal(ums.CANCELLED, log[1]))
  end)

  it("can be run 100 times in a row", function()
    for i = 1, 100 do
      local v = ums.run(function(x)
        local t = ums.spawn(function(y)
          ums.yield()
          ums.sleep(0)
          return y * 2
        end, x)
        local ok, r = t:join()
        assert(ok)
        return r
      end, i)
      assert.equal(i * 2, v)
    end
  end)

  it("runs again after a failed run", function()
    assert.has_error(function() ums.run(function() error("x") end) end)
    assert.equal(3, ums.run(function() return 3 end))
  end)

  it("requires a function", function()
    for _, v in ipairs{1, "f", {}, true} do
      local ok, err = pcall(ums.run, v)
      assert.is_false(ok)
      assert.matches("bad argument #1 to 'run'", err)
    end
  end)
end)

describe("ums.config", function()
  after_each(restore_config)

  it("returns the settings in force, defaults filled in", function()
    local c = ums.config()
    for k, v in pairs(DEFAULTS) do assert.equal(v, c[k], k) end
    for k in pairs(c) do assert.is_not_nil(DEFAULTS[k], k) end
  end)

  it("returns the new settings after a change", function()
    local c = ums.config{quantum = 0.01, max_workers = 5}
    assert.equal(0.01, c.quantum)
    assert.equal(5, c.max_workers)
    assert.equal(1, c.schedulers)
    c = ums.config()
    assert.equal(0.01, c.quantum)
    assert.equal(5, c.max_workers)
    -- the table returned is a copy: changing it changes nothing
    c.max_workers = 99
    assert.equal(5, ums.config().max_workers)
  end)

  it("raises for unknown keys and changes nothing", function()
    local ok, err = pcall(ums.config, {max_workers = 3, no_such_setting = 1})
    assert.is_false(ok)
    assert.matches("unknown setting 'no_such_setting'", err)
    assert.equal(0, ums.config().max_workers)
  end)

  local bad = {
    schedulers = {0, -1, 1.5, "1", true, {}, 0 / 0},
    max_workers = {-1, 2.5, "2", false, {}},
    quantum = {-0.001, 0 / 0, "0.1", true, {}},
    stack_size = {100, 16383, 16384, 65536, ums.STACK_SIZE_MIN - 1,
                  65536.5, "65536", {}},
    worker_idle_timeout = {"1", 0 / 0, {}, true},
    idle_workers_kept = {-1, 1.5, "3", {}},
    io = {"io_uring", "", 1, true, {}},
    io_threads = {-1, 1.5, "4", {}},
    preempt_threads = {-1, 1.5, "4", {}},
    stats = {1, "yes", {}},
    stall_threshold = {-1, 0 / 0, "1", true, {}},
  }
  for key, values in pairs(bad) do
    it("raises for bad values of " .. key, function()
      for _, v in ipairs(values) do
        local before = ums.config()[key]
        local ok, err = pcall(ums.config, {[key] = v})
        assert.is_false(ok, key .. " = " .. tostring(v))
        assert.matches("ums.config: '" .. key .. "' must be", err)
        assert.equal(before, ums.config()[key])
      end
    end)
  end

  it("io = 'pool' runs file I/O on the pool, 'uring' on io_uring", function()
    assert.is_nil(ums.io_backend())  -- outside a run
    for _, io in ipairs{"pool", "uring", "auto"} do
      ums.config{io = io}
      local p = os.tmpname()
      ums.run(function()
        assert(ums.fs.writefile(p, io))
        assert.equal(io, ums.fs.readfile(p))
        if io ~= "auto" then assert.equal(io, ums.io_backend()) end
      end)
      os.remove(p)
    end
  end)

  it("raises for a non-table argument", function()
    for _, v in ipairs{1, "x", true, function() end} do
      local ok, err = pcall(ums.config, v)
      assert.is_false(ok)
      assert.matches("bad argument #1 to 'config'", err)
    end
  end)

  -- Runs n tasks that each stay active 20 ms; returns the largest number
  -- of them seen active at once and the order in which they started.
  local function concurrency(n)
    local active, most, order = 0, 0, {}
    local statuses = {}
    ums.run(function()
      local ts = {}
      for i = 1, n do
        ts[i] = ums.spawn(function()
          order[#order + 1] = i
          active = active + 1
          if active > most then most = active end
          ums.sleep(0.02)
          active = active - 1
        end)
      end
      ums.yield()
      for i = 1, n do statuses[i] = ts[i]:status() end
      for i = 1, n do assert(ts[i]:join()) end
    end)
    return most, order, statuses
  end

  it("max_workers bounds the active tasks, the first task included, and "
     .. "starts the rest in FIFO order", function()
    ums.config{max_workers = 3}
    local most, order, statuses = concurrency(8)
    -- the first task is active too: 2 more at a time
    assert.equal(2, most)
    assert.same({1, 2, 3, 4, 5, 6, 7, 8}, order)
    assert.equal("suspended", statuses[1])
    assert.equal("suspended", statuses[2])
    for i = 3, 8 do assert.equal("pending", statuses[i]) end
  end)

  it("max_workers = 0 does not bound", function()
    ums.config{max_workers = 0}
    local most = concurrency(8)
    assert.equal(8, most)
  end)

  it("applies to the next run, not the one in progress", function()
    ums.config{max_workers = 3}
    local most_inside
    ums.run(function()
      ums.config{max_workers = 0}
      local active, most = 0, 0
      local ts = {}
      for i = 1, 6 do
        ts[i] = ums.spawn(function()
          active = active + 1
          if active > most then most = active end
          ums.sleep(0.01)
          active = active - 1
        end)
      end
      for i = 1, 6 do ts[i]:join() end
      most_inside = most
    end)
    assert.equal(2, most_inside)
    assert.equal(6, (concurrency(6)))
  end)

  it("quantum = 0 is accepted and reported", function()
    assert.equal(0, ums.config{quantum = 0}.quantum)
    assert.equal(1, ums.run(function() return 1 end))
  end)
end)
