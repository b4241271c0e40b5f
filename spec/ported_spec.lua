-- Programs ported from other runtimes (Tarantool fibers, Go, luv and
-- cqueues), written the way a user coming from them writes them, with
-- the output the original gives. Where ums differs by design the
-- expected value is ums's and docs/guide.md ("Porting from other
-- runtimes") says so.
local ums = require "ums"

-- Runs fn as a run's first task and returns the lines it logged.
local function trace(fn)
  local out = {}
  local function log(...)
    local t = {}
    for i = 1, select("#", ...) do t[#t + 1] = tostring((select(i, ...))) end
    out[#out + 1] = table.concat(t, " ")
  end
  ums.run(fn, log)
  return out
end

describe("Tarantool fiber programs", function()
  it("fiber.sleep(0) and fiber.yield() let the other fibers run", function()
    -- Tarantool prints "a1 b1 a2 b2 a3 b3" for all three, started or not.
    local pauses = {
      sleep0 = function() ums.sleep(0) end,
      yield = function() ums.yield() end,
    }
    for name, pause in pairs(pauses) do
      for _, started in ipairs{false, true} do
        local order = {}
        ums.run(function()
          local function body(tag)
            if started then ums.yield() end
            for i = 1, 3 do
              order[#order + 1] = tag .. i
              pause()
            end
          end
          local a, b = ums.spawn(body, "a"), ums.spawn(body, "b")
          assert(a:join())
          assert(b:join())
        end)
        assert.equal("a1 b1 a2 b2 a3 b3", table.concat(order, " "),
                     name .. (started and ", started" or ""))
      end
    end
  end)
end)
