-- ordered_batches.lua: a Service Broker queue's "ordered batches" on
-- ums.workqueue (docs/stdlib.md).
--
-- A Service Broker queue with MAX_QUEUE_READERS = 5 runs ten SQL
-- batches ("waitfor delay ...") tagged with an execution order: the four
-- of order 100 run together, the two of 200 only once every 100 has
-- finished, and so on up to 500. Here the queue is ums.workqueue with
-- readers = 5, each batch is an item posted with post_ordered, and the
-- phases come from application locks (Shared on the item's own order,
-- IntentExclusive on the previous one), as in the queue's activation
-- procedure. Each item writes its start and end into an execution log,
-- as the queue's ExecSQL procedure does.
--
--   lua5.4 examples/ordered_batches.lua            real time, scaled down
--                                                  100x (10.1 s -> 0.101 s)
--   lua5.4 examples/ordered_batches.lua --virtual  the queue's own delays on
--                                                  the virtual clock: the
--                                                  41.5 s schedule runs in
--                                                  milliseconds, and the
--                                                  log is the same on
--                                                  every run
--
-- It checks what the log shows (phases never overlap; never more than
-- five items at once) and fails if it does not.
local ums = require "ums"

local virtual = arg and arg[1] == "--virtual"
if virtual and ums.self() then
  -- Under the ums command the script already runs inside a run, whose
  -- clock cannot change any more.
  print("(--virtual needs plain lua5.4; running in real time)")
  virtual = false
end
local scale = virtual and 1 or 0.01
if virtual then ums.config { clock = "virtual" } end

local READERS = 5
local batches = { -- the queue's #SQLs: delay, execution order
  { "00:00:10.100", 100 }, { "00:00:10.100", 100 }, { "00:00:10.100", 100 },
  { "00:00:10.100", 100 }, { "00:00:09.200", 200 }, { "00:00:09.200", 200 },
  { "00:00:08.300", 300 }, { "00:00:07.400", 400 }, { "00:00:07.400", 400 },
  { "00:00:06.500", 500 },
}

local function seconds(delay)
  local h, m, s = delay:match("^(%d+):(%d+):([%d.]+)$")
  return tonumber(h) * 3600 + tonumber(m) * 60 + tonumber(s)
end

ums.run(function()
  local t0 = ums.now()
  local log = {} -- ExecutionLog: id, sql, order, start, finish

  -- ExecSQL: log the start, run the batch, log the end.
  local function exec(id, delay, order)
    local entry = { id = id, sql = ("waitfor delay '%s'"):format(delay),
                    order = order, start = ums.now() - t0 }
    log[#log + 1] = entry
    ums.sleep(seconds(delay) * scale)
    entry.finish = ums.now() - t0
  end

  local q = ums.workqueue { readers = READERS, name = "SchedulerQueue" }
  for id, b in ipairs(batches) do
    q:post_ordered(b[2], exec, id, b[1], b[2])
  end
  q:close()
  local ok, failures = q:wait()
  if not ok then
    local f = failures[1]
    error(("batch %s failed: %s\n%s"):format(tostring(f.item), tostring(f.err),
      tostring(f.traceback)))
  end

  print(("readers = %d, %s clock%s"):format(READERS,
    virtual and "virtual" or "real",
    virtual and "" or (", delays scaled by %g"):format(scale)))
  print(" id  order  sql                          start      end")
  table.sort(log, function(a, b)
    if a.start ~= b.start then return a.start < b.start end
    return a.id < b.id
  end)
  for _, e in ipairs(log) do
    print(("%3d  %5d  %-27s %7.3f  %7.3f"):format(e.id, e.order, e.sql,
      e.start, e.finish))
  end

  -- What the log must show. Times come from one clock, so an item that
  -- starts when the one before it ends has start == finish exactly.
  local phases, order_list = {}, {}
  for _, e in ipairs(log) do
    local p = phases[e.order]
    if not p then
      p = { n = 0, first = e.start, last = e.finish }
      phases[e.order] = p
      order_list[#order_list + 1] = e.order
    end
    p.n = p.n + 1
    p.first = math.min(p.first, e.start)
    p.last = math.max(p.last, e.finish)
  end
  table.sort(order_list)
  for i, o in ipairs(order_list) do
    local p = phases[o]
    print(("phase %d: %d item(s), %.3f .. %.3f"):format(o, p.n, p.first,
      p.last))
    local nxt = phases[order_list[i + 1]]
    if nxt and nxt.first < p.last then
      error(("phase %d started at %.3f, before phase %d ended at %.3f")
        :format(order_list[i + 1], nxt.first, o, p.last))
    end
  end
  local most = 0
  for _, e in ipairs(log) do
    local n = 0
    for _, f in ipairs(log) do
      if f.start <= e.start and e.start < f.finish then n = n + 1 end
    end
    most = math.max(most, n)
  end
  if most > READERS then
    error(("%d items ran at once, more than %d readers"):format(most,
      READERS))
  end
  print(("phases never overlap; at most %d items ran at once (readers = %d)")
    :format(most, READERS))
end)
