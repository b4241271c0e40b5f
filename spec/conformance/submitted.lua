-- Runs a program as submitted work, joined:
-- lua5.4 submitted.lua <program> [args...]. The program gets the `arg`
-- and `...` lua5.4 would give it, in the VM that runs the work; the work's
-- error is raised again here, as the program's own would be.
local ums = require "ums"
ums.run(function()
  local ok, err = ums.submit(function(prog, ...)
    arg = table.move({...}, 1, select("#", ...), 1, {[0] = prog})
    return assert(loadfile(prog))(...)
  end, table.unpack(arg, 1, #arg)):join()
  if not ok then error(err, 0) end
end)
