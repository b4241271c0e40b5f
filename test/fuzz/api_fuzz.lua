-- The API fuzzer, one seed: a run of random ums calls (test/fuzz/fuzzlib.lua)
-- from a seeded generator. test/fuzz/fuzz.sh starts one of these per seed
-- in a child process and judges how it ended; see test/fuzz/README.md.
--
-- usage: lua5.4 test/fuzz/api_fuzz.lua SEED [CALLS [DIR]]
--   SEED   the generator's seed: it picks the run's settings and every call
--   CALLS  calls made by the first task (default 2000); tasks and other
--          VMs' work add their own
--   DIR    a scratch directory for files (default: made under /tmp and
--          removed at the end)
-- UMS_FUZZ_TRACE=1 names each call on stderr, to find where a seed fails.
--
-- It prints "DONE seed=S calls=N raised=N" and exits 0 when the run
-- ended; anything else (a crash, a hang, a sanitizer report, another exit
-- status) is a finding.
local seed = math.tointeger(tonumber(arg[1]))
if not seed then
  io.stderr:write("usage: lua5.4 api_fuzz.lua SEED [CALLS [DIR]]\n")
  os.exit(2)
end
local ncalls = math.tointeger(tonumber(arg[2] or "2000")) or 2000

-- The engine must be found by name from every VM: the other schedulers'
-- VMs copy package.path when the run starts.
local here = arg[0]:match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path

local ums = require "ums"
local fuzz = require "fuzzlib"

local dir, own_dir = arg[3], false
if not dir then
  dir = os.tmpname()
  os.remove(dir)
  assert(ums.fs.mkdir(dir))
  own_dir = true
end

math.randomseed(seed)
local random = math.random
local function pick(t) return t[random(#t)] end

-- The run's settings come from the seed too, so every combination is
-- reached: one scheduler or two, the quantum on or off, each I/O backend,
-- a bound on active tasks, small stacks.
local settings = {
  schedulers = pick{1, 1, 2},
  quantum = pick{0, 0.004, 0.001},
  io = pick{"auto", "pool"},
  max_workers = pick{0, 0, 4, 32},
  stack_size = pick{nil, nil, ums.STACK_SIZE_MIN},
  io_threads = pick{0, 2},
  preempt_threads = pick{64, 2},
}
ums.config(settings)

-- Errors of tasks nobody joined are expected here (the fuzzer makes them
-- on purpose): count them instead of printing each.
local unjoined = 0
ums.on_error(function() unjoined = unjoined + 1 end)

local ctx = fuzz.new(seed, dir)
ctx.trace = os.getenv("UMS_FUZZ_TRACE") == "1"

local ok, err = pcall(ums.run, function()
  for _ = 1, random(0, 3) do
    ctx.schans[#ctx.schans + 1] = ums.shared.channel(random(0, 3))
  end
  for _ = 1, ncalls do fuzz.step(ctx, 0, "main") end
  fuzz.finish(ctx)
end)
-- A deadlock the calls made (test/fuzz/README.md) ends the run with the
-- report: an outcome, not a finding. Anything else that fails the run is.
local deadlock = not ok and type(err) == "string" and
  err:find("^ums%.run: deadlock: ") ~= nil
if not ok and not deadlock then
  io.stderr:write("api_fuzz: the run failed: ", tostring(err), "\n")
  os.exit(1)
end

if own_dir then
  local function rmtree(d)
    for name in ums.fs.dir(d) do
      if name ~= "." and name ~= ".." then
        local p = d .. "/" .. name
        local st = ums.fs.stat(p, true)
        if st and st.type == "directory" then rmtree(p) end
        ums.fs.remove(p)
      end
    end
  end
  rmtree(dir)
  assert(ums.fs.remove(dir))
end

print(("DONE seed=%d calls=%d raised=%d unjoined=%d deadlock=%d"):format(
  seed, ctx.calls, ctx.raised, unjoined, deadlock and 1 or 0))
