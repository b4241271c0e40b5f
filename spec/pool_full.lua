-- More tasks live at once than the pool of finished coroutines keeps
-- (4,096): those ending beyond it are freed at once, their joiner lists
-- (three joiners each, more than an ltask holds inline) and failed
-- outcomes included. ctest runs this script in the ASan build with leak
-- detection on, which the specs run through busted cannot have (the
-- interpreter's and busted's own allocations are not ours), so anything
-- the freeing path leaves behind fails it there.
local ums = require "ums"

local n, per = 5000, 3
-- The spawning loops run without a wait, which the stall monitor would
-- report (rightly) under a sanitizer's slowdown.
ums.config{stall_threshold = 0}
ums.run(function()
  local targets, joiners = {}, {}
  -- The targets end only once every joiner waits in join.
  local waiting, go = 0, false
  for i = 1, n do
    targets[i] = ums.spawn(function()
      repeat ums.sleep(0.001) until go
      if i % 7 == 0 then error("boom " .. i, 0) end
      return i, -i
    end)
  end
  for i = 1, n do
    for k = 1, per do
      joiners[(i - 1) * per + k] = ums.spawn(function()
        waiting = waiting + 1
        return targets[i]:join()
      end)
    end
  end
  repeat ums.sleep(0.001) until waiting == n * per
  go = true
  for i = 1, n do
    for k = 1, per do
      local ok, tok, a, b = joiners[(i - 1) * per + k]:join()
      assert(ok == true, "joiner failed")
      if i % 7 == 0 then
        assert(tok == false and a == "boom " .. i,
               ("task %d: %s %s"):format(i, tostring(tok), tostring(a)))
      else
        assert(tok == true and a == i and b == -i,
               ("task %d: %s %s %s"):format(i, tostring(tok), tostring(a),
                                            tostring(b)))
      end
    end
  end
end)
print(("pool_full: %d tasks, %d joiners each: ok"):format(n, per))
