-- Many task switches in one run, for ThreadSanitizer (ctest spec_switches,
-- registered in the TSan build only). A Lua task leaves the binding's C
-- functions by longjmp when it yields or raises from them; TSan must be
-- told that those frames are gone (lua-binding/lums.c, `resume`), or its
-- shadow call stack grows with every switch until TSan aborts or hangs
-- the process, some 65,536 frames on. TASKS tasks each yield N times and
-- catch an error raised inside the binding as often: 4 x 30,000 is more
-- than twice what that stack holds.
--
-- usage: lua5.4 spec/switches.lua [N [TASKS]]
local ums = require "ums"

local n = math.tointeger(tonumber(arg[1] or "30000"))
local ntasks = math.tointeger(tonumber(arg[2] or "4"))
-- Under TSan's slowdown a long run of yields is a stall to the monitor.
ums.config{stall_threshold = 0}

local total = 0
ums.run(function()
  local tasks = {}
  for i = 1, ntasks do
    tasks[i] = ums.spawn(function()
      local caught = 0
      for _ = 1, n do
        ums.yield()
        -- A bad argument: the binding raises from C (luaL_argerror).
        if not pcall(ums.sleep, "soon") then caught = caught + 1 end
      end
      return caught
    end)
  end
  for i = 1, ntasks do
    local ok, caught = tasks[i]:join()
    assert(ok and caught == n, ("task %d: %s %s"):format(i, ok, caught))
    total = total + caught
  end
end)
print(("switches: %d tasks, %d yields and %d errors each: ok")
  :format(ntasks, n, total // ntasks))
