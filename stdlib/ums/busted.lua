--- ums.busted: a Busted helper that runs every test, its before_each
-- and after_each blocks, its body and its finally function, as one task
-- of a fresh ums run, so that a spec may sleep, join, wait on channels and
-- start tasks without wrapping anything:
--
--   busted --helper=ums.busted spec/
--   busted --helper=ums.busted -Xhelper timeout=30,clock=virtual spec/
--   -- or in .busted:  _all = { lua = "lua5.4", helper = "ums.busted" }
--
-- Each test runs through ums.test (stdlib/ums/test.lua), which gives it a
-- fresh run, a timeout, the choice of clock, and fails it when a task it
-- started failed and nobody joined it. Each of its blocks ends as a test
-- does (test.block): the tasks the block started are waited for, and
-- those that failed with nobody joining them fail that block, so Busted
-- reports them on it (a before_each's as a before_each error). Helper
-- options (-Xhelper, split at commas by Busted):
--
--   timeout=S   real seconds each test may take, its before_each and
--               after_each blocks and finally included (default 10);
--               when it passes, the block running then fails with
--               "ums.test: timed out after S s", and the blocks after it
--               still run, but any wait in them ends the block quietly
--   clock=C     "real" (the default) or "virtual"
--               (docs/deterministic-time.md); tags below override it per
--               test
--   limit=S     with the virtual clock, the virtual seconds after which a
--               test that is still blocked fails (default 1e7)
--   gc          a full collection at the end of every test's run
--               (ums.test's gc option), for specs that rely on finalizers
--               running inside their own run (a dropped ums.fs file's
--               close)
--   helper=P    the suite's own helper (a .lua path, else a module name),
--               loaded after this one with the options this one does not
--               know as its `arg` (without helper=, such an option is an
--               error)
--
-- Tags, in the name of a test or of a describe around it (a describe's
-- tags also apply to the before_each and after_each run for its tests):
--
--   #virtual    the virtual clock
--   #real       the real clock (overrides clock=virtual)
--   #notask     run on Busted's own thread, as without this helper (for a
--               spec that calls ums.run or ums.test itself)
--
-- A test whose own tags give its body another clock than its hooks, or
-- #notask, runs each block in a run of its own (each with the timeout),
-- as does a test whose lazy_setup has yet to run.
--
-- setup/teardown (lazy or strict) and describe bodies run on Busted's
-- thread: what they build outlives one run, which a task cannot. Tasks a
-- block starts must end before the block does (test.block waits for
-- them).
--
-- Under the ums command (`ums /usr/bin/busted --helper=ums.busted`), Busted
-- itself is already a task: blocks then run in that task, in the one run
-- of the command, without a fresh run, timeout or clock of their own.
--
-- A failure is reported at the spec's own line, as without the helper:
-- the block's error is caught inside its task, where the line that raised
-- it is still on the stack, and raised again on Busted's thread from a
-- frame that carries that line (Busted takes a failure's place from the
-- frame that raises it).
--
-- Busted's public API is used for all but one thing:
-- `busted.subscribe`/`busted.publish` (the registration of blocks goes
-- through the "register" channel, which this helper intercepts to wrap
-- the block's function), `busted.parent` and the test environment's
-- `finally`. The exception is busted.safe, through which Busted runs a
-- whole test; the helper wraps it to run the test in one run (see "One
-- run per test" below).
local core = require "ums.core"
local test = require "ums.test"
local busted = require "busted"

-- M.options: the options in force; M.runs: how many blocks have run as
-- tasks so far; M.test_runs: how many fresh runs (ums.test) they took.
local M = {runs = 0, test_runs = 0}

local options = {timeout = 10, clock = "real", limit = nil, gc = false}
local chained, chained_args = nil, {}

local function bad_option(fmt, ...)
  error("ums.busted: " .. fmt:format(...), 0)
end

local function positive(key, v)
  local n = tonumber(v)
  if not n or not (n > 0) then
    bad_option("%s must be a positive number of seconds, got '%s'", key,
               tostring(v))
  end
  return n
end

-- The helper's `arg` holds Busted's -Xhelper options (busted's
-- helper_loader sets it while the helper loads).
for _, a in ipairs(arg or {}) do
  local key, value = tostring(a):match("^([%w_]+)=(.*)$")
  key = key or a
  if key == "timeout" then
    options.timeout = positive(key, value)
  elseif key == "limit" then
    options.limit = positive(key, value)
  elseif key == "clock" then
    if value ~= "real" and value ~= "virtual" then
      bad_option("clock must be 'real' or 'virtual', got '%s'",
                 tostring(value))
    end
    options.clock = value
  elseif key == "gc" then
    options.gc = value == nil or value == "" or value == "true"
                 or value == "1" or value == "yes"
  elseif key == "helper" then
    chained = value
  else
    chained_args[#chained_args + 1] = a
  end
end
-- Without a helper to take them, other options are mistakes.
if not chained and chained_args[1] ~= nil then
  bad_option("unknown option '%s' (no helper= to pass it to)",
             tostring(chained_args[1]))
end

-- ---------------------------------------------------------------------
-- Where a failure is reported
-- ---------------------------------------------------------------------

local function dir_of(modname)
  local p = package.searchpath(modname, package.path)
  return p and p:match("^(.*)[/\\][^/\\]*$")
end

-- Frames of these files are not the spec's: Busted skips its own and
-- luassert's the same way (busted.core's getTrace).
local skip_dirs = {}
for _, m in ipairs{"busted.core", "luassert.assert", "ums.test"} do
  local d = dir_of(m)
  if d then skip_dirs[#skip_dirs + 1] = d end
end

local function skipped(info)
  if info.what == "C" then return true end
  local src = info.source
  if src:sub(1, 1) ~= "@" then return false end
  for _, d in ipairs(skip_dirs) do
    if src:sub(2, #d + 2) == d .. "/" then return true end
  end
  return false
end

-- The first frame from `level` on (in the running coroutine) that is the
-- spec's: its source and line, or nil.
local function spec_frame(level)
  while true do
    local info = debug.getinfo(level + 1, "Sl")
    if not info then return nil end
    if not skipped(info) and info.currentline > 0 then
      return info.source, info.currentline
    end
    level = level + 1
  end
end

-- Raisers by source and line: a function that raises its argument, whose
-- only frame says source:line. Busted reports an error without a position
-- at the first frame that is neither C nor its own nor luassert's, and
-- takes the failure's trace from there.
local raisers = {}

local function raise_at(source, line, err)
  if not source then error(err, 0) end
  local key = source .. ":" .. line
  local f = raisers[key]
  if not f then
    -- The chunk's one statement is on `line`, so that its frame does.
    f = assert(load(("\n"):rep(line - 1) .. "error((...), 0)", source))
    raisers[key] = f
  end
  -- A tail call: between Busted's handler and this frame, no frame of
  -- the helper's shows in the failure's traceback.
  return f(err)
end

-- ---------------------------------------------------------------------
-- Running a block
-- ---------------------------------------------------------------------

-- A tag ends where a character that cannot be in one follows.
local tag_patterns = {}
for _, tag in ipairs{"virtual", "real", "notask"} do
  tag_patterns[tag] = "#" .. tag .. "%f[^%w_%-]"
end

local function has_tag(name, tag)
  return type(name) == "string" and name:find(tag_patterns[tag]) ~= nil
end

-- The names of the describe blocks being run, innermost last: Busted
-- publishes describe start and end around the run of each one.
local describes = {}
busted.subscribe({"describe", "start"}, function(element)
  describes[#describes + 1] = element.name
  return nil, true
end)
busted.subscribe({"describe", "end"}, function()
  describes[#describes] = nil
  return nil, true
end)

-- What settings() works out, by apply_tags: the block's clock ("real" |
-- "virtual") and whether it runs on Busted's thread.
local set_clock, set_notask

local function apply_tags(name)
  -- Most names have no tag at all: one plain search says so.
  if type(name) ~= "string" or not name:find("#", 1, true) then return end
  if has_tag(name, "virtual") then set_clock = "virtual" end
  if has_tag(name, "real") then set_clock = "real" end
  if has_tag(name, "notask") then set_notask = true end
end

-- How a block runs: clock and notask, from the options, then the
-- describes' tags outside in, then the block's own.
local function settings(own_name)
  set_clock, set_notask = options.clock, false
  for i = 1, #describes do apply_tags(describes[i]) end
  apply_tags(own_name)
  return set_clock, set_notask
end

local pack, unpack = table.pack, table.unpack

-- The options ums.test gets, by clock; made once the helper's options
-- are known (below).
local test_opts = {}

-- The block being run as a task. Runs cannot be nested, so there is at
-- most one (a block that runs inside a task calls its function directly,
-- below); it lives here rather than in closures made per block, so that
-- a block allocates next to nothing the collector must trace again.
-- run_block sets it on Busted's thread before the run; during the run
-- only the run's task touches it.
local block_fn, block_args  -- block_args: nil when there are none
-- The block's own error, seen in its task: set by catch when fn raises.
local caught, caught_err, caught_source, caught_line

local function catch(e)
  -- A cancellation (the timeout) is the run's business, not fn's error.
  if not rawequal(e, core.CANCELLED) then
    caught, caught_err = true, e
    caught_source, caught_line = spec_frame(2)
  end
  return e
end

local function raise_failed(ok, ...)
  if not ok then error((...), 0) end
  return ...
end

local function body()
  if block_args then
    return raise_failed(xpcall(block_fn, catch,
                               unpack(block_args, 1, block_args.n)))
  end
  return raise_failed(xpcall(block_fn, catch))
end

-- The block's outcome, from pcall(test, ...): its results, or its
-- failure raised at the spec's line.
local function outcome(ok, ...)
  local fn = block_fn
  block_fn, block_args = nil, nil
  if ok then return ... end
  local err = ...
  local info = debug.getinfo(fn, "S")
  if caught then
    local e = caught_err
    caught, caught_err = nil, nil
    -- ums.test adds a note when tasks nobody joined failed too.
    local note = type(err) == "string" and
                 err:match("\n(%(and %d+ task%(s%) failed that nobody " ..
                           "joined%))$")
    if note and type(e) == "string" then e = e .. "\n" .. note end
    return raise_at(caught_source or info.source,
                    caught_line or info.linedefined, e)
  end
  -- A timeout or a failed task nobody joined: at the block's first line.
  return raise_at(info.source, info.linedefined, err)
end

-- A test's blocks run in one run, in its test task (see "One run per
-- test" below): in_seq is true while they do, and aborted once one of
-- them has reported the run's end (its timeout): the others then end
-- quietly when their waits raise ums.CANCELLED. Both are touched only by
-- Busted's thread and, while the run lasts, by its test task.
local in_seq, aborted = false, false

-- The outcome of a block run by test.block, from pcall: as outcome's,
-- but the cancellation of the test task, which ends the test's run, is
-- reported once, as the reason the run ended (its timeout), at the
-- block's first line.
local function block_outcome(ok, ...)
  if ok or caught or not rawequal((...), core.CANCELLED) then
    return outcome(ok, ...)
  end
  local fn = block_fn
  block_fn, block_args = nil, nil
  if aborted then return end
  aborted = true
  local info = debug.getinfo(fn, "S")
  return raise_at(info.source, info.linedefined, test.cancel_reason())
end

-- Runs fn(...) as the first task of a fresh run (ums.test), or as a block
-- of the test's run (test.block), and raises its failure at the spec's
-- line.
local function run_block(fn, own_name, ...)
  if in_seq then
    M.runs = M.runs + 1
    block_fn = fn
    block_args = select("#", ...) > 0 and pack(...) or nil
    caught, caught_err = nil, nil
    return block_outcome(pcall(test.block, body))
  end
  local clock, notask = settings(own_name)
  if notask or core.self() then return fn(...) end
  M.runs = M.runs + 1
  M.test_runs = M.test_runs + 1
  block_fn = fn
  block_args = select("#", ...) > 0 and pack(...) or nil
  caught, caught_err = nil, nil
  -- The options in force now: a suite's helper may change M.options.
  local opts = test_opts[clock]
  opts.timeout, opts.limit = options.timeout, options.limit
  opts.gc = options.gc or nil
  return outcome(pcall(test, body, opts))
end

-- Gives wrapper the same _ENV upvalue as fn: Busted looks at a block's
-- environment (busted.compatibility's getfenv) to know which of its
-- functions to reject inside it, and the block's `finally` lives there.
local function env_index(f)
  local i = 1
  while true do
    local name = debug.getupvalue(f, i)
    if name == nil then return nil end
    if name == "_ENV" then return i end
    i = i + 1
  end
end

local function share_env(wrapper, fn)
  local wi, fi = env_index(wrapper), env_index(fn)
  if wi and fi then debug.upvaluejoin(wrapper, wi, fn, fi) end
end

local wrapped = setmetatable({}, {__mode = "k"})

local function wrap(descriptor, name, fn)
  local wrapper
  if descriptor == "it" then
    wrapper = function(...)
      local env = _ENV
      -- `finally` is set by Busted in the test's environment before the
      -- body runs, and called on Busted's thread after it: its function
      -- runs as a block of its own, with the test's settings.
      local finally = env.finally
      if type(finally) == "function" then
        env.finally = function(f)
          finally(function(...) return run_block(f, name, ...) end)
        end
      end
      return run_block(fn, name, ...)
    end
  else
    wrapper = function(...)
      local _ = _ENV
      return run_block(fn, nil, ...)
    end
  end
  share_env(wrapper, fn)
  wrapped[wrapper] = fn
  return wrapper
end

-- Busted registers each block by publishing ("register", descriptor) with
-- its name and function; its own subscriber attaches the block. This one
-- runs first (priority 1), publishes the same registration with the
-- wrapped function, and stops the original.
for _, descriptor in ipairs{"it", "before_each", "after_each"} do
  busted.subscribe({"register", descriptor},
    function(name, fn, trace, attributes)
      if type(fn) ~= "function" or wrapped[fn] then return nil, true end
      busted.publish({"register", descriptor}, name,
                     wrap(descriptor, name, fn), trace, attributes)
      return nil, false
    end, {priority = 1})
end

-- ---------------------------------------------------------------------
-- One run per test
-- ---------------------------------------------------------------------

-- Busted runs a test (its before_each blocks, the body, finally, its
-- after_each blocks, and the publishing of its start and end) in one call
-- of busted.safe("it", ...). Run inside one ums.test, the test pays for
-- one run rather than one per block; each block still ends as a test
-- does (test.block), so its failures are reported on it, before Busted
-- publishes the test's end. busted.safe is not in Busted's API (the
-- module `busted` is a read-only view of it): the object that has it is
-- found as the upvalue `busted` of the exported `it`. Without it (another
-- Busted), every block keeps a run of its own.
local real
do
  local it_fn = busted.it
  for i = 1, math.huge do
    if type(it_fn) ~= "function" then break end
    local name, value = debug.getupvalue(it_fn, i)
    if name == nil then break end
    if name == "busted" and type(value) == "table" and
       type(rawget(value, "safe")) == "function" then
      real = value
      break
    end
  end
end

-- The clock of a test whose blocks can share one run, or nil when they
-- cannot: its own tags ask for another clock than its hooks' (a
-- describe's tags) or for #notask, or a lazy_setup around it has not run
-- yet (it must run on Busted's thread, and Busted runs it at the start
-- of the test's call).
local function one_run(element)
  local clock, notask = settings(element.name)
  if notask then return nil end
  local hooks_clock, hooks_notask = settings(nil)
  if hooks_notask or hooks_clock ~= clock then return nil end
  local p = busted.parent(element)
  while p do
    local lazy = rawget(p, "lazy_setup")
    if type(lazy) == "table" and lazy[1] ~= nil and lazy.success == nil then
      return nil
    end
    p = busted.parent(p)
  end
  return clock
end

-- The test's call, kept here (not in a closure per test) for sequence,
-- the run's first task.
local safe = real and real.safe
local seq_descriptor, seq_run, seq_element

local function sequence()
  in_seq = true
  return safe(seq_descriptor, seq_run, seq_element)
end

-- After a test's run: its results, or the run's own failure, which no
-- block reported (a block reports its timeout, once): a deadlock report,
-- failures of tasks nobody joined that no block waited for (started
-- through a copy of ums.spawn, or submitted work). Busted then reports it
-- on the test, at the test's line, after the test's end.
local function sequence_over(ok, ...)
  local element, was_aborted = seq_element, aborted
  in_seq, aborted = false, false
  seq_descriptor, seq_run, seq_element = nil, nil, nil
  if ok then return ... end
  local err = ...
  if was_aborted and type(err) == "string" and
     err:find("^ums%.test: timed out after") then
    return real.status("error")
  end
  local fn = wrapped[element.run]
  local info = debug.getinfo(fn or element.run, "S")
  return safe("it", function()
    return raise_at(info.source, info.linedefined, err)
  end, element)
end

if real then
  real.safe = function(descriptor, run, element)
    if descriptor ~= "it" or in_seq or type(element) ~= "table" or
       element.descriptor ~= "it" or core.self() then
      return safe(descriptor, run, element)
    end
    local clock = one_run(element)
    if not clock then return safe(descriptor, run, element) end
    seq_descriptor, seq_run, seq_element = descriptor, run, element
    aborted = false
    M.test_runs = M.test_runs + 1
    local opts = test_opts[clock]
    opts.timeout, opts.limit = options.timeout, options.limit
    opts.gc = options.gc or nil
    return sequence_over(pcall(test, sequence, opts))
  end
end

M.options = options

for _, clock in ipairs{"real", "virtual"} do
  test_opts[clock] = {timeout = options.timeout, clock = clock,
                      limit = options.limit, gc = options.gc or nil}
end

-- The suite's own helper, loaded as Busted would have loaded it. It may
-- require this module, which is therefore registered first.
package.loaded["ums.busted"] = M
if chained and chained ~= "" then
  local saved = arg
  arg = chained_args  -- luacheck: ignore
  local ok, err = pcall(function()
    if chained:match("%.lua$") then
      dofile(chained)
    else
      require(chained)
    end
  end)
  arg = saved  -- luacheck: ignore
  if not ok then
    error(("ums.busted: the suite's helper '%s' failed: %s")
          :format(chained, tostring(err)), 0)
  end
end

return M
