--[[
bench/many/chan.lua: messages between two Lua VMs on two schedulers
through ums.shared.channel (issue 23's cross-scheduler shapes). One shape
per call:

  lua5.4 bench/many/chan.lua SHAPE [N]

  pingpong      the main task (scheduler 1) sends i on an unbuffered
                channel, a task on scheduler 2 sends it back on a second
                unbuffered one; N round trips (default 100,000)
  pingpong64    the same with two channels of 64, the main task sending
                64 before it receives the 64 echoes (bursts); N round
                trips
  stream        N integers (default 1,000,000) one way, scheduler 2 to
                scheduler 1, through a channel of 64

Prints one line: "SHAPE MESSAGES seconds result": MESSAGES is the number
of one-way hops (2N for the ping-pongs), the result checks the work (the
sum of what came back). bench/many/chan.sh runs every shape beside the C
spin-handoff floor and Go's channels.
]]
local ums = require "ums"

local shape = arg[1]
local n = math.tointeger(tonumber(arg[2] or
  (shape == "stream" and 1000000 or 100000)))
if not n or n < 1 then
  error("chan.lua: N must be a positive whole number, got "
        .. tostring(arg[2]), 0)
end
ums.config { schedulers = 2, quantum = 0, stall_threshold = 0 }

-- Starts fn(...) as work on scheduler 2 for sure: the calling task keeps
-- scheduler 1 busy (quantum 0) until it has started, so that scheduler 1
-- cannot steal it.
local function on2(fn, ...)
  local started = ums.shared.event(true)
  local w = ums.submit_on(1, function(started, fn, ...)
    started:set()
    return fn(...)
  end, started, fn, ...)
  while not started:is_set() do end
  return w
end

-- Runs on scheduler 2 (copied there: no upvalues).
local function echo(a, b, n)
  for _ = 1, n do b:send(a:recv()) end
  return n
end

local function produce(out, n)
  for i = 1, n do out:send(i) end
  return n
end

local shapes = {}

function shapes.pingpong(cap)
  local a, b = ums.shared.channel(cap), ums.shared.channel(cap)
  local w = on2(echo, a, b, n)
  local t0 = ums.now()
  local sum = 0
  for i = 1, n do
    a:send(i)
    sum = sum + b:recv()
  end
  local dt = ums.now() - t0
  assert(select(2, w:join()) == n)
  return 2 * n, dt, sum
end

function shapes.pingpong64()
  local B = 64
  local a, b = ums.shared.channel(B), ums.shared.channel(B)
  local w = on2(echo, a, b, n)
  local t0 = ums.now()
  local sum, i = 0, 0
  while i < n do
    local k = math.min(B, n - i)
    for j = 1, k do a:send(i + j) end
    for _ = 1, k do sum = sum + b:recv() end
    i = i + k
  end
  local dt = ums.now() - t0
  assert(select(2, w:join()) == n)
  return 2 * n, dt, sum
end

function shapes.stream()
  local ch = ums.shared.channel(64)
  local t0 = ums.now()
  local w = on2(produce, ch, n)
  local sum = 0
  for _ = 1, n do sum = sum + ch:recv() end
  local dt = ums.now() - t0
  assert(select(2, w:join()) == n)
  return n, dt, sum
end

local f = shapes[shape]
if not f then
  error("chan.lua: unknown shape " .. tostring(shape)
        .. " (pingpong, pingpong64, stream)", 0)
end
local msgs, dt, sum = ums.run(function() return f(0) end)
assert(sum == n * (n + 1) // 2, "wrong sum")
print(("%s %d %.6f %d"):format(shape, msgs, dt, sum))
