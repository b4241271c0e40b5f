--- ums.waitq: what ums.applock, ums.group and ums.workqueue share: FIFO
-- wait queues on the park calls of ums.core, argument checks worded like
-- lauxlib's, and a way to run user code where the quantum may preempt it.
-- Internal to the standard library; the conventions are those of
-- ums.sync (read its header first):
--   * all tasks of a run share one Lua VM and one scheduler thread, and
--     nothing here yields except core.park_wait, so the code between two
--     waits is one atomic step;
--   * a waiter begins its park, queues a node and waits; a waker takes
--     nodes from the head and unparks each until one succeeds (a failed
--     unpark means that park already ended, so the node is stale);
--   * a waiter whose park ends without a grant unlinks its own node.
local core = require "ums.core"

-- The atomicity above must hold against the quantum too: no function of
-- this chunk (or of the modules that call nopreempt_chunk likewise) is
-- ever cut by it.
core.nopreempt_chunk()

local park_begin, park_wait, unpark = core.park_begin, core.park_wait,
  core.unpark

local error, getmetatable, load, pairs, pcall, rawget, setmetatable, type =
  error, getmetatable, load, pairs, pcall, rawget, setmetatable, type
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
-- Wait queues: doubly linked FIFOs of { task, seq, q, prev, next, ... }
-- ---------------------------------------------------------------------

function M.newq()
  return { head = nil, tail = nil, n = 0 }
end

--- Appends a node (a table the caller may fill further) for task's park
-- seq.
function M.push(q, task, seq, node)
  node = node or {}
  node.task, node.seq, node.q = task, seq, q
  local tail = q.tail
  node.prev, node.next = tail, nil
  if tail then tail.next = node else q.head = node end
  q.tail = node
  q.n = q.n + 1
  return node
end

--- Puts node (for task's park seq) just before `at`, a queued node.
function M.insert_before(at, task, seq, node)
  local q = at.q
  node.task, node.seq, node.q = task, seq, q
  node.prev, node.next = at.prev, at
  if at.prev then at.prev.next = node else q.head = node end
  at.prev = node
  q.n = q.n + 1
  return node
end

--- Takes node off its queue, if it is still on one.
function M.unlink(node)
  local q = node.q
  if q == nil then return end
  local prev, nxt = node.prev, node.next
  if prev then prev.next = nxt else q.head = nxt end
  if nxt then nxt.prev = prev else q.tail = prev end
  node.q, node.prev, node.next = nil, nil, nil
  q.n = q.n - 1
end
local unlink = M.unlink

--- Ends the park of node with outcome; false when that park had already
-- ended (the node is stale). The node leaves its queue either way.
function M.grant(node, outcome)
  unlink(node)
  return unpark(node.task, node.seq, outcome or 0)
end

--- Ends the park of the first live waiter of q; returns its node, or nil.
function M.wake_first(q, outcome)
  local node = q.head
  while node do
    if M.grant(node, outcome) then return node end
    node = q.head
  end
  return nil
end

function M.wake_all(q, outcome)
  while M.wake_first(q, outcome) do end
end

--- Waits for the park begun for node (queued) to end. Returns the
-- outcome, or nil, "timeout"; on a timeout or a cancellation the node
-- leaves its queue, and a cancellation is raised again unchanged.
function M.await(node)
  local ok, outcome, msg = pcall(park_wait)
  if ok and outcome then return outcome end
  unlink(node)
  if not ok then error(outcome, 0) end
  return nil, msg
end

--- Parks the calling task (me) on q until woken, timeout seconds (nil:
-- forever). nocancel: cancellation does not end the wait (it must be
-- woken or time out). Returns the outcome or nil, "timeout".
function M.wait(q, me, timeout, node, nocancel)
  local seq = park_begin(timeout, nocancel)
  return M.await(M.push(q, me, seq, node))
end

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
