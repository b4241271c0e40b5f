--- ums.workqueue: a queue of work items served by at most `readers`
-- tasks, after SQL Server's Service Broker queues with activation
-- (MAX_QUEUE_READERS).
--
--   local q = ums.workqueue{readers = 5}
--   local item = q:post(fn, ...)             -- runs fn(...) in a reader
--   q:post_ordered(100, fn, ...)             -- ordered phases, below
--   local ok, failures = q:wait()            -- all done; failures listed
--   q:close()
--
-- Activation. No reader runs while the queue is empty. A post wakes a
-- reader waiting for work, or starts one if fewer than `readers` are
-- running; a reader that finds the queue empty waits `idle_timeout`
-- seconds (default 0) for more and then stops, as an activated procedure
-- stops when its RECEIVE times out. Items are taken in post order (FIFO).
--
-- Ordered phases (a Service Broker queue's "ordered batches",
-- docs/stdlib.md). Items posted with
-- post_ordered(order, ...) run in phases: items of one order may run
-- together, and an item of a later order starts only after every item of
-- every earlier order has finished. It works as that design's activation
-- procedure does, with ums.applock and no table of states and no polling:
-- a reader that takes an item of order o holds a Shared lock on "o" from
-- the moment it takes it, then asks for IntentExclusive on the previous
-- order p (the order posted before o). S and IX do not conflict with
-- themselves but conflict with each other, so the IX waits until every
-- item of order p has released its S, that is, finished; and since those
-- items themselves waited for their own previous order, the chain covers
-- every earlier phase. Items are taken in post order, so every item of
-- order p holds its S before the first item of o asks for IX on p.
-- Orders must not decrease while ordered items are queued or running
-- (a lower order then raises); once they have all finished, a new
-- sequence of orders may start anywhere. A reader waiting for its phase
-- counts against `readers`, as an activated procedure waiting for its
-- lock does.
--
-- Errors. An item that raises never takes its error with it: item:result
-- returns it, q:wait returns false and every failure so far, and the
-- `on_error` option, if given, is called at once as on_error(err,
-- traceback, item). A failure nobody saw when its item is collected goes
-- to the run's error handler (ums.on_error), as a task's does.
local core = require "ums.core"
local wq = require "ums.waitq"
local applock = require "ums.applock"

core.nopreempt_chunk()

local error, getmetatable, ipairs, pairs, pcall, rawequal, setmetatable,
  tostring, type =
  error, getmetatable, ipairs, pairs, pcall, rawequal, setmetatable,
  tostring, type
local format = string.format
local pack, unpack = table.pack, table.unpack
local traceback = debug.traceback
local argerror, typename, opt_timeout, need_task =
  wq.argerror, wq.typename, wq.opt_timeout, wq.need_task
local CANCELLED = core.CANCELLED
-- A wait's yield point (a task past its quantum yields there, also when
-- the wait need not wait), called before the wait looks at its object.
local quantum_point = core.quantum_point

local M = {}

local Queue = { __name = "ums.workqueue" }
Queue.__index = Queue

local Item = { __name = "ums.workqueue.item" }
Item.__index = Item

-- A failed item whose error nobody has seen: reported when collected.
local FailedItem = {}
for k, v in pairs(Item) do FailedItem[k] = v end
FailedItem.__index = Item

local nqueues = 0

local function check_item(obj, fname)
  local mt = getmetatable(obj)
  if mt ~= Item and mt ~= FailedItem then
    argerror(3, 1, fname, "ums.workqueue.item expected, got " ..
      typename(obj))
  end
end

local function spawn(...)
  local ums = package.loaded.ums
  return ((ums and ums.spawn) or core.spawn)(...)
end

-- The runtime's handler for errors nobody joined (lua-binding/lums.c
-- keeps it in the registry), or a print to stderr.
local function report(err, tb, item)
  local reg = debug.getregistry()
  local h = reg and reg["ums.on_error"]
  if type(h) ~= "function" then
    io.stderr:write("ums.workqueue: error in an item nobody looked at: ",
      tostring(tb or err), "\n")
    return
  end
  local ok, e = pcall(h, err, tb, item.reader)
  if not ok then
    io.stderr:write("ums.workqueue: error in the on_error handler: ",
      tostring(e), "\n")
  end
end

-- Failed items not seen yet, for ums.test (which collects garbage at the
-- end of a test only when there may be one to report). Weak: an item
-- nobody holds still goes, reporting from its __gc.
local unseen = setmetatable({}, {__mode = "k"})

function FailedItem.__gc(item)
  if not item.seen_ then
    item.seen_ = true
    report(item.err_, item.traceback_, item)
  end
end

-- ---------------------------------------------------------------------
-- The queue proper: a FIFO of items (links in the items)
-- ---------------------------------------------------------------------

local function enqueue(q, item)
  local tail = q.tail
  item.prev_, item.next_ = tail, nil
  if tail then tail.next_ = item else q.head = item end
  q.tail = item
  q.nqueued = q.nqueued + 1
end

local function dequeue(q, item)
  local prev, nxt = item.prev_, item.next_
  if prev then prev.next_ = nxt else q.head = nxt end
  if nxt then nxt.prev_ = prev else q.tail = prev end
  item.prev_, item.next_ = nil, nil
  q.nqueued = q.nqueued - 1
end

local function lock_name(q, order)
  return format("ums.workqueue %d: order %.17g", q.id, order)
end

-- ---------------------------------------------------------------------
-- Readers
-- ---------------------------------------------------------------------

local reader_body  -- below: needs take and finish

-- Starts a reader if the queue is under its bound; wakes a waiting one
-- first.
local function activate(q)
  if q.nqueued == 0 then return end
  if q.nidle > 0 and wq.wake_first(q.idleq, wq.GRANTED) then return end
  if q.nreaders < q.max then
    q.nreaders = q.nreaders + 1
    local ok, t = pcall(spawn, reader_body, q)
    if not ok then
      q.nreaders = q.nreaders - 1
      error(t, 0)
    end
    q.nstarted = q.nstarted + 1
    t:name(format("%s reader %d", q.name, q.nstarted):sub(-31))
  end
end

-- Ends an item with its outcome: the pcall-style results, or (ok false)
-- err and tb. Wakes its waiters, and the queue's if it is now empty.
local function settle(q, item, status, ok, results, err, tb)
  item.status_ = status
  item.finished_ = core.now()
  if ok then
    item.results_ = results
  else
    item.err_, item.traceback_ = err, tb
    if status == "error" then
      q.failed[#q.failed + 1] = item
      q.nfailed = q.nfailed + 1
      if q.on_error then
        item.seen_ = true
        local okh, e = pcall(q.on_error, err, tb, item)
        if not okh then report(e, traceback(tostring(e)), item) end
      else
        setmetatable(item, FailedItem)  -- reported if never seen
        unseen[item] = true
      end
    end
  end
  if item.order_ ~= nil then q.ordered_live = q.ordered_live - 1 end
  q.outstanding = q.outstanding - 1
  q.ndone = q.ndone + 1
  wq.wake_all(item.waiters, wq.GRANTED)
  if q.outstanding == 0 then wq.wake_all(q.doneq, wq.GRANTED) end
end

local function release_locks(item)
  if item.lock_prev then item.lock_prev:release() end
  if item.lock_cur then item.lock_cur:release() end
  item.lock_prev, item.lock_cur = nil, nil
end

local function reader_stops(q)
  q.nreaders = q.nreaders - 1
end

-- The reader's next item, started: its phase locks are held. nil when
-- the reader should stop. A cancellation ends the reader (raised).
local function take(q, me)
  while true do
    local item = q.head
    if item then
      dequeue(q, item)
      item.reader = me
      if item.order_ ~= nil then
        -- Granted in the step that took the item: no item of a later
        -- order has been taken yet, so nobody holds or asks IX on this
        -- order. (acquire's yield point would let a reader of the next
        -- order take IX here first, and its item run before this one.)
        item.lock_cur = assert(applock.acquire_now(
          lock_name(q, item.order_), "S"))
        if item.prev_order_ ~= nil then
          item.status_ = "waiting"
          local ok, lk, msg, why = pcall(applock.acquire,
            lock_name(q, item.prev_order_), "IX")
          if not (ok and lk) then
            -- Cancelled (no timeout is set, and the phase locks alone
            -- cannot form a cycle): the item ends with the reader. Any
            -- other answer (a deadlock through the caller's own locks)
            -- keeps acquire's description as the item's traceback.
            local err = ok and msg or lk
            release_locks(item)
            settle(q, item, rawequal(err, CANCELLED) and "cancelled" or
              "error", false, nil, err, ok and why or nil)
            reader_stops(q)
            pcall(activate, q)
            error(err, 0)
          end
          item.lock_prev = lk
        end
      end
      item.status_ = "running"
      item.started_ = core.now()
      q.nrunning = q.nrunning + 1
      if q.nrunning > q.max_running then q.max_running = q.nrunning end
      return item
    end
    if q.is_closed or q.idle_timeout == 0 then
      reader_stops(q)
      return nil
    end
    q.nidle = q.nidle + 1
    local ok, got = pcall(wq.wait, q.idleq, q.idle_timeout)
    q.nidle = q.nidle - 1
    if not ok then
      reader_stops(q)
      error(got, 0)
    end
    if not got and q.head == nil then
      reader_stops(q)
      return nil
    end
  end
end

-- A description of an error value, where a traceback starts.
local function describe(e)
  return type(e) == "string" and e or format("(error value: %s)", tostring(e))
end

-- Called by the reader with its capture state (see capturer) and the
-- item's pcall-style outcome.
local function finish(q, item, cap, ok, ...)
  q.nrunning = q.nrunning - 1
  release_locks(item)
  if ok then
    settle(q, item, "done", true, pack(...))
    return
  end
  local e = ...
  -- The handler did not see this value when it failed itself or memory
  -- ran out: the item keeps the value, described, as its traceback.
  local tb = rawequal(cap.err, e) and cap.tb or describe(e)
  cap.err, cap.tb = nil, nil
  if rawequal(e, CANCELLED) then
    -- The reader was cancelled (its run is ending, or somebody cancelled
    -- it): the item ends cancelled and the reader with it; queued items
    -- get a reader of their own.
    settle(q, item, "cancelled", false, nil, CANCELLED, tb)
    reader_stops(q)
    pcall(activate, q)
    error(CANCELLED, 0)
  end
  settle(q, item, "error", false, nil, e, tb)
end

-- xpcall's handler, one per reader (the reader's task owns cap): keeps
-- the error value and the traceback of the item's stack where it failed in
-- cap, for finish, and returns the value itself. Lua also runs load's
-- parser under this handler, and an item's load must get what it gets in
-- plain Lua when its reader raises or its chunk nests too deeply.
local function capturer()
  local cap = {}
  return cap, function(e)
    cap.err, cap.tb = e, traceback(describe(e), 2)
    return e
  end
end

-- The reader's loop calls the items' functions, so it comes from a chunk
-- that the quantum may preempt (ums.waitq.preemptible).
reader_body = wq.preemptible("ums.workqueue reader", [[
  local take, finish, capturer, self, xpcall, unpack = ...
  return function(q)
    local me = self()
    local cap, capture = capturer()
    while true do
      local item = take(q, me)
      if item == nil then return end
      local args = item.args_
      finish(q, item, cap, xpcall(item.fn_, capture,
                                  unpack(args, 1, args.n)))
    end
  end
]], take, finish, capturer, core.self, xpcall, unpack)

-- ---------------------------------------------------------------------
-- The API
-- ---------------------------------------------------------------------

local function opt_field(opts, key, check, what)
  local v = opts[key]
  if v ~= nil and not check(v) then
    argerror(3, 1, "workqueue", format("field '%s' must be %s, got %s", key,
      what, type(v) == "number" and tostring(v) or typename(v)))
  end
  return v
end

--- ums.workqueue{readers = n, name = s, idle_timeout = s, on_error = f}
function M.new(opts)
  if opts == nil then opts = {} end
  if type(opts) ~= "table" then
    argerror(2, 1, "workqueue", "table expected, got " .. typename(opts))
  end
  for k in pairs(opts) do
    if k ~= "readers" and k ~= "name" and k ~= "idle_timeout" and
       k ~= "on_error" then
      argerror(2, 1, "workqueue", format("unknown field '%s'", tostring(k)))
    end
  end
  local readers = opt_field(opts, "readers", function(v)
    return math.type(v) == "integer" and v > 0
  end, "a positive integer") or 1
  local name = opt_field(opts, "name", function(v)
    return type(v) == "string"
  end, "a string")
  local idle = opt_field(opts, "idle_timeout", function(v)
    return type(v) == "number" and v >= 0 and v == v
  end, "a non-negative number of seconds") or 0
  local on_error = opt_field(opts, "on_error", function(v)
    return type(v) == "function"
  end, "a function")
  nqueues = nqueues + 1
  return setmetatable({
    id = nqueues, name = name or format("workqueue %d", nqueues),
    max = readers, idle_timeout = idle, on_error = on_error,
    head = nil, tail = nil, nqueued = 0,
    nreaders = 0, nidle = 0, nrunning = 0, max_running = 0, nstarted = 0,
    outstanding = 0, ordered_live = 0, nposted = 0, ndone = 0, nfailed = 0,
    idleq = wq.newq(), doneq = wq.newq(), failed = {},
    last_order = nil, prev_order = nil, is_closed = false,
  }, Queue)
end

local function new_item(q, fn, order, prev_order, ...)
  local item = setmetatable({ queue = q, fn_ = fn, args_ = pack(...),
    order_ = order, prev_order_ = prev_order, status_ = "queued",
    waiters = wq.newq() }, Item)
  q.nposted = q.nposted + 1
  item.seq_ = q.nposted
  q.outstanding = q.outstanding + 1
  if order ~= nil then q.ordered_live = q.ordered_live + 1 end
  enqueue(q, item)
  activate(q)
  return item
end

local function check_open(q, fname)
  if q.is_closed then
    wq.raise(3, format("ums.workqueue:%s: the queue is closed (no posts "
      .. "after close)", fname))
  end
end

--- Queues fn(...); returns the item.
function Queue:post(fn, ...)
  wq.check_self(self, Queue, "post")
  if type(fn) ~= "function" then
    argerror(2, 2, "post", "function expected, got " .. typename(fn))
  end
  check_open(self, "post")
  return new_item(self, fn, nil, nil, ...)
end

--- Queues fn(...) in phase `order` (a number); returns the item.
function Queue:post_ordered(order, fn, ...)
  wq.check_self(self, Queue, "post_ordered")
  if type(order) ~= "number" or order ~= order then
    argerror(2, 2, "post_ordered", "order must be a number, got " ..
      (type(order) == "number" and "nan" or typename(order)))
  end
  if type(fn) ~= "function" then
    argerror(2, 3, "post_ordered", "function expected, got " .. typename(fn))
  end
  check_open(self, "post_ordered")
  local last = self.last_order
  if last ~= nil and order < last then
    if self.ordered_live > 0 then
      argerror(2, 2, "post_ordered", format("order %.17g is lower than the "
        .. "last order posted, %.17g, whose items are not all done",
        order, last))
    end
    -- Everything ordered has finished: a new sequence starts.
    self.last_order, self.prev_order, last = nil, nil, nil
  end
  if last == nil or order ~= last then
    self.prev_order, self.last_order = last, order
  end
  return new_item(self, fn, order, self.prev_order, ...)
end

--- No more posts; readers stop once the queue is empty. Items queued
-- still run. Returns true.
function Queue:close()
  wq.check_self(self, Queue, "close")
  self.is_closed = true
  wq.wake_all(self.idleq, wq.GRANTED)
  return true
end

function Queue:closed()
  wq.check_self(self, Queue, "closed")
  return self.is_closed
end

--- Waits until no item is queued or running.
-- @return true when no item has failed | false, failures (every failed
-- item so far: a list of { item, err, traceback, order }, in the order
-- they failed; they count as seen) | nil, "timeout"
function Queue:wait(timeout)
  wq.check_self(self, Queue, "wait")
  timeout = opt_timeout(timeout, 2, "wait")
  quantum_point()
  if self.outstanding > 0 then
    if timeout == 0 then return nil, "timeout" end
    need_task("workqueue:wait")
    local deadline = timeout and core.now() + timeout
    while self.outstanding > 0 do
      local left = deadline and deadline - core.now()
      if left and left < 0 then left = 0 end
      local ok, msg = wq.wait(self.doneq, left)
      if not ok then return nil, msg end
    end
  end
  if #self.failed == 0 then return true end
  local failures = {}
  for i, item in ipairs(self.failed) do
    item.seen_ = true
    failures[i] = { item = item, err = item.err_,
      traceback = item.traceback_, order = item.order_ }
  end
  return false, failures
end

--- Counters: queued, running, readers, max_running (the most items
-- running at once so far), posted, done, failed.
function Queue:stats()
  wq.check_self(self, Queue, "stats")
  return { queued = self.nqueued, running = self.nrunning,
    readers = self.nreaders, max_running = self.max_running,
    posted = self.nposted, done = self.ndone, failed = self.nfailed }
end

function Queue:__tostring()
  wq.check_self(self, Queue, "__tostring")
  return format("ums.workqueue '%s' (%d queued, %d running, %d readers)",
    self.name, self.nqueued, self.nrunning, self.nreaders)
end

-- ---------------------------------------------------------------------
-- Items
-- ---------------------------------------------------------------------

local function outcome(item)
  if item.status_ == "done" then
    return true, unpack(item.results_, 1, item.results_.n)
  end
  item.seen_ = true
  return false, item.err_, item.traceback_
end

--- Waits for the item: true, results... | false, err, traceback |
-- nil, "timeout". A cancelled item gives false, ums.CANCELLED.
function Item:result(timeout)
  check_item(self, "result")
  timeout = opt_timeout(timeout, 2, "result")
  quantum_point()
  local st = self.status_
  if st == "queued" or st == "waiting" or st == "running" then
    if timeout == 0 then return nil, "timeout" end
    need_task("workqueue item:result")
    local ok, msg = wq.wait(self.waiters, timeout)
    if not ok then return nil, msg end
  end
  return outcome(self)
end

--- "queued", "waiting" (taken, waiting for its phase), "running",
-- "done", "error" or "cancelled".
function Item:status()
  check_item(self, "status")
  return self.status_
end

--- The item's order (nil when posted with post).
function Item:order()
  check_item(self, "order")
  return self.order_
end

--- When it started and finished (ums.now() readings; nil until then).
function Item:times()
  check_item(self, "times")
  return self.started_, self.finished_
end

--- Takes a queued item off the queue: true, or false once a reader has
-- taken it. Its result is then false, ums.CANCELLED.
function Item:cancel()
  check_item(self, "cancel")
  if self.status_ ~= "queued" then return false end
  local q = self.queue
  dequeue(q, self)
  settle(q, self, "cancelled", false, nil, CANCELLED, nil)
  return true
end

function Item:__tostring()
  check_item(self, "__tostring")
  return format("ums.workqueue.item #%d (%s%s)", self.seq_, self.status_,
    self.order_ ~= nil and format(", order %.17g", self.order_) or "")
end
FailedItem.__tostring = Item.__tostring
FailedItem.__name = Item.__name

wq.methods(Queue)
wq.methods(Item)

--- true if a failed item nobody has looked at yet may still be alive
-- (ums.test then collects garbage at the end of a test, so that its __gc
-- reports the error inside the test).
function M.unseen_failures()
  for item in pairs(unseen) do
    if item.seen_ then
      unseen[item] = nil
    else
      return true
    end
  end
  return false
end

M.Queue, M.Item = Queue, Item
return M
