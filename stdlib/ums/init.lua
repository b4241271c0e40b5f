--- ums: green threads for Lua 5.4 on a user-mode scheduler.
-- The C core (ums.core) runs tasks and parks them; this module adds the
-- checked configuration, the synchronisation primitives (ums.sync) and
-- the test helper. docs/lua-api.md describes the API.
local core = require "ums.core"
local raise = require("ums.waitq").raise

local ums = {}
for k, v in pairs(core) do ums[k] = v end
-- core.run_limit, wait_end and take_unjoined are the test helper's
-- (stdlib/ums/test.lua), not API.
ums.run_limit, ums.wait_end, ums.take_unjoined = nil, nil, nil
-- core.socket holds the helpers stdlib/ums/socket.lua is built on; the
-- field ums.socket is that module, LuaSocket's API (loaded on first use,
-- at the end of this file).
ums.socket = nil

-- Configuration: every key is checked here, so a typo fails at once
-- rather than silently running with a default. The numeric bounds are
-- the runtime's own (core.limits: runtime/include/ums.h), so a value
-- accepted here is one the run accepts.
local limits = core.limits

-- An integer within the bounds of setting `name`; `note` says what
-- special values mean.
local function int_in(name, what, note)
  local lo, hi = limits[name][1], limits[name][2]
  return {function(v) return math.type(v) == "integer" and v >= lo and
                             v <= hi end,
          ("%s from %d to %d%s"):format(what, lo, hi, note or "")}
end

-- A number of seconds from 0 (or, with `negative`, any negative number
-- too) up to what the runtime's nanoseconds hold.
local function seconds(note, negative)
  local hi = limits.seconds[2]
  return {function(v)
            return type(v) == "number" and v == v and v <= hi and
                   (v >= 0 or (negative and v > -math.huge))
          end,
          ("a number of seconds %s %.0f%s"):format(
            negative and "up to" or "from 0 to", hi, note)}
end

local settings = {
  schedulers = int_in("schedulers", "an integer"),
  max_workers = int_in("max_workers", "an integer", " (0: no bound)"),
  quantum = seconds(" (0: off)"),
  preempt = {function(v) return type(v) == "boolean" end, "a boolean"},
  stack_size = int_in("stack_size", "an integer number of bytes",
                      " (ums.STACK_SIZE_MIN and up)"),
  worker_idle_timeout = seconds(" (negative: never trim)", true),
  idle_workers_kept = int_in("idle_workers_kept", "an integer"),
  io = {function(v) return v == "auto" or v == "uring" or v == "pool" end,
        '"auto", "uring" or "pool"'},
  io_threads = int_in("io_threads", "an integer", " (0: the default, 64)"),
  preempt_threads = int_in("preempt_threads", "an integer",
                           " (0: the default, 10000)"),
  stats = {function(v) return type(v) == "boolean" or v == "precise" end,
           'a boolean or "precise"'},
  stall_threshold = seconds(" (0: off)"),
  clock = {function(v) return v == "real" or v == "virtual" end,
           '"real" or "virtual"'},
  deadlock = {function(v) return type(v) == "boolean" end, "a boolean"},
  -- Loaded (require) first in every VM that runs submitted work.
  init = {function(v) return v == false or (type(v) == "string" and v ~= "")
          end, "a module name, or false for none"},
}

local defaults = {
  schedulers = 1,
  max_workers = 0,
  quantum = 0.004,
  -- false: a task is switched out only in a call that can wait; true: the
  -- quantum may interrupt it anywhere in Lua code. UMS_PREEMPT=1 in the
  -- environment sets the default.
  preempt = os.getenv("UMS_PREEMPT") == "1",
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
  -- false: a run whose tasks are woken by threads ums cannot see
  -- (docs/deadlocks.md) is not ended when every task is blocked.
  deadlock = true,
  init = false,
}

--- ums.config([settings]) -> the settings in force for the next ums.run.
function ums.config(t)
  if t ~= nil then
    if type(t) ~= "table" then
      raise(2, ("bad argument #1 to 'config' (table expected, got %s)")
            :format(type(t)))
    end
    for k, v in pairs(t) do
      local rule = settings[k]
      if not rule then
        raise(2, ("ums.config: unknown setting '%s'"):format(tostring(k)))
      end
      if not rule[1](v) then
        raise(2, ("ums.config: '%s' must be %s, got %s"):format(
          k, rule[2], tostring(v)))
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
      raise(2, ('ums.config: clock = "virtual" needs schedulers = 1, got %s')
            :format(tostring(get("schedulers"))))
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

local spawn, pack, unpack = core.spawn, table.pack, table.unpack

-- ums.run(fn, ...) called from a task (a program written for plain
-- lua5.4, run inside a task, by the ums command or as submitted work): fn
-- runs as a task of the current run and is joined, since a run cannot be
-- nested and the program must behave as it does on its own. core.run calls
-- it (lua-binding/lums.c, l_run), so that ums.run is core.run itself.
local function run_in_task(fn, ...)
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
debug.getregistry()["ums.run_in_task"] = run_in_task

--- ums.locals() -> the current task's local storage table.
function ums.locals()
  local t = core.self()
  if not t then raise(2, "ums.locals: not inside a task") end
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

-- The C core's modules are loaded under their own names too (require
-- "ums.net" gives ums.net), and that is also where Lua looks for a
-- function's name when it reports a bad argument: "bad argument #1 to
-- 'ums.fs.open'", not "to '?'", when the call came through pcall or a
-- local.
for _, name in ipairs{"fs", "net", "ffi", "shared"} do
  if package.loaded["ums." .. name] == nil then
    package.loaded["ums." .. name] = core[name]
  end
end

-- The standard library for programs (docs/stdlib.md): work queues,
-- application
-- locks, task groups. Each module also works on its own through require.
ums.applock = require "ums.applock"
ums.group = require("ums.group").new
ums.workqueue = require("ums.workqueue").new

-- ums.socket is require "ums.socket", loaded the first time a program
-- reads the field (that module requires this one, so it cannot be loaded
-- here).
setmetatable(ums, {__index = function(t, k)
  if k == "socket" then
    local m = require "ums.socket"
    rawset(t, k, m)
    return m
  end
end})

return ums
