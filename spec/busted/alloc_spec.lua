-- Run by spec/busted_helper_spec.lua with and without the helper: prints
-- the Lua heap allocated while its tests (each with a before_each and an
-- after_each) run, with the collector stopped, so that the difference is
-- what the helper allocates per test.
local ums = require "ums"
local N = 100
local before

describe("allocation", function()
  setup(function()
    -- What the first run of a process makes once is not per test.
    ums.test(function() end)
    collectgarbage()
    collectgarbage("stop")
    before = collectgarbage("count")
  end)

  teardown(function()
    local per_test = (collectgarbage("count") - before) * 1024 / N
    collectgarbage("restart")
    print(("\nallocated per test: %.0f bytes"):format(per_test))
  end)

  before_each(function() end)
  after_each(function() end)

  for i = 1, N do
    it("test " .. i, function() end)
  end
end)
