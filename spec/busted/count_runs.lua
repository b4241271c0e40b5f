-- Chained after ums.busted (helper=<this file>) by
-- scripts/debian-suite.sh: at the end of the run, fails it (exit status
-- 3) if no block ran as a task, so that a suite cannot pass around the
-- helper; prints how many did.
local busted = require "busted"
local helper = require "ums.busted"
busted.subscribe({"exit"}, function()
  io.stdout:write(("ums.busted: %d blocks ran as tasks\n"):format(
    helper.runs))
  io.stdout:flush()
  if helper.runs == 0 then os.exit(3, true) end
  return nil, true
end)
