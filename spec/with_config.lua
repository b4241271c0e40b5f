-- spec/with_config.lua: with_config(settings, f, ...) runs f(...) with
-- the ums.config settings given (for the runs f starts) and puts the
-- previous values of those keys back afterwards, also when f raises (the
-- error is raised again as it was). Returns f's results.
--
--   local with_config = require "with_config"
--   with_config({quantum = 0}, function() ... ums.run(...) ... end)
local ums = require "ums"

return function(settings, f, ...)
  local all, prev = ums.config(), {}
  for k in pairs(settings) do prev[k] = all[k] end
  ums.config(settings)
  local r = table.pack(pcall(f, ...))
  ums.config(prev)
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end
