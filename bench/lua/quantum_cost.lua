-- The cost of the quantum's check on the paths it runs on: a task switch
-- (ums.yield between two tasks) and a channel message (an unbuffered
-- send/recv pair between two tasks), and deep recursion in a task against
-- plain Lua. Meant for callgrind (instruction counts, repeatable on a
-- noisy machine) as well as wall time:
--   lua5.4 bench/lua/quantum_cost.lua switch|chan|deep [n] [preempt]
local ums = require "ums"
local what, n = arg[1] or "switch", tonumber(arg[2]) or 100000
ums.config{preempt = arg[3] == "preempt" or nil}

local function deep(d)
  if d == 0 then return 0 end
  return 1 + deep(d - 1)
end

local function run_deep()
  local t0 = os.clock()
  for _ = 1, 20 do assert(deep(n) == n) end
  return os.clock() - t0
end

if what == "plain" then
  print(("plain lua5.4 deep(%d) x20: %.3f s"):format(n, run_deep()))
  return
end

ums.run(function()
  if what == "switch" then
    local a = ums.spawn(function() for _ = 1, n do ums.yield() end end)
    local b = ums.spawn(function() for _ = 1, n do ums.yield() end end)
    a:join()
    b:join()
  elseif what == "chan" then
    local ch = ums.channel()
    local r = ums.spawn(function() for _ = 1, n do ch:recv() end end)
    for i = 1, n do ch:send(i) end
    r:join()
  elseif what == "deep" then
    local t = ums.spawn(run_deep)
    local _, s = t:join()
    print(("task deep(%d) x20 (preempt %s): %.3f s"):format(n,
      tostring(ums.config().preempt), s))
  end
end)
