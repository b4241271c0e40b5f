--[[
bench/many/many.lua: many live tasks (issue 23's shapes), ums beside the
plain-Lua floor of the same shape. One shape per call:

  lua5.4 bench/many/many.lua SHAPE [N]

  skynet_join   the skynet tree (each task spawns 10 children until the
                leaves, numbered 0..N-1; each task returns the sum of its
                subtree): ums.spawn + task:join, N leaves (default
                1,000,000: 1,111,111 tasks)
  skynet_chan   the same tree, each child sending its sum on its
                parent's ums.channel(10), the parent receiving 10
  skynet_floor  the same tree as bare coroutines run by a FIFO in Lua:
                a child resumed from the queue, its parent woken when the
                last child ended (the least a Lua scheduler can do)
  spawn_join    N tasks (default 1,000,000) spawned before any is joined,
                each returning its number; then all joined
  spawn_floor   N bare coroutines created, then each resumed to its end

Prints one line: "SHAPE N seconds result" (the result checks the work:
the sum of 0..N-1). Wall time from ums.now (a monotonic clock); one
scheduler. bench/many/run.sh runs every shape with Go's beside it.
]]
local ums = require "ums"

local shape = arg[1]
local n = math.tointeger(tonumber(arg[2] or 1000000))
if not n or n < 1 then
  error("many.lua: N must be a positive whole number, got "
        .. tostring(arg[2]), 0)
end
local DIV = 10
-- spawn_join's first task spawns a million tasks without a wait, which
-- the stall monitor would report (rightly) on stderr at every run.
ums.config{stall_threshold = 0}

local function skynet_join(num, size)
  if size == 1 then return num end
  local sub = size // DIV
  local kids = {}
  for i = 0, DIV - 1 do
    kids[i + 1] = ums.spawn(skynet_join, num + i * sub, sub)
  end
  local sum = 0
  for i = 1, DIV do
    local ok, v = kids[i]:join()
    sum = sum + v
  end
  return sum
end

local function skynet_chan(out, num, size)
  if size == 1 then out:send(num); return end
  local sub = size // DIV
  local ch = ums.channel(DIV)
  for i = 0, DIV - 1 do
    ums.spawn(skynet_chan, ch, num + i * sub, sub)
  end
  local sum = 0
  for _ = 1, DIV do sum = sum + ch:recv() end
  out:send(sum)
end

-- The floor: bare coroutines and a FIFO. A node yields "wait" until its
-- children are done; the last child to end queues its parent again.
local function skynet_floor(total)
  local queue, head, tail = {}, 1, 0
  local create, resume, yield = coroutine.create, coroutine.resume,
                                coroutine.yield
  local function node(parent, num, size)
    local self = {parent = parent, left = 0, sum = 0}
    if size == 1 then return self, num end
    local sub = size // DIV
    self.left = DIV
    for i = 0, DIV - 1 do
      local num_i = num + i * sub
      local co = create(node)
      tail = tail + 1
      queue[tail] = {co, self, num_i, sub}
    end
    yield(self)  -- woken by the last child
    return self, self.sum
  end
  local result
  local root = create(node)
  tail = tail + 1
  queue[tail] = {root, nil, 0, total}
  while head <= tail do
    local item = queue[head]
    queue[head] = nil
    head = head + 1
    local co = item[1]
    local ok, self, v
    if item[2] == false then
      ok, self, v = resume(co)          -- a parent woken
    else
      ok, self, v = resume(co, item[2], item[3], item[4])
    end
    assert(ok, self)
    if coroutine.status(co) == "dead" then
      local p = self.parent
      if p then
        p.sum = p.sum + v
        p.left = p.left - 1
        if p.left == 0 then
          tail = tail + 1
          queue[tail] = {p.co, false}
        end
      else
        result = v
      end
    else
      self.co = co                     -- parked until its children end
    end
  end
  return result
end

local function spawn_join(count)
  local tasks = {}
  local function body(i) return i end
  for i = 1, count do tasks[i] = ums.spawn(body, i - 1) end
  local sum = 0
  for i = 1, count do
    local _, v = tasks[i]:join()
    sum = sum + v
  end
  return sum
end

local function spawn_floor(count)
  local cos = {}
  local create, resume = coroutine.create, coroutine.resume
  local function body(i) return i end
  for i = 1, count do cos[i] = create(body) end
  local sum = 0
  for i = 1, count do
    local _, v = resume(cos[i], i - 1)
    sum = sum + v
  end
  return sum
end

local shapes = {
  skynet_join = function() return ums.run(skynet_join, 0, n) end,
  skynet_chan = function()
    return ums.run(function()
      local out = ums.channel(1)
      ums.spawn(skynet_chan, out, 0, n)
      return out:recv()
    end)
  end,
  skynet_floor = function() return skynet_floor(n) end,
  spawn_join = function() return ums.run(spawn_join, n) end,
  spawn_floor = function() return spawn_floor(n) end,
}
local f = shapes[shape]
if not f then
  local names = {}
  for k in pairs(shapes) do names[#names + 1] = k end
  table.sort(names)
  error("many.lua: SHAPE must be one of " .. table.concat(names, ", ")
        .. ", got " .. tostring(shape), 0)
end
if shape:match("^skynet") then
  local size = 1
  while size < n do size = size * DIV end
  if size ~= n then
    error("many.lua: skynet needs N a power of 10, got " .. n, 0)
  end
end

collectgarbage()
local t0 = ums.now()
local result = f()
local dt = ums.now() - t0
assert(result == n * (n - 1) // 2, ("wrong result %s"):format(result))
print(("%s %d %.3f %d"):format(shape, n, dt, result))
