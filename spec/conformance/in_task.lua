-- Runs a program inside a task: lua5.4 in_task.lua <program> [args...].
-- The program gets the `arg` and `...` lua5.4 would give it.
local ums = require "ums"
local prog = arg[1]
arg = table.move(arg, 2, #arg, 1, {[0] = prog})
ums.run(function() return assert(loadfile(prog))(table.unpack(arg)) end)
