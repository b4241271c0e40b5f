--[[
bench/many/parked.lua: what a parked task costs beside a bare coroutine.

  lua5.4 bench/many/parked.lua [N]        every case, each in its own process
  lua5.4 bench/many/parked.lua CASE [N]   one case: bare, event, recv, sleep

N (default 100,000) bare coroutines, each suspended in a function that
yields (bare), or N ums tasks, each parked in a wait: on a manual-reset
ums.event (event), in a channel receive (recv), in ums.sleep (sleep).
For each, the growth of the Lua heap (collectgarbage "count", after two
full collections) and of the process's resident memory (/proc/self/statm:
the Lua heap plus the C records, task stacks and allocator slack), divided
by N. A task's figures include its handle and the table slot that keeps
it, as the coroutine's include its slot. Each case runs in a fresh
process, so that memory freed by one case is not reused by the next.
Issue 23's target: a parked task at most 2 KiB beyond a bare coroutine.
One scheduler.
]]
local CASES = {"bare", "event", "recv", "sleep"}

local case, n = arg[1], arg[2]
if case and not case:match("^%a") then case, n = nil, case end
n = math.tointeger(tonumber(n or 100000))
if not n or n < 1 then
  error("parked.lua: N must be a positive whole number, got "
        .. tostring(arg[2] or arg[1]), 0)
end

if not case then
  local lua = arg[-1] or "lua5.4"
  print(("parked.lua: N = %d, each case in its own process"):format(n))
  print(("%-34s %8s %8s %8s"):format("what (bytes each)", "Lua heap", "RSS",
                                      "vs bare"))
  local bare
  for _, c in ipairs(CASES) do
    local p = assert(io.popen(("%s %q %s %d"):format(lua, arg[0], c, n)))
    local line = p:read("a")
    assert(p:close(), "parked.lua: case " .. c .. " failed")
    local name, heap, res = line:match("^(.-)\t(%S+)\t(%S+)")
    heap, res = tonumber(heap), tonumber(res)
    bare = bare or res
    print(("%-34s %8.0f %8.0f %s"):format(name, heap, res,
      c == "bare" and "       -" or ("%+8.0f"):format(res - bare)))
  end
  return
end

local ums = require "ums"
ums.config{stall_threshold = 0}

local function rss()
  local f = assert(io.open("/proc/self/statm"))
  local _, res = f:read("n", "n")
  f:close()
  return res * 4096
end

local function settled()
  collectgarbage("collect")
  collectgarbage("collect")
  return collectgarbage("count") * 1024, rss()
end

local function report(name, h0, r0, h1, r1)
  io.write(("%s\t%.1f\t%.1f\n"):format(name, (h1 - h0) / n, (r1 - r0) / n))
end

if case == "bare" then
  local h0, r0 = settled()
  local cos = {}
  for i = 1, n do
    local co = coroutine.create(function() coroutine.yield() end)
    coroutine.resume(co)
    cos[i] = co
  end
  local h1, r1 = settled()
  report("bare coroutine, suspended", h0, r0, h1, r1)
  return
end

local NAMES = {
  event = "ums task parked on ums.event",
  recv = "ums task in channel:recv()",
  sleep = "ums task in ums.sleep(3600)",
}
local name = NAMES[case] or error("parked.lua: unknown case " .. case
  .. " (bare, event, recv, sleep)", 0)

ums.run(function()
  local ev, ch = ums.event(true), ums.channel()
  local park, wake
  if case == "event" then
    park = function() ev:wait() end
    wake = function() ev:set() end
  elseif case == "recv" then
    park = function() ch:recv() end
    wake = function() ch:close() end
  else
    park = function() ums.sleep(3600) end
    wake = function(ts) for i = 1, n do ts[i]:cancel() end end
  end
  -- A task spawned and joined first: the run's one-off costs (its VM's
  -- tables, the first task stack) are not counted per task.
  ums.spawn(function() ums.sleep(0) end):join()
  local h0, r0 = settled()
  local ts = {}
  for i = 1, n do ts[i] = ums.spawn(park) end
  ums.yield()  -- every task has run to its wait
  local h1, r1 = settled()
  report(name, h0, r0, h1, r1)
  wake(ts)
  for i = 1, n do ts[i]:join() end
end)
