-- Run by spec/busted_helper_spec.lua through `busted --helper=ums.busted`:
-- every block waits (sleep, join, channel) without wrapping anything.
local ums = require "ums"

describe("blocks run as tasks", function()
  local log

  setup(function() log = {} end)

  before_each(function()
    assert(ums.self(), "before_each is not a task")
    ums.sleep(0.001)
    log[#log + 1] = "before"
  end)

  after_each(function()
    assert(ums.self(), "after_each is not a task")
    ums.sleep(0.001)
    log[#log + 1] = "after"
  end)

  it("a body sleeps, joins and uses a channel", function()
    assert(ums.self(), "the body is not a task")
    local ch = ums.channel(1)
    local t = ums.spawn(function() ums.sleep(0.005); ch:send(21) end)
    assert.equal(21, ch:recv())
    assert.is_true((t:join()))
  end)

  it("finally runs as a task too", function()
    finally(function()
      assert(ums.self(), "finally is not a task")
      ums.sleep(0.001)
      log[#log + 1] = "finally"
    end)
  end)

  it("before_each, after_each and finally ran in order", function()
    -- before, after, before, finally, after, before (this one)
    assert.same({"before", "after", "before", "finally", "after", "before"},
                log)
  end)
end)
