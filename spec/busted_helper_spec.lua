-- ums.busted, the Busted helper (stdlib/ums/busted.lua): the specs in
-- spec/busted/ are run by a child Busted, with the helper, and its report
-- is checked. A child, because what is checked is what Busted itself
-- makes of the helper's blocks: passes, failures and where it says they
-- happened.
local sp = require "subprocess"
local it = sp.guard(it, pending)

local BUSTED = os.getenv("UMS_BUSTED") or "/usr/bin/busted"
local DIR = "spec/busted/"

-- The child finds ums where this process did (ctest's LUA_PATH, or the
-- paths spec/helper.lua would set when run by hand).
local ENV = {LUA_PATH = package.path, LUA_CPATH = package.cpath}

local function busted(args, opts)
  local all = {BUSTED, "--output=plainTerminal"}
  for _, a in ipairs(args) do all[#all + 1] = a end
  opts = opts or {}
  opts.env = opts.env or ENV
  return sp.lua_run(all, opts)
end

local function ums_busted(args)
  local all = {sp.bin, BUSTED, "--output=plainTerminal"}
  for _, a in ipairs(args) do all[#all + 1] = a end
  return sp.lua_run(all, {env = ENV})
end

local function summary(r, ok, failures, errors)
  local pat = ("%d successes? / %d failures? / %d errors?"):format(
    ok, failures, errors)
  assert(r.stdout:find(pat), "expected '" .. pat .. "'\n" .. sp.describe(r))
end

local function has(r, text)
  assert(r.stdout:find(text, 1, true),
         "expected '" .. text .. "' in the report\n" .. sp.describe(r))
end

describe("ums.busted", function()
  after_each(sp.cleanup)

  it("runs bodies, before_each, after_each and finally as tasks of "
     .. "fresh runs", function()
    local r = busted({"--helper=ums.busted", DIR .. "pass_spec.lua"})
    sp.assert_exit(r, 0)
    summary(r, 3, 0, 0)
  end)

  it("without it, the same spec fails: its blocks are not tasks",
     function()
    local r = busted({DIR .. "pass_spec.lua"})
    sp.assert_exit(r, 1)
    summary(r, 0, 0, 6)
    has(r, "before_each is not a task")
  end)

  describe("reports each failure at the spec's own line", function()
    local r
    setup(function()
      r = busted({"--helper=ums.busted", "-Xhelper", "timeout=0.5",
                  DIR .. "fail_spec.lua"})
    end)

    it("and every test fails", function()
      sp.assert_exit(r, 1)
      summary(r, 0, 1, 6)
    end)

    it("an assertion, a string, a position-less string, a table and a "
       .. "runtime error", function()
      local f = DIR .. "fail_spec.lua:"
      has(r, f .. "8: Expected objects to be equal")
      has(r, f .. "13: plain error")
      has(r, f .. "18: no position")
      has(r, f .. "23: {")
      has(r, f .. "27: attempt to index a nil value")
    end)

    it("a task nobody joined, with its own error and line", function()
      local f = DIR .. "fail_spec.lua:"
      has(r, f .. "32: ums.test: 1 task(s) failed and nobody joined them")
      has(r, f .. "33: lost in a task")
    end)

    it("the timeout of the test, at the test's line", function()
      has(r, DIR .. "fail_spec.lua:37: ums.test: timed out after 0.5 s")
    end)

    it("never inside ums itself", function()
      assert.is_nil(r.stdout:find("ums/test.lua", 1, true), r.stdout)
      assert.is_nil(r.stdout:find("ums/busted.lua", 1, true), r.stdout)
    end)
  end)

  describe("runs a test's blocks in one run", function()
    local r
    setup(function()
      r = busted({"--helper=ums.busted", "-Xhelper", "timeout=1.5",
                  DIR .. "blocks_spec.lua"})
    end)

    it("and each block's failures are reported on its own test", function()
      sp.assert_exit(r, 1)
      summary(r, 5, 0, 3)
    end)

    it("a before_each's task that failed with nobody joining it",
       function()
      local f = DIR .. "blocks_spec.lua:"
      has(r, f .. "39: ums.test: 1 task(s) failed and nobody joined them")
      has(r, f .. "42: lost in before_each")
    end)

    it("a body's task that failed after the body returned", function()
      local f = DIR .. "blocks_spec.lua:"
      has(r, f .. "52: ums.test: 1 task(s) failed and nobody joined them")
      has(r, f .. "55: lost after the body")
    end)

    it("the timeout of the whole test, once", function()
      has(r, DIR .. "blocks_spec.lua:73: ums.test: timed out after 1.5 s")
      assert.is_nil(r.stdout:find("task cancelled", 1, true), r.stdout)
    end)
  end)

  describe("chooses the clock", function()
    it("real by default; #virtual and #real tags on tests and describes",
       function()
      local r = busted({"--helper=ums.busted", DIR .. "clock_spec.lua"})
      sp.assert_exit(r, 0)
      summary(r, 6, 0, 0)
      has(r, "option clock: real")
    end)

    it("virtual with clock=virtual, which #real overrides", function()
      local r = busted({"--helper=ums.busted", "-Xhelper", "clock=virtual",
                        DIR .. "clock_spec.lua"})
      sp.assert_exit(r, 0)
      summary(r, 6, 0, 0)
      has(r, "option clock: virtual")
    end)
  end)

  it("chains with a suite's own helper, which gets the other options",
     function()
    local r = busted({"--helper=ums.busted", "-Xhelper",
                      "helper=" .. DIR .. "own_helper.lua,mine=1,other",
                      DIR .. "chain_spec.lua"})
    sp.assert_exit(r, 0)
    summary(r, 2, 0, 0)
  end)

  it("is set up in a .busted file too", function()
    local cfg = sp.temp(([[
return { default = { helper = "ums.busted", Xhelper = {"timeout=5"},
                     ROOT = {%q} } }
]]):format(DIR .. "pass_spec.lua"), ".lua")
    local r = busted({"--config-file=" .. cfg})
    sp.assert_exit(r, 0)
    summary(r, 3, 0, 0)
  end)

  it("refuses a bad option before any test runs", function()
    for _, opt in ipairs{"timeout=0", "timeout=x", "clock=fast",
                         "limit=-1", "timout=5"} do
      local r = busted({"--helper=ums.busted", "-Xhelper", opt,
                        DIR .. "pass_spec.lua"})
      sp.assert_exit(r, 1)
      assert(r.stderr:find("ums.busted: ", 1, true), sp.describe(r))
      assert.is_nil(r.stdout:find("successes", 1, true))
    end
  end)

  -- The runs keep their thread and task, and ums.test and the helper
  -- keep their state in their modules: on a large heap, what each test
  -- allocates is traced again by the collector, test after test.
  it("allocates little per test, hooks included", function()
    local function per_test(args)
      local r = busted(args)
      sp.assert_exit(r, 0)
      summary(r, 100, 0, 0)
      local n = r.stdout:match("allocated per test: (%d+)")
      return tonumber((assert(n, sp.describe(r))))
    end
    local plain = per_test({DIR .. "alloc_spec.lua"})
    local helper = per_test({"--helper=ums.busted", DIR .. "alloc_spec.lua"})
    -- One run per test (before_each, the body and after_each in it).
    assert.is_true(helper - plain < 1024,
                   ("%d bytes per test added"):format(helper - plain))
  end)

  describe("under the ums command", function()
    it("runs a spec that waits, without the helper", function()
      local r = ums_busted({DIR .. "pass_spec.lua"})
      sp.assert_exit(r, 0)
      summary(r, 3, 0, 0)
    end)

    it("and with it (blocks run in Busted's own task)", function()
      local r = ums_busted({"--helper=ums.busted", DIR .. "pass_spec.lua"})
      sp.assert_exit(r, 0)
      summary(r, 3, 0, 0)
    end)
  end)
end)
