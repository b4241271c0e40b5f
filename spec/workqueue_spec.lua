-- Specs for ums.workqueue (stdlib/ums/workqueue.lua): the queue's ordered
-- batches (phases checked from the execution log), the bound on readers,
-- FIFO, activation, per-item results and errors (never swallowed), and
-- bad input. On the virtual clock: times are exact and the same on every
-- run, and a one-hour schedule takes milliseconds.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")
local CANCELLED = ums.CANCELLED

-- With the quantum off: these specs look at the queue between posts (the
-- readers have not run yet), which a preemption on real time would change
-- (a loaded TSan run did).
local with_config = require "with_config"
local function run(body)
  return with_config({ quantum = 0 }, ums.test, body, { clock = "virtual" })
end

local function near(a, b) return math.abs(a - b) < 1e-6 end

local function fails(pattern, f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "no error")
  assert.matches(pattern, tostring(err))
  return err
end

-- Items log {id, order, start, finish} (seconds since t0) into `log`.
local function logger(log, t0)
  return function(id, order, secs)
    local e = { id = id, order = order, start = ums.now() - t0 }
    log[#log + 1] = e
    ums.sleep(secs)
    e.finish = ums.now() - t0
    return id
  end
end

-- The most entries of log running at the same instant. Entries are
-- half-open [start, finish): one that ends when another starts does not
-- overlap it.
local function most_at_once(log)
  local most = 0
  for _, e in ipairs(log) do
    local n = 0
    for _, f in ipairs(log) do
      if f.start <= e.start and e.start < f.finish then n = n + 1 end
    end
    most = math.max(most, n)
  end
  return most
end

-- The seed's test: orders 100 x4, 200 x2, 300, 400 x2, 500.
local SEED = {
  { 100, 10.1 }, { 100, 10.1 }, { 100, 10.1 }, { 100, 10.1 },
  { 200, 9.2 }, { 200, 9.2 }, { 300, 8.3 }, { 400, 7.4 }, { 400, 7.4 },
  { 500, 6.5 },
}

local function seed_log(readers)
  local log
  run(function()
    log = {}
    local exec = logger(log, ums.now())
    local q = ums.workqueue { readers = readers }
    for id, s in ipairs(SEED) do q:post_ordered(s[1], exec, id, s[1], s[2]) end
    q:close()
    assert.is_true(q:wait())
    assert.is_true(q:stats().max_running <= readers)
  end)
  table.sort(log, function(a, b) return a.id < b.id end)
  return log
end

describe("ums.workqueue", function()
  describe("ordered phases (the Service Broker queue's test)", function()
    it("never overlap, and never run more than `readers` at once",
       function()
      for _, readers in ipairs { 1, 2, 3, 5, 10 } do
        local log = seed_log(readers)
        assert.equal(#SEED, #log)
        for _, a in ipairs(log) do
          for _, b in ipairs(log) do
            if a.order < b.order then
              assert.is_true(a.finish <= b.start, ("readers = %d: item %d "
                .. "(order %d) ended at %g, after item %d (order %d) "
                .. "started at %g"):format(readers, a.id, a.order, a.finish,
                b.id, b.order, b.start))
            end
          end
        end
        assert.is_true(most_at_once(log) <= readers)
      end
    end)

    it("run the items of one order together, with the queue's times",
       function()
      local log = seed_log(5)
      -- Each phase starts the moment the one before has ended.
      local want = { { 0, 10.1 }, { 0, 10.1 }, { 0, 10.1 }, { 0, 10.1 },
        { 10.1, 19.3 }, { 10.1, 19.3 }, { 19.3, 27.6 }, { 27.6, 35.0 },
        { 27.6, 35.0 }, { 35.0, 41.5 } }
      for i, e in ipairs(log) do
        assert.is_true(near(e.start, want[i][1]) and
          near(e.finish, want[i][2]), ("item %d ran %g..%g, expected %g..%g")
          :format(i, e.start, e.finish, want[i][1], want[i][2]))
      end
      assert.equal(4, most_at_once(log))
    end)

    it("give the same log on every run", function()
      local first = seed_log(3)
      for _ = 1, 3 do assert.same(first, seed_log(3)) end
    end)

    it("wait for the previous order even when posted later", function()
      run(function()
        local log, t0 = {}, ums.now()
        local exec = logger(log, t0)
        local q = ums.workqueue { readers = 4 }
        q:post_ordered(1, exec, 1, 1, 5)
        ums.sleep(2)
        q:post_ordered(2, exec, 2, 2, 1)  -- posted while order 1 runs
        assert.is_true(q:wait())
        assert.is_true(near(log[2].start, 5))
        -- All done: a new sequence may start lower.
        q:post_ordered(0, exec, 3, 0, 1)
        assert.is_true(q:wait())
      end)
    end)

    it("refuse an order lower than one still running", function()
      run(function()
        local q = ums.workqueue { readers = 2 }
        q:post_ordered(200, ums.sleep, 1)
        fails("bad argument #1 to 'post_ordered' %(order 100 is lower than "
          .. "the last order posted, 200", function()
            local r = q:post_ordered(100, ums.sleep, 1); return r end)
        assert.is_true(q:wait())
      end)
    end)
  end)

  describe("readers", function()
    it("run at most `readers` items at once, in post order", function()
      run(function()
        local log = {}
        local exec = logger(log, ums.now())
        local q = ums.workqueue { readers = 3 }
        for i = 1, 20 do q:post(exec, i, 0, (i * 7) % 5 + 1) end
        assert.is_true(q:wait())
        assert.equal(3, most_at_once(log))
        assert.equal(3, q:stats().max_running)
        -- FIFO: items start in the order they were posted.
        for i = 1, 20 do assert.equal(i, log[i].id) end
      end)
    end)

    it("start when items arrive and stop when idle", function()
      run(function()
        local q = ums.workqueue { readers = 4 }
        assert.equal(0, q:stats().readers)
        q:post(ums.sleep, 1)
        q:post(ums.sleep, 1)
        assert.equal(2, q:stats().readers)
        for _ = 1, 5 do q:post(ums.sleep, 1) end
        assert.equal(4, q:stats().readers)
        assert.equal(7, q:stats().queued)  -- the readers have not run yet
        assert(ums.run_until_idle())
        assert.equal(4, q:stats().running)
        assert.equal(3, q:stats().queued)
        assert.is_true(q:wait())
        assert(ums.run_until_idle())
        assert.equal(0, q:stats().readers)
      end)
    end)

    it("with idle_timeout, wait that long for work before stopping",
       function()
      run(function()
        local q = ums.workqueue { readers = 2, idle_timeout = 5 }
        q:post(ums.sleep, 1)
        assert.is_true(q:wait())
        ums.sleep(3)
        assert.equal(1, q:stats().readers)
        -- Taken by the reader that waits, not by a new one.
        local item = q:post(function() return ums.self():name() end)
        local _, name = item:result()
        assert.matches("reader 1$", name)
        assert.equal(1, q:stats().readers)
        ums.sleep(5.5)
        assert.equal(0, q:stats().readers)
        q:close()
      end)
    end)
  end)

  describe("results and errors", function()
    it("gives each item's results", function()
      run(function()
        local q = ums.workqueue { readers = 2 }
        local a = q:post(function(x, y) ums.sleep(1); return x + y, "a" end,
          1, 2)
        local b = q:post(function() return nil, nil end)
        assert.same({ true, 3, "a" }, { a:result() })
        local r = table.pack(b:result())
        assert.equal(3, r.n)
        assert.equal("done", b:status())
        local started, finished = a:times()
        assert.is_true(near(finished - started, 1))
        assert.same({ nil, "timeout" },
          { q:post(ums.sleep, 10):result(2) })
        q:close()
      end)
    end)

    it("reports a failing item: result, wait, on_error", function()
      run(function()
        local seen = {}
        local q = ums.workqueue { readers = 2, on_error = function(err, tb,
            item)
          seen[#seen + 1] = { err = err, tb = tb, item = item }
        end }
        local bad = q:post(function() ums.sleep(1); error("item failed") end)
        local good = q:post(function() return "fine" end)
        local ok, failures = q:wait()
        assert.is_false(ok)
        assert.equal(1, #failures)
        assert.equal(bad, failures[1].item)
        assert.matches("item failed", failures[1].err)
        assert.matches("stack traceback", failures[1].traceback)
        assert.equal(1, #seen)
        assert.equal(bad, seen[1].item)
        local rok, err = bad:result()
        assert.is_false(rok)
        assert.matches("item failed", err)
        assert.equal("error", bad:status())
        assert.same({ true, "fine" }, { good:result() })
        -- A failure keeps the queue going: the other items still ran.
        assert.equal(2, q:stats().done)
        assert.equal(1, q:stats().failed)
      end)
    end)

    it("keeps the error value itself", function()
      run(function()
        local q = ums.workqueue()
        local e = { code = 42 }
        local ok, err = q:post(error, e):result()
        assert.is_false(ok)
        assert.equal(e, err)
        q:wait()
      end)
    end)

    it("leaves load's errors as they are inside an item", function()
      run(function()
        local q = ums.workqueue()
        local ok, f, e = q:post(load, function() error("reader failed") end)
          :result()
        assert.is_true(ok)
        assert.is_nil(f)
        assert.equal("string", type(e))
        assert.matches("workqueue_spec%.lua:%d+: reader failed$", e)
        local _, _, deep = q:post(load, string.rep("(", 300) .. "1" ..
                                  string.rep(")", 300)):result()
        assert.equal("C stack overflow", deep)
        -- An item's own error afterwards keeps its traceback.
        local tb
        ok, e, tb = q:post(function()
          assert(not load(function() error("first") end))
          error("second")
        end):result()
        assert.is_false(ok)
        assert.matches("second$", e)
        assert.matches("^[^\n]*second\nstack traceback:", tb)
        assert.not_matches("first", tb)
        q:wait()
      end)
    end)

    it("never swallows an error nobody looked at", function()
      local ok, err = pcall(ums.test, function()
        local q = ums.workqueue { readers = 1 }
        q:post(function() error("unseen item error") end)
        -- Nobody asks the item or the queue: the queue is dropped.
      end, { clock = "virtual" })
      assert.is_false(ok)
      assert.matches("nobody joined", err)
      assert.matches("unseen item error", err)
    end)

    it("cancels a queued item", function()
      run(function()
        local q = ums.workqueue { readers = 1 }
        local ran = false
        q:post(ums.sleep, 1)
        local item = q:post(function() ran = true end)
        assert.is_true(item:cancel())
        assert.same({ false, CANCELLED }, { item:result() })
        assert.equal("cancelled", item:status())
        assert.is_true(q:wait())
        assert.is_false(ran)
        assert.is_false(item:cancel())
      end)
    end)

    it("wait gives nil, 'timeout' after the timeout", function()
      run(function()
        local q = ums.workqueue()
        q:post(ums.sleep, 10)
        local t0 = ums.now()
        assert.same({ nil, "timeout" }, { q:wait(4) })
        assert.is_true(near(ums.now() - t0, 4))
        assert.same({ nil, "timeout" }, { q:wait(0) })
        assert.is_true(q:wait())
      end)
    end)
  end)

  it("takes an item and its phase lock in one step, also past the quantum",
     function()
    -- Real clock, the default quantum: item 1 computes past the quantum,
    -- so its reader is past it when it takes item 2. Were that reader to
    -- yield before its S on order 100, the other reader would take item
    -- 3, get IX on 100 from nobody and run an order-200 item first.
    ums.test(function()
      local log = {}
      local q = ums.workqueue { readers = 2 }
      local function note(id)
        log[#log + 1] = "start " .. id
        ums.sleep(0.005)
        log[#log + 1] = "end " .. id
      end
      q:post_ordered(100, function()
        local t = os.clock()
        while os.clock() - t < 0.02 do end
        log[#log + 1] = "end 1"
      end)
      q:post_ordered(100, note, 2)
      q:post_ordered(200, note, 3)
      q:close()
      assert.is_true(q:wait())
      assert.same({ "end 1", "start 2", "end 2", "start 3", "end 3" }, log)
    end, 20)
  end)

  it("lets the quantum preempt a CPU-bound item (preempt = true)",
     function()
    ums.config{preempt = true}
    finally(function() ums.config{preempt = false} end)
    -- Real clock: the item's loop ends only if another task runs
    -- meanwhile, which only the quantum can arrange.
    ums.test(function()
      local stop = false
      local q = ums.workqueue { readers = 1 }
      local item = q:post(function()
        local n = 0
        while not stop do n = n + 1 end
        return n
      end)
      ums.sleep(0.01)
      stop = true
      assert.is_true((item:result()))
    end, 20)
  end)

  describe("bad input", function()
    it("raises clear errors", function()
      run(function()
        for _, v in ipairs { -1, 0, 1.5, "2", true } do
          fails("bad argument #1 to 'workqueue' %(field 'readers' must be a "
            .. "positive integer, got ", ums.workqueue, { readers = v })
        end
        fails("bad argument #1 to 'workqueue' %(table expected, got number%)",
          ums.workqueue, 3)
        fails("bad argument #1 to 'workqueue' %(unknown field 'reader'%)",
          ums.workqueue, { reader = 2 })
        fails("field 'idle_timeout' must be a non%-negative number",
          ums.workqueue, { idle_timeout = -1 })
        fails("field 'on_error' must be a function", ums.workqueue,
          { on_error = "print" })
        local q = ums.workqueue()
        fails("bad argument #1 to 'post' %(function expected, got number%)",
          function() local r = q:post(1); return r end)
        fails("bad argument #1 to 'post_ordered' %(order must be a number, "
          .. "got string%)", function()
            local r = q:post_ordered("1", print); return r end)
        fails("bad argument #1 to 'post_ordered' %(order must be a number, "
          .. "got nan%)", function()
            local r = q:post_ordered(0 / 0, print); return r end)
        fails("bad argument #2 to 'post_ordered' %(function expected",
          function() local r = q:post_ordered(1); return r end)
        fails("bad argument #1 to 'wait' %(timeout must be a non%-negative",
          function() local r = q:wait(-1); return r end)
        q:close()
        fails("ums.workqueue:post: the queue is closed", function()
          local r = q:post(print); return r end)
        fails("ums.workqueue:post_ordered: the queue is closed", function()
          local r = q:post_ordered(1, print); return r end)
        local fake = setmetatable({}, { __index = require("ums.workqueue")
          .Queue })
        fails("calling 'post' on bad self %(ums.workqueue expected, got "
          .. "table%)", function() local r = fake:post(print); return r end)
      end)
    end)
  end)
end)
