-- Specs for a C-call pool that runs out of threads: tasks each blocked in
-- an ums.ffi call that waits for another task's call (a read on a pipe
-- whose writer is another task's ffi write) either complete, with the
-- default bound, or are reported (ums.stats() shows the exhaustion, and
-- the monitor prints one line naming the oldest waiter's C function),
-- never hang silently.

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local ums = dofile(here .. "helper.lua")
package.path = here .. "?.lua;" .. package.path
local sp = require "subprocess"
local ffi = ums.ffi
local C = ffi.C

ffi.cdef[[
int pipe(void *fds);
int close(int fd);
ssize_t read(int fd, void *buf, size_t n);
ssize_t write(int fd, const void *buf, size_t n);
]]
ffi.cdef([[ ssize_t write_now(int fd, const void *buf, size_t n)
  __asm__("write"); ]], {inline = true})

local function pipe()
  local b = ffi.buffer(8)
  assert.equal(0, C.pipe(b))
  return string.unpack("i4i4", ffi.string(b, 8))
end

-- n readers, each blocked in C.read on a pipe of its own, then n writers,
-- each writing that pipe's byte through C.write: the readers hold n pool
-- threads, and the writers need more. Returns the tasks and the pipes.
local function echo_shape(n)
  local fds, tasks, started = {}, {}, 0
  for i = 1, n do fds[i] = {pipe()} end
  for i = 1, n do
    tasks[#tasks + 1] = ums.spawn(function()
      local b = ffi.buffer(1)
      started = started + 1
      assert.equal(1, C.read(fds[i][1], b, 1))
    end)
  end
  while started < n do ums.yield() end
  for i = 1, n do
    tasks[#tasks + 1] = ums.spawn(function()
      assert.equal(1, C.write(fds[i][2], "x", 1))
    end)
  end
  return tasks, fds
end

local function join_all(tasks)
  for _, t in ipairs(tasks) do assert.is_true(t:join(60)) end
end

local function close_all(fds)
  for _, p in ipairs(fds) do
    C.close(p[1])
    C.close(p[2])
  end
end

local function preemptive_pool()
  for _, row in ipairs(ums.stats()) do
    if row.hidden and row.name == "preemptive" then return row end
  end
  error("no preemptive pool in ums.stats()")
end

describe("a C-call pool out of threads", function()
  after_each(function()
    ums.config{preempt_threads = 0, stall_threshold = 1}
  end)

  for _, n in ipairs{100, 1000} do
    it(("completes %d readers and their writers by default"):format(n),
       function()
      ums.test(function()
        local tasks, fds = echo_shape(n)
        join_all(tasks)
        close_all(fds)
        local pool = preemptive_pool()
        assert.is_true(pool.max_threads >= 10000)
        -- A thread per blocked call, not one per tick of the pool's
        -- monitor up to its bound.
        assert.is_true(pool.threads <= 2 * n + 64, pool.threads)
        assert.equal(0, pool.exhaustions)
        assert.is_false(pool.exhausted)
      end, 120)
    end)
  end

  it("is shown in ums.stats() when its bound is too low", function()
    ums.config{preempt_threads = 50, stall_threshold = 0.2}
    ums.test(function()
      local tasks, fds = echo_shape(100)
      -- Nothing moves any more: the readers hold every thread and the
      -- writers wait behind them. The bound is for a hang, not a speed.
      local t0, pool = ums.now(), nil
      repeat
        ums.sleep(0.05)
        pool = preemptive_pool()
      until pool.exhausted or ums.now() - t0 > 30
      assert.is_true(pool.exhausted)
      assert.equal(1, pool.exhaustions)
      assert.equal(50, pool.max_threads)
      assert.equal(50, pool.workers_active)
      assert.is_true(pool.pending >= 50)
      assert.is_true(pool.oldest_wait >= 0.2)
      assert.is_true(pool.longest_wait >= 0.2)
      -- Let the readers go from here (an inline write): the pool drains.
      for _, p in ipairs(fds) do assert.equal(1, C.write_now(p[2], "x", 1)) end
      join_all(tasks)
      -- The writers' bytes are still in the pipes; nobody reads them.
      close_all(fds)
      repeat
        ums.sleep(0.05)
        pool = preemptive_pool()
      until not pool.exhausted or ums.now() - t0 > 60
      assert.is_false(pool.exhausted)
      assert.equal(1, pool.exhaustions)
      assert.equal(0, pool.pending)
    end, 120)
  end)

  local sp_it = sp.guard(it, pending)
  sp_it("is reported once on stderr, naming the C function waited for",
        function()
    local script = sp.temp(([=[
      package.path = %q .. "?.lua;" .. package.path
      local ums = dofile(%q .. "helper.lua")
      local ffi, C = ums.ffi, ums.ffi.C
      ffi.cdef[[
        int pipe(void *fds);
        ssize_t read(int fd, void *buf, size_t n);
        ssize_t write(int fd, const void *buf, size_t n);
      ]]
      ffi.cdef("ssize_t write_now(int, const void *, size_t) " ..
               "__asm__(\"write\");", {inline = true})
      ums.config{preempt_threads = 4, stall_threshold = 0.2}
      ums.run(function()
        local fds = {}
        for i = 1, 8 do
          local b = ffi.buffer(8)
          assert(C.pipe(b) == 0)
          fds[i] = {string.unpack("i4i4", ffi.string(b, 8))}
        end
        for i = 1, 8 do
          ums.spawn(function() C.read(fds[i][1], ffi.buffer(1), 1) end)
        end
        for i = 1, 8 do
          ums.spawn(function() C.write(fds[i][2], "x", 1) end)
        end
        local t0 = ums.now()
        repeat
          ums.sleep(0.05)
          local pool
          for _, r in ipairs(ums.stats()) do
            if r.name == "preemptive" then pool = r end
          end
        until pool.exhausted or ums.now() - t0 > 30
        ums.sleep(0.5) -- more of the monitor's looks: still one report
        for i = 1, 8 do C.write_now(fds[i][2], "x", 1) end
      end)
      print("done")
    ]=]):format(here, here), ".lua")
    local r = sp.lua_run({script}, {timeout = 60})
    sp.assert_exit(r, 0)
    assert.equal("done\n", r.stdout)
    local _, lines = r.stderr:gsub("pool is exhausted", "")
    assert.equal(1, lines, r.stderr)
    assert.matches("the preemptive pool is exhausted: 4 of its 4 threads",
                   r.stderr, 1, true)
    assert.matches("calls read and has waited", r.stderr, 1, true)
    assert.matches("raise preempt_threads", r.stderr, 1, true)
  end)
end)
