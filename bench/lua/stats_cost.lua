--[[
stats_cost.lua: the workload stats_cost.sh counts instructions of.

Usage: lua5.4 bench/lua/stats_cost.lua switch|channel N
  switch   N yields between two tasks (ums.yield), as bench_ums.lua's
  channel  N messages through an unbuffered ums.channel, as bench_ums.lua's
Stats are on or off through UMS_STATS (the default or "off").
]]
local ums = require "ums"
local what, n = arg[1], math.tointeger(tonumber(arg[2]))
if (what ~= "switch" and what ~= "channel") or not n or n < 2 then
  io.stderr:write("usage: lua5.4 stats_cost.lua switch|channel N\n")
  os.exit(2)
end
ums.run(function()
  if what == "switch" then
    local half = n // 2
    local function body() for _ = 1, half do ums.yield() end end
    local a, b = ums.spawn(body), ums.spawn(body)
    assert(a:join())
    assert(b:join())
  else
    local ch = ums.channel()
    local p = ums.spawn(function() for i = 1, n do ch:send(i) end end)
    local c = ums.spawn(function()
      for i = 1, n do assert(ch:recv() == i) end
    end)
    assert(p:join())
    assert(c:join())
  end
end)
