-- Every Lua example is a smoke test: examples/*.lua must run to the end
-- with exit 0 (and no crash report) under plain lua5.4 and under the ums
-- command.
local sp = require "subprocess"
local it = sp.guard(it, pending)

local function list_examples()
  local p = assert(io.popen("ls -1 " .. sp.q(sp.examples) .. " 2>/dev/null"))
  local names = {}
  for name in p:lines() do
    if name:match("%.lua$") then names[#names + 1] = name end
  end
  p:close()
  table.sort(names)
  return names
end

local examples = list_examples()

describe("examples", function()
  after_each(sp.cleanup)

  it("include the tour", function()
    local found = false
    for _, name in ipairs(examples) do found = found or name == "tour.lua" end
    assert.is_true(found, "no tour.lua in " .. sp.examples)
  end)

  for _, name in ipairs(examples) do
    local path = sp.examples .. "/" .. name

    it(name .. " runs with lua5.4", function()
      local r = sp.lua_run({path}, {timeout = 60})
      sp.assert_exit(r, 0)
      if name == "tour.lua" then
        -- every section ran, and said what it should
        assert.matches("1%. join:%s+true%s+42", r.stdout)
        assert.matches("6%. mutex: 4 tasks x 10 increments = 40", r.stdout)
        assert.matches("7%. files: 6 lines, 84 bytes", r.stdout)
        assert.matches("tour done\n$", r.stdout)
      elseif name == "top.lua" then
        -- not a terminal: one table, every part of it filled in
        assert.matches("SCHEDULER.*SWITCH/s", r.stdout)
        assert.matches("\n  preemptive ", r.stdout)
        assert.matches("\n%d+ +cruncher%-%d", r.stdout)
        assert.matches("\nsleep ", r.stdout)
        assert.matches("\nmutex ", r.stdout)
        assert.matches("top done\n$", r.stdout)
      end
    end)

    it(name .. " runs with the ums command", function()
      local r = sp.ums({path}, {timeout = 60})
      sp.assert_exit(r, 0)
    end)
  end
end)
