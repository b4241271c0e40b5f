-- Run by spec/busted_helper_spec.lua: each test fails after a wait; the
-- report must name this file and the line marked in the comment.
local ums = require "ums"

describe("failures", function()
  it("an assertion", function()
    ums.sleep(0.001)
    assert.equal(1, 2)  -- line 8
  end)

  it("a string error", function()
    ums.sleep(0.001)
    error("plain error")  -- line 13
  end)

  it("an error without a position", function()
    ums.sleep(0.001)
    error("no position", 0)  -- line 18
  end)

  it("a table error", function()
    ums.sleep(0.001)
    error({code = 42})  -- line 23
  end)

  it("a runtime error in a function the test calls", function()
    local function deeper(t) return t.field end  -- line 27
    ums.sleep(0.001)
    deeper(nil)
  end)

  it("a task nobody joined", function()  -- line 32
    ums.spawn(function() error("lost in a task") end)
    ums.sleep(0.01)
  end)

  it("a timeout", function()  -- line 37
    ums.sleep(3600)
  end)
end)
