-- The start and stop cost of one run: N calls of ums.run(function() end)
-- in a row, after one that is not counted (it loads what the process
-- keeps). Prints the wall time per run (ums.now, a monotonic clock) and
-- the process's CPU time per run (os.clock: every thread's), in ms.
--
--   lua5.4 bench/lua/bench_run.lua [N] [setting=value ...]
--
-- Settings go to ums.config first, e.g. quantum=0 io=pool.
local ums = require "ums"
local core = require "ums.core"

local n = tonumber(arg[1]) or 500
local cfg = {}
for i = 2, #arg do
  local k, v = arg[i]:match("^([%w_]+)=(.*)$")
  if not k then error("bench_run.lua: not a setting: " .. arg[i], 0) end
  if v == "true" then v = true
  elseif v == "false" then v = false
  else v = tonumber(v) or v end
  cfg[k] = v
end
if next(cfg) then ums.config(cfg) end

local function empty() end
ums.run(empty)
local c0, w0 = os.clock(), core.now()
for _ = 1, n do ums.run(empty) end
local w1, c1 = core.now(), os.clock()
print(("%d runs%s: %.3f ms wall, %.3f ms CPU per run"):format(
  n, #arg > 1 and " (" .. table.concat(arg, " ", 2) .. ")" or "",
  (w1 - w0) * 1000 / n, (c1 - c0) * 1000 / n))
