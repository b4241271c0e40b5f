-- A fault-job program (test/fault/CMakeLists.txt), run with memory
-- mappings failing (strace injects ENOMEM into mmap after start-up): many
-- tasks that wait where Lua cannot yield (inside table.sort's comparator,
-- so each needs a worker with a stack of its own), sleeps, channels. Every
-- task must end: joined with its results, or with an error that says
-- memory ran out. The run must end too.
--
-- usage: lua5.4 test/fault/spawns.lua [TASKS [RUNS [SCHEDULERS [QUANTUM]]]]
local ums = require "ums"
local N = math.tointeger(tonumber(arg[1] or "2000"))
local RUNS = math.tointeger(tonumber(arg[2] or "1"))
ums.config{schedulers = math.tointeger(tonumber(arg[3] or "1")),
           quantum = tonumber(arg[4] or "0.004")}

local function oom(msg)
  msg = tostring(msg)
  return msg:find("out of memory", 1, true) or
         msg:find("not enough memory", 1, true)
end

local function run() return pcall(ums.run, function()
  local ch = ums.channel(8)
  -- Set once every task is spawned: until then each task waits inside its
  -- comparator, holding a worker, so that all their stacks exist at once.
  local gate = ums.event(true)
  local waiting = 0
  local tasks = {}
  for i = 1, N do
    local spawned, t = pcall(ums.spawn, function()
      local t = {5, 3, 9, 1, 7}
      table.sort(t, function(a, b)
        if not gate:is_set() then waiting = waiting + 1 end
        gate:wait(120)
        return a < b
      end)
      ums.sleep(0.001)
      ch:try_send(i)
      ch:try_recv()
      return t[1] + t[5]
    end)
    if spawned then
      tasks[#tasks + 1] = t
    else
      assert(oom(t), "spawn: " .. tostring(t))
    end
  end
  -- Until every task waits (or, with tasks that cannot start, for ten
  -- seconds at most).
  for _ = 1, 200 do
    if waiting >= #tasks then break end
    ums.sleep(0.05)
  end
  gate:set()
  local done, failed = 0, 0
  for _, t in ipairs(tasks) do
    local r = {t:join(120)}
    assert(r[1] ~= nil, "a task did not end: " .. tostring(r[2]))
    if r[1] then
      assert(r[2] == 10, "wrong result " .. tostring(r[2]))
      done = done + 1
    else
      assert(oom(r[2]), "a task failed: " .. tostring(r[2]))
      failed = failed + 1
    end
  end
  print(("%d tasks: %d done, %d out of memory"):format(#tasks, done, failed))
end) end

-- Each run starts threads and a ring afresh: later runs meet the failures
-- at start-up, earlier ones while tasks run.
for _ = 1, RUNS do
  local ok, err = run()
  if not ok then
    -- A run may fail as a whole, but only because memory ran out.
    assert(oom(err), "the run failed: " .. tostring(err))
    print("the run failed: " .. tostring(err):match("[^\n]*"))
  end
end
print("OK")
