-- Specs for deadlock reports (docs/deadlocks.md): a run whose tasks are
-- all blocked with nothing that could wake them ends with an error that
-- lists each blocked task (id, name, wait type, object, holder,
-- traceback), instead of hanging. What is only slow (a sleep, a C call
-- or a file read in flight, another VM's task) is never reported.
--
-- Each run has a real-time limit (core.run_limit): a missing report shows
-- as "time limit" instead of a hang.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")
local core = require "ums.core"

local LIMIT = 20  -- seconds: bounds a hang, measures nothing
local THIS = debug.getinfo(1, "S").source:sub(2)

-- Runs fn as the first task of a run with the given settings, within
-- limit seconds (LIMIT by default); returns ok and the run's result or
-- error.
local function run(fn, cfg, limit)
  local prev = ums.config()
  local saved = {}
  for k in pairs(cfg or {}) do saved[k] = prev[k] end
  if cfg then ums.config(cfg) end
  local ok, res = pcall(core.run_limit, limit or LIMIT, fn)
  for k in pairs(cfg or {}) do
    ums.config{[k] = saved[k] == nil and (k == "deadlock") or saved[k]}
  end
  return ok, res
end

local function count(s, pat)
  local n = 0
  for _ in s:gmatch(pat) do n = n + 1 end
  return n
end

describe("a deadlock", function()
  it("an auto-reset event set once, two waiters: the report names the "
     .. "one left", function()
    local ok, err = run(function()
      local e = ums.event()
      local a = ums.spawn(function() e:wait() end)
      a:name("first")
      local b = ums.spawn(function() e:wait() end)
      b:name("second")
      ums.yield()
      e:set()
    end)
    assert.is_false(ok)
    assert.is_string(err)
    assert.truthy(err:find("ums.run: deadlock: 1 task(s) blocked", 1, true),
                  err)
    assert.equal(1, count(err, "\n  task %d+ '"))
    assert.truthy(err:find("waits: event on ums.event: ", 1, true), err)
    assert.truthy(err:find("'first'", 1, true) or
                  err:find("'second'", 1, true), err)
    assert.truthy(err:find("stack traceback:", 1, true), err)
    assert.truthy(err:find("in function <" .. THIS .. ":", 1, true), err)
  end)

  it("two mutexes taken in opposite orders: both tasks, each held by "
     .. "the other", function()
    local ids = {}
    local ok, err = run(function()
      local m1, m2 = ums.mutex(), ums.mutex()
      local go = ums.event(true)
      local a = ums.spawn(function() m1:lock(); go:wait(); m2:lock() end)
      local b = ums.spawn(function() m2:lock(); go:wait(); m1:lock() end)
      a:name("ab")
      b:name("ba")
      ids.a, ids.b = a:info().id, b:info().id
      ums.yield()
      go:set()
      a:join()
    end)
    assert.is_false(ok)
    assert.truthy(err:find("ums.run: deadlock: 3 task(s) blocked", 1, true),
                  err)
    assert.truthy(err:find(("task %d 'ab' %%(scheduler %%d+%%) waits: mutex "
                            .. "on ums.mutex: [^\n]*, held by task %d")
                           :format(ids.a, ids.b)), err)
    assert.truthy(err:find(("task %d 'ba' %%(scheduler %%d+%%) waits: mutex "
                            .. "on ums.mutex: [^\n]*, held by task %d")
                           :format(ids.b, ids.a)), err)
    assert.truthy(err:find("waits: join on ums.task", 1, true), err)
    assert.equal(3, count(err, "stack traceback:"))
  end)

  it("a channel nobody writes", function()
    local ok, err = run(function()
      local ch = ums.channel()
      return ch:recv()
    end)
    assert.is_false(ok)
    assert.truthy(err:find("ums.run: deadlock: 1 task(s) blocked", 1, true),
                  err)
    assert.truthy(err:find("waits: channel_recv on ums.channel: ", 1, true),
                  err)
    assert.truthy(err:find("in method 'recv'", 1, true), err)
  end)

  it("a condition wait whose mutex was left locked by a task that ended: "
     .. "the report, and wait raises instead of hanging", function()
    local waited
    local ok, err = run(function()
      local m, c = ums.mutex(), ums.cond()
      local w = ums.spawn(function()
        m:lock()
        local ok2, e = pcall(c.wait, c, m)
        waited = {ok2, e, m.owner}
      end)
      ums.yield()  -- w holds m and waits on c
      -- Signals w while holding m, and ends holding it.
      local h = ums.spawn(function() m:lock(); c:signal() end)
      h:join()
      w:join()
    end)
    assert.is_false(ok)
    assert.truthy(err:find("ums.run: deadlock:", 1, true), err)
    assert.truthy(err:find("waits: mutex on ums.mutex: [^\n]*, held by task "
                           .. "%d+, which has ended\n"), err)
    assert.is_table(waited)
    assert.is_false(waited[1])
    assert.truthy(tostring(waited[2]):find("ums.cond:wait: deadlock: the "
      .. "mutex cannot be locked again %(its holder, task %d+, has ended%)"),
      tostring(waited[2]))
    -- Not the waiter's: unlock in a <close> handler would raise, as it
    -- should.
    assert.is_not_nil(waited[3])
  end)

  it("behind a C call nobody waits for any more: reported once it ends",
     function()
    local ffi = ums.ffi
    ffi.cdef[[ int usleep(unsigned int usec); ]]
    local sleep = ffi.timeout(ffi.C.usleep, 0.01)
    local ok, err = run(function()
      -- Given up after 10 ms; the call goes on for 0.3 s, detached, and
      -- the scheduler goes idle counting it.
      local res, why = sleep(300000)
      assert(res == nil and why == "timeout", why)
      return ums.channel():recv()
    end)
    assert.is_false(ok)
    assert.truthy(err:find("ums.run: deadlock: 1 task(s) blocked", 1, true),
                  err)
  end)

  it("fails ums.test at once on the real clock, with the report",
     function()
    local ok, err = pcall(ums.test, function()
      ums.channel():recv()
    end, 10)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("deadlock: 1 task(s) blocked", 1, true),
                  tostring(err))
  end)

  it("of many tasks blocked the same way: one entry counts them, so the "
     .. "report's size does not grow with their number", function()
    local sizes = {}
    for _, n in ipairs{50, 5000} do
      local ok, err = run(function()
        local e, m = ums.event(), ums.mutex()
        for _ = 1, n do ums.spawn(function() e:wait() end) end
        local holder = ums.spawn(function() m:lock(); e:wait() end)
        holder:name("holder")
        for _ = 1, 2 do ums.spawn(function() m:lock() end) end
        ums.yield()
      end)
      assert.is_false(ok)
      assert.truthy(err:find("ums.run: deadlock: " .. (n + 3)
        .. " task(s) blocked", 1, true), err)
      -- The n waiters: one entry and a count. The holder waits the same
      -- way from another line, so it has an entry of its own; the two
      -- on the mutex share one, which names the holder.
      assert.truthy(err:find("and " .. (n - 1) .. " more task%(s%) blocked "
        .. "the same way, with the same traceback: %d+ %d+"), err)
      assert.truthy(err:find("'holder' (scheduler 0) waits: event", 1, true),
                    err)
      assert.truthy(err:find("waits: mutex on ums.mutex: 0x%x+, held by "
        .. "task %d+\n"), err)
      assert.truthy(err:find("and 1 more task(s) blocked the same way", 1,
                             true), err)
      assert.equal(3, count(err, "\n  task %d+ "))
      sizes[#sizes + 1] = #err
    end
    -- Ids differ in length at most; nothing else grows with n.
    assert.is_true(sizes[2] < sizes[1] + 200, sizes[1] .. " " .. sizes[2])
  end)

  it("is waited out with deadlock = false", function()
    local ok, err = run(function()
      -- The run's limit ends it, not a report.
      local ch = ums.channel()
      ums.spawn(function() ch:recv() end)
    end, {deadlock = false}, 0.5)
    assert.is_false(ok)
    assert.truthy(err:find("ums.run: time limit", 1, true), err)
  end)
end)

describe("not a deadlock", function()
  it("a task sleeps 0.2 s, then sets the event another waits on",
     function()
    local ok, res = run(function()
      local e = ums.event()
      ums.spawn(function() ums.sleep(0.2); e:set() end)
      assert(e:wait())
      return "woken"
    end)
    assert.is_true(ok, res)
    assert.equal("woken", res)
  end)

  it("a task waits for a C call in flight", function()
    local ffi = ums.ffi
    ffi.cdef[[ int usleep(unsigned int usec); ]]
    local ok, res = run(function()
      local ch = ums.channel()
      ums.spawn(function()
        ffi.C.usleep(200000)
        ch:send("returned")
      end)
      return ch:recv()
    end)
    assert.is_true(ok, res)
    assert.equal("returned", res)
  end)

  -- The writer is a shell, which cannot start under a TSan preload.
  local TSAN = (os.getenv("LD_PRELOAD") or ""):find("libtsan") ~= nil
  local it_sh = TSAN and pending or it

  it_sh("a task waits for a file read in flight", function()
    local dir = os.tmpname()
    os.remove(dir)
    local fifo = dir .. ".fifo"
    assert(os.execute("mkfifo " .. fifo))
    -- The writer opens the FIFO 0.2 s later: until then the open and the
    -- read are in flight.
    assert(os.execute(("(sleep 0.2; printf data > %s) &"):format(fifo)))
    local ok, res = run(function()
      local ch = ums.channel()
      ums.spawn(function()
        local f = assert(ums.fs.open(fifo, "r"))
        ch:send(f:read("a"))
        f:close()
      end)
      return ch:recv()
    end)
    os.remove(fifo)
    assert.is_true(ok, res)
    assert.equal("data", res)
  end)

  it("a shared object signalled from another VM's task", function()
    local ok, res = run(function()
      local e = ums.shared.event()
      ums.submit_on(1, function(e)
        local ums = require "ums"
        ums.sleep(0.2)
        e:set()
      end, e)
      assert(e:wait())
      return "set"
    end, {schedulers = 2})
    assert.is_true(ok, res)
    assert.equal("set", res)
  end)
end)
