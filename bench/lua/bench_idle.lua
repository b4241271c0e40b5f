-- What an idle run costs: a run on S schedulers (default 2) whose every
-- VM has run tasks (the quantum's monitor started, pools warmed), then
-- SECONDS (default 10) in which every task sleeps. Reports the process's
-- CPU time over that spell (utime + stime from /proc/self/stat, in clock
-- ticks of 10 ms) and the context switches of all its threads (each is a
-- thread waking up).
--
--   lua5.4 bench/lua/bench_idle.lua [SECONDS] [SCHEDULERS]
local ums = require "ums"

local seconds = tonumber(arg[1] or 10)
local nsched = math.tointeger(tonumber(arg[2] or 2))
if not seconds or seconds <= 0 then
  error("bench_idle.lua: SECONDS must be a positive number, got "
        .. tostring(arg[1]), 0)
end
if not nsched or nsched < 1 then
  error("bench_idle.lua: SCHEDULERS must be a whole number >= 1, got "
        .. tostring(arg[2]), 0)
end

local function read(path)
  local f = io.open(path)
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

-- utime + stime of the whole process, in clock ticks.
local function cpu_ticks()
  local stat = assert(read("/proc/self/stat"))
  -- Fields after the command name (which may hold spaces) start at 3.
  local rest = stat:match("%) (.*)$")
  local f, i = {}, 3
  for w in rest:gmatch("%S+") do f[i] = w; i = i + 1 end
  return tonumber(f[14]) + tonumber(f[15])
end

local function threads()
  local tids = {}
  for tid in ums.fs.dir("/proc/self/task") do
    if tid:match("^%d+$") then tids[#tids + 1] = tid end
  end
  return tids
end

-- Context switches: the total, and per thread ("tid name" -> count).
local function switches(tids)
  local n, per = 0, {}
  for _, tid in ipairs(tids) do
    local s = read("/proc/self/task/" .. tid .. "/status")
    if s then
      local name = (read("/proc/self/task/" .. tid .. "/comm") or "?")
        :gsub("\n$", "")
      local k = 0
      for v in s:gmatch("ctxt_switches:%s*(%d+)") do k = k + tonumber(v) end
      per[tid .. " " .. name] = k
      n = n + k
    end
  end
  return n, per
end

ums.config{schedulers = nsched}
ums.run(function()
  -- Work on every scheduler, then two tasks here: every VM exists, the
  -- quantum's monitor runs.
  local works = {}
  for i = 1, 4 * nsched do
    works[i] = ums.submit(function(n)
      local s = 0
      for k = 1, n do s = s + k end
      require("ums").sleep(0.01)
      return s
    end, 100000)
  end
  for i = 1, #works do assert(works[i]:join()) end
  ums.spawn(function() ums.sleep(0.01) end):join()
  ums.sleep(0.1)
  local tids = threads()
  local c0, t0 = cpu_ticks(), ums.now()
  local s0, per0 = switches(tids)
  ums.sleep(seconds)
  local c1, t1 = cpu_ticks(), ums.now()
  local s1, per1 = switches(tids)
  local wall = t1 - t0
  print(("idle %.1f s, %d schedulers, %d threads: CPU %d ticks (%.3f%% of "
         .. "one CPU), %d context switches (%.1f/s)"):format(
    wall, nsched, #tids, c1 - c0, (c1 - c0) * 1.0 / wall, s1 - s0,
    (s1 - s0) / wall))
  local woke = {}
  for k, v in pairs(per1) do
    if per0[k] and v > per0[k] then
      woke[#woke + 1] = ("%s %d"):format(k:match("^%d+ (.*)$"), v - per0[k])
    end
  end
  table.sort(woke)
  print("  threads that woke: " .. (#woke > 0 and table.concat(woke, ", ")
                                    or "none"))
end)
