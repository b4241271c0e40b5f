-- Programs ported from other runtimes (Tarantool fibers, Go, luv and
-- cqueues), written the way a user coming from them writes them, with
-- the output the original gives. Where ums differs by design the
-- expected value is ums's, a comment gives the original's, and
-- docs/guide.md ("Porting from other runtimes") says so. Timers run on
-- the virtual clock; sockets are local.
local ums = require "ums"

-- Runs fn(log) as a test task (on the virtual clock with opts) and
-- returns the lines it logged, each value tostring'ed, space separated.
local function trace(fn, opts)
  local out = {}
  local function log(...)
    local t = {}
    for i = 1, select("#", ...) do t[#t + 1] = tostring((select(i, ...))) end
    out[#out + 1] = table.concat(t, " ")
  end
  ums.test(function() fn(log) end, opts)
  return out
end

local VIRTUAL = {clock = "virtual"}

local function cancelled(ok, err)
  return ok == false and rawequal(err, ums.CANCELLED)
end

-- Go's `for v := range ch`: the values until the channel is closed.
local function range(ch)
  return function()
    local v, err = ch:recv()
    if err == "closed" then return nil end
    return true, v
  end
end

describe("Tarantool fiber programs", function()
  it("fiber.sleep(0) and fiber.yield() let the other fibers run", function()
    -- Tarantool prints "a1 b1 a2 b2 a3 b3" for both, started or not.
    local pauses = {
      sleep0 = function() ums.sleep(0) end,
      yield = function() ums.yield() end,
    }
    for name, pause in pairs(pauses) do
      for _, started in ipairs{false, true} do
        local order = {}
        ums.test(function()
          local function body(tag)
            if started then ums.yield() end
            for i = 1, 3 do
              order[#order + 1] = tag .. i
              pause()
            end
          end
          local a, b = ums.spawn(body, "a"), ums.spawn(body, "b")
          assert(a:join())
          assert(b:join())
        end)
        assert.equal("a1 b1 a2 b2 a3 b3", table.concat(order, " "),
                     name .. (started and ", started" or ""))
      end
    end
  end)

  it("fiber.channel: put/get with timeouts, count, close", function()
    local out = trace(function(log)
      local ch = ums.channel(2)
      log("size", ch:cap(), "count", ch:len())
      log("put", ch:send("a"), ch:send("b", 0))
      log("full", ch:len() == ch:cap())
      log("put timeout", ch:send("c", 0.01))       -- Tarantool: false
      log("get", ch:recv(), ch:recv())
      log("get timeout", ch:recv(0.01))            -- Tarantool: nil
      -- a reader waiting when the channel closes
      local ch2 = ums.channel()
      local r = ums.spawn(function() return ch2:recv() end)
      ums.yield()
      ch2:close()
      log("reader", select(2, r:join()))
      log("put closed", ch2:send(1))                -- Tarantool: false
      -- close with values buffered: ums drains them first
      local ch3 = ums.channel(3)
      ch3:send(1)
      ch3:send(2)
      ch3:close()
      log("drain", ch3:recv(0), ch3:recv(0), ch3:recv(0))  -- Tarantool: nil
      -- a writer waiting on a full channel when it closes
      local ch4 = ums.channel(1)
      ch4:send("x")
      local w = ums.spawn(function() return ch4:send("y") end)
      ums.yield()
      ch4:close()
      log("writer", select(2, w:join()))
      -- nil is a value
      local ch5 = ums.channel(2)
      log("nil", ch5:send(nil), ch5:len(), ch5:recv(0), ch5:len())
      -- an unbuffered rendezvous
      local ch6 = ums.channel()
      ums.spawn(function()
        for i = 1, 3 do ch6:send(i) end
        ch6:send(nil)
      end)
      local s = {}
      for _ = 1, 4 do s[#s + 1] = tostring(ch6:recv(1)) end
      log("rendezvous", table.concat(s, ","))
    end, VIRTUAL)
    assert.same({
      "size 2 count 0",
      "put true true",
      "full true",
      "put timeout nil timeout",
      "get a b",
      "get timeout nil timeout",
      "reader nil closed",
      "put closed nil closed",
      "drain 1 2 nil closed",
      "writer nil closed",
      "nil true 1 nil 0",
      "rendezvous 1,2,3,nil",
    }, out)
  end)

  it("fiber.cond: signal wakes the first, broadcast the rest", function()
    local out = trace(function(log)
      local cond, m = ums.cond(), ums.mutex()
      local woke = {}
      for i = 1, 3 do
        ums.spawn(function()
          m:lock()
          local ok = cond:wait(m, 1)
          m:unlock()
          woke[#woke + 1] = i .. ":" .. tostring(ok)
        end)
      end
      ums.yield()
      cond:signal()
      ums.sleep(0.01)
      log("signal", table.concat(woke, " "))
      cond:broadcast()
      ums.sleep(0.01)
      log("broadcast", table.concat(woke, " "))
      m:lock()
      log("timeout", cond:wait(m, 0.01))            -- Tarantool: false
      m:unlock()
    end, VIRTUAL)
    assert.same({"signal 1:true", "broadcast 1:true 2:true 3:true",
                 "timeout nil timeout"}, out)
  end)

  it("fiber join, cancel and testcancel", function()
    local out = trace(function(log)
      local f = ums.spawn(function(a, b) ums.sleep(0.01) return a + b end, 1, 2)
      log("join", f:join())
      local ok, err = ums.spawn(function() error("boom", 0) end):join()
      log("error", ok, err)
      local sleeper = ums.spawn(function() ums.sleep(10) return "slept" end)
      ums.yield()
      sleeper:cancel()
      log("cancel sleep", cancelled(sleeper:join()))
      -- fiber.testcancel() in a loop: any ums wait is a cancel point
      local n = 0
      local looper = ums.spawn(function() while true do n = n + 1 ums.yield() end end)
      ums.yield()
      ums.yield()
      looper:cancel()
      log("cancel loop", cancelled(looper:join()), n > 0)
      local ch = ums.channel()
      local getter = ums.spawn(function() return ch:recv() end)
      ums.yield()
      getter:cancel()
      log("cancel get", cancelled(getter:join()), ums.channel_queues(ch))
      -- a fiber cancelled before it ran: it never runs
      local ran = false
      local never = ums.spawn(function() ran = true end)
      never:cancel()
      log("cancel unstarted", cancelled(never:join()), ran)
    end, VIRTUAL)
    assert.same({"join true 3", "error false boom", "cancel sleep true",
                 "cancel loop true true", "cancel get true 0 0",
                 "cancel unstarted true false"}, out)
  end)
end)

describe("Go concurrency patterns", function()
  it("a pipeline, fan-out and fan-in", function()
    local out = trace(function(log)
      local function gen(...)
        local out, nums = ums.channel(), {...}
        ums.spawn(function()
          for _, n in ipairs(nums) do out:send(n) end
          out:close()
        end)
        return out
      end
      local function sq(inp)
        local out = ums.channel()
        ums.spawn(function()
          for _, n in range(inp) do out:send(n * n) end
          out:close()
        end)
        return out
      end
      local function merge(...)
        local wg, out, cs = ums.waitgroup(), ums.channel(), {...}
        wg:add(#cs)
        for _, c in ipairs(cs) do
          ums.spawn(function()
            for _, n in range(c) do out:send(n) end
            wg:done()
          end)
        end
        ums.spawn(function() wg:wait() out:close() end)
        return out
      end
      local s = 0
      for _, v in range(sq(sq(gen(1, 2, 3, 4)))) do s = s + v end
      log("pipeline", s)
      local inp = gen(1, 2, 3, 4, 5, 6, 7, 8)
      local got = {}
      for _, v in range(merge(sq(inp), sq(inp), sq(inp))) do got[#got + 1] = v end
      table.sort(got)
      log("fanin", table.concat(got, " "))
    end)
    assert.same({"pipeline 354", "fanin 1 4 9 16 25 36 49 64"}, out)
  end)

  it("a worker pool with a context's deadline", function()
    local out = trace(function(log)
      -- context.WithTimeout: a done channel closed at the deadline
      local done, ctxerr = ums.channel(), nil
      local timer = ums.spawn(function()
        ums.sleep(0.05)
        ctxerr = "context deadline exceeded"
        done:close()
      end)
      local jobs, results, wg = ums.channel(100), ums.channel(100),
                                ums.waitgroup()
      for _ = 1, 3 do
        wg:add(1)
        ums.spawn(function()
          while true do
            local i, j, err = ums.select({{done, "recv"}, {jobs, "recv"}})
            if i == 1 or err == "closed" then break end
            ums.sleep(j / 1000)
            results:send(j)
          end
          wg:done()
        end)
      end
      for _ = 1, 5 do jobs:send(1) end
      for _ = 1, 5 do jobs:send(1000) end
      wg:wait()
      timer:join()
      results:close()
      local n, long = 0, 0
      for _, j in range(results) do
        n = n + 1
        if j == 1000 then long = long + 1 end
      end
      -- Each worker finishes the job it holds at the deadline.
      log("pool", n, long, ctxerr)
    end, VIRTUAL)
    assert.same({"pool 8 3 context deadline exceeded"}, out)
  end)

  it("select with default, with time.After, and a ticker", function()
    local out = trace(function(log)
      local ch = ums.channel(1)
      log(ums.select({{ch, "recv"}}, 0) or "default")
      ch:send(7)
      log(ums.select({{ch, "recv"}}, 0))
      log(ums.select({{ch, "recv"}}, 0.01))
      -- time.NewTicker(10ms) read until a 55 ms deadline, then Stop
      local tick = ums.channel(1)
      local t0 = ums.now()
      local ticker = ums.spawn(function()
        while true do
          ums.sleep(0.01)
          tick:try_send(ums.now() - t0)
        end
      end)
      local deadline, ticks = t0 + 0.055, {}
      while true do
        local i, at = ums.select({{tick, "recv"}}, deadline - ums.now())
        if not i then break end
        ticks[#ticks + 1] = string.format("%.2f", at)
      end
      ticker:cancel()
      log("ticks", table.concat(ticks, " "))
    end, VIRTUAL)
    assert.same({"default", "1 7", "nil timeout",
                 "ticks 0.01 0.02 0.03 0.04 0.05"}, out)
  end)

  it("sync.Mutex, sync.Once and sync.WaitGroup", function()
    local out = trace(function(log)
      local mu, cnt, wg = ums.mutex(), 0, ums.waitgroup()
      for _ = 1, 100 do
        wg:add(1)
        ums.spawn(function()
          for _ = 1, 10 do
            mu:lock()
            local c = cnt
            ums.yield()     -- another task may run: the lock keeps it out
            cnt = c + 1
            mu:unlock()
          end
          wg:done()
        end)
      end
      wg:wait()
      log("counter", cnt)
      local function once()
        local m, did = ums.mutex(), false
        return function(f)
          if did then return end
          m:lock()
          if not did then f() did = true end
          m:unlock()
        end
      end
      local o, calls, wg2 = once(), 0, ums.waitgroup()
      for _ = 1, 10 do
        wg2:add(1)
        ums.spawn(function()
          o(function() ums.sleep(0.005) calls = calls + 1 end)
          wg2:done()
        end)
      end
      wg2:wait()
      log("once", calls)
    end, VIRTUAL)
    assert.same({"counter 1000", "once 1"}, out)
  end)

  it("errgroup: the first error cancels the others", function()
    local out = trace(function(log)
      local g = ums.group()
      local cancelled_n = 0
      for k = 0, 4 do
        g:spawn(function()
          if k == 2 then error("task 2 failed", 0) end
          local ok, e = pcall(ums.sleep, 1)
          if not ok then cancelled_n = cancelled_n + 1 error(e, 0) end
        end)
      end
      local ok, err = g:wait()
      -- Go's goroutines 3 and 4 run (4 see the cancel); ums's tasks 3 and
      -- 4 had not started when task 2 failed, so they never run.
      log("errgroup", ok, err, cancelled_n)
    end, VIRTUAL)
    assert.same({"errgroup false task 2 failed 2"}, out)
  end)

  it("a bounded semaphore, and closing a channel receivers range over",
     function()
    local out = trace(function(log)
      local sem, wg, cur, peak = ums.semaphore(3), ums.waitgroup(), 0, 0
      for _ = 1, 10 do
        wg:add(1)
        ums.spawn(function()
          sem:acquire()
          cur = cur + 1
          if cur > peak then peak = cur end
          ums.sleep(0.005)
          cur = cur - 1
          sem:release()
          wg:done()
        end)
      end
      wg:wait()
      log("peak", peak)
      local cc, wg2, counts = ums.channel(), ums.waitgroup(), {0, 0, 0}
      for k = 1, 3 do
        wg2:add(1)
        ums.spawn(function()
          for _ in range(cc) do counts[k] = counts[k] + 1 end
          wg2:done()
        end)
      end
      for k = 0, 29 do cc:send(k) end
      cc:close()
      wg2:wait()
      log("ranged", counts[1] + counts[2] + counts[3],
          counts[1] > 0 and counts[2] > 0 and counts[3] > 0)
    end, VIRTUAL)
    assert.same({"peak 3", "ranged 30 true"}, out)
  end)

  it("sync.RWMutex as applock S and X", function()
    local out = trace(function(log)
      local readers, maxr, wg = 0, 0, ums.waitgroup()
      for _ = 1, 5 do
        wg:add(1)
        ums.spawn(function()
          local l <close> = assert(ums.applock.acquire("rw", "S"))
          readers = readers + 1
          if readers > maxr then maxr = readers end
          ums.sleep(0.01)
          readers = readers - 1
          wg:done()
        end)
      end
      ums.sleep(0.001)
      do
        local l <close> = assert(ums.applock.acquire("rw", "X"))
        log("writer sees readers", readers, "max", maxr)
      end
      wg:wait()
    end, VIRTUAL)
    assert.same({"writer sees readers 0 max 5"}, out)
  end)
end)

describe("luv and cqueues programs", function()
  it("timers: one-shot, repeating, stopped", function()
    local out = trace(function(log)
      local fired = {}
      local t0 = ums.now()
      local function at() return string.format("%.3f", ums.now() - t0) end
      local once = ums.spawn(function() ums.sleep(0.02) fired[#fired + 1] = "once@" .. at() end)
      local rep = ums.spawn(function()
        while true do ums.sleep(0.008) fired[#fired + 1] = "rep@" .. at() end
      end)
      local stopped = ums.spawn(function() ums.sleep(0.5) fired[#fired + 1] = "never" end)
      ums.sleep(0.03)
      rep:cancel()
      stopped:cancel()
      assert(once:join())
      log(table.concat(fired, " "))
    end, VIRTUAL)
    assert.same({"rep@0.008 rep@0.016 once@0.020 rep@0.024"}, out)
  end)

  it("a TCP echo server and clients that half-close", function()
    local out = trace(function(log)
      local srv = assert(ums.net.listen("127.0.0.1", 0))
      local _, port = srv:getsockname()
      local server = ums.spawn(function()
        while true do
          local c = srv:accept()
          if not c then return end
          ums.spawn(function()
            while true do
              local data = c:recv()
              if not data then break end
              assert(c:send(data))
            end
            c:close()
          end)
        end
      end)
      local clients, good = {}, 0
      for i = 1, 20 do
        clients[i] = ums.spawn(function()
          local c <close> = assert(ums.net.connect("127.0.0.1", port))
          local msg = string.rep(string.char(64 + i), 5000 * i)
          assert(c:write(msg))
          assert(c:shutdown("w"))
          return c:read("a") == msg
        end)
      end
      for i = 1, 20 do
        local ok, same = clients[i]:join()
        if ok and same then good = good + 1 end
      end
      srv:close()
      server:join()
      log("echoed", good)
    end)
    assert.same({"echoed 20"}, out)
  end)

  it("a line chat server with three clients", function()
    local out = trace(function(log)
      local srv = assert(ums.net.listen("127.0.0.1", 0))
      local _, port = srv:getsockname()
      local members, joined = {}, ums.semaphore(0)
      local server = ums.spawn(function()
        while true do
          local c = srv:accept()
          if not c then return end
          members[c] = true
          joined:release()
          ums.spawn(function()
            for line in c:lines() do
              for o in pairs(members) do
                if o ~= c then o:write(line, "\n") end
              end
            end
            members[c] = nil
            c:close()
          end)
        end
      end)
      local names, conns, readers = {"ann", "bob", "cid"}, {}, {}
      for k in ipairs(names) do
        conns[k] = assert(ums.net.connect("127.0.0.1", port))
      end
      for _ = 1, 3 do joined:acquire() end
      for k in ipairs(names) do
        readers[k] = ums.spawn(function()
          local heard = {}
          for _ = 1, 4 do heard[#heard + 1] = assert(conns[k]:read("l")) end
          table.sort(heard)
          return table.concat(heard, "; ")
        end)
      end
      for k, n in ipairs(names) do
        conns[k]:write(n, " says hi\n", n, " says bye\n")
      end
      for k, n in ipairs(names) do log(n, select(2, readers[k]:join())) end
      for k in ipairs(names) do conns[k]:close() end
      srv:close()
      server:join()
    end)
    assert.same({
      "ann bob says bye; bob says hi; cid says bye; cid says hi",
      "bob ann says bye; ann says hi; cid says bye; cid says hi",
      "cid ann says bye; ann says hi; bob says bye; bob says hi",
    }, out)
  end)

  it("a lookup, a file read while a timer ticks, many short tasks",
     function()
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    for k = 1, 20000 do f:write("line ", k, "\n") end
    f:close()
    local out = trace(function(log)
      local addrs = assert(ums.net.resolve("localhost", "http",
                                           {family = "inet", socktype = "stream"}))
      log("resolve", addrs[1].addr, addrs[1].port)
      local ticks = 0
      local tick = ums.spawn(function()
        while true do ums.sleep(0.001) ticks = ticks + 1 end
      end)
      local n, last = 0, nil
      for l in ums.fs.lines(path) do n, last = n + 1, l end
      tick:cancel()
      log("lines", n, last)
      local ts, sum = {}, 0
      for k = 1, 10000 do ts[k] = ums.spawn(function(x) return x end, k) end
      for k = 1, 10000 do sum = sum + select(2, ts[k]:join()) end
      log("sum", sum)
    end)
    os.remove(path)
    assert.same({"resolve 127.0.0.1 80", "lines 20000 line 20000",
                 "sum 50005000"}, out)
  end)

  -- cqueues' condition ports as Tarantool's fiber.cond above.
  it("cqueues' promise", function()
    local out = trace(function(log)
      -- promise.new(f, ...): get() returns the results or raises
      local function promise(fn, ...)
        local t = ums.spawn(fn, ...)
        return {
          get = function()
            local r = table.pack(t:join())
            if not r[1] then error(r[2], 0) end
            return table.unpack(r, 2, r.n)
          end,
          status = function()
            local s = t:status()
            return s == "done" and "fulfilled"
              or (s == "error" or s == "cancelled") and "rejected" or "pending"
          end,
        }
      end
      local p = promise(function(a, b) ums.sleep(0.01) return a + b, "x" end, 1, 2)
      log("status", p.status())
      log("get", p.get())
      log("status", p.status())
      local p2 = promise(function() error("bad", 0) end)
      log("get err", pcall(p2.get))
      log("status", p2.status())
    end, VIRTUAL)
    assert.same({"status pending", "get 3 x",
                 "status fulfilled", "get err false bad", "status rejected"},
                out)
  end)
end)

describe("what a porter gets wrong", function()
  it("negative and NaN timeouts raise, naming the argument", function()
    ums.test(function()
      local ch = ums.channel(1)
      local calls = {
        {function() return ch:recv(-1) end, "bad argument #1 to 'recv'"},
        {function() return ch:send(1, -0.5) end, "bad argument #2 to 'send'"},
        {function() return ums.sleep(-1) end, "bad argument #1 to 'sleep'"},
        {function() return ums.select({{ch, "recv"}}, -1) end,
         "bad argument #2 to 'select'"},
        {function() return ums.mutex():lock(-1) end, "bad argument #1 to 'lock'"},
        {function() return ums.spawn(ums.yield):join(-1) end,
         "bad argument #1 to 'join'"},
      }
      for _, c in ipairs(calls) do
        local ok, err = pcall(c[1])
        assert.is_false(ok)
        assert.truthy(err:find(c[2], 1, true), err)
        assert.truthy(err:find("negative", 1, true), err)
      end
      local ok, err = pcall(ch.recv, ch, 0 / 0)
      assert.is_false(ok)
      assert.truthy(err:find("NaN", 1, true), err)
    end)
  end)

  it("an error in a task nobody joins reaches ums.on_error", function()
    local seen = {}
    local prev = debug.getregistry()["ums.on_error"]
    ums.on_error(function(err) seen[#seen + 1] = tostring(err) end)
    local ok, err = pcall(ums.run, function()
      ums.spawn(function() error("first", 0) end)
      ums.spawn(function() ums.sleep(0.001) error("second", 0) end)
    end)
    ums.on_error(prev)
    assert(ok, err)
    table.sort(seen)
    assert.same({"first", "second"}, seen)
  end)

  it("cancel ends every kind of wait", function()
    ums.test(function()
      local m, sem, ev, cv = ums.mutex(), ums.semaphore(0), ums.event(),
                             ums.cond()
      local q = ums.workqueue{}
      local srv = assert(ums.net.listen("127.0.0.1", 0))
      local holder = ums.spawn(function() m:lock() ums.sleep(10) end)
      local lock = assert(ums.applock.acquire("ported", "X"))
      local done = ums.event(true)
      q:post(done.wait, done)
      ums.yield()
      local waits = {
        sleep = function() ums.sleep(10) end,
        recv = function() ums.channel():recv() end,
        send = function() ums.channel():send(1) end,
        select = function()
          ums.select({{ums.channel(), "recv"}, {ums.channel(), "send", 1}})
        end,
        lock = function() m:lock() end,
        acquire = function() sem:acquire() end,
        event = function() ev:wait() end,
        cond = function()
          local own = ums.mutex()
          own:lock()
          cv:wait(own)
        end,
        waitgroup = function()
          local wg = ums.waitgroup()
          wg:add(1)
          wg:wait()
        end,
        join = function() holder:join() end,
        group = function()
          -- leaving the scope by the cancel cancels the member too
          local g <close> = ums.group()
          g:spawn(ums.sleep, 10)
          g:wait()
        end,
        workqueue = function() q:wait() end,
        applock = function() ums.applock.acquire("ported", "X") end,
        accept = function() srv:accept() end,
        nested_run = function() ums.run(ums.sleep, 10) end,
        park = function() ums.park_begin() ums.park_wait() end,
      }
      for name, wait in pairs(waits) do
        local t = ums.spawn(wait)
        ums.sleep(0.001)
        assert.equal("suspended", t:status(), name)
        t:cancel()
        assert.is_true(cancelled(t:join(5)), name)
      end
      lock:release()
      done:set()
      holder:cancel()
      holder:join()
      q:close()
      assert.is_true(q:wait(5))
      srv:close()
    end)
  end)
end)
