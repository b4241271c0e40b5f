--- ums.group: a set of tasks that end together (a nursery, an errgroup).
--
--   do
--     local g <close> = ums.group()
--     g:spawn(fetch, a)
--     g:spawn(fetch, b)
--   end  -- waits for both; the first error is raised here
--
-- * g:spawn(fn, ...) starts a task in the group and returns its handle.
-- * The first task that fails (raises anything but ums.CANCELLED) cancels
--   the others, unless the group was made with {cancel_on_error = false}.
--   A task spawned into a group that has been cancelled is cancelled at
--   once.
-- * g:wait([timeout]) waits until every task of the group has ended:
--   true, or false, err, traceback for the first failure (all of them:
--   g:errors()), or nil, "timeout". The failures it returns count as seen.
-- * Leaving the scope of a <close> variable (or g:close()) waits for the
--   tasks. On a normal exit, a failure nobody has seen is raised there, so
--   it cannot be lost. On an exit by error, the tasks are cancelled first,
--   the exit's own error goes on, and a failure of a task that nobody
--   has seen stays with its unjoined task, for ums.on_error to report.
--   A cancelled task still waits for its group's tasks to end (they were
--   cancelled with it) before it goes on unwinding.
-- * Locks taken with ums.applock for the group as owner are released when
--   it closes, at the latest.
--
-- Tasks of a group may spawn into it, and wait on it except from inside
-- (a task waiting for its own group would wait for itself).
local core = require "ums.core"
local wq = require "ums.waitq"

core.nopreempt_chunk()

local error, getmetatable, ipairs, pairs, pcall, rawequal, setmetatable,
  tostring, type =
  error, getmetatable, ipairs, pairs, pcall, rawequal, setmetatable,
  tostring, type
local format = string.format
local argerror, typename, opt_timeout, need_task =
  wq.argerror, wq.typename, wq.opt_timeout, wq.need_task
local CANCELLED = core.CANCELLED
-- A wait's yield point (a task past its quantum yields there, also when
-- the wait need not wait), called before the wait looks at its object.
local quantum_point = core.quantum_point

local M = {}

local Group = { __name = "ums.group" }
Group.__index = Group

-- A member: { group, task, done, ok, err, traceback, joined }. Its
-- metatable's __close runs when its task's body ends, however it ends.
local Member = {}
Member.__index = Member

local function spawn(...)
  -- Through the ums module when loaded, so that ums.test sees the tasks.
  local ums = package.loaded.ums
  return ((ums and ums.spawn) or core.spawn)(...)
end

-- A member's task has ended (ok, or failed with err, which may be nil).
local function member_end(m, err)
  local g = m.group
  m.done = true
  g.nlive = g.nlive - 1
  if not m.ok then
    if rawequal(err, CANCELLED) then
      m.cancelled = true
    else
      m.err = err
      g.failed[#g.failed + 1] = m
      if g.cancel_on_error and not g.cancelled then
        g.cancelled = true
        M.cancel_members(g)  -- through M: it is defined below
      end
    end
  end
  if g.nlive == 0 then wq.wake_all(g.q, wq.GRANTED) end
end

-- Cancels every member still running.
function M.cancel_members(g)
  local n = 0
  for _, m in ipairs(g.members) do
    if not m.done and m.task and m.task:cancel() then n = n + 1 end
  end
  return n
end
local cancel_members = M.cancel_members

-- Runs in the member's task as its body ends: success (returned set by
-- the body) or failure (err, the error value, which may be nil).
function Member:__close(err)
  member_end(self, err)
end

function Member:returned(...)
  self.ok = true
  return ...
end

-- The task body, from a chunk of its own: it calls user code, which the
-- quantum must be able to preempt (ums.waitq.preemptible). `returned` is
-- not a tail call (a function with a <close> variable makes none), so
-- the member's <close> runs after fn has returned and `ok` is set.
local body = wq.preemptible("ums.group task", [[
  return function(member, fn, ...)
    local guard <close> = member
    return member:returned(fn(...))
  end
]])

--- ums.group([opts]) -> a group. opts: cancel_on_error (default true),
-- name (for messages).
function M.new(opts)
  local cancel_on_error, name = true, nil
  if opts ~= nil then
    if type(opts) ~= "table" then
      argerror(2, 1, "group", "table expected, got " .. typename(opts))
    end
    for k, v in pairs(opts) do
      if k == "cancel_on_error" then
        if type(v) ~= "boolean" then
          argerror(2, 1, "group", "field 'cancel_on_error' must be a "
            .. "boolean, got " .. typename(v))
        end
        cancel_on_error = v
      elseif k == "name" then
        if type(v) ~= "string" then
          argerror(2, 1, "group", "field 'name' must be a string, got "
            .. typename(v))
        end
        name = v
      else
        argerror(2, 1, "group", format("unknown field '%s'", tostring(k)))
      end
    end
  end
  return setmetatable({
    creator = core.self(), name = name, cancel_on_error = cancel_on_error,
    members = {}, failed = {}, nlive = 0, q = wq.newq(),
    cancelled = false, closed = false,
  }, Group)
end

function M.is_group(v)
  return getmetatable(v) == Group
end

--- The tasks that may act for g (ums.applock's deadlock check): its live
-- members and the task that created it.
function M.actors(g)
  local out = {}
  if g.creator then out[1] = g.creator end
  for _, m in ipairs(g.members) do
    if not m.done and m.task then out[#out + 1] = m.task end
  end
  return out
end

function M.describe(g)
  if g.name then return format("group '%s'", g.name) end
  return "a group"
end

--- Starts fn(...) as a task of the group; returns its handle.
function Group:spawn(fn, ...)
  wq.check_self(self, Group, "spawn")
  if type(fn) ~= "function" then
    argerror(2, 2, "spawn", "function expected, got " .. typename(fn))
  end
  if self.closed then
    wq.raise(2, "ums.group:spawn: the group is closed")
  end
  local m = setmetatable({ group = self }, Member)
  local t = spawn(body, m, fn, ...)
  m.task = t
  self.members[#self.members + 1] = m
  self.nlive = self.nlive + 1
  if self.cancelled then t:cancel() end
  return t
end

--- Cancels every task of the group still running; returns how many.
function Group:cancel()
  wq.check_self(self, Group, "cancel")
  self.cancelled = true
  return cancel_members(self)
end

-- Takes the outcome of every ended member from its task (a join that
-- cannot wait: they have ended), so that the runtime does not report it
-- again. `failed_too` false leaves failures unjoined.
local ENDED = { done = true, error = true, cancelled = true }
local function collect(g, failed_too)
  for _, m in ipairs(g.members) do
    if m.done and not m.joined and (failed_too or not m.err) and
       ENDED[m.task:status()] then
      local r = table.pack(m.task:join(0))
      m.joined = true
      if r[1] == false then m.traceback = r[3] end
    end
  end
end

local function check_not_member(g, me, fname)
  for _, m in ipairs(g.members) do
    if m.task == me and not m.done then
      wq.raise(3, format("ums.group:%s: a task cannot wait for its own group",
        fname))
    end
  end
end

-- Ends the members whose task has ended without running its body: a
-- task cancelled before it started never runs it (lua-binding/lums.c),
-- so its <close> never told the group. Returns whether a member has not
-- started yet (it may still end that way, waking nobody).
local function reap(g)
  local unstarted = false
  for _, m in ipairs(g.members) do
    if not m.done then
      local st = m.task:status()
      if ENDED[st] then
        member_end(m, CANCELLED)
      elseif st == "pending" then
        unstarted = true
      end
    end
  end
  return unstarted
end

-- Waits until no member is live: true, or nil, "timeout". nocancel: the
-- caller's cancellation does not end the wait (a cancelled task closing
-- its group waits for the tasks it cancelled); otherwise it raises.
local function wait_members(g, timeout, nocancel)
  local deadline = timeout and core.now() + timeout
  while true do
    local unstarted = reap(g)
    if g.nlive == 0 then return true end
    local left = deadline and deadline - core.now()
    if left and left <= 0 then return nil, "timeout" end
    if unstarted then
      -- A member that has not started yet either starts (its <close>
      -- will wake us) or ends unstarted at its first turn, waking
      -- nobody: look again once every runnable task has had its turn.
      wq.pass(nocancel)
    else
      local ok, msg = wq.wait(g.q, left, nocancel)
      if not ok then return nil, msg end
    end
  end
end

--- Waits until every task of the group has ended.
-- @return true | false, err, traceback | nil, "timeout"
function Group:wait(timeout)
  wq.check_self(self, Group, "wait")
  timeout = opt_timeout(timeout, 2, "wait")
  quantum_point()
  reap(self)
  if self.nlive > 0 then
    if timeout == 0 then return nil, "timeout" end
    local me = need_task("group:wait")
    check_not_member(self, me, "wait")
    local ok, msg = wait_members(self, timeout)
    if not ok then return nil, msg end
  end
  collect(self, true)
  local first = self.failed[1]
  for _, m in ipairs(self.failed) do m.seen = true end
  if first then return false, first.err, first.traceback end
  return true
end

--- Every failure so far: a list of { task, err, traceback }.
function Group:errors()
  wq.check_self(self, Group, "errors")
  collect(self, true)
  local out = {}
  for i, m in ipairs(self.failed) do
    m.seen = true
    out[i] = { task = m.task, err = m.err, traceback = m.traceback }
  end
  return out
end

--- The handles of the group's tasks, in spawn order.
function Group:tasks()
  wq.check_self(self, Group, "tasks")
  local out = {}
  for i, m in ipairs(self.members) do out[i] = m.task end
  return out
end

--- The number of tasks still running.
function Group:live()
  wq.check_self(self, Group, "live")
  return self.nlive
end

local function release_locks(g)
  local applock = package.loaded["ums.applock"]
  if applock then applock.release_all(g) end
end

local function close(g, err)
  if g.closed then return end
  g.closed = true
  reap(g)
  if g.nlive > 0 then
    local me = need_task("group:close")
    check_not_member(g, me, "close")
    if err ~= nil then
      g.cancelled = true
      cancel_members(g)
      wait_members(g, nil, true)
    else
      local ok, e = pcall(wait_members, g, nil)
      if not ok then
        -- Cancelled while waiting: the tasks go with us.
        g.cancelled = true
        cancel_members(g)
        wait_members(g, nil, true)
        collect(g, false)
        release_locks(g)
        error(e, 0)
      end
    end
  end
  collect(g, err == nil)
  release_locks(g)
  if err == nil then
    for _, m in ipairs(g.failed) do
      if not m.seen then
        m.seen = true
        local e = m.err
        if type(e) == "string" and m.traceback then e = m.traceback end
        error(e, 0)
      end
    end
  end
end

--- Waits for the tasks (see the header), releases the group's locks, and
-- raises a failure nobody has seen. The group takes no tasks after it.
function Group:close()
  wq.check_self(self, Group, "close")
  close(self, nil)
  return true
end

function Group:__close(err)
  wq.check_self(self, Group, "close")
  close(self, err)
end

function Group:__tostring()
  wq.check_self(self, Group, "__tostring")
  return format("ums.group%s (%d live)",
    self.name and (" '" .. self.name .. "'") or "", self.nlive)
end

wq.methods(Group)
M.Group = Group
return M
