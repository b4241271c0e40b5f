-- Ctrl-C (SIGINT) during ums.run and in the ums command: the run is
-- cancelled at once, the tasks' <close> handlers run, and "interrupted!"
-- is raised as lua5.4 raises it (the process then exits with 1 after the
-- report); a second SIGINT during the cancellation ends the process by
-- the default action. Each case runs lua5.4 in the background of a small
-- shell driver that sends the signals once the child says it is ready,
-- and kills it if it has not ended 10 s later (a hang).
local sp = require "subprocess"
local it = sp.guard(it, pending)

-- $1: a file the driver's status goes to; then the command to run. The
-- child's stdout and stderr go to files of their own ($OUT, $ERR); the
-- driver sends SIGINT once $ERR holds a line "ready", and a second one
-- once it holds a line "$SECOND" (when set).
local DRIVER = [=[
status=$1; shift
if [ -n "$CHILD_PRELOAD" ]; then
  env LD_PRELOAD="$CHILD_PRELOAD" "$@" >"$OUT" 2>"$ERR" &
else
  "$@" >"$OUT" 2>"$ERR" &
fi
pid=$!
wait_for() {
  n=0
  until grep -qx "$1" "$ERR" 2>/dev/null; do
    n=$((n + 1))
    if [ $n -gt 200 ]; then echo "never said $1" >"$status"; break; fi
    sleep 0.05
  done
}
( sleep 10; kill -KILL $pid ) >/dev/null 2>&1 &
dog=$!
wait_for ready
kill -INT $pid
if [ -n "$SECOND" ]; then
  wait_for "$SECOND"
  kill -INT $pid
fi
wait $pid
st=$?
kill $dog 2>/dev/null
echo "$st" >>"$status"
]=]

local slurp = sp.slurp

-- Runs the script (under the ums command when opts.ums) through the
-- driver; returns the child's exit status as the shell reports it (128 +
-- the signal when one ended it), its stdout and its stderr.
local function interrupt(src, opts)
  opts = opts or {}
  local script = sp.temp(src, ".lua")
  local driver = sp.temp(DRIVER, ".sh")
  local status, out, err = sp.temp(""), sp.temp(""), sp.temp("")
  local cmd = {"sh", driver, status, sp.lua}
  if opts.ums then cmd[#cmd + 1] = sp.bin end
  cmd[#cmd + 1] = script
  local q = {}
  for i, a in ipairs(cmd) do q[i] = sp.q(a) end
  -- Under the TSan build only lua5.4 may get the preload (the shell
  -- crashes with it; see subprocess.lua): the driver passes it on.
  local preload = sp.child_preload
  sp.child_preload = nil
  local ok, r = pcall(sp.sh, table.concat(q, " "), {
    env = {OUT = out, ERR = err, SECOND = opts.second or "",
           UMS_QUANTUM = opts.quantum, UMS_SCHEDULERS = opts.schedulers,
           CHILD_PRELOAD = preload},
    timeout = 30})
  sp.child_preload = preload
  if not ok then error(r, 0) end
  local st = slurp(status)
  local res = {status = tonumber(st:match("(%d+)%s*$")), stdout = slurp(out),
               stderr = slurp(err)}
  res.describe = ("driver: %s\nstatus file: %s\nstdout:\n%s\nstderr:\n%s")
    :format(sp.describe(r), st, res.stdout, res.stderr)
  assert(not r.timed_out and r.code == 0, res.describe)
  assert(not st:find("never said", 1, true), res.describe)
  return res
end

-- A run whose tasks would sleep for 30 s, each with a <close> handler
-- that says it ran.
local SLEEPING_RUN = [[
local ums = require "ums"
ums.config{schedulers = SCHEDULERS}
local function closer(name)
  return setmetatable({}, {__close = function()
    io.stdout:write(name, " closed\n")
  end})
end
ums.run(function()
  ums.spawn(function()
    local _ <close> = closer("task")
    ums.sleep(30)
  end)
  ums.submit_on(SCHEDULERS - 1, function()
    local ums = require "ums"
    local _ <close> = setmetatable({}, {__close = function()
      io.stdout:write("work closed\n")
    end})
    ums.sleep(30)
  end)
  local _ <close> = closer("first task")
  ums.sleep(0.05)
  io.stderr:write("ready\n")
  ums.sleep(30)
end)
print("not reached")
]]

local function sleeping_run(schedulers)
  return (SLEEPING_RUN:gsub("SCHEDULERS", tostring(schedulers)))
end

local function lines(s)
  local t = {}
  for l in s:gmatch("[^\n]+") do t[#t + 1] = l end
  table.sort(t)
  return t
end

-- Under TSan a signal handler runs only once its thread calls a function
-- TSan intercepts; the thread that called ums.run waits in a raw futex
-- system call, which is none, and is not woken: Ctrl-C reaches no run
-- there, so the cases that send it are pending under TSan.
local TSAN = os.getenv("UMS_TSAN") and
             "TSan holds back signal handlers while a thread waits in a " ..
             "raw system call"
local function it_sig(name, fn)
  return it(name, function()
    if TSAN then return pending(TSAN) end
    return fn()
  end)
end

describe("Ctrl-C", function()
  after_each(sp.cleanup)

  for _, n in ipairs{1, 2} do
    it_sig(("cancels ums.run at once and raises interrupted! (%d scheduler%s)")
       :format(n, n > 1 and "s" or ""), function()
      local r = interrupt(sleeping_run(n))
      assert.equal(1, r.status, r.describe)
      assert.same({"first task closed", "task closed", "work closed"},
                  lines(r.stdout), r.describe)
      assert.truthy(r.stderr:find("lua5.4: interrupted!\nstack traceback:",
                                  1, true), r.describe)
      assert.falsy(sp.crash_marker(r.stderr), r.describe)
    end)
  end

  -- A Ctrl-C after many runs reaches the run in progress, and only that
  -- one.
  it_sig("cancels the run in progress after many runs", function()
    local r = interrupt("local ums = require 'ums'\n" ..
                        "for _ = 1, 30 do ums.run(function() end) end\n" ..
                        sleeping_run(1))
    assert.equal(1, r.status, r.describe)
    assert.same({"first task closed", "task closed", "work closed"},
                lines(r.stdout), r.describe)
    assert.truthy(r.stderr:find("lua5.4: interrupted!\nstack traceback:",
                                1, true), r.describe)
  end)

  -- A Ctrl-C in a run that ends before the watcher thread has seen it
  -- (lintr.c) is not lost: it reaches the caller as ums.run returns.
  it_sig("in a run that ends at once still raises interrupted!", function()
    local r = sp.lua_run({sp.temp([[
      local ums = require "ums"
      ums.ffi.cdef("UMS_INLINE int kill(int, int); " ..
                   "UMS_INLINE int getpid(void);")
      local ok, err = pcall(ums.run, function()
        ums.ffi.C.kill(ums.ffi.C.getpid(), 2)  -- SIGINT
      end)
      print(ok, err)
    ]], ".lua")})
    sp.assert_exit(r, 0)
    assert.equal("false\tinterrupted!\n", r.stdout, sp.describe(r))
  end)

  it_sig("can be caught with pcall, and lua5.4 is itself again after",
         function()
    local r = interrupt([[
      local ums = require "ums"
      local ok, err = pcall(ums.run, function()
        io.stderr:write("ready\n")
        ums.sleep(30)
      end)
      io.stderr:write(tostring(ok), " ", tostring(err), "\n")
      -- The first Ctrl-C set the default action, as lua.c's handler does.
      io.stderr:write("again\n")
      local t = os.time() + 30
      while os.time() < t do end
    ]], {second = "again"})
    assert.equal(128 + 2, r.status, r.describe)
    assert.equal("ready\nfalse interrupted!\nagain\n", r.stderr, r.describe)
  end)

  it_sig("in the ums command: reported with a traceback, status 1", function()
    local r = interrupt([[
      local ums = require "ums"
      ums.spawn(function()
        local _ <close> = setmetatable({}, {__close = function()
          io.stdout:write("task closed\n")
        end})
        ums.sleep(30)
      end)
      ums.sleep(0.05)
      io.stderr:write("ready\n")
      ums.sleep(30)
    ]], {ums = true})
    assert.equal(1, r.status, r.describe)
    assert.equal("task closed\n", r.stdout, r.describe)
    assert.truthy(r.stderr:find("ums: interrupted!\nstack traceback:\n",
                                1, true), r.describe)
    assert.truthy(r.stderr:find(":10: in main chunk", 1, true), r.describe)
  end)

  it_sig("in the ums command, for a script that calls ums.run", function()
    local r = interrupt(sleeping_run(2), {ums = true, schedulers = "2"})
    assert.equal(1, r.status, r.describe)
    assert.same({"first task closed", "task closed", "work closed"},
                lines(r.stdout), r.describe)
    assert.truthy(r.stderr:find("ums: interrupted!\nstack traceback:\n",
                                1, true), r.describe)
  end)

  for _, ums_cmd in ipairs{false, true} do
    it_sig("a second one during the cancellation ends the process" ..
       (ums_cmd and " (ums command)" or ""), function()
      local r = interrupt([[
        local ums = require "ums"
        ums.config{quantum = 0}
        ums.run(function()
          local _ <close> = setmetatable({}, {__close = function()
            io.stderr:write("closing\n")
            local t = os.time() + 30
            while os.time() < t do end
          end})
          io.stderr:write("ready\n")
          ums.sleep(30)
        end)
      ]], {second = "closing", ums = ums_cmd, quantum = "0"})
      assert.equal(128 + 2, r.status, r.describe)
    end)
  end

  -- The signal mask is inherited by every thread the run makes and every
  -- process a task starts: SIGINT blocked there would leave a command
  -- started without a shell deaf to Ctrl-C for good.
  it("leaves SIGINT unblocked in the threads that run tasks", function()
    local r = sp.lua_run({sp.temp([[
      local ums = require "ums"
      ums.config{schedulers = 2}
      local function blocked()
        local ums = require "ums"
        ums.ffi.cdef("UMS_INLINE int sigprocmask(int, const void *, void *);")
        local old = ums.ffi.buffer(128)
        assert(ums.ffi.C.sigprocmask(0, nil, old) == 0)
        return ums.ffi.string(old, 1):byte() & 2 ~= 0  -- SIGINT is 2
      end
      ums.run(function()
        print(blocked(), select(2, assert(ums.submit_on(1, blocked):join())))
      end)
    ]], ".lua")})
    sp.assert_exit(r, 0)
    assert.equal("false\tfalse\n", r.stdout, sp.describe(r))
  end)

  it("is left to lua5.4 outside ums.run", function()
    local r = interrupt([[
      local ums = require "ums"
      ums.run(function() ums.sleep(0.001) end)
      io.stderr:write("ready\n")
      local t = os.time() + 30
      while os.time() < t do end
    ]])
    assert.equal(1, r.status, r.describe)
    assert.truthy(r.stderr:find("interrupted!\nstack traceback:", 1, true),
                  r.describe)
  end)
end)
