-- Task records and their anchors (lua-binding/lums.c, "Task life cycle"):
-- a VM hands out task records from a free list of slots, anchors each
-- task's coroutine and handle at its slot's stack slots in its chunk's
-- anchor thread, and keeps its pooled records and their anchors from one
-- run to the next, renumbered when a run made many. Every generation below has N tasks live at once
-- (more than one chunk of records, and by default more than the pool of
-- finished coroutines keeps, so that records are freed and reused too)
-- while the handles of the generation before, whose slots they reuse,
-- must still give their own outcomes. A record handed out twice, or a
-- coroutine left unanchored, shows as a wrong ums.self() after a full
-- collection, a wrong outcome, or a crash. ctest runs this script in the
-- ASan build with leak detection on.
--
-- usage: lua5.4 spec/anchors.lua [N [RUNS]]
local ums = require "ums"

local n = math.tointeger(tonumber(arg[1] or "5000"))
local runs = math.tointeger(tonumber(arg[2] or "3"))
-- The spawning loops run without a wait, which the stall monitor would
-- report (rightly) under a sanitizer's slowdown.
ums.config{stall_threshold = 0}

local function check(cond, fmt, ...)
  if not cond then error(fmt:format(...), 2) end
end

-- n tasks live at once, each ending with base + i (every seventh with an
-- error); old: the previous generation's handles and base.
local function generation(base, old)
  local tasks, started, go = {}, 0, false
  for i = 1, n do
    tasks[i] = ums.spawn(function()
      local me = ums.self()
      started = started + 1
      repeat ums.sleep(0.001) until go
      if i % 1000 == 1 then collectgarbage() end
      check(rawequal(ums.self(), me), "task %d: ums.self() changed", i)
      check(rawequal(me, tasks[i]), "task %d: ums.self() is not its handle",
            i)
      if i % 7 == 0 then error("boom " .. (base + i), 0) end
      return base + i
    end)
  end
  repeat ums.sleep(0.001) until started == n
  collectgarbage()
  if old then
    for i = 1, n do
      local h = old.tasks[i]
      check(h:status() == (i % 7 == 0 and "error" or "done"),
            "old task %d: status %s", i, h:status())
      check(h:id() ~= tasks[i]:id(), "old task %d: id reused", i)
    end
  end
  go = true
  for i = 1, n do
    local ok, v = tasks[i]:join()
    if i % 7 == 0 then
      check(ok == false and v == "boom " .. (base + i),
            "task %d: %s %s", i, tostring(ok), tostring(v))
    else
      check(ok == true and v == base + i, "task %d: %s %s", i, tostring(ok),
            tostring(v))
    end
  end
  -- The old handles once more, now that their slots went round again.
  if old then
    for i = 1, n, 13 do
      local ok, v = old.tasks[i]:join()
      check(ok == (i % 7 ~= 0), "old task %d: %s", i, tostring(ok))
      if ok then check(v == old.base + i, "old task %d: %s", i, tostring(v)) end
    end
  end
  return {tasks = tasks, base = base}
end

local last
for run = 1, runs do
  ums.run(function()
    local a = generation(run * 10 * n, last)
    last = generation(run * 10 * n + n, a)
    -- A few spawns and ends, fewer than a chunk: the pool's records.
    for i = 1, 100 do
      local ok, v = ums.spawn(function() return i end):join()
      check(ok and v == i, "small task %d", i)
    end
  end)
  -- Between runs only what the VM keeps anchors the pooled coroutines.
  collectgarbage()
  collectgarbage()
end
print(("anchors: %d runs of 2 x %d tasks: ok"):format(runs, n))
