-- Many runs in one process (a test framework starts one per test): what
-- a run starts and stops each time, and what the process keeps for the
-- next runs (an io_uring ring per scheduler, the runtime's threads, the
-- Ctrl-C watcher).
-- Whatever the number of runs, the threads and descriptors left once
-- ums.run returns are those left by the first run.
local ums = require "ums"
local core = require "ums.core"
local fs = ums.fs

local this_file = debug.getinfo(1, "S").source:sub(2)

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

-- The descriptors of this process, as a set of "fd type" strings, where
-- type is "uring" (an io_uring ring), "eventfd" or "other".
local function fds()
  local names = {}
  for name in fs.dir("/proc/self/fd") do names[#names + 1] = name end
  local set = {}
  for _, name in ipairs(names) do
    local info = read("/proc/self/fdinfo/" .. name)
    if info then  -- the listing's own descriptor is gone by now
      local kind = info:find("SqMask", 1, true) and "uring"
                   or info:find("eventfd-count", 1, true) and "eventfd"
                   or "other"
      set[name .. " " .. kind] = true
    end
  end
  return set
end

local function count(set, suffix)
  local n = 0
  for k in pairs(set) do
    if k:sub(-#suffix) == suffix then n = n + 1 end
  end
  return n
end

-- The threads of this process, as a set of "tid name" strings.
local function threads()
  local set = {}
  for tid in fs.dir("/proc/self/task") do
    local name = read("/proc/self/task/" .. tid .. "/comm")
    if name then set[tid .. " " .. name:gsub("\n$", "")] = true end
  end
  return set
end

-- The ids of this process's threads, as a set. Compared by id, not by
-- name: a thread names itself once it runs, so a thread just started may
-- still carry the process's name.
local function tids()
  local set = {}
  for tid in fs.dir("/proc/self/task") do set[tid] = true end
  return set
end

-- A run that does file I/O (through the ring, with that backend).
local function io_run()
  return ums.run(function()
    assert(fs.readfile(this_file))
    return core.io_backend()
  end)
end

describe("runs one after another", function()
  it("leave no more threads and descriptors than the first run left",
     function()
    io_run()
    local t1, f1 = tids(), fds()
    for _ = 1, 30 do io_run() end
    assert.same(t1, tids())
    assert.same(f1, fds())
  end)

  -- The threads a short run needs (the runtime's monitor) are those the
  -- previous run left parked, and the Ctrl-C watcher is the process's
  -- (lintr.c): an empty run starts no thread.
  it("run on the threads the previous run left, and start none", function()
    -- The count from /proc/self/status: plain io, which starts nothing.
    local function count()
      local f = assert(io.open("/proc/self/status"))
      local n = tonumber(f:read("a"):match("\nThreads:%s*(%d+)"))
      f:close()
      return n
    end
    ums.run(function() end)
    local before = tids()
    for _ = 1, 20 do
      assert.equal(0, ums.run(count) - count())
      assert.same(before, tids())
    end
  end)

  -- With one scheduler (the default) the thread that calls ums.run runs
  -- the scheduler itself: a run starts and stops without handing
  -- anything to another thread and back.
  it("run their tasks on the thread that called ums.run", function()
    local function tid()
      return assert(read("/proc/thread-self/stat")):match("^(%d+) ")
    end
    local here = tid()
    assert.equal(here, ums.run(tid))
    assert.equal(here, ums.run(function()
      ums.sleep(0.001)
      return select(2, ums.spawn(tid):join())
    end))
    -- With more, each scheduler has a thread of its own.
    ums.config{schedulers = 2}
    local ok, other = pcall(ums.run, tid)
    ums.config{schedulers = 1}
    assert(ok, other)
    assert.not_equal(here, other)
  end)

  -- A run takes the scheduler-side thread and the pooled task of the
  -- previous one, and leaves its failed-task set emptied in place: what
  -- a run allocates from the Lua heap is what a large heap's collector
  -- must trace again, once per test under a test framework.
  it("allocate little from the Lua heap after the first", function()
    local function empty() end
    ums.run(empty)
    collectgarbage()
    collectgarbage("stop")
    local ok, per_run = pcall(function()
      local before = collectgarbage("count")
      for _ = 1, 100 do ums.run(empty) end
      return (collectgarbage("count") - before) * 1024 / 100
    end)
    collectgarbage("restart")
    assert(ok, per_run)
    -- The first task's handle is all that is left per run.
    assert.is_true(per_run < 512, ("%.0f bytes per run"):format(per_run))
  end)

  it("have the Ctrl-C watcher", function()
    local watched = ums.run(function()
      for _ = 1, 500 do
        for k in pairs(threads()) do
          if k:match(" ums%-sigint$") then return true end
        end
        ums.sleep(0.01)
      end
      return false
    end)
    assert.is_true(watched)
  end)

  it("keep the ring of the first run for the next ones", function()
    local before = fds()
    local backend = io_run()
    if backend ~= "uring" then
      return pending("the io_uring backend is not in use here")
    end
    local after = fds()
    -- Once a run has ended its ring and the ring's eventfd stay open...
    assert.is_true(count(after, " uring") >= 1)
    assert.is_true(count(after, " eventfd") >= 1)
    -- ... and the next run uses them: the same descriptors, no new ones.
    for _ = 1, 5 do io_run() end
    assert.same(after, fds())
    for k in pairs(before) do assert.is_true(after[k], k) end
  end)

  it("still do I/O in every run after a run that abandoned I/O", function()
    -- An open of a FIFO nobody writes to, abandoned when its run is
    -- cancelled: the ring is drained before the next run takes it.
    local fifo = os.tmpname()
    os.remove(fifo)
    ums.run(function()
      ums.ffi.cdef("UMS_INLINE int mkfifo(const char *, unsigned int);")
      assert(ums.ffi.C.mkfifo(fifo, tonumber("600", 8)) == 0)
    end)
    -- Opened for reading and writing, a FIFO opens at once, and a read
    -- of it waits for a write that never comes.
    local ok, err = pcall(core.run_limit, 0.2, function()
      local f = assert(fs.open(fifo, "r+"))
      f:read(1)
    end)
    os.remove(fifo)
    assert.is_false(ok)
    assert.matches("time limit", tostring(err))
    for _ = 1, 5 do assert.is_string(io_run()) end
  end)

end)
