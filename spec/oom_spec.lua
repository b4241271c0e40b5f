-- Tasks the runtime cannot start or continue for lack of memory end with
-- "out of memory", seen by their joiner or ums.on_error: never a handle
-- left pending, a run that never returns, or a crash. Each case runs in a
-- child process (under `timeout`): one whose address space is limited
-- (`ulimit -v`), so that only some of 20,000 tasks waiting inside a
-- table.sort comparator (each keeping a worker and its stack) get one;
-- one with allocation failures injected at random through a run of
-- spawns, waits and joins by libfailalloc.so (runtime/test/fault/failalloc.c; UMS_FAILALLOC names it).
local sp = require "subprocess"
local it = sp.guard(it, pending)

local preload = os.getenv("LD_PRELOAD") or ""
local child_preload = (sp.child_preload or "") .. " " .. preload
-- The sanitizers reserve terabytes of shadow memory: none of their
-- processes starts under `ulimit -v`, and the failure library's malloc
-- would sit behind theirs.
local sanitized = (child_preload:find("libasan", 1, true) or
                   child_preload:find("libtsan", 1, true)) and
                  "a sanitizer cannot run under ulimit -v nor behind " ..
                  "another malloc"

-- The child: spawns n tasks that each wait inside table.sort's comparator
-- (arg 3: seconds), joins them all, and prints what it saw. It counts
-- every handle by its final status too, after the run, so a handle left
-- pending shows.
local CHILD = [[
local ums = require "ums"
local n, quantum, nap = tonumber(arg[1]), tonumber(arg[2]), tonumber(arg[3])
local inject = arg[4] == "inject"
ums.config{quantum = quantum}
local seen = {ok = 0, oom = 0, other = 0, spawn_oom = 0, reported = 0}
local function classify(err)
  if tostring(err):find("out of memory", 1, true)
     or tostring(err):find("not enough memory", 1, true) then
    return "oom"
  end
  io.stderr:write("unexpected error: ", tostring(err), "\n")
  return "other"
end
ums.on_error(function(err)
  seen.reported = seen.reported + 1
  local k = classify(err)
  seen[k] = seen[k] + 1
end)
local hs = {}
local function body()
  local t = {3, 1, 2}
  table.sort(t, function(a, b) ums.sleep(nap); return a < b end)
  return t[1]
end
local ran, err = pcall(ums.run, function()
  if inject then os.getenv("FAILALLOC_ARM") end
  for i = 1, n do
    local ok, h = pcall(ums.spawn, body)
    if ok then
      hs[#hs + 1] = h
    else
      seen.spawn_oom = seen.spawn_oom + 1
      if classify(h) ~= "oom" then seen.other = seen.other + 1 end
    end
  end
  for _, h in ipairs(hs) do
    local ok, v = h:join()
    if ok and v == 1 then
      seen.ok = seen.ok + 1
    elseif ok then
      seen.other = seen.other + 1
    else
      local k = classify(v)
      seen[k] = seen[k] + 1
    end
  end
end)
if inject then os.getenv("FAILALLOC_DISARM") end
local status = {}
for _, h in ipairs(hs) do
  local s = h:status()
  status[s] = (status[s] or 0) + 1
end
print(("run=%s err=%s ok=%d oom=%d other=%d spawn_oom=%d reported=%d " ..
       "done=%d error=%d cancelled=%d pending=%d suspended=%d handles=%d")
      :format(tostring(ran), tostring(err):gsub("%s+", " "):sub(1, 80),
              seen.ok, seen.oom, seen.other, seen.spawn_oom, seen.reported,
              status.done or 0, status.error or 0, status.cancelled or 0,
              status.pending or 0, status.suspended or 0, #hs))
]]

-- The same shape as work submitted to another scheduler (ums.submit_on):
-- the work's join sees the result or "out of memory"; no work is left
-- "pending" or "running" after the run.
local SUBMIT_CHILD = [[
local ums = require "ums"
local n = tonumber(arg[1])
ums.config{quantum = 0, schedulers = 2}
local ws, seen = {}, {ok = 0, oom = 0, other = 0}
local ran, err = pcall(ums.run, function()
  for i = 1, n do
    ws[i] = ums.submit_on(1, function()
      local ums = require "ums"
      local t = {3, 1, 2}
      table.sort(t, function(a, b) ums.sleep(0.5); return a < b end)
      return t[1]
    end)
  end
  for i = 1, n do
    local ok, v = ws[i]:join()
    local k = ok and v == 1 and "ok" or
              not ok and tostring(v):find("out of memory", 1, true) and "oom"
              or "other"
    if k == "other" then io.stderr:write("unexpected: ", tostring(v), "\n") end
    seen[k] = seen[k] + 1
  end
end)
local st = {}
for i = 1, #ws do
  local s = ws[i]:status()
  st[s] = (st[s] or 0) + 1
end
print(("run=%s err=%s ok=%d oom=%d other=%d done=%d error=%d " ..
       "cancelled=%d pending=%d running=%d handles=%d")
      :format(tostring(ran), tostring(err):gsub("%s+", " "):sub(1, 80),
              seen.ok, seen.oom, seen.other, st.done or 0, st.error or 0,
              st.cancelled or 0, st.pending or 0, st.running or 0, #ws))
]]

local function field(out, name)
  return tonumber(out:match(name .. "=(%d+)"))
end

-- Asserts what every case must show: the child exited by itself, every
-- handle ended (done, error or cancelled), every error was out of memory,
-- and the run returned or raised that.
local function check(r, n)
  sp.assert_exit(r, 0)
  local out = r.stdout
  local why = sp.describe(r)
  assert.is_truthy(out:find("run=", 1, true), why)
  assert.equal(0, field(out, "other"), why)
  assert.equal(0, field(out, "pending"), why)
  assert.equal(0, field(out, "suspended"), why)
  local handles = field(out, "handles")
  assert.equal(handles, field(out, "done") + field(out, "error") +
               field(out, "cancelled"), why)
  if out:find("run=false", 1, true) then
    -- The first task itself could not go on (its spawn loop may have
    -- stopped short): the run raised that.
    assert.is_truthy(out:find("err=[^\n]*out of memory") or
                     out:find("err=[^\n]*not enough memory"), why)
    assert.is_true(handles + field(out, "spawn_oom") <= n, why)
  else
    assert.equal(n, handles + field(out, "spawn_oom"), why)
    -- A run that returned joined every handle it made.
    assert.equal(handles, field(out, "ok") + field(out, "oom") -
                 field(out, "reported"), why)
  end
  return out
end

-- Runs child (a script's text) with args once per seed 1..seeds, with
-- allocations failing at random (libfailalloc.so; env adds its settings),
-- hands each run to check_run, and asserts that some call failed.
local function failing_runs(child, args, seeds, env, check_run)
  local lib = os.getenv("UMS_FAILALLOC")
  assert.is_truthy(lib, "UMS_FAILALLOC names libfailalloc.so")
  local script = sp.temp(child, ".lua")
  local failures = 0
  for seed = 1, seeds do
    local e = {LD_PRELOAD = (preload ~= "" and preload .. " " or "") .. lib,
               FAILALLOC_SEED = tostring(seed), FAILALLOC_VERBOSE = "1"}
    for k, v in pairs(env) do e[k] = v end
    local argv = {script}
    for _, a in ipairs(args) do argv[#argv + 1] = a end
    local r = sp.lua_run(argv, {timeout = 120, env = e})
    check_run(r)
    failures = failures + tonumber(r.stderr:match("(%d+) calls failed"))
  end
  assert.is_true(failures > 0, "no allocation was made to fail")
end

describe("a task that cannot get memory", function()
  after_each(sp.cleanup)

  for _, quantum in ipairs{0, 0.004} do
    it("ends with out of memory under ulimit -v (quantum " .. quantum ..
       "), 20,000 tasks waiting inside table.sort", function()
      if sanitized then return pending(sanitized) end
      local script = sp.temp(CHILD, ".lua")
      local r = sp.sh("sh -c " .. sp.q("ulimit -v 4000000 && exec " ..
                      sp.q(sp.lua) .. " " .. sp.q(script) .. " 20000 " ..
                      quantum .. " 0.5"), {timeout = 240})
      local out = check(r, 20000)
      -- The limit leaves room for some stacks, not all: a run that
      -- returned saw both outcomes. (One whose first task ran out raised
      -- that, and cancelled the rest: check has seen to it.)
      if out:find("run=true", 1, true) then
        assert.is_true(field(out, "done") > 0, sp.describe(r))
        assert.is_true(field(out, "error") > 0, sp.describe(r))
      end
    end)
  end

  it("ends submitted work with out of memory under ulimit -v", function()
    if sanitized then return pending(sanitized) end
    local script = sp.temp(SUBMIT_CHILD, ".lua")
    local r = sp.sh("sh -c " .. sp.q("ulimit -v 4000000 && exec " ..
                    sp.q(sp.lua) .. " " .. sp.q(script) .. " 20000"),
                    {timeout = 240})
    sp.assert_exit(r, 0)
    local out, why = r.stdout, sp.describe(r)
    assert.is_truthy(out:find("run=", 1, true), why)
    assert.equal(0, field(out, "other"), why)
    assert.equal(0, field(out, "pending"), why)
    assert.equal(0, field(out, "running"), why)
    assert.equal(20000, field(out, "done") + field(out, "error") +
                 field(out, "cancelled"), why)
    assert.is_true(field(out, "error") > 0, why)
    if out:find("run=false", 1, true) then
      assert.is_truthy(out:find("err=[^\n]*out of memory"), why)
    else
      assert.equal(20000, field(out, "ok") + field(out, "oom"), why)
    end
  end)

  it("ends with an error when allocations fail at random during a run",
     function()
    if sanitized then return pending(sanitized) end
    failing_runs(CHILD, {"300", "0.004", "0.05", "inject"}, 10,
                 {FAILALLOC_PERMILLE = "100"},
                 function(r) check(r, 300) end)
  end)
end)

-- The child of the descriptor case: makes listeners, connections (both
-- ways of connecting), accepts and datagram sockets with allocations
-- failing at random (FAILALLOC_ARM), each round in a pcall, then disarms
-- and prints how many descriptors it holds beyond those it started with.
local NET_CHILD = [[
local ums = require "ums"
local net = ums.net
local function fds()
  collectgarbage(); collectgarbage()
  local n = 0
  for _ in ums.fs.dir("/proc/self/fd") do n = n + 1 end
  return n
end
local rounds, failed = tonumber(arg[1]), 0
local base, leaked
local ok, err = pcall(ums.run, function()
  base = fds()
  os.getenv("FAILALLOC_ARM")
  for i = 1, rounds do
    local ok = pcall(function()
      local srv <close> = assert(net.listen("127.0.0.1", 0))
      local _, port = srv:getsockname()
      local t = ums.spawn(function()
        local c = srv:accept(0.2)
        if c then c:close() end
      end)
      local c = net.connect("127.0.0.1", port, {timeout = 0.2,
                                                wait = i % 2 == 0})
      if c then c:write("x"); c:close() end
      t:join()
      local u = net.udp()
      if u then u:close() end
      local path = os.tmpname()
      os.remove(path)
      local us = net.listen_unix(path)
      if us then us:close() end
      os.remove(path)
    end)
    if not ok then failed = failed + 1 end
  end
  os.getenv("FAILALLOC_DISARM")
  ums.sleep(0.05)  -- closes that the runtime finishes after their calls
  leaked = fds() - base
end)
os.getenv("FAILALLOC_DISARM")
print(("run=%s err=%s failed=%d leaked=%s"):format(tostring(ok),
      tostring(err):gsub("%s+", " "):sub(1, 80), failed, tostring(leaked)))
]]

describe("network objects when allocations fail", function()
  after_each(sp.cleanup)

  it("leave no descriptor open", function()
    if sanitized then return pending(sanitized) end
    failing_runs(NET_CHILD, {"200"}, 3,
                 {FAILALLOC_ARMED = "0", FAILALLOC_PERMILLE = "20"},
                 function(r)
                   sp.assert_exit(r, 0)
                   assert.is_truthy(r.stdout:find("leaked=0", 1, true),
                                    sp.describe(r))
                 end)
  end)
end)
