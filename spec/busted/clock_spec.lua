-- Run by spec/busted_helper_spec.lua with and without clock=virtual.
-- Inside a run, ums.config() shows the clock the run was started with.
-- (A test's hooks and body share one run, so the virtual time a
-- before_each sleeps has passed when the body starts.)
local ums = require "ums"

local function virtual() return ums.config().clock == "virtual" end

describe("the clock", function()
  it("follows the option", function()
    print("option clock: " .. (virtual() and "virtual" or "real"))
  end)

  it("is virtual with the tag #virtual", function()
    assert.is_true(virtual())
    local t0 = ums.now()
    ums.sleep(3600)
    assert.is_true(ums.now() - t0 >= 3600)
  end)

  it("is real with the tag #real", function()
    assert.is_false(virtual())
  end)
end)

describe("a describe tagged #virtual", function()
  before_each(function()
    assert.is_true(virtual(), "before_each on the real clock")
    ums.sleep(60)
  end)

  it("gives its tests and their hooks the virtual clock", function()
    assert.is_true(virtual())
    ums.sleep(60)
  end)

  it("unless a test says #real", function()
    assert.is_false(virtual())
  end)
end)

describe("a test tagged #notask", function()
  it("runs on Busted's thread and may start runs itself #notask", function()
    assert.is_nil(ums.self())
    assert.equal(3, ums.test(function() ums.sleep(0.001); return 3 end))
  end)
end)
