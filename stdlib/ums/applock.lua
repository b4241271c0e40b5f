--- ums.applock: named application locks with SQL Server's lock modes, in
-- the manner of sp_getapplock / sp_releaseapplock, for the tasks of one
-- ums run.
--
--   local lock, err = ums.applock.acquire(name, mode [, timeout [, owner]])
--   ...
--   lock:release()        -- or: local lock <close> = assert(acquire(...))
--   local lock = ums.applock.acquire_now(name, mode [, owner])  -- no yield
--
-- Modes: "IS", "S", "U", "IX", "SIX", "X" (or sp_getapplock's names
-- "IntentShared", "Shared", "Update", "IntentExclusive", "Exclusive",
-- and "SharedIntentExclusive"). Two requests conflict when their owners
-- differ and the matrix below says so; one owner never conflicts with
-- itself (it may hold a resource in several modes, each grant released
-- on its own).
--
-- Owners: the calling task (the default), or a ums.group passed as
-- `owner`, whose grants belong to the group as a whole (any of its tasks
-- may hold them; they are released when the group closes at the latest).
--
-- Waiting. Requests wait in one FIFO per resource and are granted in
-- order: a request is granted only when it is compatible with every mode
-- granted to other owners and no request is queued before it, so a
-- stream of S never starves a waiting X. A request by an owner that
-- already holds the resource (a conversion, such as S to X) goes before
-- the requests of owners that hold nothing, as in SQL Server.
-- timeout: seconds; -1 or nil waits forever, 0 tries once. A timeout is
-- the result nil, "timeout".
--
-- Ended owners. As SQL Server releases a session's locks when the
-- session ends, grants owned by a task that has ended (returned, failed
-- or cancelled without releasing them) are released, when a request for
-- the same resource next meets them (acquire, test, mode, locks, and the
-- deadlock check). A request already waiting when that owner ended is
-- granted at the next such meeting, or ends with its timeout: release
-- locks in <close> variables so it never comes to that. A group's grants
-- are released when the group closes.
--
-- Deadlocks. Before a request waits, the wait-for graph is checked: each
-- waiting request waits for the owners of the incompatible grants and for
-- the requests queued before it; a task owner can act if its task is not
-- waiting on an applock, a group owner if any of its tasks (or the task
-- that created it) can. If the new wait could never end, the requester is
-- the victim: acquire returns nil, "deadlock", and a description of the
-- cycle (sp_getapplock's -3), instead of waiting. Waits on other things
-- (mutexes, channels, joins) are not in the graph; a timeout does not
-- exempt a request (SQL Server's rule).
--
-- As in ums.sync, everything here runs on the run's one scheduler thread
-- and never yields except in park_wait and at acquire's yield point
-- (before it looks at any state), so the state needs no lock.
local core = require "ums.core"
local wq = require "ums.waitq"
-- A task past its quantum yields there, also when acquire need not wait.
local quantum_point = core.quantum_point

core.nopreempt_chunk()

local error, ipairs, pairs, pcall, setmetatable, tostring, type =
  error, ipairs, pairs, pcall, setmetatable, tostring, type
local format, concat = string.format, table.concat
local argerror, typename, opt_timeout, need_task =
  wq.argerror, wq.typename, wq.opt_timeout, wq.need_task

local M = {}

-- ---------------------------------------------------------------------
-- Request lists: each resource's waiting requests, FIFO, doubly linked
-- nodes { task, seq, q, prev, next, owner, mode, ... }. Not a core.waitq:
-- a release grants every compatible request from the head in one go,
-- and the deadlock check and M.locks read the requests' modes and owners.
-- Waiting on one follows the protocol of lua-binding/lwaitq.h all the
-- same: the granter unlinks a node, then unparks its task (a failed
-- unpark means that park already ended: the node was stale); a request
-- whose park ended otherwise unlinks its own node.
-- ---------------------------------------------------------------------

local park_wait, unpark = core.park_wait, core.unpark

local function newq()
  return { head = nil, tail = nil }
end

-- Appends node (for its task's park, seq set later).
local function push(q, node)
  node.q = q
  local tail = q.tail
  node.prev, node.next = tail, nil
  if tail then tail.next = node else q.head = node end
  q.tail = node
end

-- Puts node just before `at`, a queued node.
local function insert_before(at, node)
  local q = at.q
  node.q = q
  node.prev, node.next = at.prev, at
  if at.prev then at.prev.next = node else q.head = node end
  at.prev = node
end

-- Takes node off its list, if it is still on one.
local function unlink(node)
  local q = node.q
  if q == nil then return end
  local prev, nxt = node.prev, node.next
  if prev then prev.next = nxt else q.head = nxt end
  if nxt then nxt.prev = prev else q.tail = prev end
  node.q, node.prev, node.next = nil, nil, nil
end

-- Ends the park of node's task; false when that park had already ended
-- (the node is stale). The node leaves its list either way.
local function grant(node)
  unlink(node)
  return unpark(node.task, node.seq, 0)
end

-- Waits for the park begun for node (queued) to end. Returns the
-- outcome, or nil, "timeout"; on a timeout or a cancellation the node
-- leaves its list, and a cancellation is raised again unchanged.
local function await(node)
  local ok, outcome, msg = pcall(park_wait)
  if ok and outcome then return outcome end
  unlink(node)
  if not ok then error(outcome, 0) end
  return nil, msg
end

-- ---------------------------------------------------------------------
-- Modes and SQL Server's compatibility matrix
-- ---------------------------------------------------------------------

--- The modes, weakest first.
M.MODES = { "IS", "S", "U", "IX", "SIX", "X" }

local LONG_NAMES = {
  IntentShared = "IS", Shared = "S", Update = "U", IntentExclusive = "IX",
  SharedIntentExclusive = "SIX", Exclusive = "X",
}

-- From "Lock compatibility (Database Engine)" in SQL Server's transaction
-- locking guide: the requested mode (row) against a mode already granted
-- to another owner (column). The matrix is symmetric.
--
--          IS   S    U    IX   SIX  X
--   IS     yes  yes  yes  yes  yes  no
--   S      yes  yes  yes  no   no   no
--   U      yes  yes  no   no   no   no
--   IX     yes  no   no   yes  no   no
--   SIX    yes  no   no   no   no   no
--   X      no   no   no   no   no   no
local COMPAT = {
  IS  = { IS = true, S = true,  U = true,  IX = true,  SIX = true,  X = false },
  S   = { IS = true, S = true,  U = true,  IX = false, SIX = false, X = false },
  U   = { IS = true, S = true,  U = false, IX = false, SIX = false, X = false },
  IX  = { IS = true, S = false, U = false, IX = true,  SIX = false, X = false },
  SIX = { IS = true, S = false, U = false, IX = false, SIX = false, X = false },
  X   = { IS = false, S = false, U = false, IX = false, SIX = false,
          X = false },
}

-- For mode(): the most restrictive first.
local RANK = { IS = 1, S = 2, IX = 3, U = 4, SIX = 5, X = 6 }

local function norm_mode(m)
  if type(m) ~= "string" then return nil end
  if COMPAT[m] then return m end
  return LONG_NAMES[m]
end

local function check_mode(m, narg, fname)
  local mode = norm_mode(m)
  if not mode then
    argerror(3, narg, fname, type(m) == "string" and
      format("unknown lock mode '%s'; expected IS, S, U, IX, SIX or X", m)
      or "lock mode expected, got " .. typename(m))
  end
  return mode
end

--- Whether a request in mode `requested` can be granted next to a grant
-- in mode `granted` of another owner.
function M.compatible(requested, granted)
  return COMPAT[check_mode(requested, 1, "compatible")][
    check_mode(granted, 2, "compatible")]
end

-- ---------------------------------------------------------------------
-- Owners
-- ---------------------------------------------------------------------

local group_mod  -- ums.group, loaded on first use (it does not need us)
local function groups()
  group_mod = group_mod or require "ums.group"
  return group_mod
end

-- The owner a request is made for: arg (a ums.group) or the task.
local function check_owner(owner, narg, fname, me)
  if owner == nil then return me end
  if groups().is_group(owner) then return owner end
  if owner == me then return me end
  argerror(3, narg, fname, "ums.group expected, got " .. typename(owner))
end

local function alive(task)
  local s = task:status()
  return s == "pending" or s == "running" or s == "suspended"
end

local function describe_task(t)
  local name = t:name()
  if name ~= "" then return format("task '%s'", name) end
  return tostring(t)
end

local function describe_owner(o)
  if groups().is_group(o) then return groups().describe(o) end
  return describe_task(o)
end

-- ---------------------------------------------------------------------
-- Resources, grants, requests
-- ---------------------------------------------------------------------

-- name -> { name, grants = {grant...}, q = wait queue of requests }
local resources = {}
-- task -> the request it waits on (each task waits on one at most)
local waiting = setmetatable({}, { __mode = "k" })

local Lock = { __name = "ums.applock.lock" }
Lock.__index = Lock

local function resource(name)
  local r = resources[name]
  if not r then
    r = { name = name, grants = {}, q = newq() }
    resources[name] = r
  end
  return r
end

local function drop_if_unused(r)
  if #r.grants == 0 and r.q.head == nil and resources[r.name] == r then
    resources[r.name] = nil
  end
end

local function add_grant(r, owner, mode, task)
  -- Fields end in _ to stay apart from the methods of the same names.
  local g = setmetatable({ res_ = r, owner_ = owner, mode_ = mode,
    task_ = task, held_ = true }, Lock)
  r.grants[#r.grants + 1] = g
  return g
end

local function remove_grant(g)
  local grants = g.res_.grants
  for i = #grants, 1, -1 do
    if grants[i] == g then
      table.remove(grants, i)
      break
    end
  end
  g.held_ = false
end

-- Releases the grants of r whose owner is a task that has ended; then
-- requests that waited for them may go.
local function reclaim(r)
  local gone = false
  local grants = r.grants
  for i = #grants, 1, -1 do
    local g = grants[i]
    local o = g.owner_
    if not groups().is_group(o) and not alive(o) then
      table.remove(grants, i)
      g.held_ = false
      gone = true
    end
  end
  return gone
end

local function compatible_with_others(r, owner, mode)
  local row = COMPAT[mode]
  for _, g in ipairs(r.grants) do
    if g.owner_ ~= owner and not row[g.mode_] then return false end
  end
  return true
end

local function holds(r, owner)
  for _, g in ipairs(r.grants) do
    if g.owner_ == owner then return true end
  end
  return false
end

-- Grants queued requests from the head, in order, while they are
-- compatible; the first that is not stops the queue (FIFO: nobody
-- passes it). A request whose park has already ended (timed out or
-- cancelled, its task not yet back to take its node off) is skipped.
local function grant_waiters(r)
  local node = r.q.head
  while node do
    local nxt = node.next
    if not compatible_with_others(r, node.owner, node.mode) then break end
    local g = add_grant(r, node.owner, node.mode, node.task)
    node.grant = g
    if not grant(node) then
      node.grant = nil
      remove_grant(g)
    end
    node = nxt
  end
end

local function reclaim_and_grant(r)
  if reclaim(r) then grant_waiters(r) end
end

local function reclaim_all()
  local list = {}
  for _, r in pairs(resources) do list[#list + 1] = r end
  for _, r in ipairs(list) do
    reclaim_and_grant(r)
    drop_if_unused(r)
  end
end

local function release_grant(g)
  local r = g.res_
  remove_grant(g)
  grant_waiters(r)
  drop_if_unused(r)
end

-- ---------------------------------------------------------------------
-- The wait-for graph
-- ---------------------------------------------------------------------

-- Calls f(kind, x) for what `node` waits for: ("owner", o) for the owner
-- of each grant it conflicts with, ("task", t) for each request of
-- another owner queued before it.
local function each_blocker(node, f)
  -- A request off its queue waits for nothing: it was granted (or its
  -- park ended) and its task has not yet run to take its node out of
  -- `waiting`. Walking its resource's queue would count every request
  -- queued there as "before it", a cycle that is not there.
  if node.q == nil then return false end
  local r = node.res
  local row = COMPAT[node.mode]
  for _, g in ipairs(r.grants) do
    if g.owner_ ~= node.owner and not row[g.mode_] then
      if f("owner", g.owner_, g) then return true end
    end
  end
  local n = r.q.head
  while n and n ~= node do
    if n.owner ~= node.owner then
      if f("task", n.task, n) then return true end
    end
    n = n.next
  end
  return false
end

-- The tasks that can release what owner holds.
local function actors(owner)
  if groups().is_group(owner) then return groups().actors(owner) end
  return { owner }
end

-- Which waiting tasks can still get what they wait for: the least fixed
-- point of "every blocker can act", starting from the tasks that do not
-- wait on an applock (they may release at any time). A group owner can
-- act when any of its tasks can; a finished task never can.
local function proceeding()
  local can = {}
  local function task_ok(t)
    if can[t] then return true end
    return waiting[t] == nil and alive(t)
  end
  local function blocker_stuck(kind, x)
    if kind == "task" then return not task_ok(x) end
    for _, t in ipairs(actors(x)) do
      if task_ok(t) then return false end
    end
    return true
  end
  repeat
    local changed = false
    for t, node in pairs(waiting) do
      if not can[t] and not each_blocker(node, blocker_stuck) then
        can[t] = true
        changed = true
      end
    end
  until not changed
  return can
end

-- A readable path from me's request back to me (or to a finished task).
local function describe_cycle(me, can)
  local parts, seen = {}, {}
  local t = me
  while t and not seen[t] do
    seen[t] = true
    local node = waiting[t]
    local nxt, why
    each_blocker(node, function(kind, x, what)
      local cands = kind == "task" and { x } or actors(x)
      for _, c in ipairs(cands) do
        if not can[c] and (waiting[c] or not alive(c)) then
          nxt = c
          why = kind == "task" and format("queued before it by %s (%s)",
              describe_task(x), what.mode)
            or format("held by %s (%s)", describe_owner(x), what.mode_)
          return true
        end
      end
      return false
    end)
    parts[#parts + 1] = format("%s waits for '%s' (%s), %s",
      t == me and "this task" or describe_task(t), node.res.name,
      node.mode, why or "held")
    if nxt and not alive(nxt) and not waiting[nxt] then
      parts[#parts + 1] = describe_task(nxt) .. " has ended"
      break
    end
    t = nxt
  end
  return concat(parts, "; ")
end

-- ---------------------------------------------------------------------
-- The API
-- ---------------------------------------------------------------------

local function check_name(name, narg, fname)
  if type(name) ~= "string" then
    argerror(3, narg, fname, "string expected, got " .. typename(name))
  end
  if name == "" then argerror(3, narg, fname, "name must not be empty") end
  return name
end

-- The grant of r in mode for owner if it can be made now, else nil and
-- whether owner already holds r (a conversion). Never yields.
local function grant_now(r, owner, mode, me)
  -- Owners that have ended give up their grants first, here and in the
  -- rest of the wait-for graph (the deadlock check reads it).
  reclaim_and_grant(r)
  for _, n in pairs(waiting) do reclaim_and_grant(n.res) end
  local conversion = holds(r, owner)
  if compatible_with_others(r, owner, mode) and
     (conversion or r.q.head == nil) then
    return add_grant(r, owner, mode, me)
  end
  return nil, conversion
end

--- Acquires a lock on `name` in `mode` for `owner` (default: the calling
-- task). @return a lock | nil, "timeout" | nil, "deadlock", description
function M.acquire(name, mode, timeout, owner)
  check_name(name, 1, "acquire")
  mode = check_mode(mode, 2, "acquire")
  timeout = opt_timeout(timeout, 3, "acquire", true)
  local me = need_task("applock.acquire")
  owner = check_owner(owner, 4, "acquire", me)
  quantum_point()

  local r = resource(name)
  local g, conversion = grant_now(r, owner, mode, me)
  if g then return g end
  if timeout == 0 then
    drop_if_unused(r)
    return nil, "timeout"
  end

  local node = { owner = owner, mode = mode, res = r, task = me,
    conversion = conversion }
  local before = nil
  if conversion then
    -- After the conversions already queued, before everybody else.
    before = r.q.head
    while before and before.conversion do before = before.next end
  end
  if before then
    insert_before(before, node)
  else
    push(r.q, node)
  end
  waiting[me] = node
  local can = proceeding()
  if not can[me] then
    local why = describe_cycle(me, can)
    waiting[me] = nil
    unlink(node)
    drop_if_unused(r)
    return nil, "deadlock", "ums.applock.acquire: deadlock, this task is "
      .. "the victim: " .. why
  end

  local ok, seq = pcall(core.park_begin, timeout)
  if not ok then  -- cancelled already
    waiting[me] = nil
    unlink(node)
    grant_waiters(r)
    drop_if_unused(r)
    error(seq, 0)
  end
  node.seq = seq
  local okw, outcome, msg = pcall(await, node)
  waiting[me] = nil
  if okw and outcome then return node.grant end
  -- Timed out or cancelled: the node is off the queue, which may let the
  -- requests behind it through.
  grant_waiters(r)
  drop_if_unused(r)
  if not okw then error(outcome, 0) end
  return nil, msg
end

--- acquire(name, mode, 0, owner) without its yield point: the lock if it
-- can be granted now, else nil, "timeout". Never yields, so code can take
-- a lock in the same step as another change of its own state (as
-- ums.workqueue takes an item and its phase lock).
function M.acquire_now(name, mode, owner)
  check_name(name, 1, "acquire_now")
  mode = check_mode(mode, 2, "acquire_now")
  local me = need_task("applock.acquire_now")
  owner = check_owner(owner, 3, "acquire_now", me)
  local r = resource(name)
  local g = grant_now(r, owner, mode, me)
  if g then return g end
  drop_if_unused(r)
  return nil, "timeout"
end

--- Whether acquire(name, mode) for owner would be granted now, without
-- waiting (APPLOCK_TEST).
function M.test(name, mode, owner)
  check_name(name, 1, "test")
  mode = check_mode(mode, 2, "test")
  local me = need_task("applock.test")
  owner = check_owner(owner, 3, "test", me)
  local r = resources[name]
  if not r then return true end
  reclaim_and_grant(r)
  return compatible_with_others(r, owner, mode) and
    (holds(r, owner) or r.q.head == nil)
end

--- The most restrictive mode owner holds on name (X > SIX > U > IX > S >
-- IS), or "NoLock" (APPLOCK_MODE).
function M.mode(name, owner)
  check_name(name, 1, "mode")
  local me = need_task("applock.mode")
  owner = check_owner(owner, 2, "mode", me)
  local best = "NoLock"
  local r = resources[name]
  if r then
    reclaim_and_grant(r)
    for _, g in ipairs(r.grants) do
      if g.owner_ == owner and
         (best == "NoLock" or RANK[g.mode_] > RANK[best])
      then best = g.mode_ end
    end
  end
  return best
end

--- Releases owner's most recent grant on name (sp_releaseapplock).
-- Raises when owner holds none.
function M.release(name, owner)
  check_name(name, 1, "release")
  local me = need_task("applock.release")
  owner = check_owner(owner, 2, "release", me)
  local r = resources[name]
  if r then
    for i = #r.grants, 1, -1 do
      local g = r.grants[i]
      if g.owner_ == owner then
        release_grant(g)
        return true
      end
    end
  end
  argerror(2, 1, "release", format("no lock on '%s' is held by %s", name,
    owner == me and "this task" or describe_owner(owner)))
end

--- Releases every grant of owner (a task or a group); returns how many.
-- ums.group calls it when a group closes.
function M.release_all(owner)
  if owner == nil then
    argerror(2, 1, "release_all", "owner expected, got nil")
  end
  local mine = {}
  for _, r in pairs(resources) do
    for _, g in ipairs(r.grants) do
      if g.owner_ == owner then mine[#mine + 1] = g end
    end
  end
  for _, g in ipairs(mine) do release_grant(g) end
  return #mine
end

--- A snapshot of the locks (sys.dm_tran_locks): a list, sorted by name,
-- of { name, granted = {{mode, owner, task}...},
-- waiting = {{mode, owner, task}...} }; only `name` if given.
function M.locks(name)
  if name ~= nil then check_name(name, 1, "locks") end
  reclaim_all()
  local out = {}
  for n, r in pairs(resources) do
    if name == nil or n == name then
      local e = { name = n, granted = {}, waiting = {} }
      for _, g in ipairs(r.grants) do
        e.granted[#e.granted + 1] = { mode = g.mode_, owner = g.owner_,
          task = g.task_ }
      end
      local node = r.q.head
      while node do
        e.waiting[#e.waiting + 1] = { mode = node.mode, owner = node.owner,
          task = node.task }
        node = node.next
      end
      out[#out + 1] = e
    end
  end
  table.sort(out, function(a, b) return a.name < b.name end)
  return out
end

-- ---------------------------------------------------------------------
-- Lock handles
-- ---------------------------------------------------------------------

--- Releases this grant. Raises if it is not held any more.
function Lock:release()
  wq.check_self(self, Lock, "release")
  if not self.held_ then
    wq.raise(2, format("ums.applock: lock:release: the lock on '%s' (%s) is "
      .. "not held (released already, or its task has ended)",
      self.res_.name, self.mode_))
  end
  release_grant(self)
  return true
end

function Lock:held()
  wq.check_self(self, Lock, "held")
  return self.held_
end

function Lock:name()
  wq.check_self(self, Lock, "name")
  return self.res_.name
end

function Lock:mode()
  wq.check_self(self, Lock, "mode")
  return self.mode_
end

--- The owner: the task that acquired it, or the group it was taken for.
function Lock:owner()
  wq.check_self(self, Lock, "owner")
  return self.owner_
end

-- A <close> variable releases the lock if it is still held.
function Lock:__close()
  if self.held_ then release_grant(self) end
end

function Lock:__tostring()
  return format("ums.applock.lock '%s' (%s%s)", self.res_.name, self.mode_,
    self.held_ and "" or ", released")
end

wq.methods(Lock)
M.Lock = Lock
return M
