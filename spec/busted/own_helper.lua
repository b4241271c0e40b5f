-- A suite's own helper, chained by ums.busted (helper=<this file>): it
-- gets the options ums.busted does not know as its `arg`, and may use
-- Busted's API like any helper.
local busted = require "busted"
OWN_HELPER_ARGS = table.concat(arg or {}, ",")
OWN_HELPER_TESTS = 0
busted.subscribe({"test", "start"}, function()
  OWN_HELPER_TESTS = OWN_HELPER_TESTS + 1
  return nil, true
end)
