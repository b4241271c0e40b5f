-- Helper threads that cannot be created. Every thread ums starts when a
-- run begins (the schedulers', the runtime's monitor, which also drives
-- the quantum) is needed: if one cannot be created the run does not start,
-- and the error names the thread. Threads started later on demand (the
-- I/O and C-call pools) degrade the pool, which says so once on stderr,
-- and the work still runs. Thread creation is made to fail with strace's
-- fault injection on clone3 (glibc's pthread_create), in a child process
-- under `timeout`; where strace cannot trace, the cases are pending.
local sp = require "subprocess"
local it = sp.guard(it, pending)

local function strace_works()
  local ok, _, code = os.execute("strace -f -qq -o /dev/null true " ..
                                 ">/dev/null 2>&1")
  return ok and code == 0
end
local traced = not sp.unavailable and strace_works()

-- Runs lua5.4 on the script with the when-th clone3 (when: strace's
-- syntax, "3" or "4+") failing with EAGAIN.
local function run_failing(script, when)
  local file = sp.temp(script, ".lua")
  return sp.sh(("strace -f -qq -o /dev/null -e trace=clone3 "
                .. "-e inject=clone3:error=EAGAIN:when=%s %s %s")
               :format(when, sp.q(sp.lua), sp.q(file)), {timeout = 60})
end

-- A task that computes forever, cancelled by the quantum: it can end only
-- if the monitor runs.
local CANCEL = [[
local ums = require "ums"
ums.config{schedulers = 2, quantum = 0.004, stall_threshold = 0.3,
           preempt = true}
ums.run(function()
  local hog = ums.spawn(function() local x = 0; while true do x = x + 1 end end)
  ums.sleep(0.05)
  hog:cancel()
  local ok, err = hog:join()
  assert(not ok and err == ums.CANCELLED, tostring(err))
  print("cancelled")
end)
]]

describe("a helper thread that cannot be created", function()
  after_each(sp.cleanup)

  it("fails the start of the run, naming the thread, or is not needed",
     function()
    if not traced then return pending("strace cannot trace here") end
    local seen = {}
    -- Two schedulers and the runtime's monitor are the threads a run
    -- starts; the ones after them are not needed here.
    for n = 1, 6 do
      local r = run_failing(CANCEL, tostring(n))
      assert(not r.timed_out, "the run hung\n" .. sp.describe(r))
      if r.code == 0 then
        assert.matches("cancelled", r.stdout, 1, true)
      else
        sp.assert_exit(r, 1)
        local what = r.stderr:match("ums%.run: cannot start the runtime: "
                                    .. "cannot create the ([^:]-thread[^:]*)")
        assert(what, "no thread named\n" .. sp.describe(r))
        seen[what] = true
      end
    end
    assert.is_true(seen["thread of scheduler 0"])
    assert.is_true(seen["thread of scheduler 1"])
    assert.is_true(seen["monitor thread (stall reports, CPU sampling)"])
  end)

  it("in a pool is reported once, and the pool's work still runs",
     function()
    if not traced then return pending("strace cannot trace here") end
    local path = sp.temp(("x"):rep(10000))
    local script = ([[
local ums = require "ums"
ums.config{io = "pool", quantum = 0, stall_threshold = 0, stats = false}
ums.ffi.cdef[=[ int usleep(unsigned int us); ]=]
ums.run(function()
  local ts = {}
  for i = 1, 8 do
    ts[i] = ums.spawn(function()
      for _ = 1, 20 do assert(#ums.fs.readfile(%q) == 10000) end
      for _ = 1, 5 do assert(ums.ffi.C.usleep(1000) == 0) end
    end)
  end
  for i = 1, 8 do assert(ts[i]:join()) end
  print("done")
end)
]]):format(path)
    -- strace counts calls per thread. With "k+", each thread's k-th
    -- clone3 and every later one fail. The main thread runs the one
    -- scheduler itself. k = 3: its first two clone3 succeed (the Ctrl-C
    -- watcher, made once for the process by its first run, and the I/O
    -- pool's first thread); every later one fails: the I/O pool's
    -- monitor, and every thread of the C-call pool. A sanitizer's own
    -- threads come first on the main thread: while the run cannot start
    -- (and says which thread it could not create), k goes up.
    local r
    for k = 3, 6 do
      r = run_failing(script, k .. "+")
      if r.code == 0 then break end
      sp.assert_exit(r, 1)
      assert.matches("ums.run: cannot start the runtime: cannot create the "
                     .. "thread of scheduler 0", r.stderr, 1, true)
    end
    sp.assert_exit(r, 0)
    assert.matches("done", r.stdout, 1, true)
    local function count(pattern)
      local _, n = r.stderr:gsub(pattern, "")
      return n
    end
    -- Once at most (under a sanitizer the count of clone3 calls before it
    -- differs, and the I/O pool's monitor may be the one that starts).
    local io_monitor = count("ums: the ums%-io pool cannot create its "
      .. "monitor thread %(Resource temporarily unavailable%)")
    local preloaded = (os.getenv("LD_PRELOAD") or sp.child_preload or "")
                      ~= ""
    if preloaded then
      assert.is_true(io_monitor <= 1, sp.describe(r))
    else
      assert.equal(1, io_monitor, sp.describe(r))
    end
    assert.equal(1, count("ums: the ums%-preempt pool cannot create a "
                          .. "thread %(Resource temporarily unavailable%): "
                          .. "its work runs on its callers' threads"),
                 sp.describe(r))
  end)
end)
