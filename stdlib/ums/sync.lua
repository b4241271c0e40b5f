--- ums.sync: mutex, semaphore, event, condition variable and wait group
-- for the tasks of one ums run (channel and select are in C: lchan.c,
-- re-exported here).
--
-- Everything here is plain Lua on the wait queues of ums.core
-- (`core.waitq`, see lua-binding/CORE-API.md). All tasks of a VM run on
-- that VM's one scheduler thread, and nothing in this file yields except
-- a queue's wait and a wait's yield point (`core.quantum_point`, before
-- the wait looks at its object), so the state of a primitive needs no lock: the code between
-- two waits runs as one atomic step. For the same reason these objects
-- belong to the VM that created them; work on other cores talks through
-- shared objects (core.shared, lua-binding/lshared.c), which the
-- constructors here make when given {shared = true}.
--
-- Conventions (docs/design/architecture.md, "Conventions"):
--   * a bad argument raises, with luaL_argerror's wording;
--   * a timeout (seconds, a non-negative number; nil = forever) is a
--     result: `nil, "timeout"`; a timeout of 0 polls without parking;
--   * other runtime failures return `nil, message`;
--   * a cancelled task sees `core.CANCELLED` raised from any wait that
--     would park it; a wait that can complete at once still succeeds;
--   * operations that only change state return true.
--
-- Waiters. Each primitive keeps FIFO wait queues (core.waitq), whose
-- protocol is written once, at the top of lua-binding/lwaitq.h: a waker
-- ends the park of the first live waiter; a waiter whose park ended
-- otherwise (timeout, cancellation) leaves its queue by itself.

local core = require "ums.core"
local wq = require "ums.waitq"

-- The atomicity above must hold against the quantum too: a task preempted
-- half-way through a semaphore release lets another task see it torn
-- (units lost or handed twice), and one preempted between
-- waitq_wait_begin and waitq_wait_end breaks the park protocol.
-- core.nopreempt_chunk() asks the core to defer preemption while any
-- function of this chunk runs.
core.nopreempt_chunk()

local newq, qwait, qwake, qwake_all = core.waitq, core.waitq_wait,
  core.waitq_wake, core.waitq_wake_all
local qwait_begin, qwait_end = core.waitq_wait_begin, core.waitq_wait_end
-- Wait types, so that ums.tasks() and ums.waits() say what a task waits
-- for (and on which object, held by whom).
local W = core.WAIT
local pairs, tostring = pairs, tostring
local current_task = core.self
-- Every wait below calls it first, before it looks at its object: a task
-- past its quantum yields there, also when the wait need not wait.
local quantum_point = core.quantum_point

local error, getmetatable, pcall, setmetatable, type =
  error, getmetatable, pcall, setmetatable, type
local format = string.format
local maxinteger = math.maxinteger
local tointeger = math.tointeger

local GRANTED = 0

-- ---------------------------------------------------------------------
-- Argument checks, worded like lauxlib's so that Lua and C functions of
-- ums read alike: ums.waitq's, shared by the standard library's modules.
-- ---------------------------------------------------------------------

local typename, check_self = wq.typename, wq.check_self

-- Raises "bad argument #narg to 'fname' (extramsg)" at the caller of the
-- public function `level` frames up (2: it called argerror directly; 3:
-- through one check helper), numbering as luaL_argerror does: ums.waitq's.
local argerror = wq.argerror

local function check_integer(v, narg, fname)
  if type(v) ~= "number" then
    argerror(3, narg, fname, "number expected, got " .. typename(v))
  end
  local n = tointeger(v)
  if not n then
    argerror(3, narg, fname, "number has no integer representation")
  end
  return n
end

-- The options table every constructor takes after its usual arguments:
-- {shared = true} makes the object with core.shared instead (an object
-- every VM of a run may use: lua-binding/lshared.c). Returns whether.
local function shared_opt(opts, narg, fname)
  if opts == nil then return false end
  if type(opts) ~= "table" then
    argerror(3, narg, fname, "table expected, got " .. typename(opts))
  end
  for k, v in pairs(opts) do
    if k ~= "shared" then
      argerror(3, narg, fname, format("unknown option '%s'", tostring(k)))
    elseif type(v) ~= "boolean" then
      argerror(3, narg, fname, "option 'shared' must be a boolean, got "
        .. typename(v))
    end
  end
  return opts.shared == true
end

-- Returns the timeout in seconds, or nil for "forever" (nil or math.huge).
local opt_timeout = wq.opt_timeout

-- The calling task (every wait needs it, and a mutex records it as
-- owner), or a clear error outside a task.
local need_task = wq.need_task

-- ---------------------------------------------------------------------
-- Mutex: FIFO, not recursive, owned by the task that locked it. Unlock
-- hands ownership straight to the first live waiter, so a task that
-- arrives later cannot barge in and no waiter starves. A task that ends
-- (or is cancelled) while holding it leaves it locked, as in C: unlock
-- from a <close> variable or after a pcall.
-- ---------------------------------------------------------------------

local Mutex = { __name = "ums.mutex" }
Mutex.__index = Mutex

local function mutex(opts)
  if shared_opt(opts, 1, "mutex") then return core.shared.mutex() end
  return setmetatable({ owner = nil, q = newq() }, Mutex)
end

--- Locks the mutex, waiting up to timeout seconds.
-- @return true | nil, "timeout" | nil, msg when the caller already holds
-- it (it would wait for itself forever)
function Mutex:lock(timeout)
  check_self(self, Mutex, "lock")
  timeout = opt_timeout(timeout, 2, "lock")
  quantum_point()
  local me = need_task("mutex:lock")
  local owner = self.owner
  if owner == nil then
    self.owner = me
    return true
  end
  if owner == me then
    return nil, "would deadlock: the mutex is already locked by this task"
  end
  if timeout == 0 then return nil, "timeout" end
  local outcome, msg = qwait(self.q, timeout, false, W.mutex, self, owner)
  if not outcome then return nil, msg end
  -- Granted: unlock already made us the owner.
  return true
end

--- Locks the mutex if it is free. @return true | false
function Mutex:trylock()
  check_self(self, Mutex, "trylock")
  local me = need_task("mutex:trylock")
  if self.owner == nil then
    self.owner = me
    return true
  end
  return false
end

local function unlock(m)
  m.owner = qwake(m.q, GRANTED)
end

--- Unlocks the mutex; raises unless the calling task holds it.
function Mutex:unlock()
  check_self(self, Mutex, "unlock")
  local me = need_task("mutex:unlock")
  local owner = self.owner
  if owner ~= me then
    wq.raise(2, owner == nil and "ums.mutex:unlock: the mutex is not locked"
      or "ums.mutex:unlock: the mutex is locked by another task")
  end
  unlock(self)
  return true
end

-- ---------------------------------------------------------------------
-- Semaphore: a counter; release hands units straight to waiters in FIFO
-- order, so a positive value means nobody live is waiting.
-- ---------------------------------------------------------------------

local Semaphore = { __name = "ums.semaphore" }
Semaphore.__index = Semaphore

local function semaphore(n, opts)
  if shared_opt(opts, 2, "semaphore") then return core.shared.semaphore(n) end
  n = check_integer(n, 1, "semaphore")
  if n < 0 then
    argerror(2, 1, "semaphore", "initial value must not be negative")
  end
  return setmetatable({ count = n, q = newq() }, Semaphore)
end

--- Takes one unit, waiting up to timeout seconds.
-- @return true | nil, "timeout"
function Semaphore:acquire(timeout)
  check_self(self, Semaphore, "acquire")
  timeout = opt_timeout(timeout, 2, "acquire")
  quantum_point()
  local n = self.count
  if n > 0 then
    self.count = n - 1
    return true
  end
  if timeout == 0 then return nil, "timeout" end
  need_task("semaphore:acquire")  -- its error names this call
  local outcome, msg = qwait(self.q, timeout, false, W.semaphore, self)
  if not outcome then return nil, msg end
  return true
end

--- Gives back n units (default 1), first to waiters.
-- @return true | nil, msg when the value would overflow
function Semaphore:release(n)
  check_self(self, Semaphore, "release")
  if n == nil then
    n = 1
  else
    n = check_integer(n, 2, "release")
    if n < 1 then argerror(2, 2, "release", "count must be positive") end
  end
  if n > maxinteger - self.count then
    return nil, "semaphore value out of range"
  end
  while n > 0 and qwake(self.q, GRANTED) do n = n - 1 end
  self.count = self.count + n
  return true
end

--- The current value (units available now).
function Semaphore:value()
  check_self(self, Semaphore, "value")
  return self.count
end

-- ---------------------------------------------------------------------
-- Event: manual reset (set wakes every waiter and stays set until reset)
-- or auto reset (set wakes one waiter, or stays set until one wait
-- consumes it).
-- ---------------------------------------------------------------------

local Event = { __name = "ums.event" }
Event.__index = Event

local function event(manual, opts)
  if shared_opt(opts, 2, "event") then return core.shared.event(manual) end
  if manual ~= nil and type(manual) ~= "boolean" then
    argerror(2, 1, "event", "boolean expected, got " .. typename(manual))
  end
  return setmetatable({ manual = manual or false, set_ = false,
    q = newq() }, Event)
end

function Event:set()
  check_self(self, Event, "set")
  if self.manual then
    self.set_ = true
    qwake_all(self.q, GRANTED)
  elseif not qwake(self.q, GRANTED) then
    self.set_ = true
  end
  return true
end

function Event:reset()
  check_self(self, Event, "reset")
  self.set_ = false
  return true
end

function Event:is_set()
  check_self(self, Event, "is_set")
  return self.set_
end

--- Waits until the event is set (an auto-reset event is consumed).
-- @return true | nil, "timeout"
function Event:wait(timeout)
  check_self(self, Event, "wait")
  timeout = opt_timeout(timeout, 2, "wait")
  quantum_point()
  if self.set_ then
    if not self.manual then self.set_ = false end
    return true
  end
  if timeout == 0 then return nil, "timeout" end
  need_task("event:wait")  -- its error names this call
  local outcome, msg = qwait(self.q, timeout, false, W.event, self)
  if not outcome then return nil, msg end
  return true
end

-- ---------------------------------------------------------------------
-- Condition variable over a ums mutex.
-- ---------------------------------------------------------------------

local Cond = { __name = "ums.cond" }
Cond.__index = Cond

local function cond()
  return setmetatable({ q = newq() }, Cond)
end

-- Takes mutex m again for task me after a condition wait, whatever ended
-- that wait: the caller's code (an unlock in a <close> handler or after a
-- pcall) counts on holding m when wait returns or raises. A cancellation
-- that arrives while we wait for m is kept and returned, to be raised
-- once m is ours. The wait for m is a park that cancellation cannot end
-- (a cancelled task is refused every other wait), as in the C
-- ums_cond_wait: unlock hands m over, which always ends it, unless m's
-- holder has ended or waits for this task. Then the deadlock detector ends
-- the wait, and wait raises without m.
local function relock(m, me, err)
  if m.owner == nil then
    m.owner = me
  elseif m.owner ~= me then
    local owner = m.owner
    -- Only unlock, which makes us the owner, or the detector ends it.
    if not pcall(qwait, m.q, nil, true, W.mutex, m, owner) then
      wq.raise(3, ("ums.cond:wait: deadlock: the mutex cannot be locked " ..
        "again (its holder, task %d, %s); wait returns without it"):format(
        owner:id(), owner:status() == "suspended" and "waits for ever"
          or "has ended"))
    end
  end
  return err
end

--- Unlocks m, waits for a signal (up to timeout seconds), locks m again.
-- Returns with m locked also on timeout; on cancellation, m is locked
-- again before core.CANCELLED is raised.
-- @return true | nil, "timeout"
function Cond:wait(m, timeout)
  check_self(self, Cond, "wait")
  if getmetatable(m) ~= Mutex then
    argerror(2, 2, "wait", "ums.mutex expected, got " .. typename(m))
  end
  timeout = opt_timeout(timeout, 3, "wait")
  local me = need_task("cond:wait")
  if m.owner ~= me then
    wq.raise(2, "ums.cond:wait: the mutex is not locked by the calling task")
  end
  -- Nobody can signal between here and the end of a zero wait.
  if timeout == 0 then return nil, "timeout" end
  -- Queue the wait before giving up m: if the task is already cancelled
  -- it raises here, with m still held as the caller expects.
  qwait_begin(self.q, timeout, false, W.cond, self)
  unlock(m)
  local ok, outcome, msg = pcall(qwait_end)
  local err = relock(m, me, not ok and outcome or nil)
  if err ~= nil then error(err, 0) end
  if not outcome then return nil, msg end
  return true
end

function Cond:signal()
  check_self(self, Cond, "signal")
  qwake(self.q, GRANTED)
  return true
end

function Cond:broadcast()
  check_self(self, Cond, "broadcast")
  qwake_all(self.q, GRANTED)
  return true
end

-- ---------------------------------------------------------------------
-- Wait group: a counter of outstanding work; wait returns once it is 0.
-- ---------------------------------------------------------------------

local WaitGroup = { __name = "ums.waitgroup" }
WaitGroup.__index = WaitGroup

local function waitgroup(opts)
  if shared_opt(opts, 1, "waitgroup") then return core.shared.waitgroup() end
  return setmetatable({ count = 0, q = newq() }, WaitGroup)
end

local function wg_add(wg, n, fname)
  local c = wg.count + n
  if c < 0 then
    wq.raise(3, format("ums.waitgroup:%s: the counter would become negative",
      fname))
  end
  wg.count = c
  if c == 0 then qwake_all(wg.q, GRANTED) end
end

--- Adds n (may be negative) to the counter; raises if it would go below 0.
function WaitGroup:add(n)
  check_self(self, WaitGroup, "add")
  n = check_integer(n, 2, "add")
  wg_add(self, n, "add")  -- not a tail call: its error level counts on it
  return true
end

function WaitGroup:done()
  check_self(self, WaitGroup, "done")
  wg_add(self, -1, "done")
  return true
end

--- Waits until the counter is 0. @return true | nil, "timeout"
function WaitGroup:wait(timeout)
  check_self(self, WaitGroup, "wait")
  timeout = opt_timeout(timeout, 2, "wait")
  quantum_point()
  if self.count == 0 then return true end
  if timeout == 0 then return nil, "timeout" end
  need_task("waitgroup:wait")  -- its error names this call
  local outcome, msg = qwait(self.q, timeout, false, W.waitgroup, self)
  if not outcome then return nil, msg end
  return true
end

for _, class in ipairs{Mutex, Semaphore, Event, Cond, WaitGroup} do
  wq.methods(class)
end

return {
  mutex = mutex,
  semaphore = semaphore,
  event = event,
  cond = cond,
  -- In C (lua-binding/lchan.c): the channel is the hot path of task
  -- communication, and there a value moves from one task's stack to the
  -- other's with no call back into Lua.
  channel = core.channel,
  select = core.select,
  waitgroup = waitgroup,
}
