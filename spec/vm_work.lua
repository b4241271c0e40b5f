-- spec/vm_work.lua: functions that vm_spec.lua submits by name
-- ("vm_work.add"). Loaded in whichever VM runs the work.
local ums = require "ums"

local M = {}

function M.add(a, b) return a + b end

-- The scheduler (from 0) the work ran on, and the VM's init count.
function M.where() return ums.scheduler(), INIT_COUNT end

function M.fail(msg)
  error(msg, 1)
end

-- Not a function: submitting "vm_work.answer" must fail cleanly.
M.answer = 42

return M
