-- Run by spec/busted_helper_spec.lua with helper=spec/busted/own_helper.lua.
local ums = require "ums"

describe("a chained helper", function()
  it("was loaded with its own options", function()
    assert.equal("mine=1,other", OWN_HELPER_ARGS)
    ums.sleep(0.001)
  end)

  it("sees the tests start", function()
    assert.equal(2, OWN_HELPER_TESTS)
  end)
end)
