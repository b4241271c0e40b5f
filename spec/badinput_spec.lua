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
