--- ums: green threads for Lua 5.4 on a user-mode scheduler.
-- The C core (ums.core) runs tasks and parks them; this module adds the
-- checked configuration, the synchronisation primitives (ums.sync) and
-- the test helper. See README.md for the API.
local core = require "ums.core"

local ums = {}
for k, v in pairs(core) do ums[k] = v end
-- core.run_limit is the test helper's (stdlib/ums/test.lua), not API.
ums.run_limit = nil

-- Configuration: every key is checked here, so a typo fails at once
-- rather than silently running with a default.
local function positive_int(v) return math.type(v) == "integer" and v > 0 end
local function non_negative_int(v)
  return math.type(v) == "integer" and v >= 0
end
local function non_negative_number(v)
  return type(v) == "number" and v >= 0 and v == v
end
local function number_or_negative(v) return type(v) == "number" and v == v end

local settings = {
  schedulers = {positive_int, "a positive integer"},
  max_workers = {non_negative_int, "a non-negative integer (0: no bound)"},
  quantum = {non_negative_number,
             "a non-negative number of seconds (0: off)"},
  stack_size = {function(v) return math.type(v) == "integer" and v >= 16384 end,
                "an integer number of bytes, at least 16384"},
  worker_idle_timeout = {number_or_negative,
                         "a number of seconds (negative: never trim)"},
  idle_workers_kept = {non_negative_int, "a non-negative integer"},
  io = {function(v) return v == "auto" or v == "uring" or v == "pool" end,
        '"auto", "uring" or "pool"'},
  io_threads = {non_negative_int,
                "a non-negative integer (0: the default, 64)"},
  preempt_threads = {non_negative_int,
                     "a non-negative integer (0: the default, 64)"},
  stats = {function(v) return type(v) == "boolean" or v == "precise" end,
           'a boolean or "precise"'},
  stall_threshold = {non_negative_number,
                     "a non-negative number of seconds (0: off)"},
  clock = {function(v) return v == "real" or v == "virtual" end,
           '"real" or "virtual"'},
  -- Loaded (require) first in every VM that runs submitted work.
  init = {function(v) return v == false or (type(v) == "string" and v ~= "")
          end, "a module name, or false for none"},
}

local defaults = {
  schedulers = 1,
  max_workers = 0,
  quantum = 0.004,
  stack_size = 1024 * 1024,
  worker_idle_timeout = 10,
  idle_workers_kept = 16,
  io = "auto",
  io_threads = 0,
  preempt_threads = 0,
  -- true: waits timed on the millisecond wait clock; "precise": to the
  -- nanosecond, at a clock reading per park; false: off. UMS_STATS=off,
  -- on or precise in the environment sets the default (the runtime reads
  -- the same variable), for measuring what they cost.
  stats = (os.getenv("UMS_STATS") == "precise" and "precise")
          or os.getenv("UMS_STATS") ~= "off",
  stall_threshold = 1,
  clock = "real",
  init = false,
}

--- ums.config([settings]) -> the settings in force for the next ums.run.
function ums.config(t)
  if t ~= nil then
    if type(t) ~= "table" then
      error(("bad argument #1 to 'config' (table expected, got %s)")
            :format(type(t)), 2)
    end
    for k, v in pairs(t) do
      local rule = settings[k]
      if not rule then
        error(("ums.config: unknown setting '%s'"):format(tostring(k)), 2)
      end
      if not rule[1](v) then
        error(("ums.config: '%s' must be %s, got %s"):format(
          k, rule[2], tostring(v)), 2)
      end
    end
    -- The virtual clock needs the run's one scheduler to itself
    -- (runtime/include/ums.h, "Virtual clock").
    local cur = core.config()
    local function get(k)
      if t[k] ~= nil then return t[k] end
      if cur[k] ~= nil then return cur[k] end
      return defaults[k]
    end
    if get("clock") == "virtual" and get("schedulers") ~= 1 then
      error(('ums.config: clock = "virtual" needs schedulers = 1, got %s')
            :format(tostring(get("schedulers"))), 2)
    end
    core.config(t)
  end
  local current = core.config()
  local out = {}
  for k, v in pairs(defaults) do
    if current[k] == nil then out[k] = v else out[k] = current[k] end
  end
  return out
end

-- Make the defaults explicit in the core's table, once.
core.config(ums.config())

local spawn, self, pack, unpack = core.spawn, core.self, table.pack,
  table.unpack

--- ums.run(fn, ...) -> fn's results. Blocks until every task has ended.
-- Called from a task (a program written for plain lua5.4, run inside a
-- task, by the ums command or as submitted work), it runs fn as a task of
-- the current run and waits for that task only: a run cannot be nested,
-- and the program must behave as it does on its own.
function ums.run(fn, ...)
  if type(fn) ~= "function" then
    error(("bad argument #1 to 'run' (function expected, got %s)")
          :format(type(fn)), 2)
  end
  if self() == nil then return core.run(fn, ...) end
  local t = spawn(fn, ...)
  -- If the caller is cancelled while waiting, so is the inner task.
  local _ <close> = setmetatable({}, {__close = function() t:cancel() end})
  local r = pack(t:join())
  if r[1] then return unpack(r, 2, r.n) end
  -- As from a run of its own: a string error with the task's traceback.
  local err, tb = r[2], r[3]
  if type(err) == "string" and type(tb) == "string" then err = tb end
  error(err, 0)
end

--- ums.locals() -> the current task's local storage table.
function ums.locals()
  local t = core.self()
  if not t then error("ums.locals: not inside a task", 2) end
  return t:locals()
end

--- ums.test(fn [, timeout | opts]) -> runs fn as a task in a fresh run
-- (opts.clock = "virtual": on the virtual clock); raises
-- on timeout or on an error of any task nobody joined (stdlib/ums/test.lua).
function ums.test(fn, timeout)
  return require("ums.test")(fn, timeout)
end

local has_sync, sync = pcall(require, "ums.sync")
if has_sync then
  for k, v in pairs(sync) do ums[k] = v end
elseif not tostring(sync):find("module 'ums.sync' not found", 1, true) then
  error(sync, 0)
end

-- ums.run_until_idle([timeout]) -> true | nil, "timeout" (copied from
-- core above): waits until no other task of the run can go on without
-- time passing (every one is blocked: on a lock, a channel, a sleep...)
-- and no file I/O or C call is in flight. With the virtual clock, it
-- returns before the clock moves.

-- The standard library for programs (issue 9): work queues, application
-- locks, task groups. Each module also works on its own through require.
ums.applock = require "ums.applock"
ums.group = require("ums.group").new
ums.workqueue = require("ums.workqueue").new

return ums
