-- Every Lua example is a smoke test: examples/*.lua must run to the end
-- with exit 0 (and no crash report) under plain lua5.4 and under the ums
-- command. The tour and ordered_batches.lua are also checked for what
-- they print.
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
      elseif name == "ordered_batches.lua" then
        -- it checks its own log and fails if phases overlap or more than
        -- five items run at once; here: every phase is there, in order
        assert.matches("real clock, delays scaled by 0%.01", r.stdout)
        local phases = {}
        for o, n in r.stdout:gmatch("phase (%d+): (%d) item") do
          phases[#phases + 1] = o .. "x" .. n
        end
        assert.same({ "100x4", "200x2", "300x1", "400x2", "500x1" }, phases)
        assert.matches("phases never overlap; at most [1-5] items ran at "
          .. "once %(readers = 5%)\n$", r.stdout)
      elseif name == "http_fetch.lua" then
        -- all 20 pages, and the fetches overlapped at the server
        assert.matches("^fetched 20 pages, at most %d+ in flight", r.stdout)
        local most = tonumber(r.stdout:match("at most (%d+) in flight"))
        assert.is_true(most > 1)
      end
    end)

    if name == "ordered_batches.lua" then
      it(name .. " --virtual prints the queue's schedule, the same each run",
         function()
        local first
        for _ = 1, 2 do
          local r = sp.lua_run({path, "--virtual"}, {timeout = 60})
          sp.assert_exit(r, 0)
          assert.matches("phase 100: 4 item%(s%), 0%.000 %.%. 10%.100\n"
            .. "phase 200: 2 item%(s%), 10%.100 %.%. 19%.300\n"
            .. "phase 300: 1 item%(s%), 19%.300 %.%. 27%.600\n"
            .. "phase 400: 2 item%(s%), 27%.600 %.%. 35%.000\n"
            .. "phase 500: 1 item%(s%), 35%.000 %.%. 41%.500\n", r.stdout)
          assert.matches("at most 4 items ran at once", r.stdout)
          if first then assert.equal(first, r.stdout) end
          first = r.stdout
        end
      end)
    end

    it(name .. " runs with the ums command", function()
      local r = sp.ums({path}, {timeout = 60})
      sp.assert_exit(r, 0)
    end)
  end
end)
