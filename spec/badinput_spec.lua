-- Bad input: every public function of ums, given each kind of value in
-- each argument position, raises a Lua error with a clear message or
-- returns nil, msg (or accepts the value where it is valid); the process
-- never crashes. The calls run in child processes (spec/badinput_driver.lua)
-- so that a crash is reported as the failure of the function that caused
-- it; the same sweep also runs in this process at the end.
local ums = require "ums"

local LUA = os.getenv("UMS_LUA") or "lua5.4"

local function dirname(path) return path:match("^(.*)/[^/]*$") or "." end
local HERE = dirname(debug.getinfo(1, "S").source:match("^@(.*)$")
                     or "spec/badinput_spec.lua")
local DRIVER = HERE .. "/badinput_driver.lua"

local function q(s) return "'" .. tostring(s):gsub("'", [['\'']]) .. "'" end

-- Runs lua5.4 with the arguments (the environment, LUA_PATH, LUA_CPATH and
-- a sanitizer's LD_PRELOAD, is inherited); returns the output (stdout and
-- stderr) and how it ended.
local function child(args)
  local parts = {"timeout", "-k", "5", "120", q(LUA)}
  for _, a in ipairs(args) do parts[#parts + 1] = q(a) end
  local p = assert(io.popen(table.concat(parts, " ") .. " 2>&1", "r"))
  local out = p:read("a")
  local ok, how, code = p:close()
  return out, ok, how, code
end

local function child_code(code)
  local name = os.tmpname()
  local f = assert(io.open(name, "w"))
  f:write(code)
  f:close()
  local out, ok, how, status = child({name})
  os.remove(name)
  return out, ok, how, status
end

local FUNCTIONS = {
  "run", "spawn", "yield", "sleep", "self", "now", "config", "on_error",
  "locals", "test", "park_begin", "park_wait", "unpark", "run_until_idle",
  "applock_acquire", "applock_release", "applock_compatible", "workqueue",
  "group",
  -- task methods
  "join", "cancel", "status", "name", "id", "task_locals",
  -- many VMs: submitted work, its handle, shared objects
  "submit", "submit_on", "scheduler", "schedulers", "work_join",
  "work_cancel", "work_status", "work_scheduler", "shared_channel",
  "shared_mutex", "shared_semaphore", "shared_event", "shared_waitgroup",
  "shared_send", "shared_try_send",
  -- ums.ffi's types and cdata
  "ffi_new", "ffi_typeof", "ffi_sizeof", "ffi_alignof", "ffi_offsetof",
  "ffi_cast", "ffi_copy", "ffi_fill", "ffi_string", "ffi_istype", "ffi_gc",
  -- ums.ffi calls: structs by value, callbacks, interruptible calls
  "ffi_cdef", "ffi_struct_arg", "ffi_struct_ret", "ffi_callback_arg",
  "ffi_callback_pool", "ffi_callback_cast", "ffi_callback_set",
  "ffi_callback_free", "ffi_interruptible",
}

describe("bad input", function()
  for _, where in ipairs{"outside", "inside"} do
    describe(where == "outside" and "outside a run" or "inside a task",
             function()
      for _, fname in ipairs(FUNCTIONS) do
        it(fname .. ": a clear error or nil, msg for every value in every "
           .. "position, no crash", function()
          local out, ok, how, code = child({DRIVER, fname, where})
          local bad, calls = {}, nil
          for line in out:gmatch("[^\n]+") do
            if line:match("^BAD ") then bad[#bad + 1] = line end
            calls = calls or tonumber(line:match("^DONE (%d+)"))
          end
          assert.is_true(ok and how == "exit" and code == 0,
            ("the process ended with %s %s:\n%s"):format(
              tostring(how), tostring(code), out:sub(-2000)))
          assert.is_not_nil(calls, "the sweep did not finish:\n" .. out)
          assert.is_true(calls >= 18)
          assert.equal(0, #bad, table.concat(bad, "\n"))
        end)
      end
    end)
  end
end)

describe("misuse of the park calls never crashes the process", function()
  -- Each snippet misuses core.park_begin / core.park_wait inside a task.
  -- The contract (CORE-API.md) forbids these sequences, but breaking it
  -- must be a Lua error, not an abort.
  local cases = {
    {"park_wait without park_begin", [[
      local ok, err = pcall(core.park_wait)
      assert(not ok, "park_wait without a park returned " .. tostring(err))
      assert(type(err) == "string" and err:find("park"), tostring(err))
    ]]},
    {"park_wait twice", [[
      core.park_begin(0)
      assert(select(2, core.park_wait()) == "timeout")
      local ok, err = pcall(core.park_wait)
      assert(not ok and type(err) == "string", tostring(err))
    ]]},
    {"park_wait without park_begin inside a table.sort comparator", [[
      table.sort({2, 1}, function(a, b)
        local ok, err = pcall(core.park_wait)
        assert(not ok and type(err) == "string", tostring(err))
        return a < b
      end)
    ]]},
    {"the task ends between park_begin and park_wait", [[
      local t = ums.spawn(function() core.park_begin(0.01) end)
      local ok = t:join()
      -- whatever the outcome, the process lives on and the run ends
    ]]},
    {"the task raises between park_begin and park_wait", [[
      local t = ums.spawn(function()
        core.park_begin(0.01)
        error("between")
      end)
      local ok, err = t:join()
      assert(ok == false and tostring(err):find("between"))
    ]]},
    {"ums.yield between park_begin and park_wait", [[
      local t = ums.spawn(function()
        core.park_begin(0.01)
        local ok, err = pcall(ums.yield)
        pcall(core.park_wait)
        return ok, err
      end)
      t:join()
    ]]},
    {"coroutine.yield in the task body between park_begin and park_wait", [[
      local t = ums.spawn(function()
        core.park_begin(0.01)
        pcall(coroutine.yield)
        pcall(core.park_wait)
      end)
      t:join()
    ]]},
    {"a second park_begin before park_wait", [[
      local t = ums.spawn(function()
        core.park_begin(0.01)
        local ok, err = pcall(core.park_begin, 0.01)
        assert(not ok and type(err) == "string", tostring(err))
        assert(select(2, core.park_wait()) == "timeout")
        return "ok"
      end)
      local ok, v = t:join()
      assert(ok and v == "ok", tostring(v))
    ]]},
  }
  for _, c in ipairs(cases) do
    it(c[1], function()
      local out, ok, how, code = child_code(([[
        local ums = require "ums"
        local core = require "ums.core"
        ums.run(function()
          %s
        end)
        print("SURVIVED")
        os.exit(0, true)
      ]]):format(c[2]))
      assert.is_true(ok and how == "exit" and code == 0
                     and out:find("SURVIVED", 1, true) ~= nil,
        ("the process ended with %s %s:\n%s"):format(
          tostring(how), tostring(code), out:sub(-2000)))
    end)
  end
end)

describe("bad input in this process", function()
  -- The same kinds of values straight into each function, here: only the
  -- calls that are safe whatever the core does (no park calls).
  local values = {nil, true, 0, -1, 0 / 0, "x", {}, function() end,
                  coroutine.create(function() end), io.stdout}
  local NV = 10

  local function check_call(f, ...)
    local r = table.pack(pcall(f, ...))
    if r[1] then return end
    assert.equal("string", type(r[2]))
  end

  it("survives every value outside a run", function()
    for i = 1, NV do
      local v = values[i]
      check_call(ums.sleep, v)
      check_call(ums.yield, v)
      check_call(ums.spawn, v)
      check_call(ums.locals, v)
      check_call(ums.self, v)
      check_call(ums.now, v)
      if type(v) ~= "function" then
        check_call(ums.run, v)
        check_call(ums.test, v)
        check_call(ums.on_error, v)
      end
      if type(v) ~= "table" then check_call(ums.config, v) end
    end
  end)

  it("survives every value inside a task", function()
    ums.run(function()
      local done = ums.spawn(function() end)
      done:join()
      for i = 1, NV do
        local v = values[i]
        if type(v) ~= "number" or v < 0 or v ~= v then
          check_call(ums.sleep, v)
        end
        check_call(ums.yield, v)
        check_call(ums.spawn, v)
        check_call(ums.locals, v)
        check_call(ums.run, v)
        check_call(ums.test, v)
        check_call(done.join, v)
        check_call(done.join, done, v)
        check_call(done.cancel, v)
        check_call(done.status, v)
        check_call(done.name, v)
        check_call(done.id, v)
        check_call(done.locals, v)
      end
      assert.equal("done", done:status())
      assert.equal("", done:name())
    end)
  end)
end)

describe("error messages", function()
  -- The line of the call in this file, as the error's prefix.
  local THIS = debug.getinfo(1, "S").short_src

  local function err_of(f, ...)
    local ok, err = pcall(f, ...)
    assert.is_false(ok, "no error")
    return tostring(err)
  end

  -- The messages of the error raised by `src` (one line of code, E
  -- being env) in a chunk named "caller", both ways: as a statement
  -- (the message begins "caller:1: "), and as a tail call, which leaves
  -- no frame of the caller behind: a C function's error still names
  -- "caller:1:", a Lua function's the nearest Lua function left on the
  -- stack (err_of here). Returns the two messages without their
  -- position, after checking that each has one.
  local AT = "caller:1: "
  local function both(env, src)
    local plain = assert(load("local E = ...; local r = " .. src
                              .. "; return r", "=caller", "t"))
    local tail = assert(load("local E = ...; return " .. src, "=caller",
                             "t"))
    local e1, e2 = err_of(plain, env), err_of(tail, env)
    assert.equal(AT, e1:sub(1, #AT))
    assert.truthy(e2:find("^[^:]+:%d+: "), e2)
    return e1:sub(#AT + 1), (e2:gsub("^[^:]+:%d+: ", ""))
  end

  it("ums.config names the setting and the runtime's bounds, at the "
     .. "caller's line", function()
    local saved = ums.config()
    local function cfg(t)
      local line = debug.getinfo(1, "l").currentline + 1
      local ok, err = pcall(function() ums.config(t) end)
      assert.is_false(ok, "accepted")
      return err, THIS .. ":" .. line .. ": "
    end
    local cases = {
      {{schedulers = 100000}, "'schedulers' must be an integer from 1 "
        .. "to 1024, got 100000"},
      {{io_threads = math.maxinteger}, "'io_threads' must be an integer "
        .. "from 0 to 2147483647 (0: the default, 64), got "
        .. math.maxinteger},
      {{preempt_threads = -1}, "'preempt_threads' must be an integer from "
        .. "0 to 2147483647"},
      {{stack_size = 100}, "'stack_size' must be an integer number of "
        .. "bytes from 524288 to 1073741824 (ums.STACK_SIZE_MIN and up), "
        .. "got 100"},
      {{quantum = 1e300}, "'quantum' must be a number of seconds from 0 "
        .. "to 1000000000 (0: off), got 1e+300"},
      {{stall_threshold = 0 / 0}, "'stall_threshold' must be a number of "
        .. "seconds"},
      {{worker_idle_timeout = -math.huge}, "'worker_idle_timeout' must be "
        .. "a number of seconds up to 1000000000"},
    }
    for _, c in ipairs(cases) do
      local err, where = cfg(c[1])
      assert.equal(where, err:sub(1, #where))
      assert.truthy(err:find("ums.config: " .. c[2], 1, true), err)
    end
    assert.same(saved, ums.config())
  end)

  it("NaN is named as such by every function that takes seconds",
     function()
    assert.matches("bad argument #1 to 'sleep' %(sleep time is NaN",
                   err_of(function() ums.run(function()
                     ums.sleep(0 / 0) end) end))
    ums.run(function()
      local t = ums.spawn(function() end)
      local nan = "timeout is NaN, not a number of seconds"
      local objs = {
        {ums.channel(), "recv"}, {ums.mutex(), "lock"},
        {ums.semaphore(0), "acquire"}, {ums.event(), "wait"},
        {ums.waitgroup(), "wait"}, {t, "join"}, {ums.group(), "wait"},
        {ums.shared.semaphore(0), "acquire"},
      }
      for _, o in ipairs(objs) do
        local e1, e2 = both(o, "E[1]:" .. o[2] .. "(0/0)")
        for _, e in ipairs{e1, e2} do
          assert.equal("bad argument #1 to '" .. o[2] .. "' (" .. nan .. ")",
                       e)
        end
      end
      t:join()
    end)
  end)

  it("the Lua-written objects number arguments as the C ones do and "
     .. "name the caller's line, also through a tail call", function()
    ums.run(function()
      local g, q = ums.group(), ums.workqueue()
      local cases = {
        {ums.channel(), "recv", "'x'", 1, "number expected, got string"},
        {ums.semaphore(1), "acquire", "'x'", 1, "number expected"},
        {ums.semaphore(1), "release", "0", 1, "count must be positive"},
        {ums.event(), "wait", "'x'", 1, "number expected"},
        {ums.waitgroup(), "add", "'x'", 1, "number expected"},
        {ums.cond(), "wait", "1", 1, "ums.mutex expected, got number"},
        {ums.mutex(), "lock", "-1", 1, "timeout must be a non-negative"},
        {g, "spawn", "1", 1, "function expected, got number"},
        {q, "post", "1", 1, "function expected, got number"},
      }
      for _, c in ipairs(cases) do
        local e1, e2 = both(c, ("E[1]:%s(%s)"):format(c[2], c[3]))
        local want = ("bad argument #%d to '%s' (%s"):format(c[4], c[2],
                                                             c[5])
        for _, e in ipairs{e1, e2} do assert.equal(want, e:sub(1, #want)) end
      end
      q:close()
    end)
  end)

  it("methods called on a bad self say so, never fail inside the module",
     function()
    ums.run(function()
      local g, q = ums.group(), ums.workqueue()
      local item = q:post(function() end)
      for _, o in ipairs{g, q, item, ums.semaphore(1), ums.event(),
                         ums.waitgroup(), ums.cond(), ums.mutex()} do
        local mt = getmetatable(o)
        for name, f in pairs(mt.__index) do
          if type(f) == "function" and name ~= "__gc" then
            local e = err_of(function() local r = f(true); return r end)
            assert.falsy(e:find("attempt to", 1, true), name .. ": " .. e)
            assert.truthy(e:find("expected, got boolean", 1, true),
                          name .. ": " .. e)
          end
        end
        -- obj.method(true) is method-call-less: argument #1.
        if mt.__tostring then
          local e = err_of(mt.__tostring, true)
          assert.truthy(e:find("expected, got boolean", 1, true), e)
        end
      end
      q:close()
      assert(q:wait(10))
    end)
  end)

  it("ffi.load names the library once", function()
    local name = ("u"):rep(300)
    local e = err_of(ums.ffi.load, name)
    local _, n = e:gsub(name, "")
    assert.equal(1, n, e)
    assert.truthy(e:find("File name too long", 1, true), e)
  end)

  it("environment variables with bad values are refused, naming them",
     function()
    -- Without a bad variable, the same script runs.
    local out, ok = child_code("local ums = require 'ums'\n"
                               .. "ums.run(function() end)\n")
    assert.is_true(ok, out)
    for _, c in ipairs{
      {"UMS_IO", "bogus", "auto, uring or pool"},
      {"UMS_STATS", "bogus", "on, off or precise"},
      {"UMS_STACK_GUARD", "bogus", "mprotect"},
      {"UMS_STAMP_CLOCK", "bogus", "gettime"},
    } do
      local name = os.tmpname()
      local f = assert(io.open(name, "w"))
      f:write("local ums = require 'ums'\nums.run(function() end)\n")
      f:close()
      local p = assert(io.popen(("env %s=%s timeout 60 %s %s 2>&1")
        :format(c[1], c[2], q(LUA), q(name))))
      local o = p:read("a")
      local okc = p:close()
      os.remove(name)
      assert.is_falsy(okc, o)
      assert.truthy(o:find(name:match("[^/]*$") .. ":2: ums.run: cannot "
        .. "start the runtime: environment variable " .. c[1] .. "="
        .. c[2] .. ": must be " .. c[3], 1, true), o)
    end
  end)
end)
