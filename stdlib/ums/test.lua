--- ums.test(fn [, timeout | opts]): runs fn as a task inside a fresh
-- ums.run, for test frameworks such as Busted:
--
--   it("sends", function() ums.test(function() ... end) end)
--   it("expires", function()
--     ums.test(function() ums.sleep(3600) end, {clock = "virtual"})
--   end)
--
-- opts: timeout (seconds, as the plain number form), clock ("real", the
-- default, or "virtual"), with the virtual clock, limit (virtual
-- seconds, default 1e7, about four months), and gc (true: a full
-- collection at the end of fn, so that finalizers a spec relies on, such
-- as a dropped ums.fs file's close, run inside its own run; see below).
--
-- With clock = "virtual" the run uses the runtime's virtual clock
-- (docs/deterministic-time.md): sleeps and timeouts take no real time
-- and tasks wake in the same order on every run. The run gets one
-- scheduler; the settings are restored afterwards. `timeout` is then a
-- real-time limit on the whole run (it catches a test that never blocks,
-- where virtual time stands still), and `limit` a virtual one: if every
-- task is blocked with nothing to wake it, the clock jumps to the limit
-- at once, so a deadlocked test fails in milliseconds with
-- "ums.test: timed out after <limit> s of virtual time". On the real
-- clock a deadlocked test fails at once too, with ums.run's deadlock
-- report (docs/deadlocks.md), which lists the blocked tasks.
--
-- Raises (so the surrounding `it` fails)
--   * when fn raises: a string error is raised again with the task's
--     traceback appended; any other value is raised as is (identity kept);
--   * when fn has not finished after `timeout` seconds (default 10), or the
--     tasks it started are still running then: the test task and every other
--     task of the run are cancelled, and the error is
--     "ums.test: timed out after N s";
--   * when a task failed and nobody joined it: the error lists each such
--     error with its traceback.
-- Returns fn's results otherwise. Cannot be called inside a run.
--
-- A test made of parts (a Busted test's before_each, body and after_each)
-- calls each part through test.block (below) inside fn: each part then
-- ends as a test does, and its failures are its own.
--
-- fn runs as the run's first task; the helper adds one task, the watchdog
-- (it sleeps for the timeout, then cancels). It counts against
-- ums.config{max_workers = n} like any task: with max_workers = 1 it never
-- starts, and the timeout cannot fire.
--
-- The runtime's error handler (ums.on_error) is replaced for the duration
-- of the test and restored afterwards. The core has no getter for it, so
-- the handler in force is read from the registry, where ums.core keeps it
-- (debug.getregistry()["ums.on_error"]); if that is not available, the
-- default handler (print to stderr) is installed afterwards.
--
-- While the test runs, ums.spawn, ums.submit and ums.submit_on (fields of
-- the `ums` module) are wrapped to note the tasks and work started, so
-- that the helper knows when all of them have ended (it polls their
-- status after fn returns; joining them would hide their errors). A task started through a copy of ums.spawn
-- taken before the test is not seen: if it is still running when fn
-- returns, the run waits for it without a timeout. On timeout, every task
-- of the run is cancelled, seen or not.
local core = require "ums.core"

local ONERROR_KEY = "ums.on_error"  -- lua-binding/lums.c

local function get_registry() return debug.getregistry() end

local function current_handler()
  local ok, reg = pcall(get_registry)
  if ok and type(reg) == "table" and type(reg[ONERROR_KEY]) == "function" then
    return reg[ONERROR_KEY]
  end
  return nil
end

local function is_live(task)
  local s = task:status()
  return s == "pending" or s == "running" or s == "suspended"
end

local function format_timeout(timeout)
  if math.type(timeout) == "float" and timeout == math.floor(timeout)
     and timeout < 2^53 then
    return ("%d"):format(timeout)
  end
  return tostring(timeout)
end

local function bad_timeout(v, what)
  error(("bad argument #2 to 'test' (%s must be a positive number of "
         .. "seconds, got %s)"):format(what, type(v) == "number"
                                       and tostring(v) or type(v)), 3)
end

-- The state of the test in progress. Runs cannot be nested, so there is
-- at most one; it lives here rather than in closures made per call, so
-- that a test allocates next to nothing the collector must trace again
-- (a cost that grows with the heap, paid by every test of a suite).
-- test() sets it before the run and clears it before returning; during
-- the run only the run's tasks (on its one Lua thread) touch it.
local ums           -- the ums module, whose spawn and submit are wrapped
local fn            -- the test's function
local virtual, limit, timeout, gc
local unjoined = {}  -- {err, traceback, task} of each failed task nobody
                     -- joined
local spawned = {}   -- every task started through ums.spawn/submit
local work = {}      -- the handles in spawned that are submitted work, as
                     -- keys: their ends are polled, not waited for
local started       -- real clock only: core.now() before the run, which
                    -- its time limit passes timeout seconds after
local timed_out = false
local prev_spawn, prev_submit, prev_submit_on
local prev_handler  -- ums.on_error's handler before the test
local prev_clock, prev_scheds  -- virtual clock only: the run's settings
local me            -- the test task
local watchdog      -- virtual clock only: the task that enforces limit
-- Set when the test task ends, however it ends. The watchdog must not
-- fire after that: with the virtual clock, once the test task has
-- failed, the clock may jump to the watchdog's deadline before the main
-- thread's cancellation of the rest of the run arrives.
local main_over = false
local fn_returned = false
local over_guard = setmetatable({}, {__close = function()
  main_over = true
end})

local function clear(t)
  for i = #t, 1, -1 do t[i] = nil end
end

local function note_failure(err, traceback, task)
  unjoined[#unjoined + 1] = {err = err, traceback = traceback, task = task}
end

local function spawn_noted(...)
  local t = prev_spawn(...)
  spawned[#spawned + 1] = t
  return t
end

-- Submitted work (ums.submit): its handle has status and cancel too.
local function submit_noted(...)
  local w = prev_submit(...)
  spawned[#spawned + 1] = w
  work[w] = true
  return w
end

local function submit_on_noted(...)
  local w = prev_submit_on(...)
  spawned[#spawned + 1] = w
  work[w] = true
  return w
end

local function others_live()
  for i = 1, #spawned do
    if is_live(spawned[i]) then return true end
  end
  return false
end

local function cancel_all()
  for i = 1, #spawned do spawned[i]:cancel() end
end

-- A failed work queue item nobody looked at reports its error when it
-- is collected: if there is one, collect now, so that it reports to
-- the handler above, inside the test. Failed task handles need no
-- collection (the run reports those still unjoined at its end), and a
-- full collection per test would cost as much as the heap is large.
local function collect_if_needed()
  local wqm = package.loaded["ums.workqueue"]
  if gc or (type(wqm) == "table" and wqm.unseen_failures and
            wqm.unseen_failures()) then
    collectgarbage()
  end
end

local function watch()
  core.sleep(virtual and limit or timeout)
  -- Everything had ended, and the helper's next look (below) is due
  -- later: not a timeout.
  if main_over or (fn_returned and not others_live()) then return end
  timed_out = true
  cancel_all()
  me:cancel()
end

-- What the test task does once fn has returned (its results are the
-- arguments, passed on). With the virtual clock it waits for the tasks
-- fn started, polling their status (joining them here would hide their
-- errors from on_error); on timeout the watchdog cancels this task: the
-- sleep then raises. The pause keeps doubling: sleeping costs no real
-- time there, but every look does, and tasks that run for a virtual hour
-- would otherwise be looked at 180,000 times. On the real clock ums.run
-- itself waits for them.
local function after_fn(...)
  fn_returned = true
  if virtual then
    local pause = 0.001
    while others_live() do
      core.sleep(pause)
      pause = pause * 2
    end
    watchdog:cancel()
  end
  collect_if_needed()
  return ...
end

-- The run's first task runs fn itself, so that the helper adds at most
-- one task (the watchdog) to the run.
local function main()
  local over <close> = over_guard
  me = core.self()
  me:name("ums.test")
  -- On the real clock the run's own limit (core.run_limit) is the
  -- timeout, and ums.run waits for the tasks fn started: the run then
  -- arms no timer of its own, so a test whose tasks are all blocked
  -- ends at once with ums.run's deadlock report.
  if virtual then
    watchdog = prev_spawn(watch)
    watchdog:name("ums.test watchdog")
  end
  return after_fn(fn())
end

-- Forgets the test's state (its tasks' handles and errors among it).
local function reset()
  fn, me, watchdog = nil, nil, nil
  clear(unjoined)
  clear(spawned)
  if next(work) ~= nil then
    for w in pairs(work) do work[w] = nil end
  end
end

-- The report of the failed tasks nobody joined (unjoined is not empty),
-- which it empties.
local function unjoined_report()
  local parts = {("ums.test: %d task(s) failed and nobody joined them:")
                 :format(#unjoined)}
  for i, u in ipairs(unjoined) do
    local name = u.task and u.task:name() or ""
    local text = tostring(u.traceback)
    if type(u.err) ~= "string" then
      text = ("(error value: %s)\n%s"):format(tostring(u.err), text)
    end
    parts[#parts + 1] = ("[%d]%s %s"):format(
      i, name ~= "" and (" task '" .. name .. "':") or "", text)
  end
  clear(unjoined)
  return table.concat(parts, "\n")
end

-- Puts back the settings the test changed for its run; passes its
-- arguments on.
local function restore(...)
  if virtual then
    core.config{clock = prev_clock or "real", schedulers = prev_scheds}
  end
  core.on_error(prev_handler or core.default_on_error)
  prev_handler = nil
  return ...
end

-- The test's outcome, from pcall(core.run_limit, ...): its results, or
-- the error to raise (see the top of this file).
local function settle(ok, ...)
  ums.spawn = prev_spawn
  ums.submit, ums.submit_on = prev_submit, prev_submit_on
  prev_spawn, prev_submit, prev_submit_on = nil, nil, nil
  local failure
  if timed_out then
    failure = ("ums.test: timed out after %s s%s"):format(
      format_timeout(virtual and limit or timeout),
      virtual and " of virtual time" or "")
  elseif not ok then
    local res = ...
    if type(res) == "string" and
       res:find("ums.run: time limit of", 1, true) then
      failure = ("ums.test: timed out after %s s"):format(
        format_timeout(timeout))
    elseif rawequal(res, core.CANCELLED) then
      failure = "ums.test: the test task was cancelled"
    elseif res == nil or res == false then
      failure = ("ums.test: the test task raised %s"):format(tostring(res))
    else
      failure = res
    end
  end
  if failure ~= nil then
    if #unjoined > 0 and type(failure) == "string" then
      failure = failure .. ("\n(and %d task(s) failed that nobody joined)")
                :format(#unjoined)
    end
    reset()
    error(failure, 0)
  end
  if #unjoined > 0 then
    local report = unjoined_report()
    reset()
    error(report, 0)
  end
  reset()
  return ...
end

-- ---------------------------------------------------------------------
-- Blocks: parts of one test that each end as a test does
-- ---------------------------------------------------------------------

-- Waits for the tasks and work spawned[first..] (and those they start)
-- to end. Work has no end to wait on: its status is polled, with a pause
-- that doubles (bounded on the real clock, where pauses take time).
local function wait_block(first)
  local i = first
  while i <= #spawned do
    local h = spawned[i]
    if work[h] then
      local pause = 0.001
      while is_live(h) do
        core.sleep(pause)
        pause = virtual and pause * 2 or math.min(pause * 2, 0.05)
      end
    else
      core.wait_end(h)
    end
    i = i + 1
  end
end

-- Takes the failures of the block's tasks that nobody joined into
-- unjoined, and forgets the block's handles (they have all ended).
local function take_block(first)
  for i = first, #spawned do
    local h = spawned[i]
    if work[h] then
      work[h] = nil
    else
      local failed, err, traceback = core.take_unjoined(h)
      if failed then note_failure(err, traceback, h) end
    end
    spawned[i] = nil
  end
end

-- The block raised err: the tasks it started are cancelled, and waited
-- for unless the test task itself is cancelled (then its waits cannot
-- wait); err is raised again, with a note when some of them had failed
-- with nobody joining them.
local function block_failed(first, err)
  for i = first, #spawned do spawned[i]:cancel() end
  pcall(wait_block, first)
  take_block(first)
  if #unjoined > 0 then
    if type(err) == "string" then
      err = err .. ("\n(and %d task(s) failed that nobody joined)")
            :format(#unjoined)
    end
    clear(unjoined)
  end
  error(err, 0)
end

local function block_over(first, ok, ...)
  if not ok then return block_failed(first, (...)) end
  wait_block(first)
  take_block(first)
  if #unjoined > 0 then error(unjoined_report(), 0) end
  return ...
end

--- test.block(f, ...): in the test task of a ums.test run, runs f(...)
-- as one block of the test, which ends as the test would: it waits for
-- the tasks f started (through ums.spawn or ums.submit, and those these
-- start), then raises the report of those that failed with nobody joining
-- them, as ums.test does at its end (so do failures reported to on_error
-- meanwhile, such as a collected handle's). When f raises, the tasks it
-- started are cancelled and its error is raised again (a string gets the
-- note "(and N task(s) failed that nobody joined)" when that happened).
-- Returns f's results. A test made of blocks (the Busted helper runs
-- before_each, the body, finally and after_each so) reports each block's
-- failures at its end rather than all at the end of the run.
local function block(f, ...)
  if me == nil or core.self() ~= me then
    error("ums.test.block: only in the test task of a ums.test run", 2)
  end
  return block_over(#spawned + 1, pcall(f, ...))
end

--- test.cancel_reason(): in a test's run, why its test task was
-- cancelled: the timeout's message when the timeout has passed (as
-- ums.test raises it), else a message saying that the run was ended
-- otherwise (a deadlock, whose report ums.test raises once the run is
-- over, or Ctrl-C).
local function cancel_reason()
  if virtual then
    if timed_out then
      return ("ums.test: timed out after %s s of virtual time")
             :format(format_timeout(limit))
    end
    -- Virtual time tells nothing of the real timeout, the one other
    -- limit such a run has (a deadlock moves the clock to the limit).
    return ("ums.test: timed out after %s s"):format(format_timeout(timeout))
  elseif started and core.now() - started >= timeout then
    return ("ums.test: timed out after %s s"):format(format_timeout(timeout))
  end
  return "ums.test: the test task was cancelled: the run was ended (a " ..
         "deadlock's report follows)"
end

local function test(f, opt)
  if type(f) ~= "function" then
    error(("bad argument #1 to 'test' (function expected, got %s)")
          :format(type(f)), 2)
  end
  local t, v, lim, g = opt, false, 1e7, false
  if type(opt) == "table" then
    for k in pairs(opt) do
      if k ~= "timeout" and k ~= "clock" and k ~= "limit" and k ~= "gc" then
        error(("bad argument #2 to 'test' (unknown option '%s')")
              :format(tostring(k)), 2)
      end
    end
    if opt.clock ~= nil and opt.clock ~= "real" and
       opt.clock ~= "virtual" then
      error(("bad argument #2 to 'test' (clock must be \"real\" or "
             .. "\"virtual\", got %s)"):format(tostring(opt.clock)), 2)
    end
    v = opt.clock == "virtual"
    g = opt.gc and true or false
    if opt.limit ~= nil then
      if type(opt.limit) ~= "number" or not (opt.limit > 0) then
        bad_timeout(opt.limit, "limit")
      end
      lim = opt.limit
    end
    t = opt.timeout
  end
  if t == nil then
    t = 10
  elseif type(t) ~= "number" or not (t > 0) then
    bad_timeout(t, "the timeout")
  end
  if core.self() then
    error("ums.test: cannot be called inside a task (ums.run cannot be "
          .. "nested)", 2)
  end

  ums = ums or require "ums"
  reset()
  fn, virtual, limit, timeout, gc = f, v, lim, t, g
  timed_out, main_over, fn_returned = false, false, false
  prev_handler = current_handler()
  prev_spawn = ums.spawn
  prev_submit, prev_submit_on = ums.submit, ums.submit_on
  core.on_error(note_failure)
  ums.spawn = spawn_noted
  if prev_submit then
    ums.submit, ums.submit_on = submit_noted, submit_on_noted
  end

  -- If fn raises, ums.run cancels every task left (also those the helper
  -- does not know of) and raises the error again (a string with fn's
  -- traceback appended).
  if virtual then
    local cfg = core.config()
    prev_clock, prev_scheds = cfg.clock, cfg.schedulers
    core.config{clock = "virtual", schedulers = 1}
  else
    started = core.now()
  end
  return settle(restore(pcall(core.run_limit, timeout, main)))
end

-- The module is called as ums.test; block and cancel_reason are its
-- fields. A tail call, so that test's errors name its caller's line.
return setmetatable({block = block, cancel_reason = cancel_reason},
                    {__call = function(_, f, opt) return test(f, opt) end})
