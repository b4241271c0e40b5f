-- debug.gethook in a task makes no system call: a debugger or a profiler
-- may call it at every line. The quantum's signal handler must not put
-- ums's hook back while the hook is read, and holding the signal off
-- (pthread_sigmask) would cost two system calls per read. This script runs
-- itself under strace twice, once without reads and once with many, with
-- the default configuration and with preemption on (its signal firing
-- while the task reads), and compares the counts of signal-mask calls.
--
--   lua5.4 spec/gethook_calls.lua            (needs strace on PATH or in
--                                             UMS_STRACE)
--   lua5.4 spec/gethook_calls.lua child N MODE
local READS = 20000

if arg[1] == "child" then
  local ums = require "ums"
  local n, mode = tonumber(arg[2]), arg[3]
  if mode == "preempt" then ums.config{quantum = 0.0002, preempt = true} end
  ums.run(function()
    local t = ums.spawn(function()
      local function user() end
      debug.sethook(user, "", 1000)
      local bad = 0
      for _ = 1, n do
        local fn, mask, count = debug.gethook()
        if fn ~= user or mask ~= "" or count ~= 1000 then bad = bad + 1 end
      end
      debug.sethook()
      return bad
    end)
    local ok, bad = t:join()
    assert(ok, bad)
    assert(bad == 0, bad .. " reads gave another hook")
  end)
  return
end

local strace = os.getenv("UMS_STRACE") or "strace"
local lua = os.getenv("UMS_LUA") or "lua5.4"
local me = arg[0]
local preload = os.getenv("UMS_CHILD_LD_PRELOAD") or
                os.getenv("LD_PRELOAD") or ""

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- The number of rt_sigprocmask calls a child run makes.
local function calls(n, mode)
  local out = os.tmpname()
  local cmd = table.concat({
    "env -u LD_PRELOAD", q(strace), "-f -qq -e trace=rt_sigprocmask",
    preload ~= "" and ("-E " .. q("LD_PRELOAD=" .. preload)) or "",
    "-o", q(out), q(lua), q(me), "child", tostring(n), mode}, " ")
  local ok = os.execute(cmd)
  local f = assert(io.open(out))
  local c = 0
  for l in f:lines() do
    if l:find("rt_sigprocmask(", 1, true) then c = c + 1 end
  end
  f:close()
  os.remove(out)
  assert(ok, "the child run failed: " .. cmd)
  return c
end

for _, mode in ipairs({"default", "preempt"}) do
  local base, reads = calls(0, mode), calls(READS, mode)
  print(("%s: %d signal-mask calls without reads, %d with %d reads"):format(
    mode, base, reads, READS))
  -- Thread starts and the run's own waits vary a little from run to run;
  -- one call per read would add READS.
  assert(reads - base < READS / 20,
         mode .. ": debug.gethook makes system calls")
end
print("ok")
