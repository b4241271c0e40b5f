-- Specs for ums.sync (stdlib/ums/sync.lua): mutex, semaphore, event, cond,
-- channel, select and waitgroup, as re-exported by the ums module.
--
-- Every spec runs its body as a task of a fresh ums.run (see `run`). Tasks
-- are ordered with `settle`: a task just spawned, or just woken, runs up
-- to its next wait before the spawner's yields return, because a run has
-- one scheduler and its runnable queue is FIFO.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")
local core = require "ums.core"
local sync = require "ums.sync"

local CANCELLED = core.CANCELLED
local pack, unpack = table.pack, table.unpack

-- Runs body as the first task of a fresh run (ums.test): the spec fails
-- when body raises, when it or a task it started has not ended after
-- `limit` seconds (10 by default; everything left is then cancelled, so a
-- deadlock fails the spec instead of hanging Busted), or when a task
-- raised and nobody joined it.
local function run(body, limit)
  return ums.test(body, limit or 10)
end

-- Lets every other runnable task run up to its next wait.
local function settle()
  for _ = 1, 5 do ums.yield() end
end

-- Joins t, asserts it ended normally, and returns its results.
local function results(t)
  local r = pack(t:join(5))
  assert(r[1] == true, "task did not end normally: " .. tostring(r[2])
    .. "\n" .. tostring(r[3]))
  return unpack(r, 2, r.n)
end

-- Joins t and asserts it ended by cancellation.
local function assert_cancelled(t)
  local ok, err = t:join(5)
  assert.is_false(ok)
  assert.equal(CANCELLED, err)
  assert.equal("cancelled", t:status())
end

-- Runs f and returns its results after the time it took.
local function timed(f, ...)
  local t0 = ums.now()
  local r = pack(f(...))
  return ums.now() - t0, unpack(r, 1, r.n)
end

-- Runs f with the quantum set to q seconds for the runs it starts.
local with_config = require "with_config"
local function with_quantum(q, f) return with_config({ quantum = q }, f) end

-- Whether ums.core keeps the quantum out of ums.sync's code (see the top
-- of ums/sync.lua). Until it does, the specs whose tasks run long steps
-- turn the quantum off, and "under preemption" below is pending.
local PREEMPT_SAFE = core.nopreempt_chunk ~= nil

-- Asserts that f raises a string error that contains msg, and that the
-- error points at the line that called the ums function (as a Lua error
-- raised with level 2 does).
local function assert_raises(msg, f)
  local ok, err = pcall(f)
  assert(not ok, "did not raise: " .. msg)
  assert(type(err) == "string" and err:find(msg, 1, true),
    "raised " .. tostring(err) .. "\ninstead of " .. msg)
  assert(err:match("^[^:]*sync_spec%.lua:%d+: "),
    "no position in " .. err)
end

-- Timers never fire early (docs/design/architecture.md); allow for float
-- rounding.
local function assert_waited(dt, timeout)
  assert(dt >= timeout - 0.001, ("woke after %.4f s, timeout %.4f s")
    :format(dt, timeout))
  assert(dt < timeout + 2, ("woke after %.4f s, timeout %.4f s")
    :format(dt, timeout))
end

describe("ums.sync", function()
  it("is what the ums module exports", function()
    for _, name in ipairs { "mutex", "semaphore", "event", "cond",
        "channel", "select", "waitgroup" } do
      assert.is_function(sync[name], name)
      assert.equal(sync[name], ums[name], name)
    end
  end)

  -- -------------------------------------------------------------------
  describe("mutex", function()
    it("locks, unlocks and trylocks", function()
      run(function()
        local m = ums.mutex()
        assert.equal("ums.mutex", tostring(m):match("^[%w.]+"))
        assert.is_true(m:trylock())
        assert.is_false(m:trylock())
        assert.is_true(m:unlock())
        assert.is_true(m:lock())
        local other = ums.spawn(function() return m:trylock() end)
        assert.is_false(results(other))
        assert.is_true(m:unlock())
        other = ums.spawn(function()
          local got = m:trylock()
          m:unlock()
          return got
        end)
        assert.is_true(results(other))
      end)
    end)

    it("keeps other tasks out while it is held", function()
      run(function()
        local m = ums.mutex()
        local inside, most, total = 0, 0, 0
        local tasks = {}
        for i = 1, 4 do
          tasks[i] = ums.spawn(function()
            for _ = 1, 3 do
              assert.is_true(m:lock())
              inside = inside + 1
              most = math.max(most, inside)
              ums.yield()
              ums.sleep(0.001)
              total = total + 1
              inside = inside - 1
              m:unlock()
            end
          end)
        end
        for i = 1, 4 do results(tasks[i]) end
        assert.equal(1, most)
        assert.equal(12, total)
      end)
    end)

    it("hands itself to waiters in FIFO order, without barging", function()
      run(function()
        local m = ums.mutex()
        local order = {}
        m:lock()
        local tasks = {}
        for i = 1, 5 do
          tasks[i] = ums.spawn(function()
            m:lock()
            order[#order + 1] = i
            m:unlock()
          end)
          settle()  -- queue them in spawn order
        end
        assert.same({}, order)
        m:unlock()
        -- Ownership went straight to the first waiter, which has not run.
        assert.is_false(m:trylock())
        for i = 1, 5 do results(tasks[i]) end
        assert.same({ 1, 2, 3, 4, 5 }, order)
        assert.is_true(m:trylock())
      end)
    end)

    it("times out, and a timed-out waiter is skipped", function()
      run(function()
        local m = ums.mutex()
        m:lock()
        local poll = ums.spawn(function() return m:lock(0) end)
        assert.same({ nil, "timeout" }, { results(poll) })
        local waiter = ums.spawn(function() return timed(m.lock, m, 0.05) end)
        local dt, ok, msg = results(waiter)
        assert_waited(dt, 0.05)
        assert.is_nil(ok)
        assert.equal("timeout", msg)
        m:unlock()
        -- Nobody got it on the way out.
        local probe = ums.spawn(function() return m:trylock() end)
        assert.is_true(results(probe))
      end)
    end)

    it("skips a waiter that was cancelled", function()
      run(function()
        local m = ums.mutex()
        m:lock()
        local victim = ums.spawn(function() m:lock() end)
        settle()
        local got = false
        local next_in_line = ums.spawn(function()
          assert.is_true(m:lock())
          got = true
          m:unlock()
        end)
        settle()
        assert.is_true(victim:cancel())
        assert_cancelled(victim)
        m:unlock()
        results(next_in_line)
        assert.is_true(got)
        -- Nobody holds it now, the cancelled task least of all.
        assert.is_true(m:trylock())
        m:unlock()
        -- A lone cancelled waiter leaves the mutex free as well.
        m:lock()
        victim = ums.spawn(function() m:lock() end)
        settle()
        victim:cancel()
        assert_cancelled(victim)
        m:unlock()
        assert.is_true(m:trylock())
      end)
    end)

    it("refuses a second lock by its owner and an unlock by others",
      function()
        run(function()
          local m = ums.mutex()
          assert.is_true(m:lock())
          local ok, msg = m:lock()
          assert.is_nil(ok)
          assert.matches("deadlock", msg)
          local other = ums.spawn(function() return pcall(m.unlock, m) end)
          local uok, err = results(other)
          assert.is_false(uok)
          assert.matches("locked by another task", err)
          m:unlock()
          assert_raises("ums.mutex:unlock: the mutex is not locked",
            function() m:unlock() end)
        end)
      end)

    it("raises a clear error outside a task", function()
      local m = ums.mutex()
      local ok, err = pcall(m.lock, m)
      assert.is_false(ok)
      assert.matches("not inside a task", err)
    end)
  end)

  -- -------------------------------------------------------------------
  describe("semaphore", function()
    it("counts units", function()
      run(function()
        local s = ums.semaphore(2)
        assert.equal(2, s:value())
        assert.is_true(s:acquire())
        assert.is_true(s:acquire(1))
        assert.equal(0, s:value())
        assert.same({ nil, "timeout" }, { s:acquire(0) })
        assert.is_true(s:release())
        assert.equal(1, s:value())
        assert.is_true(s:release(3))
        assert.equal(4, s:value())
        assert.equal(0, ums.semaphore(0):value())
      end)
    end)

    it("hands released units to waiters in FIFO order", function()
      run(function()
        local s = ums.semaphore(0)
        local order = {}
        local tasks = {}
        for i = 1, 3 do
          tasks[i] = ums.spawn(function()
            assert.is_true(s:acquire())
            order[#order + 1] = i
          end)
          settle()
        end
        s:release(2)
        assert.equal(0, s:value())  -- both went to waiters
        settle()
        assert.same({ 1, 2 }, order)
        s:release(2)
        assert.equal(1, s:value())
        for i = 1, 3 do results(tasks[i]) end
        assert.same({ 1, 2, 3 }, order)
      end)
    end)

    it("times out without taking a unit", function()
      run(function()
        local s = ums.semaphore(0)
        local waiter = ums.spawn(function()
          return timed(s.acquire, s, 0.05)
        end)
        local dt, ok, msg = results(waiter)
        assert_waited(dt, 0.05)
        assert.is_nil(ok)
        assert.equal("timeout", msg)
        s:release()
        assert.equal(1, s:value())
      end)
    end)

    it("skips a waiter that was cancelled; no unit is lost", function()
      run(function()
        local s = ums.semaphore(0)
        local victim = ums.spawn(function() s:acquire() end)
        settle()
        victim:cancel()
        assert_cancelled(victim)
        s:release()
        assert.equal(1, s:value())
        assert.is_true(s:acquire(0))
        victim = ums.spawn(function() s:acquire() end)
        local other = ums.spawn(function() return s:acquire() end)
        settle()
        victim:cancel()
        s:release()
        assert.is_true(results(other))
        assert_cancelled(victim)
        assert.equal(0, s:value())
      end)
    end)

    it("reports an overflow", function()
      run(function()
        local s = ums.semaphore(math.maxinteger)
        local ok, msg = s:release()
        assert.is_nil(ok)
        assert.matches("out of range", msg)
        assert.equal(math.maxinteger, s:value())
      end)
    end)
  end)

  -- -------------------------------------------------------------------
  describe("event", function()
    it("auto reset: stays set until one wait consumes it", function()
      run(function()
        local e = ums.event()
        assert.is_false(e:is_set())
        assert.same({ nil, "timeout" }, { e:wait(0) })
        assert.is_true(e:set())
        assert.is_true(e:is_set())
        assert.is_true(e:wait())
        assert.is_false(e:is_set())
        assert.same({ nil, "timeout" }, { e:wait(0) })
        e:set()
        e:reset()
        assert.is_false(e:is_set())
      end)
    end)

    it("auto reset: set wakes exactly one waiter", function()
      run(function()
        local e = ums.event(false)
        local woke = {}
        local tasks = {}
        for i = 1, 2 do
          tasks[i] = ums.spawn(function()
            assert.is_true(e:wait())
            woke[#woke + 1] = i
          end)
          settle()
        end
        e:set()
        settle()
        assert.same({ 1 }, woke)
        assert.is_false(e:is_set())
        e:set()
        for i = 1, 2 do results(tasks[i]) end
        assert.same({ 1, 2 }, woke)
        assert.is_false(e:is_set())
      end)
    end)

    it("manual reset: set wakes every waiter and stays set", function()
      run(function()
        local e = ums.event(true)
        local woke = 0
        local tasks = {}
        for i = 1, 3 do
          tasks[i] = ums.spawn(function()
            assert.is_true(e:wait())
            woke = woke + 1
          end)
        end
        settle()
        assert.equal(0, woke)
        e:set()
        for i = 1, 3 do results(tasks[i]) end
        assert.equal(3, woke)
        assert.is_true(e:is_set())
        assert.is_true(e:wait())
        assert.is_true(e:wait(0))
        e:reset()
        assert.same({ nil, "timeout" }, { e:wait(0) })
      end)
    end)

    it("times out", function()
      run(function()
        local e = ums.event()
        local dt, ok, msg = timed(e.wait, e, 0.05)
        assert_waited(dt, 0.05)
        assert.is_nil(ok)
        assert.equal("timeout", msg)
        -- The timed-out waiter does not consume a later set.
        e:set()
        assert.is_true(e:is_set())
      end)
    end)

    it("skips a waiter that was cancelled", function()
      run(function()
        local e = ums.event()
        local victim = ums.spawn(function() e:wait() end)
        settle()
        victim:cancel()
        assert_cancelled(victim)
        e:set()
        assert.is_true(e:is_set())  -- nobody consumed it
        e:reset()
        victim = ums.spawn(function() e:wait() end)
        local other = ums.spawn(function() return e:wait() end)
        settle()
        victim:cancel()
        e:set()
        assert.is_true(results(other))
        assert_cancelled(victim)
        assert.is_false(e:is_set())
      end)
    end)
  end)

  -- -------------------------------------------------------------------
  describe("cond", function()
    it("signal wakes one waiter in FIFO order, with the mutex held",
      function()
        run(function()
          local m, c = ums.mutex(), ums.cond()
          local order = {}
          local tasks = {}
          for i = 1, 3 do
            tasks[i] = ums.spawn(function()
              m:lock()
              assert.is_true(c:wait(m))
              order[#order + 1] = i
              m:unlock()  -- raises unless wait gave the mutex back
            end)
            settle()
          end
          m:lock()
          assert.is_true(c:signal())
          settle()
          assert.same({}, order)  -- it needs m, which we hold
          m:unlock()
          settle()
          assert.same({ 1 }, order)
          c:signal()
          c:signal()
          for i = 1, 3 do results(tasks[i]) end
          assert.same({ 1, 2, 3 }, order)
          c:signal()  -- nobody waits: a no-op
        end)
      end)

    it("broadcast wakes every waiter", function()
      run(function()
        local m, c = ums.mutex(), ums.cond()
        local woke = 0
        local tasks = {}
        for i = 1, 4 do
          tasks[i] = ums.spawn(function()
            m:lock()
            c:wait(m)
            woke = woke + 1
            m:unlock()
          end)
        end
        settle()
        assert.is_true(c:broadcast())
        for i = 1, 4 do results(tasks[i]) end
        assert.equal(4, woke)
      end)
    end)

    it("times out with the mutex held again", function()
      run(function()
        local m, c = ums.mutex(), ums.cond()
        m:lock()
        assert.same({ nil, "timeout" }, { c:wait(m, 0) })
        local dt, ok, msg = timed(c.wait, c, m, 0.05)
        assert_waited(dt, 0.05)
        assert.is_nil(ok)
        assert.equal("timeout", msg)
        assert.is_true(m:unlock())
        -- When the mutex is busy at the timeout, wait returns once it
        -- has the mutex back.
        local waiter = ums.spawn(function()
          m:lock()
          local a, b = c:wait(m, 0.02)
          local mine = pcall(m.unlock, m)
          return a, b, mine
        end)
        settle()
        m:lock()
        ums.sleep(0.06)
        assert.equal("suspended", waiter:status())
        m:unlock()
        local a, b, mine = results(waiter)
        assert.is_nil(a)
        assert.equal("timeout", b)
        assert.is_true(mine)
      end)
    end)

    it("re-locks the mutex on cancellation, then raises", function()
      run(function()
        local m, c = ums.mutex(), ums.cond()
        local victim = ums.spawn(function()
          m:lock()
          local ok, err = pcall(c.wait, c, m)
          -- Cleanup code runs with the mutex held.
          local unlocked = pcall(m.unlock, m)
          return ok, err, unlocked
        end)
        settle()
        victim:cancel()
        local ok, err, unlocked = results(victim)
        assert.is_false(ok)
        assert.equal(CANCELLED, err)
        assert.is_true(unlocked)
        -- The cancelled waiter is gone: a signal reaches the next one.
        local other = ums.spawn(function()
          m:lock()
          local r = c:wait(m)
          m:unlock()
          return r
        end)
        settle()
        c:signal()
        assert.is_true(results(other))
      end)
    end)

    it("re-locks a mutex held by another task after cancellation",
      function()
        run(function()
          local m, c = ums.mutex(), ums.cond()
          local order = {}
          local waiter = ums.spawn(function()
            m:lock()
            local ok, err = pcall(c.wait, c, m)
            -- Raised with the mutex held again.
            order[#order + 1] = "waiter holds: " .. tostring(m:trylock()
              == false and m.owner == ums.self())
            m:unlock()
            error(err, 0)
          end)
          ums.yield()                 -- waiter is parked in c:wait
          m:lock()                    -- we hold m while it is cancelled
          waiter:cancel()
          ums.sleep(0.01)             -- it must wait for m, not give up
          order[#order + 1] = "holder unlocks"
          m:unlock()
          local ok, err = waiter:join()
          assert.is_false(ok)
          assert.equal(ums.CANCELLED, err)
          assert.same({"holder unlocks", "waiter holds: true"}, order)
        end)
      end)

    it("requires the mutex to be held by the caller", function()
      run(function()
        local m, c = ums.mutex(), ums.cond()
        assert_raises(
          "ums.cond:wait: the mutex is not locked by the calling task",
          function() c:wait(m) end)
        m:lock()
        local other = ums.spawn(function() return pcall(c.wait, c, m) end)
        local ok, err = results(other)
        assert.is_false(ok)
        assert.matches("not locked by the calling task", err)
      end)
    end)
  end)

  -- -------------------------------------------------------------------
  describe("channel", function()
    it("unbuffered: send waits for a receiver", function()
      run(function()
        local ch = ums.channel()
        assert.equal(0, ch:cap())
        assert.equal(0, ums.channel(0):cap())
        local sent = false
        local sender = ums.spawn(function()
          assert.is_true(ch:send("hello"))
          sent = true
        end)
        settle()
        assert.is_false(sent)
        assert.equal(0, ch:len())
        assert.equal("hello", ch:recv())
        results(sender)
        assert.is_true(sent)
      end)
    end)

    it("passes nil and false as values, in order", function()
      run(function()
        local ch = ums.channel()
        local sender = ums.spawn(function()
          ch:send(nil)
          ch:send(false)
          ch:send(3)
        end)
        local r = pack(ch:recv())
        assert.equal(1, r.n)
        assert.is_nil(r[1])
        assert.is_false(ch:recv())
        assert.equal(3, ch:recv())
        results(sender)
        -- Through a buffer too.
        local b = ums.channel(2)
        b:send(nil)
        assert.equal(1, b:len())
        assert.same({ true, nil, n = 2 }, pack(b:try_recv()))
      end)
    end)

    it("buffered: keeps FIFO order across the buffer and parked senders",
      function()
        run(function()
          local ch = ums.channel(2)
          assert.equal(2, ch:cap())
          assert.is_true(ch:send(1))
          assert.is_true(ch:send(2))
          assert.equal(2, ch:len())
          assert.same({ false, "full" }, { ch:try_send(0) })
          local senders = {}
          for i = 3, 5 do
            senders[i] = ums.spawn(function() return ch:send(i) end)
            settle()
          end
          assert.equal(2, ch:len())
          assert.equal(1, ch:recv())
          assert.equal(2, ch:len())  -- 3 moved in behind 2
          local got = {}
          for _ = 1, 4 do got[#got + 1] = ch:recv() end
          assert.same({ 2, 3, 4, 5 }, got)
          for i = 3, 5 do assert.is_true(results(senders[i])) end
          assert.equal(0, ch:len())
        end)
      end)

    it("serves receivers in FIFO order", function()
      run(function()
        local ch = ums.channel()
        local receivers = {}
        for i = 1, 3 do
          receivers[i] = ums.spawn(function() return ch:recv() end)
          settle()
        end
        for i = 1, 3 do assert.is_true(ch:send("v" .. i)) end
        for i = 1, 3 do assert.equal("v" .. i, results(receivers[i])) end
      end)
    end)

    it("times out on send and on recv; nothing is delivered late",
      function()
        run(function()
          local ch = ums.channel()
          local dt, ok, msg = timed(ch.recv, ch, 0.05)
          assert_waited(dt, 0.05)
          assert.is_nil(ok)
          assert.equal("timeout", msg)
          -- The timed-out receiver does not swallow a later value.
          assert.same({ false, "full" }, { ch:try_send(1) })
          dt, ok, msg = timed(ch.send, ch, "late", 0.05)
          assert_waited(dt, 0.05)
          assert.is_nil(ok)
          assert.equal("timeout", msg)
          assert.same({ false, nil, "empty", n = 3 }, pack(ch:try_recv()))
          assert.same({ nil, "timeout" }, { ch:recv(0) })
          assert.same({ nil, "timeout" }, { ch:send(1, 0) })
          local full = ums.channel(1)
          full:send(1)
          assert.same({ nil, "timeout" }, { full:send(2, 0.01) })
          assert.equal(1, full:len())
        end)
      end)

    -- A send from the receiver's own scheduler ends its park without a
    -- lock on the way in or out (runtime/src/park.c). Here the sender
    -- holds the scheduler past the receiver's deadline, so the timer is
    -- due but has not fired when the send wakes the receiver (the wake
    -- must win, once), or first lets the pass run the timer (the timeout
    -- must win, and the value stay with the sender). A receiver resumed
    -- twice for one park would see a second outcome: a value out of
    -- order, a timeout for a value that was handed over, or a wait that
    -- ended early.
    it("a same-scheduler wake racing the waiter's timeout resumes it once",
      function()
        run(function()
          local ch, ack = ums.channel(), ums.channel()
          local n, now = 300, ums.now
          local r = ums.spawn(function()
            for i = 1, n do
              local v, err = ch:recv(0.0002 * (i % 5 + 1))
              assert(v == i or (v == nil and err == "timeout"),
                ("recv %d got %s, %s"):format(i, tostring(v), tostring(err)))
              ack:send(v ~= nil)
            end
            return n
          end)
          local wakes, timeouts = 0, 0
          for i = 1, n do
            ums.yield()  -- the receiver parks
            local t0, spin = now(), 0.00025 * (i * 7 % 6)
            while now() - t0 < spin do end
            if i % 3 == 0 then ums.yield() end  -- due timers fire here
            local sent = ch:send(i, 0) == true
            assert.equal(sent, ack:recv())
            if sent then wakes = wakes + 1 else timeouts = timeouts + 1 end
          end
          assert.equal(n, results(r))
          assert.is_true(wakes > 0)
          assert.is_true(timeouts > 0)
          assert.same({ nil, "timeout" }, { ch:recv(0.01) })
        end)
      end)

    it("close: receivers drain the buffer, then get nil, \"closed\"",
      function()
        run(function()
          local ch = ums.channel(3)
          ch:send(1)
          ch:send(2)
          assert.is_false(ch:closed())
          assert.is_true(ch:close())
          assert.is_true(ch:closed())
          assert.same({ nil, "closed" }, { ch:close() })
          assert.same({ nil, "closed" }, { ch:send(3) })
          assert.same({ false, "closed" }, { ch:try_send(3) })
          assert.equal(1, ch:recv())
          assert.same({ true, 2 }, { ch:try_recv() })
          assert.same({ nil, "closed" }, { ch:recv() })
          assert.same({ nil, "closed" }, { ch:recv(0) })
          assert.same({ false, nil, "closed", n = 3 }, pack(ch:try_recv()))
        end)
      end)

    it("close wakes parked receivers and senders", function()
      run(function()
        local ch = ums.channel()
        local r1 = ums.spawn(function() return ch:recv() end)
        local r2 = ums.spawn(function() return ch:recv(5) end)
        settle()
        ch:close()
        assert.same({ nil, "closed" }, { results(r1) })
        assert.same({ nil, "closed" }, { results(r2) })
        local full = ums.channel(1)
        full:send("kept")
        local s = ums.spawn(function() return full:send("dropped") end)
        settle()
        full:close()
        assert.same({ nil, "closed" }, { results(s) })
        assert.equal("kept", full:recv())
        assert.same({ nil, "closed" }, { full:recv() })
      end)
    end)

    it("try_send and try_recv hand over to parked parties", function()
      run(function()
        local ch = ums.channel()
        assert.same({ false, nil, "empty", n = 3 }, pack(ch:try_recv()))
        assert.same({ false, "full" }, { ch:try_send(1) })
        local r = ums.spawn(function() return ch:recv() end)
        settle()
        assert.is_true(ch:try_send(42))
        assert.equal(42, results(r))
        local s = ums.spawn(function() return ch:send(43) end)
        settle()
        assert.same({ true, 43 }, { ch:try_recv() })
        assert.is_true(results(s))
      end)
    end)

    it("skips a cancelled receiver; the value is not lost", function()
      run(function()
        local ch = ums.channel()
        local victim = ums.spawn(function() return ch:recv() end)
        settle()
        victim:cancel()
        assert_cancelled(victim)
        assert.same({ nil, "timeout" }, { ch:send("x", 0.02) })
        victim = ums.spawn(function() return ch:recv() end)
        local other = ums.spawn(function() return ch:recv() end)
        settle()
        victim:cancel()
        assert.is_true(ch:send("y"))
        assert.equal("y", results(other))
        assert_cancelled(victim)
      end)
    end)

    it("withdraws the value of a cancelled sender", function()
      run(function()
        local ch = ums.channel()
        local victim = ums.spawn(function() ch:send("gone") end)
        local other = ums.spawn(function() return ch:send("next") end)
        settle()
        victim:cancel()
        assert_cancelled(victim)
        assert.equal("next", ch:recv())
        assert.is_true(results(other))
        assert.same({ false, nil, "empty", n = 3 }, pack(ch:try_recv()))
      end)
    end)

    it("works between tasks at volume", function()
      -- luassert makes these steps long enough for the quantum to cut.
      with_quantum(PREEMPT_SAFE and ums.config().quantum or 0, function()
        run(function()
          local ch = ums.channel(3)
          local n = 2000
          local producer = ums.spawn(function()
            for i = 1, n do assert.is_true(ch:send(i)) end
            ch:close()
          end)
          local sum, count = 0, 0
          while true do
            local v, err = ch:recv()
            if err then
              assert.equal("closed", err)
              break
            end
            count = count + 1
            assert.equal(count, v)
            sum = sum + v
          end
          results(producer)
          assert.equal(n, count)
          assert.equal(n * (n + 1) // 2, sum)
        end)
      end)
    end)
  end)

    -- A channel is a table like the other sync objects; its methods take
    -- any channel as self, however often either has been used (lchan.c
    -- binds fast forms after a few calls: nothing here may tell).
    it("is a table named ums.channel whose methods serve any channel as "
      .. "self, fresh or much used", function()
        run(function()
          local a, b = ums.channel(1), ums.channel(1)
          assert.equal("table", type(a))
          assert.matches("^ums%.channel: 0x%x+$", tostring(a))
          local mt = getmetatable(a).__index
          for round = 1, 3 do
            assert.is_true(a.send(b, "b by a's send " .. round))
            assert.equal("b by a's send " .. round, a.recv(b))
            assert.is_true(mt.send(a, "a by the metatable's " .. round))
            assert.equal("a by the metatable's " .. round, b.recv(a))
            assert.equal(0, a:len())
            assert.equal(0, b:len())
            assert_raises("bad argument #1 to 'send' (ums.channel expected",
              function() a.send({}, 1) end)
            assert_raises("bad argument #1 to 'recv' (ums.channel expected",
              function() a.recv(42) end)
            for i = 1, 4 do
              assert.is_true(a:send(i))
              assert.equal(i, a:recv())
            end
          end
        end)
      end)

    it("a task waiting on a channel keeps it alive when nothing else "
      .. "refers to it", function()
        run(function()
          for _, uses in ipairs{0, 8} do
            local weak = setmetatable({}, {__mode = "k"})
            local receiver
            do
              local ch = ums.channel()
              for i = 1, uses / 2 do
                ums.spawn(function() ch:send(i) end)
                assert.equal(i, ch:recv())
              end
              weak[ch] = true
              receiver = ums.spawn(function() return ch:recv() end)
            end
            settle()
            collectgarbage("collect")
            collectgarbage("collect")
            local ch = next(weak)
            assert.is_not_nil(ch, "the waiting receiver's channel was "
              .. "collected (" .. uses .. " uses before)")
            assert.is_true(ch:send("still there"))
            assert.equal("still there", results(receiver))
            ch = nil
            collectgarbage("collect")
            collectgarbage("collect")
            assert.is_nil(next(weak), "a channel nobody uses any more was "
              .. "kept (" .. uses .. " uses before)")
          end
        end)
      end)

    -- Every case of a channel's behaviour on a channel already used a few
    -- times, unbuffered and buffered (lchan.c serves such a channel by
    -- another path: it must behave the same).
    describe("after a few uses", function()
      -- Four calls: enough for lchan.c to take its fast forms.
      local function bound(ch)
        for i = 1, 2 do
          local t = ums.spawn(function() assert.is_true(ch:send(i)) end)
          assert.equal(i, ch:recv())
          results(t)
        end
        return ch
      end

      it("passes values both ways between parked partners, in order",
        function()
          run(function()
            local ch = bound(ums.channel())
            local got = {}
            local r = ums.spawn(function()
              for i = 1, 6 do got[i] = ch:recv() end
            end)
            settle()  -- r is parked in recv: each send finds it
            for i = 1, 3 do assert.is_true(ch:send(i)) end
            local s = ums.spawn(function()
              for i = 4, 6 do assert.is_true(ch:send(i)) end
            end)
            results(r)
            results(s)
            assert.same({ 1, 2, 3, 4, 5, 6 }, got)
            assert.same({ 0, 0 }, { core.channel_queues(ch) })
          end)
        end)

      it("wakes parked receivers and senders in FIFO order", function()
        run(function()
          local ch = bound(ums.channel())
          local order = {}
          for i = 1, 3 do
            ums.spawn(function()
              local v = ch:recv()
              order[#order + 1] = i .. ":" .. v
            end)
          end
          settle()
          for i = 1, 3 do assert.is_true(ch:send(i)) end
          settle()
          assert.same({ "1:1", "2:2", "3:3" }, order)
          for i = 1, 3 do
            ums.spawn(function() assert.is_true(ch:send(i * 10)) end)
          end
          settle()
          assert.same({ 0, 3 }, { core.channel_queues(ch) })
          for i = 1, 3 do assert.equal(i * 10, ch:recv()) end
        end)
      end)

      it("fills a buffer, parks the sender when full and moves its value "
        .. "in behind the others", function()
          run(function()
            local ch = bound(ums.channel(2))
            assert.is_true(ch:send("a"))
            assert.is_true(ch:send("b"))
            assert.equal(2, ch:len())
            local s = ums.spawn(function() return ch:send("c") end)
            settle()
            assert.same({ 0, 1 }, { core.channel_queues(ch) })
            assert.equal("a", ch:recv())
            assert.is_true(results(s))
            assert.equal("b", ch:recv())
            assert.equal("c", ch:recv())
            local r = ums.spawn(function() return ch:recv() end)
            settle()  -- empty: parked
            assert.same({ 1, 0 }, { core.channel_queues(ch) })
            assert.is_true(ch:send("d"))
            assert.equal("d", results(r))
          end)
        end)

      it("on a closed channel: send fails, recv drains then fails, parked "
        .. "calls wake with closed", function()
          run(function()
            local ch = bound(ums.channel(1))
            local r = ums.spawn(function() return ch:recv() end)
            local plain = bound(ums.channel())
            local s = ums.spawn(function() return plain:send("x") end)
            settle()
            assert.is_true(ch:close())
            assert.is_true(plain:close())
            assert.same({ nil, "closed" }, { results(r) })
            assert.same({ nil, "closed" }, { results(s) })
            assert.same({ nil, "closed" }, { ch:send(1) })
            assert.same({ nil, "closed" }, { plain:send(1) })
            local full = bound(ums.channel(1))
            assert.is_true(full:send("kept"))
            full:close()
            assert.equal("kept", full:recv())
            assert.same({ nil, "closed" }, { full:recv() })
            assert.same({ nil, "closed" }, { plain:recv() })
          end)
        end)

      it("times out and polls with a timeout, and a cancel ends a parked "
        .. "call", function()
          run(function()
            local ch = bound(ums.channel())
            assert.same({ nil, "timeout" }, { ch:recv(0) })
            assert.same({ nil, "timeout" }, { ch:send(1, 0) })
            local dt, v, msg = timed(ch.recv, ch, 0.02)
            assert_waited(dt, 0.02)
            assert.same({ nil, "timeout" }, { v, msg })
            assert.same({ 0, 0 }, { core.channel_queues(ch) })
            local other = bound(ums.channel())
            local r = ums.spawn(function() return ch:recv() end)
            local s = ums.spawn(function() return other:send("never") end)
            settle()
            assert.same({ 1, 0 }, { core.channel_queues(ch) })
            assert.same({ 0, 1 }, { core.channel_queues(other) })
            r:cancel()
            s:cancel()
            assert_cancelled(r)
            assert_cancelled(s)
            assert.same({ 0, 0 }, { core.channel_queues(ch) })
            assert.same({ 0, 0 }, { core.channel_queues(other) })
            assert.same({ nil, "timeout" }, { other:recv(0) })
            -- Nothing was lost or left: the channel still works.
            local r2 = ums.spawn(function() return ch:recv() end)
            settle()
            assert.is_true(ch:send("after"))
            assert.equal("after", results(r2))
          end)
        end)
    end)

  -- -------------------------------------------------------------------
  describe("select", function()
    it("performs the ready case", function()
      run(function()
        local a, b = ums.channel(), ums.channel(1)
        b:send("b")
        assert.same({ 2, "b" }, { ums.select { { a, "recv" }, { b, "recv" } } })
        assert.same({ 2, n = 1 },
          pack(ums.select { { a, "send", 1 }, { b, "send", 2 } }))
        assert.equal(2, b:recv())
      end)
    end)

    it("with several ready cases, performs the first and only it",
      function()
        run(function()
          local a, b, c = ums.channel(1), ums.channel(1), ums.channel(1)
          a:send("a")
          b:send("b")
          assert.same({ 1, "a" }, { ums.select {
            { a, "recv" }, { b, "recv" }, { c, "send", "c" } } })
          assert.equal(0, a:len())
          assert.equal(1, b:len())
          assert.equal(0, c:len())
          assert.same({ 1, n = 1 }, pack(ums.select {
            { c, "send", "c" }, { b, "recv" } }))
          assert.equal(1, b:len())
          assert.equal(1, c:len())
          assert.equal("c", c:recv())
          assert.equal("b", b:recv())
        end)
      end)

    it("waits until a receive case can proceed", function()
      run(function()
        local a, b = ums.channel(), ums.channel()
        local sel = ums.spawn(function()
          return ums.select { { a, "recv" }, { b, "recv" } }
        end)
        settle()
        assert.is_true(b:send("x"))
        assert.same({ 2, "x" }, { results(sel) })
        -- Its entry on a is stale and must not take a value.
        assert.same({ false, "full" }, { a:try_send("y") })
      end)
    end)

    it("waits until a send case can proceed", function()
      run(function()
        local a, b = ums.channel(), ums.channel()
        local sel = ums.spawn(function()
          return ums.select { { a, "send", "va" }, { b, "send", "vb" } }
        end)
        settle()
        assert.equal("vb", b:recv())
        assert.same({ 2, n = 1 }, pack(results(sel)))
        -- The other offer was withdrawn.
        assert.same({ false, nil, "empty", n = 3 }, pack(a:try_recv()))
      end)
    end)

    it("never hands a value to a select that already completed", function()
      run(function()
        local a, b = ums.channel(), ums.channel(1)
        local sel = ums.spawn(function()
          return ums.select { { a, "recv" }, { b, "recv" } }
        end)
        settle()
        -- Both in one step: the first completes the select, the second
        -- finds only its stale entry and goes to b's buffer instead.
        assert.is_true(a:try_send("first"))
        assert.is_true(b:try_send("second"))
        assert.equal(1, b:len())
        assert.same({ 1, "first" }, { results(sel) })
        assert.equal("second", b:recv())
      end)
    end)

    it("lets two selects share a channel", function()
      run(function()
        local shared, o1, o2 = ums.channel(), ums.channel(), ums.channel()
        local s1 = ums.spawn(function()
          return ums.select { { o1, "recv" }, { shared, "recv" } }
        end)
        settle()
        local s2 = ums.spawn(function()
          return ums.select { { shared, "recv" }, { o2, "recv" } }
        end)
        settle()
        shared:send(1)
        shared:send(2)
        assert.same({ 2, 1 }, { results(s1) })
        assert.same({ 1, 2 }, { results(s2) })
      end)
    end)

    it("times out, leaving no waiter behind", function()
      run(function()
        local a, b = ums.channel(), ums.channel()
        local cases = { { a, "recv" }, { b, "send", 1 } }
        assert.same({ nil, "timeout" }, { ums.select(cases, 0) })
        local dt, i, msg = timed(ums.select, cases, 0.05)
        assert_waited(dt, 0.05)
        assert.is_nil(i)
        assert.equal("timeout", msg)
        assert.same({ false, "full" }, { a:try_send(1) })
        assert.same({ false, nil, "empty", n = 3 }, pack(b:try_recv()))
      end)
    end)

    it("reports a closed channel as its case's result", function()
      run(function()
        local a, b = ums.channel(), ums.channel()
        b:close()
        assert.same({ 2, nil, "closed", n = 3 },
          pack(ums.select { { a, "recv" }, { b, "recv" } }))
        assert.same({ 2, nil, "closed", n = 3 },
          pack(ums.select { { a, "send", 1 }, { b, "send", 1 } }))
        local c = ums.channel()
        local sel = ums.spawn(function()
          return ums.select { { a, "recv" }, { c, "recv" } }
        end)
        settle()
        c:close()
        assert.same({ 2, nil, "closed", n = 3 }, pack(results(sel)))
        assert.same({ false, "full" }, { a:try_send(1) })
      end)
    end)

    it("skips a cancelled select; nothing is lost", function()
      run(function()
        local a, b = ums.channel(), ums.channel()
        local victim = ums.spawn(function()
          return ums.select { { a, "recv" }, { b, "send", "offer" } }
        end)
        settle()
        victim:cancel()
        assert_cancelled(victim)
        assert.same({ false, "full" }, { a:try_send(1) })
        assert.same({ false, nil, "empty", n = 3 }, pack(b:try_recv()))
        local r = ums.spawn(function() return a:recv() end)
        settle()
        assert.is_true(a:send("to r"))
        assert.equal("to r", results(r))
      end)
    end)
  end)

  -- -------------------------------------------------------------------
  describe("wait queues", function()
    -- White-box: peeks at the queues of ums/sync.lua (core.waitq_len)
    -- and of the channels (core.channel_queues), to prove that waiters
    -- that time out, are cancelled or lose a select leave no entry behind
    -- (else a select loop over an idle channel would grow its queue
    -- without bound).
    local core = require "ums.core"
    local function empty(q) return core.waitq_len(q) == 0 end
    local function idle(ch)
      local r, s = core.channel_queues(ch)
      return r == 0 and s == 0
    end

    it("keep nothing of waits that ended without a grant", function()
      run(function()
        local a, b = ums.channel(), ums.channel()
        for _ = 1, 3 do
          ums.select({ { a, "recv" }, { b, "send", 1 } }, 0.001)
        end
        a:recv(0.001)
        b:send(1, 0.001)
        assert.is_true(idle(a) and idle(b))
        local sel = ums.spawn(function()
          return ums.select { { a, "recv" }, { b, "recv" } }
        end)
        settle()
        b:send("x")
        results(sel)
        assert.is_true(idle(a) and idle(b))
        local victim = ums.spawn(function()
          ums.select { { a, "recv" }, { b, "recv" } }
        end)
        settle()
        victim:cancel()
        assert_cancelled(victim)
        assert.is_true(idle(a) and idle(b))
        local m, s, e = ums.mutex(), ums.semaphore(0), ums.event()
        m:lock()
        local w = ums.spawn(function()
          m:lock(0.001)
          s:acquire(0.001)
          e:wait(0.001)
        end)
        results(w)
        assert.is_true(empty(m.q) and empty(s.q) and empty(e.q))
      end)
    end)
  end)

  -- -------------------------------------------------------------------
  describe("core.waitq", function()
    -- The binding's wait queue under the objects above (lwaitq.c).
    local newq, qwait, qwake, qwake_all, qlen = core.waitq,
      core.waitq_wait, core.waitq_wake, core.waitq_wake_all, core.waitq_len

    it("wakes in FIFO order, with the outcome given, and names the task",
      function()
      run(function()
        local q = newq()
        local order = {}
        local ws = {}
        for i = 1, 3 do
          ws[i] = ums.spawn(function()
            local o = qwait(q)
            order[#order + 1] = i
            return o
          end)
        end
        settle()
        assert.equal(3, qlen(q))
        assert.equal(ws[1], qwake(q, 7))
        assert.equal(2, qwake_all(q, 9))
        assert.is_nil(qwake(q))
        assert.equal(0, qlen(q))
        assert.equal(7, results(ws[1]))
        assert.equal(9, results(ws[2]))
        assert.equal(9, results(ws[3]))
        assert.same({ 1, 2, 3 }, order)
      end)
    end)

    it("drops a waiter that timed out or was cancelled, never waking it",
      function()
      run(function()
        local q = newq()
        local timed_out = ums.spawn(function() return qwait(q, 0.01) end)
        local victim = ums.spawn(function() return qwait(q) end)
        local live = ums.spawn(function() return qwait(q) end)
        settle()
        assert.equal(3, qlen(q))
        victim:cancel()
        ums.sleep(0.05)
        -- Both left by themselves when their park ended.
        assert.equal(1, qlen(q))
        assert.same({ nil, "timeout" }, { results(timed_out) })
        assert_cancelled(victim)
        assert.equal(live, qwake(q, 3))
        assert.equal(3, results(live))
        assert.equal(0, qwake_all(q))
      end)
    end)

    it("refuses a cancelled task before queueing it; nocancel waits on",
      function()
      run(function()
        local q = newq()
        local early = ums.spawn(function()
          ums.self():cancel()
          return qwait(q)
        end)
        assert_cancelled(early)
        assert.equal(0, qlen(q))
        local stubborn = ums.spawn(function() return qwait(q, nil, true) end)
        settle()
        stubborn:cancel()
        settle()
        assert.equal("suspended", stubborn:status())
        assert.equal(stubborn, qwake(q, 1))
        assert.equal(1, results(stubborn))
      end)
    end)

    it("waits in two halves around the caller's own step", function()
      run(function()
        local q, other = newq(), newq()
        local peer = ums.spawn(function() return qwait(other) end)
        settle()
        local w = ums.spawn(function()
          core.waitq_wait_begin(q, nil, false, core.WAIT.cond, q)
          -- Queued already: a wake-up from here on is not lost.
          assert.equal(1, qlen(q))
          qwake(other, 5)
          return core.waitq_wait_end()
        end)
        assert.equal(5, results(peer))
        settle()
        assert.equal(w, qwake(q, 4))
        assert.equal(4, results(w))
        local ok, err = pcall(core.waitq_wait_end)
        assert.is_false(ok)
        assert.matches("no wait begun", err)
      end)
    end)

    it("says what a task waits on, and for whom", function()
      run(function()
        local q, obj = newq(), {}
        local holder = ums.self()
        local w = ums.spawn(function()
          return qwait(q, nil, false, core.WAIT.mutex, obj, holder)
        end)
        settle()
        local row
        for _, r in ipairs(ums.tasks()) do
          if r.id == w:id() then row = r end
        end
        assert.equal("mutex", row.wait_type)
        assert.equal(tostring(obj):match("0x%x+"),
          tostring(row.wait_object):match("0x%x+"))
        assert.equal(holder:id(), row.blocker)
        qwake(q)
        results(w)
      end)
    end)

    it("allocates nothing per wait", function()
      run(function()
        local e1, e2 = ums.event(), ums.event()
        local n = 2000
        local peer = ums.spawn(function()
          for _ = 1, n do e1:wait(); e2:set() end
        end)
        settle()
        collectgarbage("collect")
        collectgarbage("stop")
        local before = collectgarbage("count")
        for _ = 1, n do e1:set(); e2:wait() end
        local grown = collectgarbage("count") - before
        collectgarbage("restart")
        results(peer)
        -- A table per wait would be n * 2 of them (both tasks wait).
        assert.is_true(grown < 16, ("grew %.1f KiB"):format(grown))
      end)
    end)

    it("checks its arguments", function()
      run(function()
        assert.has_error(function() qwake({}) end,
          "bad argument #1 to 'waitq_wake' (ums.waitq expected, got table)")
        assert.has_error(function() qwake(newq(), -1) end,
          "bad argument #2 to 'waitq_wake' (outcome must be a non-negative "
          .. "integer)")
      end)
    end)
  end)

  -- -------------------------------------------------------------------
  describe("waitgroup", function()
    it("waits until the counter is back to zero", function()
      run(function()
        local wg = ums.waitgroup()
        assert.is_true(wg:wait())
        assert.is_true(wg:add(3))
        local finished = 0
        for i = 1, 3 do
          ums.spawn(function()
            ums.sleep(0.001 * i)
            finished = finished + 1
            wg:done()
          end)
        end
        local waiters = {}
        for i = 1, 2 do
          waiters[i] = ums.spawn(function() return wg:wait() end)
        end
        assert.is_true(wg:wait())
        assert.equal(3, finished)
        for i = 1, 2 do assert.is_true(results(waiters[i])) end
        assert.is_true(wg:wait(0))
        -- add with a negative count counts down too.
        wg:add(2)
        local w = ums.spawn(function() return wg:wait() end)
        settle()
        wg:add(-2)
        assert.is_true(results(w))
      end)
    end)

    it("times out", function()
      run(function()
        local wg = ums.waitgroup()
        wg:add(1)
        assert.same({ nil, "timeout" }, { wg:wait(0) })
        local dt, ok, msg = timed(wg.wait, wg, 0.05)
        assert_waited(dt, 0.05)
        assert.is_nil(ok)
        assert.equal("timeout", msg)
        assert.is_true(wg:done())
        assert.is_true(wg:wait(0))
      end)
    end)

    it("refuses to count below zero", function()
      run(function()
        local wg = ums.waitgroup()
        assert_raises("ums.waitgroup:done: the counter would become "
          .. "negative", function() wg:done() end)
        wg:add(1)
        assert_raises("ums.waitgroup:add: the counter would become "
          .. "negative", function() wg:add(-2) end)
        assert.is_true(wg:done())
      end)
    end)

    it("skips a waiter that was cancelled", function()
      run(function()
        local wg = ums.waitgroup()
        wg:add(1)
        local victim = ums.spawn(function() wg:wait() end)
        local other = ums.spawn(function() return wg:wait() end)
        settle()
        victim:cancel()
        assert_cancelled(victim)
        wg:done()
        assert.is_true(results(other))
      end)
    end)
  end)

  -- -------------------------------------------------------------------
  describe("under preemption", function()
    -- The primitives count on running atomically between waits; the
    -- quantum must not cut into them (see the top of ums/sync.lua).
    if not PREEMPT_SAFE then
      pending("keeps channel order and mutual exclusion when the quantum "
        .. "interrupts tasks (needs core.nopreempt_chunk in ums.core)")
      return
    end
    if os.getenv("UMS_TSAN") then
      -- A 0.1 ms quantum under TSan's slowdown starves the run; the same
      -- stress runs in the normal and ASan builds.
      pending("keeps channel order under preemption (not under TSan)")
      return
    end

    it("keeps channel order and mutual exclusion", function()
      with_quantum(0.0001, function()
        run(function()
          -- A big buffer makes long steps, which the quantum cuts often,
          -- with the other party runnable meanwhile.
          local ch = ums.channel(1000)
          local n = 50000
          local producer = ums.spawn(function()
            for i = 1, n do ch:send(i) end
            ch:close()
          end)
          local expect = 1
          while true do
            local v, err = ch:recv()
            if err then break end
            if v ~= expect then
              error(("received %s, expected %d"):format(tostring(v),
                expect))
            end
            expect = expect + 1
          end
          results(producer)
          assert.equal(n + 1, expect)

          local m, inside, overlaps = ums.mutex(), 0, 0
          local tasks = {}
          for k = 1, 3 do
            tasks[k] = ums.spawn(function()
              for _ = 1, 20000 do
                m:lock()
                inside = inside + 1
                if inside ~= 1 then overlaps = overlaps + 1 end
                inside = inside - 1
                m:unlock()
              end
            end)
          end
          for k = 1, 3 do results(tasks[k]) end
          assert.equal(0, overlaps)
        end)
      end)
    end)
  end)

  -- -------------------------------------------------------------------
  describe("bad input", function()
    local samples = {
      { "nil", nil },
      { "boolean", true },
      { "integer", 2 },
      { "negative", -1 },
      { "fraction", 0.001 },
      { "string", "x" },
      { "table", {} },
      { "function", print },
      { "thread", coroutine.create(print) },
      { "channel", sync.channel() },
    }
    local TIMEOUT = { ["nil"] = true, integer = true, fraction = true }
    local ANY = setmetatable({}, { __index = function() return true end })

    -- Each row: the function's name as errors give it, the argument
    -- number they report, a call with the sample in that position, and
    -- the samples that are valid there. Method calls use `:` and are not
    -- tail calls, so numbering skips self as with lauxlib.
    local function fresh_recv_channel()
      local ch = sync.channel(1)
      ch:send(1)
      return ch
    end
    local rows = {
      { "mutex", "lock", 1, function(v)
        local m = ums.mutex()
        local r = m:lock(v)
        return r
      end, TIMEOUT },
      { "semaphore", "semaphore", 1, function(v)
        local r = ums.semaphore(v)  -- not a tail call: keep the caller
        return r
      end, { integer = true } },
      { "semaphore", "acquire", 1, function(v)
        local s = ums.semaphore(1)
        local r = s:acquire(v)
        return r
      end, TIMEOUT },
      { "semaphore", "release", 1, function(v)
        local s = ums.semaphore(0)
        local r = s:release(v)
        return r
      end, { ["nil"] = true, integer = true } },
      { "event", "event", 1, function(v)
        local r = ums.event(v)
        return r
      end, { ["nil"] = true, boolean = true } },
      { "event", "wait", 1, function(v)
        local e = ums.event(true)
        e:set()
        local r = e:wait(v)
        return r
      end, TIMEOUT },
      { "cond", "wait", 1, function(v)
        local c = ums.cond()
        local r = c:wait(v)
        return r
      end, {} },
      { "cond", "wait", 2, function(v)
        local m, c = ums.mutex(), ums.cond()
        m:lock()
        ums.spawn(function() c:signal() end)
        local r = c:wait(m, v)
        return r
      end, TIMEOUT },
      { "channel", "channel", 1, function(v)
        local r = ums.channel(v)
        return r
      end, { ["nil"] = true, integer = true } },
      { "channel", "send", 1, function(v)
        local ch = ums.channel(1)
        local r = ch:send(v)
        return r
      end, ANY },
      { "channel", "send", 2, function(v)
        local ch = ums.channel(1)
        local r = ch:send(1, v)
        return r
      end, TIMEOUT },
      { "channel", "recv", 1, function(v)
        local ch = fresh_recv_channel()
        local r = ch:recv(v)
        return r
      end, TIMEOUT },
      { "channel", "try_send", 1, function(v)
        local ch = ums.channel(1)
        local r = ch:try_send(v)
        return r
      end, ANY },
      { "select", "select", 1, function(v)
        local r = ums.select(v)
        return r
      end, {} },
      { "select", "select", 2, function(v)
        local r = ums.select({ { fresh_recv_channel(), "recv" } }, v)
        return r
      end, TIMEOUT },
      { "waitgroup", "add", 1, function(v)
        local wg = ums.waitgroup()
        wg:add(5)
        local r = wg:add(v)
        return r
      end, { integer = true, negative = true } },
      { "waitgroup", "wait", 1, function(v)
        local wg = ums.waitgroup()
        local r = wg:wait(v)
        return r
      end, TIMEOUT },
    }

    it("every argument position takes each kind of value safely", function()
      run(function()
        for _, row in ipairs(rows) do
          local what, fname, narg, call, valid = unpack(row)
          for _, sample in ipairs(samples) do
            local kind, v = sample[1], sample[2]
            local label = ("%s %s #%d given %s"):format(what, fname, narg,
              kind)
            local ok, err = pcall(call, v)
            if valid[kind] then
              assert(ok, label .. ": raised " .. tostring(err))
            else
              assert(not ok, label .. ": did not raise")
              assert(type(err) == "string", label .. ": non-string error")
              local want = ("bad argument #%d to '%s' ("):format(narg, fname)
              assert(err:find(want, 1, true),
                label .. ": unexpected error " .. err)
              -- The position is the caller's line, as for a Lua error.
              assert(err:find("sync_spec.lua:", 1, true),
                label .. ": no position in " .. err)
            end
          end
        end
      end)
    end)

    it("every method refuses a bad self", function()
      run(function()
        local objects = {
          mutex = { ums.mutex(), { "lock", "trylock", "unlock" } },
          semaphore = { ums.semaphore(0),
            { "acquire", "release", "value" } },
          event = { ums.event(), { "set", "reset", "wait", "is_set" } },
          cond = { ums.cond(), { "wait", "signal", "broadcast" } },
          channel = { ums.channel(), { "send", "recv", "close", "try_send",
            "try_recv", "len", "cap", "closed" } },
          waitgroup = { ums.waitgroup(), { "add", "done", "wait" } },
        }
        for what, entry in pairs(objects) do
          local obj, methods = entry[1], entry[2]
          for _, name in ipairs(methods) do
            local f = obj[name]
            for _, sample in ipairs(samples) do
              -- A channel is a valid self for channel methods.
              if what ~= "channel" or sample[1] ~= "channel" then
                local ok, err = pcall(f, sample[2])
                local label = ("%s:%s self = %s"):format(what, name,
                  sample[1])
                assert(not ok, label .. ": did not raise")
                local want = ("bad argument #1 to '%s' (ums.%s expected, "
                  .. "got %s)"):format(name, what, sample[1] == "channel"
                    and "ums.channel" or type(sample[2]))
                assert(err:find(want, 1, true),
                  label .. ": " .. tostring(err))
              end
            end
          end
        end
        -- Through `:` on an impostor, worded like lauxlib's.
        local impostor = setmetatable({}, { __index = getmetatable(
          ums.mutex()).__index })
        assert.has_error(function() impostor:lock() end)
        local ok, err = pcall(function() impostor:lock() end)
        assert.is_false(ok)
        assert.matches(
          "calling 'lock' on bad self %(ums.mutex expected, got table%)",
          err)
      end)
    end)

    it("words the errors like lauxlib", function()
      run(function()
        local function message(f)
          local ok, err = pcall(f)
          assert.is_false(ok)
          return (err:gsub("^[^:]*:%d+: ", ""))
        end
        assert.equal(
          "bad argument #1 to 'semaphore' (number expected, got string)",
          message(function() ums.semaphore("3") end))
        assert.equal("bad argument #1 to 'semaphore' "
          .. "(number has no integer representation)",
          message(function() ums.semaphore(1.5) end))
        assert.equal("bad argument #1 to 'channel' (size must not be "
          .. "negative)", message(function() ums.channel(-1) end))
        local m = ums.mutex()
        assert.equal("bad argument #1 to 'lock' (timeout must be a "
          .. "non-negative number)", message(function() m:lock(-1) end))
        assert.equal("bad argument #1 to 'lock' (timeout is NaN, not a "
          .. "number of seconds)", message(function() m:lock(0 / 0) end))
        assert.equal("bad argument #1 to 'wait' (ums.mutex expected, got "
          .. "ums.channel)", message(function()
            ums.cond():wait(ums.channel())
          end))
        local ch = ums.channel()
        assert.equal("bad argument #1 to 'select' (no cases)",
          message(function() ums.select {} end))
        assert.equal("bad argument #1 to 'select' (case 1: table "
          .. "expected, got number)", message(function()
            ums.select { 42 }
          end))
        assert.equal("bad argument #1 to 'select' (case 2: ums.channel "
          .. "expected, got nil)", message(function()
            ums.select { { ch, "recv" }, { nil, "recv" } }
          end))
        assert.equal("bad argument #1 to 'select' (case 1: operation "
          .. "must be \"recv\" or \"send\", got \"peek\")",
          message(function() ums.select { { ch, "peek" } } end))
        assert.equal("bad argument #1 to 'release' (count must be "
          .. "positive)", message(function()
            ums.semaphore(0):release(0)
          end))
      end)
    end)

    it("waits that cannot complete at once need a task", function()
      local ch = ums.channel(1)
      assert.is_true(ch:send(1))           -- completes at once
      assert.equal(1, ch:recv())
      assert.same({ nil, "timeout" }, { ch:recv(0) })
      local ok, err = pcall(ch.recv, ch)
      assert.is_false(ok)
      assert.matches("ums.channel:recv: not inside a task", err)
      ok, err = pcall(ums.select, { { ch, "recv" } })
      assert.is_false(ok)
      assert.matches("ums.select: not inside a task", err)
    end)
  end)
end)
