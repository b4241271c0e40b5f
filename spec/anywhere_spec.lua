-- Yield from anywhere: a ums wait parks only the waiting task in every
-- context, including those where Lua itself cannot yield (C functions
-- calling back into Lua, metamethods, the user's own coroutines). Every
-- combination of a context and a wait is a spec of its own; another task
-- increments a counter all along, which proves that the rest of the run
-- kept going while the task waited.
local ums = require "ums"

local has_sync = pcall(require, "ums.sync")
local TIMEOUT = 20  -- per spec, seconds (ASan builds are slow)

-- Waits. Each one returns only after it really waited (for another task
-- or a timer) and checks its own results.
local waits = {}
local wait_names = {}
local function wait(name, fn)
  waits[name] = fn
  wait_names[#wait_names + 1] = name
end

wait("ums.sleep", function()
  local t0 = ums.now()
  ums.sleep(0.005)
  assert(ums.now() - t0 >= 0.004, "ums.sleep returned early")
end)

wait("ums.yield", function() ums.yield() end)

wait("task:join", function()
  local t = ums.spawn(function(a) ums.sleep(0.003); return a, "j" end, 1)
  local ok, a, j = t:join()
  assert(ok == true and a == 1 and j == "j", "join gave wrong results")
end)

wait("task:join timeout", function()
  local t = ums.spawn(function() ums.sleep(100) end)
  local a, b = t:join(0.003)
  assert(a == nil and b == "timeout", "join(timeout) did not time out")
  t:cancel()
  local ok, err = t:join()
  assert(ok == false and rawequal(err, ums.CANCELLED))
end)

if has_sync then
  wait("event:wait", function()
    local ev = ums.event()
    ums.spawn(function() ums.sleep(0.003); ev:set() end)
    assert(ev:wait() == true)
  end)

  wait("event:wait timeout", function()
    local ev = ums.event()
    local a, b = ev:wait(0.003)
    assert(a == nil and b == "timeout")
  end)

  wait("channel:recv", function()
    local ch = ums.channel()
    local v = {}
    ums.spawn(function() ums.sleep(0.003); ch:send(v) end)
    assert(rawequal(ch:recv(), v))
  end)

  wait("channel:send", function()
    local ch = ums.channel()
    local got
    local r = ums.spawn(function() ums.sleep(0.003); got = ch:recv() end)
    assert(ch:send("sent") == true)
    r:join()
    assert(got == "sent")
  end)

  wait("mutex:lock", function()
    local m = ums.mutex()
    local holding = ums.event()
    local h = ums.spawn(function()
      m:lock()
      holding:set()
      ums.sleep(0.003)
      m:unlock()
    end)
    holding:wait()
    assert(m:lock() == true)
    m:unlock()
    h:join()
  end)

  wait("semaphore:acquire", function()
    local s = ums.semaphore(0)
    ums.spawn(function() ums.sleep(0.003); s:release() end)
    assert(s:acquire() == true)
  end)

  wait("cond:wait", function()
    local m, c = ums.mutex(), ums.cond()
    local ready = false
    ums.spawn(function()
      ums.sleep(0.003)
      m:lock()
      ready = true
      c:signal()
      m:unlock()
    end)
    m:lock()
    while not ready do assert(c:wait(m) == true) end
    m:unlock()
  end)

  wait("waitgroup:wait", function()
    local wg = ums.waitgroup()
    wg:add(2)
    for _ = 1, 2 do ums.spawn(function() ums.sleep(0.003); wg:done() end) end
    assert(wg:wait() == true)
  end)

  wait("select", function()
    local a, b = ums.channel(), ums.channel()
    ums.spawn(function() ums.sleep(0.003); b:send("from b") end)
    local i, v = ums.select{{a, "recv"}, {b, "recv"}}
    assert(i == 2 and v == "from b")
  end)

  -- The parked select offers its value from its own stack; the receiver
  -- copies it from there, whichever way the select waits.
  wait("select send", function()
    local a, b = ums.channel(), ums.channel()
    local v = {}
    local r = ums.spawn(function() ums.sleep(0.003); return b:recv() end)
    local i = ums.select{{a, "recv"}, {b, "send", v}}
    assert(i == 2)
    local ok, got = r:join()
    assert(ok and rawequal(got, v))
  end)
end

-- Contexts. ctx(w) calls w (one wait, checked) somewhere inside the
-- context, and checks that the context itself still works.
local contexts = {}
local context_names = {}
local function context(name, fn)
  contexts[name] = fn
  context_names[#context_names + 1] = name
end

-- Temporary modules for the require context: each is <tmpname>.lua next
-- to the name os.tmpname reserved (no shell: under a TSan preload /bin/sh
-- cannot start).
local moddirs = {}
local modfiles = {}
local function new_module(body)
  local base = os.tmpname()
  local dir, name = base:match("^(.*)/([^/]+)$")
  if not moddirs[dir] then
    moddirs[dir] = true
    package.path = dir .. "/?.lua;" .. package.path
  end
  local f = assert(io.open(base .. ".lua", "w"))
  f:write(body)
  f:close()
  os.remove(base)
  modfiles[#modfiles + 1] = base .. ".lua"
  return name
end

local function remove_modules()
  for _, file in ipairs(modfiles) do os.remove(file) end
  modfiles = {}
end

context("the task body", function(w) w() end)

context("a table.sort comparator", function(w)
  local t = {5, 3, 4, 1, 2}
  local waited = 0
  table.sort(t, function(a, b)
    if waited < 2 then
      waited = waited + 1
      w()
    end
    return a < b
  end)
  assert(waited == 2)
  assert(table.concat(t, ",") == "1,2,3,4,5", "sort result wrong")
end)

context("a string.gsub replacement function", function(w)
  local s, n = ("abc"):gsub("%w", function(c)
    if c == "b" then w() end
    return c:upper()
  end)
  assert(s == "ABC" and n == 3)
end)

context("an __index metamethod", function(w)
  local t = setmetatable({}, {__index = function(_, k)
    w()
    return k .. "!"
  end})
  assert(t.key == "key!")
end)

context("a __newindex metamethod", function(w)
  local store = {}
  local t = setmetatable({}, {__newindex = function(_, k, v)
    w()
    store[k] = v
  end})
  t.x = 5
  assert(store.x == 5 and rawget(t, "x") == nil)
end)

local function cmp_object(v, mt) return setmetatable({v = v}, mt) end

context("an __lt metamethod", function(w)
  local mt = {__lt = function(a, b) w(); return a.v < b.v end}
  assert(cmp_object(1, mt) < cmp_object(2, mt))
end)

context("an __le metamethod", function(w)
  local mt = {__le = function(a, b) w(); return a.v <= b.v end}
  assert(not (cmp_object(3, mt) <= cmp_object(2, mt)))
end)

context("an __add metamethod", function(w)
  local mt = {}
  mt.__add = function(a, b) w(); return a.v + b end
  assert(cmp_object(40, mt) + 2 == 42)
end)

context("a __concat metamethod", function(w)
  local mt = {__concat = function(a, b) w(); return a.v .. b end}
  assert(cmp_object("con", mt) .. "cat" == "concat")
end)

context("an __eq metamethod", function(w)
  local mt = {__eq = function(a, b) w(); return a.v == b.v end}
  assert(cmp_object(1, mt) == cmp_object(1, mt))
end)

context("a __len metamethod", function(w)
  local t = setmetatable({}, {__len = function() w(); return 7 end})
  assert(#t == 7)
end)

context("a __call metamethod", function(w)
  local f = setmetatable({}, {__call = function(_, a, b) w(); return a + b end})
  assert(f(1, 2) == 3)
end)

context("a __close metamethod", function(w)
  local closed = false
  do
    local x <close> = setmetatable({}, {__close = function()
      w()
      closed = true
    end})
  end
  assert(closed)
end)

context("a __pairs metamethod", function(w)
  local t = setmetatable({}, {__pairs = function()
    w()
    return next, {a = 1}, nil
  end})
  local n = 0
  for k, v in pairs(t) do n = n + 1; assert(k == "a" and v == 1) end
  assert(n == 1)
end)

context("a generic-for iterator function", function(w)
  local sum = 0
  for i in function(_, i)
    if i == 2 then w() end
    if i < 4 then return i + 1 end
  end, nil, 0 do
    sum = sum + i
  end
  assert(sum == 1 + 2 + 3 + 4)
end)

context("pcall", function(w)
  local ok, a, b = pcall(function() w(); return "r", 2 end)
  assert(ok == true and a == "r" and b == 2)
end)

context("pcall, an error after the wait caught", function(w)
  local e = {}
  local ok, err = pcall(function() w(); error(e) end)
  assert(ok == false and rawequal(err, e))
end)

context("xpcall, an error after the wait caught", function(w)
  local ok, err = xpcall(function() w(); error("late", 0) end,
                         function(m) return "handled: " .. m end)
  assert(ok == false and err == "handled: late")
end)

context("an xpcall message handler", function(w)
  local ok, err = xpcall(function() error("e", 0) end,
                         function(m) w(); return "h: " .. m end)
  assert(ok == false and err == "h: e")
end)

context("nested pcalls", function(w)
  local ok, inner_ok, v = pcall(pcall, function() w(); return "deep" end)
  assert(ok and inner_ok and v == "deep")
end)

context("a required module's main chunk", function(w)
  _G.UMS_ANYWHERE_WAIT = w
  local name = new_module([[
    local name = ...
    UMS_ANYWHERE_WAIT()
    return {name = name, loaded = true}
  ]])
  local m = require(name)
  _G.UMS_ANYWHERE_WAIT = nil
  assert(m.loaded == true and m.name == name)
  assert(rawequal(package.loaded[name], m))
end)

context("the user's coroutine.wrap generator", function(w)
  local gen = coroutine.wrap(function(first)
    assert(first == "start")
    for i = 1, 3 do
      w()
      local back = coroutine.yield(i)
      assert(back == "next" .. i, "generator got " .. tostring(back))
    end
    return "end"
  end)
  -- The generator's own yields reach its caller, in order, each exactly
  -- once; the scheduler's never do.
  assert(gen("start") == 1)
  assert(gen("next1") == 2)
  assert(gen("next2") == 3)
  assert(gen("next3") == "end")
end)

context("the user's coroutine.create/resume", function(w)
  local co = coroutine.create(function(a)
    w()
    local b = coroutine.yield(a + 1, "y")
    w()
    return b * 2
  end)
  local r = table.pack(coroutine.resume(co, 1))
  assert(r.n == 3 and r[1] == true and r[2] == 2 and r[3] == "y")
  assert(coroutine.status(co) == "suspended")
  local ok, v = coroutine.resume(co, 5)
  assert(ok == true and v == 10)
  assert(coroutine.status(co) == "dead")
end)

context("nested coroutines two deep", function(w)
  local outer = coroutine.wrap(function()
    local inner = coroutine.wrap(function()
      w()
      coroutine.yield("i1")
      w()
      coroutine.yield("i2")
      return "i-end"
    end)
    coroutine.yield("o:" .. inner())
    w()
    coroutine.yield("o:" .. inner())
    coroutine.yield("o:" .. inner())
    return "o-end"
  end)
  assert(outer() == "o:i1")
  assert(outer() == "o:i2")
  assert(outer() == "o:i-end")
  assert(outer() == "o-end")
end)

context("an error from inside a user coroutine after the wait", function(w)
  local co = coroutine.create(function() w(); error("in co", 0) end)
  local ok, err = coroutine.resume(co)
  assert(ok == false and err == "in co")
  assert(coroutine.status(co) == "dead")
end)

context("tostring with __tostring", function(w)
  local t = setmetatable({}, {__tostring = function() w(); return "T!" end})
  assert(tostring(t) == "T!")
end)

context("string.format %s with __tostring", function(w)
  local t = setmetatable({}, {__tostring = function() w(); return "F!" end})
  assert(("<%s>"):format(t) == "<F!>")
end)

context("a load()ed chunk", function(w)
  local chunk = assert(load("local w = ...; w(); return 42", "=loaded"))
  assert(chunk(w) == 42)
end)

context("a load() reader function", function(w)
  local parts = {"return ", "4", "2"}
  local i = 0
  local chunk = assert(load(function()
    i = i + 1
    if i == 2 then w() end
    return parts[i]
  end, "=reader"))
  assert(chunk() == 42)
end)

-- Waits that end by their own timer. A task woken by its timer runs
-- before the run queue (docs/design/architecture.md), so when the scheduler's
-- thread is held up past the timeout (a loaded machine, a sanitizer
-- build) right after the task parked, it runs again before the counter
-- had its turn. For these, a park recorded by the runtime's wait
-- statistics is the proof that the wait parked instead of blocking the
-- thread; the others wake through another task, queued behind the
-- counter.
local timer_woken = { ["ums.sleep"] = true, ["task:join timeout"] = true,
                      ["event:wait timeout"] = true }

-- Parks so far, over every wait type.
local function parks()
  local c = 0
  for _, row in ipairs(ums.waits()) do c = c + row.count end
  return c
end

-- Runs ctx(w) with wait `wname` in a task while a counter task keeps
-- counting; checks that the counter moved during every wait (or, for a
-- timer-woken wait that the counter could not overtake, that it parked).
local function run_combination(ctxname, wname)
  ums.test(function()
    local n, stop = 0, false
    local counter = ums.spawn(function()
      while not stop do
        n = n + 1
        ums.yield()
      end
    end)
    local waited, stalled = 0, 0
    local function w()
      local n0, p0 = n, parks()
      waits[wname]()
      waited = waited + 1
      if n == n0 and not (timer_woken[wname] and parks() > p0) then
        stalled = stalled + 1
      end
    end
    local worker = ums.spawn(function()
      contexts[ctxname](w)
      return "finished"
    end)
    local ok, v, tb = worker:join()
    stop = true
    counter:join()
    assert(ok, tostring(v) .. "\n" .. tostring(tb))
    assert(v == "finished")
    assert(waited >= 1, "the context never called the wait")
    assert(stalled == 0, ("%d of %d waits saw no progress of the other task")
                         :format(stalled, waited))
  end, TIMEOUT)
end

teardown(remove_modules)

describe("a ums wait parks only its task", function()
  for _, ctxname in ipairs(context_names) do
    describe("inside " .. ctxname, function()
      for _, wname in ipairs(wait_names) do
        it(wname, function() run_combination(ctxname, wname) end)
      end
    end)
  end
end)

describe("a cancel delivered while the task waits", function()
  for _, ctxname in ipairs(context_names) do
    it("inside " .. ctxname .. " raises ums.CANCELLED there", function()
      ums.test(function()
        local seen, waiting = nil, false
        local function w()
          waiting = true
          local ok, err = pcall(ums.sleep, 100)
          seen = err
          if ok then error("the sleep was not interrupted", 0) end
          error(err, 0)
        end
        local early
        local t = ums.spawn(function()
          local _, cerr = pcall(contexts[ctxname], w)
          if not waiting then early = tostring(cerr) end
          -- every later wait is refused the same way
          local ok, err = pcall(ums.yield)
          return ok, err
        end)
        while not waiting and not early do ums.yield() end
        assert(not early, "the context failed before waiting: "
                          .. tostring(early))
        ums.sleep(0.002)
        assert(t:status() == "suspended", t:status())
        local t0 = ums.now()
        assert(t:cancel() == true)
        local ok, later_ok, later_err = t:join()
        assert(ums.now() - t0 < 5, "the cancel took too long")
        assert(ok == true, tostring(later_ok))
        assert(rawequal(seen, ums.CANCELLED),
               "the wait raised " .. tostring(seen))
        assert(later_ok == false and rawequal(later_err, ums.CANCELLED))
      end, TIMEOUT)
    end)
  end

  it("inside a table.sort comparator ends the task with ums.CANCELLED",
     function()
    ums.test(function()
      local t = ums.spawn(function()
        table.sort({3, 2, 1}, function(a, b) ums.sleep(100); return a < b end)
      end)
      ums.sleep(0.005)
      t:cancel()
      local ok, err, tb = t:join()
      assert(ok == false and rawequal(err, ums.CANCELLED))
      assert(tb:find("sort", 1, true), tb)
    end, TIMEOUT)
  end)

  it("inside a user coroutine ends the task with ums.CANCELLED", function()
    ums.test(function()
      local t = ums.spawn(function()
        local gen = coroutine.wrap(function() ums.sleep(100) end)
        gen()
      end)
      ums.sleep(0.005)
      t:cancel()
      local ok, err = t:join()
      assert(ok == false and rawequal(err, ums.CANCELLED))
    end, TIMEOUT)
  end)
end)

describe("many tasks waiting in non-yieldable contexts at once", function()
  it("all make progress and finish", function()
    ums.test(function()
      local ts = {}
      for i = 1, 20 do
        ts[i] = ums.spawn(function()
          local t = {4, 2, 3, 1}
          table.sort(t, function(a, b)
            ums.sleep(0.001 * (i % 3))
            ums.yield()
            return a < b
          end)
          return t[1] + t[4] + i
        end)
      end
      for i = 1, 20 do
        local ok, v = ts[i]:join()
        assert(ok, v)
        assert(v == 5 + i)
      end
    end, TIMEOUT)
  end)
end)
