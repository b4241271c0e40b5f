local ums = require "ums"

describe("ums.run", function()
  it("runs the README example", function()
    local ok, v = ums.run(function()
      local t = ums.spawn(function(a) ums.sleep(0.01); return a * 2 end, 21)
      return t:join()
    end)
    assert.is_true(ok)
    assert.equal(42, v)
  end)
end)
