-- More tasks live at once than the pool of finished coroutines keeps
-- (4,096): those ending beyond it are freed at once, with three joiners
-- each waiting on their queues, and failed outcomes.
--
-- One scenario, two users:
-- * spec/task_spec.lua requires this file and runs it in every build,
--   with the targets ending after a short sleep (some may end before all
--   their joiners wait);
-- * ctest runs this file as a script (spec_pool_full), strictly: every
--   joiner waits in join before any target ends. The ASan build runs it
--   with leak detection on, which specs run through busted cannot have
--   (the interpreter's and busted's own allocations are not ours), so
--   anything the freeing path leaves behind fails it there.
local M = {}

-- Runs the scenario in a run of its own; raises on a wrong outcome.
-- strict: every joiner waits before any target ends.
function M.run(ums, strict)
  local n, per = 5000, 3
  ums.run(function()
    local targets, joiners = {}, {}
    local waiting, go = 0, false
    for i = 1, n do
      targets[i] = ums.spawn(function()
        if strict then
          repeat ums.sleep(0.001) until go
        else
          ums.sleep(0.01)
        end
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
    if strict then
      repeat ums.sleep(0.001) until waiting == n * per
    end
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
  return n, per
end

if (...) == "pool_full" then return M end  -- required by task_spec

local ums = require "ums"
-- The spawning loops run without a wait, which the stall monitor would
-- report (rightly) under a sanitizer's slowdown.
ums.config{stall_threshold = 0}
local n, per = M.run(ums, true)
print(("pool_full: %d tasks, %d joiners each: ok"):format(n, per))
