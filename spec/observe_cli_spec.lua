-- The scheduler monitor's default report, seen from outside: one line on
-- stderr per stall, naming the scheduler, the task and where it was, even
-- for a task stuck in a C call that never gets back to Lua in time. Runs
-- scripts in child processes (spec/subprocess.lua), so it is pending
-- under the TSan preload; the in-process checks are in observe_spec.lua.
local sp = require "subprocess"
local it = sp.guard(it, pending)

local function script(body)
  return sp.temp(([[
local ums = require "ums"
ums.config { quantum = 0, stall_threshold = 0.3 }
local function spin(s)
  local c0 = os.clock()
  while os.clock() - c0 < s do end
end
%s
]]):format(body), ".lua")
end

local function stall_lines(stderr)
  local lines = {}
  for l in stderr:gmatch("[^\n]+") do
    if l:find("stalled", 1, true) then lines[#lines + 1] = l end
  end
  return lines
end

describe("the default stall report", function()
  after_each(sp.cleanup)

  it("is one line naming the task and where it spins", function()
    local path = script [[
ums.run(function()
  local t = ums.spawn(function() spin(1) end)
  t:name("cruncher")
  t:join()
end)
]]
    local r = sp.lua_run({path}, {timeout = 60})
    sp.assert_exit(r, 0)
    local lines = stall_lines(r.stderr)
    assert.equal(1, #lines, sp.describe(r))
    assert.matches("^ums: scheduler 0 stalled: task %d+ 'cruncher' has "
      .. "not yielded for [%d.]+ s %(non%-yielding scheduler%), at .*:5: "
      .. "in upvalue 'spin'$", lines[1])
  end)

  it("says when the task is in a C call", function()
    local path = script [[
ums.ffi.cdef [=[UMS_INLINE int blocking_usleep(unsigned int usec)
                 __asm__("usleep");]=]
ums.run(function()
  local t = ums.spawn(function()
    local t0 = ums.now()
    repeat ums.ffi.C.blocking_usleep(900000) until ums.now() - t0 >= 0.9
  end)
  t:name("sleeper")
  t:join()
end)
]]
    local r = sp.lua_run({path}, {timeout = 60})
    sp.assert_exit(r, 0)
    local lines = stall_lines(r.stderr)
    assert.equal(1, #lines, sp.describe(r))
    -- Either the report's signal ended the sleep and the task got back to
    -- Lua in time to be located, or the line says it is in C.
    assert.matches("^ums: scheduler 0 stalled: task %d+ 'sleeper' has "
      .. "not yielded for [%d.]+ s %(non%-yielding scheduler%), ", lines[1])
    assert.is_truthy(lines[1]:find(", in a C call", 1, true)
      or lines[1]:find(":%d+: in "), lines[1])
  end)

  it("names the scheduler and task of another VM", function()
    local path = script [[
ums.config { schedulers = 2 }
ums.run(function()
  local stop = false
  -- Busy, yielding every millisecond.
  local busy = ums.spawn(function()
    while not stop do spin(0.001); ums.yield() end
  end)
  assert(ums.submit_on(1, function()
    local u = require("ums")
    u.self():name("far-cruncher")
    -- wall time (os.clock, the process's CPU time, runs twice as fast
    -- with both schedulers busy)
    local t0 = u.now()
    while u.now() - t0 < 1.5 do end
  end):join(30))
  stop = true
  busy:join()
end)
]]
    local r = sp.lua_run({path}, {timeout = 60})
    sp.assert_exit(r, 0)
    -- Scheduler 0's busy task yields every millisecond; only a machine
    -- so loaded that its thread gets no CPU for 0.3 s could report it,
    -- and that is not what this checks: one report of the far task.
    local far = {}
    for _, l in ipairs(stall_lines(r.stderr)) do
      if l:find("scheduler 1 ", 1, true) then far[#far + 1] = l end
    end
    assert.equal(1, #far, sp.describe(r))
    assert.matches("^ums: scheduler 1 stalled: task %d+ 'far%-cruncher' ",
      far[1])
  end)

  it("is silent for an idle run", function()
    local path = script [[
ums.run(function() ums.sleep(1) end)
]]
    local r = sp.lua_run({path}, {timeout = 60})
    sp.assert_exit(r, 0)
    assert.equal(0, #stall_lines(r.stderr), sp.describe(r))
  end)
end)
