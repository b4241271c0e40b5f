-- bench/lua/shared_lock.lua: the uncontended cost of the shared sync
-- objects from one task: lock+unlock of ums.shared.mutex, acquire+release
-- of ums.shared.semaphore, wait on a set manual ums.shared.event; ns per
-- pair, best of 5 rounds of N (arg 1, default 2,000,000).
local ums = require "ums"
local N = tonumber(arg[1]) or 2000000
local function best(f)
  local b = math.huge
  for _ = 1, 5 do
    local t0 = os.clock()
    f()
    b = math.min(b, os.clock() - t0)
  end
  return b / N * 1e9
end
ums.run(function()
  local m = ums.shared.mutex()
  local s = ums.shared.semaphore(1)
  local e = ums.shared.event(true); e:set()
  local ml = best(function() for _ = 1, N do m:lock(); m:unlock() end end)
  local sa = best(function() for _ = 1, N do s:acquire(); s:release() end end)
  local ew = best(function() for _ = 1, N do e:wait() end end)
  print(("shared mutex lock+unlock %.1f ns; semaphore acquire+release "
         .. "%.1f ns; set event wait %.1f ns"):format(ml, sa, ew))
end)
