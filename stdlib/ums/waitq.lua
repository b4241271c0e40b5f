--- ums.waitq: what ums.applock, ums.group and ums.workqueue share: FIFO
-- wait queues (core.waitq), argument checks worded like lauxlib's, and a
-- way to run user code where the quantum may preempt it.
-- Internal to the standard library; the conventions are those of
-- ums.sync (read its header first). All tasks of a run share one Lua VM
-- and one scheduler thread, and nothing here yields except a queue's
-- wait and M.pass, so the code between two waits is one atomic step. The
-- queues are core.waitq's; their protocol is written once, at the top of
-- lua-binding/lwaitq.h.
local core = require "ums.core"

-- The atomicity above must hold against the quantum too: no function of
-- this chunk (or of the modules that call nopreempt_chunk likewise) is
-- ever cut by it.
core.nopreempt_chunk()

local park_begin, park_wait, unpark = core.park_begin, core.park_wait,
  core.unpark

local error, getmetatable, load, pairs, rawget, setmetatable, type =
  error, getmetatable, load, pairs, rawget, setmetatable, type
local format = string.format
local getinfo = debug.getinfo
local huge = math.huge

local M = {}

M.GRANTED = 0

-- ---------------------------------------------------------------------
-- Argument checks
-- ---------------------------------------------------------------------

function M.typename(v)
  local mt = getmetatable(v)
  if type(mt) == "table" then
    local name = rawget(mt, "__name")
    if type(name) == "string" then return name end
  end
  return type(v)
end

-- The methods of the standard library's objects (M.methods): a method
-- reached by a tail call (`return obj:m(x)`) has lost its call's name, so
-- this is how argerror still numbers its arguments as for obj:m(x).
local methods = setmetatable({}, {__mode = "k"})

--- Registers the functions of a class table as methods.
function M.methods(class)
  for _, f in pairs(class) do
    if type(f) == "function" then methods[f] = true end
  end
end

-- For the public function `level` frames up (counted as getinfo counts
-- from the caller of this function: 2 is that caller's caller), the
-- error level, counted the same way, of the function that called it, and
-- whether it was called as a method. A C function keeps its caller's
-- frame when it is tail-called; a Lua function does not, so for one the
-- error is placed at the nearest Lua function still on the stack rather
-- than at no place at all.
local function caller(level)
  local here = level + 1  -- the same frame, counted from here
  local ar = getinfo(here, "ntf")
  if not ar then return level + 1, false end
  if not ar.istailcall then return level + 1, ar.namewhat == "method" end
  local at = here + 1
  local up = getinfo(at, "S")
  while up and up.what == "C" do
    at = at + 1
    up = getinfo(at, "S")
  end
  return (up and at or here + 1) - 1, methods[ar.func] == true
end

--- Raises msg at the caller of the public function `level` frames up
-- from raise's caller (2: that function called raise directly).
function M.raise(level, msg)
  error(msg, (caller(level)))
end

--- Raises "bad argument #narg to 'fname' (extramsg)", at the caller of
-- the public function `level` frames up from argerror's caller (2: that
-- function called argerror directly; 3: through one helper). As with
-- luaL_argerror, a method call (obj:fn()) does not count self, and a bad
-- self is "calling 'fname' on bad self".
function M.argerror(level, narg, fname, extramsg)
  local at, method = caller(level)
  if method then
    narg = narg - 1
    if narg == 0 then
      error(format("calling '%s' on bad self (%s)", fname, extramsg), at)
    end
  end
  error(format("bad argument #%d to '%s' (%s)", narg, fname, extramsg), at)
end
local argerror = M.argerror

--- Checks that obj has metatable mt (argument 1, usually self).
function M.check_self(obj, mt, fname)
  if getmetatable(obj) ~= mt then
    argerror(3, 1, fname, mt.__name .. " expected, got " .. M.typename(obj))
  end
end

--- A timeout in seconds: nil or math.huge mean forever (returned as nil);
-- otherwise a non-negative number. `neg1` also takes -1 as forever.
function M.opt_timeout(t, narg, fname, neg1)
  if t == nil then return nil end
  if type(t) ~= "number" then
    argerror(3, narg, fname, "number expected, got " .. M.typename(t))
  end
  if neg1 and t == -1 then return nil end
  if t ~= t then
    argerror(3, narg, fname, "timeout is NaN, not a number of seconds")
  end
  if t < 0 then
    argerror(3, narg, fname, neg1 and
      "timeout must be -1 (forever) or a non-negative number" or
      "timeout must be a non-negative number")
  end
  if t == huge then return nil end
  return t
end

--- The calling task; raises a clear error outside one (level 3: the
-- caller of the public function that called need_task).
function M.need_task(fname)
  local me = core.self()
  if me == nil then
    M.raise(3, format("ums.%s: not inside a task (call it from a function "
      .. "run by ums.run or ums.spawn)", fname))
  end
  return me
end

-- ---------------------------------------------------------------------
-- Wait queues: core.waitq, the binding's own (lua-binding/lwaitq.h)
-- ---------------------------------------------------------------------

--- A FIFO wait queue.
M.newq = core.waitq

--- Parks the calling task on q until woken, timeout seconds (nil:
-- forever): M.wait(q, timeout, nocancel). nocancel: cancellation does
-- not end the wait (it must be woken or time out). Returns the outcome
-- or nil, "timeout"; raises a cancellation with the task off q.
M.wait = core.waitq_wait

--- Ends the park of the first live waiter of q with outcome (default
-- 0); returns its task, or nil.
M.wake_first = core.waitq_wake

--- The same for every live waiter; returns how many.
M.wake_all = core.waitq_wake_all

--- Lets every task runnable now take its turn before the caller goes on
-- (a yield through a park that the caller ends itself, so that with
-- nocancel it works in a cancelled task too).
function M.pass(nocancel)
  local seq = park_begin(nil, nocancel)
  unpark(core.self(), seq)
  park_wait()
end

-- ---------------------------------------------------------------------
-- User code outside the no-preempt chunks
-- ---------------------------------------------------------------------

--- Compiles `src` (a chunk returning a function, given `...`) as a chunk
-- of its own, named `name`. The quantum never preempts a task while any
-- function of a nopreempt chunk is on its stack, so a task body that
-- calls user code (a group's task, a queue's reader) must come from such
-- a separate chunk, calling back into the library only for its state
-- changes; otherwise a CPU-bound item would never be preempted.
function M.preemptible(name, src, ...)
  local chunk = assert(load(src, "=" .. name, "t"))
  return chunk(...)
end

return M
