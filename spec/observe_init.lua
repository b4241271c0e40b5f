-- observe_spec.lua's init module for the VMs of other schedulers
-- (ums.config{init = "observe_init"}): this VM's own stall handler, which
-- keeps the report in a global the work running here can return.
local ums = require "ums"
ums.on_stall(function(info)
  _G.last_stall = { name = info.name, scheduler = info.scheduler,
                    traceback = info.traceback }
end)
return {}
