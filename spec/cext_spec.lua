-- Specs for the C extension API (runtime/include/ums-lua.h), through the
-- example module examples/cmod/zutil.c: a separate shared object loaded
-- with require that runs real blocking calls (open/read, zlib) on the
-- preemptive pool and resumes the task through a continuation. Covered:
-- results against Lua and known values; 1,000 other tasks running during
-- a slow call; timeout and cancel during a call (the work is detached,
-- stops early, its request is freed once it returns, the pool thread is
-- reused); calls outside tasks and where Lua cannot yield; errors raised
-- in the continuation; bad arguments; the module without ums.
--
-- Slow calls read a FIFO: the work blocks in open or read until the spec
-- writes, which is a real blocking call whose length the spec controls.
-- lua-binding/test/test_ums_lua.c checks the same contract from C.

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local ums = dofile(here .. "helper.lua")
package.path = here .. "?.lua;" .. package.path
if not package.searchpath("zutil", package.cpath) then
  -- Run by hand: the module is in the build tree next to ums.core.
  local build = os.getenv("UMS_BUILD_DIR") or (here .. "../build")
  package.cpath = build .. "/examples/cmod/?.so;" .. package.cpath
end
local zutil = require "zutil"
local sp = require "subprocess"
local ffi = ums.ffi
local C = ffi.C

local O_RDONLY, O_WRONLY, O_NONBLOCK = 0, 1, 0x800
local ENOENT, EISDIR, ENXIO = 2, 21, 6
local API_KEY = "ums.lua_api" -- UMS_LUA_API_KEY

-- Called directly on the scheduler: they never block (the FIFO is opened
-- for writing without blocking), and the preemptive pool may be busy
-- with the very call the spec is about to unblock.
ffi.cdef([[
int cext_mkfifo(const char *path, unsigned int mode) __asm__("mkfifo");
int cext_open(const char *path, int flags, ...) __asm__("open");
ssize_t cext_write(int fd, const void *buf, size_t n) __asm__("write");
int cext_close(int fd) __asm__("close");
]], {inline = true})

-- CRC-32 as zlib computes it, in Lua.
local crc_table = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do
    c = (c & 1) ~= 0 and (0xEDB88320 ~ (c >> 1)) or (c >> 1)
  end
  crc_table[i] = c
end
local function lua_crc32(s)
  local c = 0xFFFFFFFF
  for i = 1, #s do c = crc_table[(c ~ s:byte(i)) & 0xFF] ~ (c >> 8) end
  return c ~ 0xFFFFFFFF
end

local function run(body, limit) return ums.test(body, limit or 30) end

-- it() twice: outside a task, and as a task of a run.
local function both(name, body)
  it(name .. " (outside a task)", body)
  it(name .. " (in a task)", function() run(body) end)
end

local function errmsg(f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected an error")
  return tostring(err)
end

local function temp_file(content)
  local name = os.tmpname()
  local f = assert(io.open(name, "wb"))
  f:write(content)
  f:close()
  return name
end

local function new_fifo()
  local name = os.tmpname()
  os.remove(name)
  assert(C.cext_mkfifo(name, tonumber("600", 8)) == 0, "mkfifo failed")
  return name
end

-- Opens the FIFO for writing once a reader (the work) has it open: a
-- non-blocking open fails with ENXIO until then. Inside a task.
local function open_writer(fifo)
  local limit = ums.now() + 10
  while true do
    local fd = C.cext_open(fifo, O_WRONLY | O_NONBLOCK)
    if fd >= 0 then return fd end
    assert(ffi.errno() == ENXIO, "open for writing: errno " .. ffi.errno())
    assert(ums.now() < limit, "the reader never opened the FIFO")
    ums.sleep(0.001)
  end
end

-- Waits (inside a task) until zutil has no request left unreleased.
local function wait_released()
  local limit = ums.now() + 10
  while zutil.pending() > 0 and ums.now() < limit do ums.sleep(0.002) end
  assert.equal(0, zutil.pending(), "requests still held")
end

local content = {}
for i = 1, 20000 do content[i] = string.char((i * 7 + i // 256) % 256) end
content = table.concat(content)

describe("C extensions (ums-lua.h) through examples/cmod/zutil", function()
  local file, files = nil, {}
  setup(function()
    file = temp_file(content)
    files[#files + 1] = file
  end)
  teardown(function()
    for _, f in ipairs(files) do os.remove(f) end
  end)
  after_each(function()
    sp.cleanup()
    -- Every request was released, whoever gave up on it.
    assert.equal(0, zutil.pending())
  end)

  both("results match Lua and known values", function()
    local crc, bytes = zutil.crc32_file(file)
    assert.equal(lua_crc32(content), crc)
    assert.equal(#content, bytes)
    local check = temp_file("123456789")
    files[#files + 1] = check
    assert.equal(0xCBF43926, (zutil.crc32_file(check)))
    local empty = temp_file("")
    files[#files + 1] = empty
    assert.same({0, 0}, {zutil.crc32_file(empty)})
    -- zlib both ways; "hello" at the default level is a known stream.
    assert.equal("\x78\x9c\xcb\x48\xcd\xc9\xc9\x07\x00\x06\x2c\x02\x15",
                 zutil.compress("hello"))
    for _, s in ipairs{"", "x", content, ("abc"):rep(10000)} do
      for _, level in ipairs{-1, 0, 1, 9} do
        local z = zutil.compress(s, level)
        assert.equal(s, zutil.uncompress(z, #s))
        assert.equal(s, zutil.uncompress(z, #s + 100))
      end
    end
    assert.is_true(#zutil.compress(("abc"):rep(10000), 9) < 200)
  end)

  both("failures are results, with errno", function()
    local none, msg, errno = zutil.crc32_file(file .. ".missing")
    assert.is_nil(none)
    assert.equal(file .. ".missing: No such file or directory", msg)
    assert.equal(ENOENT, errno)
    none, msg, errno = zutil.crc32_file("/")
    assert.is_nil(none)
    assert.equal("/: Is a directory", msg)
    assert.equal(EISDIR, errno)
    assert.same({nil, "zutil.uncompress: data error"},
                {zutil.uncompress("not zlib at all", 100)})
    local z = zutil.compress(content)
    assert.same({nil, "zutil.uncompress: data error"},
                {zutil.uncompress(z:sub(1, #z // 2), #content)})
  end)

  it("outside a task the call runs inline and the timeout does not apply",
     function()
    assert.is_nil(ums.self())
    assert.equal(lua_crc32(content), (zutil.crc32_file(file, 0)))
    assert.equal("x", zutil.uncompress(zutil.compress("x", 1, 0), 1, 0))
  end)

  local ntasks = 1000
  it("1,000 other tasks keep running while a slow call runs", function()
    -- The call lasts 50 ms: a scheduler blocked by it would show a gap
    -- of 50 ms or more every time. 20 ms leaves room for a loaded VM
    -- (both CPUs busy elsewhere gave gaps of 4-5 ms here).
    local limit = 0.02
    local data = ("0123456789"):rep(100)
    local function measure()
      local fifo = new_fifo()
      files[#files + 1] = fifo
      local max_gap, steps, took, crc, bytes = 0, 0
      run(function()
        local stop, last = false, ums.now()
        local tasks = {}
        for i = 1, ntasks do
          tasks[i] = ums.spawn(function()
            while not stop do
              local now = ums.now()
              if now - last > max_gap then max_gap = now - last end
              last = now
              steps = steps + 1
              ums.yield()
            end
          end)
        end
        -- The writer lets the call end after 50 ms.
        local writer = ums.spawn(function()
          ums.sleep(0.05)
          local fd = open_writer(fifo)
          assert.equal(#data, C.cext_write(fd, data, #data))
          C.cext_close(fd)
        end)
        ums.yield()
        local t0 = ums.now()
        last, max_gap, steps = t0, 0, 0
        crc, bytes = zutil.crc32_file(fifo)
        took = ums.now() - t0
        stop = true
        for _, t in ipairs(tasks) do assert.is_true((t:join())) end
        assert.is_true((writer:join()))
      end)
      assert.equal(lua_crc32(data), crc)
      assert.equal(#data, bytes)
      assert.is_true(took >= 0.05, "the call returned early: " .. took)
      assert.is_true(steps >= ntasks, "the others did not run: " .. steps)
      return max_gap
    end
    -- On a shared 2-CPU VM the kernel itself may take the scheduler
    -- thread away for a few ms; a call that blocked the scheduler would
    -- stall it for the whole 50 ms every time. Best of a few runs.
    local gaps = {}
    for i = 1, 10 do
      gaps[i] = measure()
      if gaps[i] < limit then break end
    end
    table.sort(gaps)
    assert.is_true(gaps[1] < limit, ("a stall of %.1f ms (limit %.1f ms)")
      :format(gaps[1] * 1e3, limit * 1e3))
  end)

  describe("timeout and cancel during a call", function()
    before_each(function() ums.config{preempt_threads = 1} end)
    after_each(function() ums.config{preempt_threads = 0} end)

    -- After the caller gave up on a read of `fifo`: the detached work
    -- still holds its request; once it gets data it notices it was
    -- abandoned and stops, although the writer stays open (were it to
    -- read on, it would block for good); then the pool's one thread
    -- serves the next call.
    local function detached_work_ends(fifo)
      assert.equal(1, zutil.pending())
      -- A reader of our own, so that the write cannot meet a FIFO whose
      -- only reader (the work) has just closed it (SIGPIPE).
      local rfd = C.cext_open(fifo, O_RDONLY | O_NONBLOCK)
      assert.is_true(rfd >= 0)
      local fd = open_writer(fifo)
      -- Closed also when a check fails: an EOF then ends the work, and
      -- the run's shutdown does not wait for it forever.
      local ok, err = pcall(function()
        assert.equal(5, C.cext_write(fd, "hello", 5))
        wait_released()
        assert.equal(lua_crc32(content), (zutil.crc32_file(file, 5)))
      end)
      C.cext_close(fd)
      C.cext_close(rfd)
      assert(ok, err)
    end

    it("times out: nil, 'timeout'; the work stops; the thread is reused",
       function()
      local fifo = new_fifo()
      files[#files + 1] = fifo
      run(function()
        local t0 = ums.now()
        local res, err = zutil.crc32_file(fifo, 0.05)
        local took = ums.now() - t0
        assert.is_nil(res)
        assert.equal("timeout", err)
        assert.is_true(took >= 0.05 and took < 2, "took " .. took)
        detached_work_ends(fifo)
      end)
    end)

    it("is cancelled: the task unwinds, the work goes on detached",
       function()
      local fifo = new_fifo()
      files[#files + 1] = fifo
      run(function()
        local started, closed = false, false
        local reader = ums.spawn(function()
          local _ <close> = setmetatable({}, {__close = function()
            closed = true
          end})
          started = true
          zutil.crc32_file(fifo)
          error("not reached")
        end)
        while not started do ums.yield() end
        ums.sleep(0.02)
        assert.is_true(reader:cancel())
        local ok, err = reader:join(5)
        assert.is_false(ok)
        assert.equal(ums.CANCELLED, err)
        assert.is_true(closed)
        detached_work_ends(fifo)
      end)
    end)

    it("times out where Lua cannot yield too", function()
      local fifo = new_fifo()
      files[#files + 1] = fifo
      run(function()
        local res
        table.sort({2, 1}, function(a, b)
          res = table.pack(zutil.crc32_file(fifo, 0.05))
          return a < b
        end)
        assert.same({n = 2, nil, "timeout"}, res)
        detached_work_ends(fifo)
      end)
    end)
  end)

  it("works where Lua cannot yield, while other tasks run", function()
    local want = lua_crc32(content)
    run(function()
      -- table.sort's comparator: the worker stays bound to the task
      local t = {3, 1, 2}
      table.sort(t, function(a, b)
        assert.equal(want, (zutil.crc32_file(file)))
        return a < b
      end)
      assert.same({1, 2, 3}, t)
      -- a metamethod
      local proxy = setmetatable({}, {__index = function(_, k)
        return zutil.uncompress(zutil.compress(k), #k)
      end})
      assert.equal("metamethod", proxy.metamethod)
      -- the user's own generator: its yields stay its own
      local gen = coroutine.wrap(function()
        for i = 1, 3 do
          coroutine.yield(zutil.uncompress(zutil.compress(("%d"):format(i)),
                                           1))
        end
      end)
      assert.same({"1", "2", "3"}, {gen(), gen(), gen()})
      -- a slow call in the comparator: a ticker keeps running meanwhile
      local fifo = new_fifo()
      files[#files + 1] = fifo
      local ticks, stop = 0, false
      local ticker = ums.spawn(function()
        while not stop do ticks = ticks + 1; ums.sleep(0.001) end
      end)
      local writer = ums.spawn(function()
        ums.sleep(0.05)
        local fd = open_writer(fifo)
        C.cext_write(fd, "abc", 3)
        C.cext_close(fd)
      end)
      local during
      table.sort({2, 1}, function(a, b)
        local before = ticks
        assert.equal(lua_crc32("abc"), (zutil.crc32_file(fifo)))
        during = ticks - before
        return a < b
      end)
      stop = true
      ticker:join()
      writer:join()
      -- The call could end only because the writer, a task of this
      -- scheduler, ran; the ticker ran too (not a count: the VM is noisy).
      assert.is_true(during >= 1, "the ticker ran " .. during .. " times")
    end)
  end)

  it("an error raised in the continuation reaches pcall and join",
     function()
    local z = zutil.compress(content)
    local want = "zutil.uncompress: the data is larger than size (10 bytes)"
    -- outside a task
    assert.matches(want, errmsg(zutil.uncompress, z, 10), 1, true)
    run(function()
      assert.matches(want, errmsg(zutil.uncompress, z, 10), 1, true)
      local t = ums.spawn(function() return zutil.uncompress(z, 10) end)
      local ok, err, tb = t:join()
      assert.is_false(ok)
      assert.matches(want, err, 1, true)
      assert.matches("stack traceback", tb, 1, true)
      -- the same where Lua cannot yield
      assert.matches(want, errmsg(table.sort, {1, 2}, function()
        return zutil.uncompress(z, 10)
      end), 1, true)
    end)
  end)

  it("an error raised in the continuation of a task nobody joins reaches "
     .. "the error handler", function()
    local z = zutil.compress(content)
    local got
    local prev = debug.getregistry()["ums.on_error"]
    ums.on_error(function(err) got = err end)
    local ok, err = pcall(ums.run, function()
      ums.spawn(function() return zutil.uncompress(z, 10) end)
    end)
    ums.on_error(prev)
    assert.is_true(ok, err)
    assert.matches("the data is larger than size", tostring(got), 1, true)
  end)

  both("bad arguments raise errors naming the function and argument",
       function()
    local cases = {
      {function() zutil.crc32_file() end,
       "bad argument #1 to 'crc32_file' (string expected, got no value)"},
      {function() zutil.crc32_file({}) end,
       "bad argument #1 to 'crc32_file' (string expected, got table)"},
      {function() zutil.crc32_file("a\0b") end,
       "bad argument #1 to 'crc32_file' (path contains a NUL byte)"},
      {function() zutil.crc32_file(file, -1) end,
       "bad argument #2 to 'crc32_file' (timeout must be a non-negative "
         .. "number)"},
      {function() zutil.crc32_file(file, 0 / 0) end,
       "bad argument #2 to 'crc32_file' (timeout must be a non-negative"},
      {function() zutil.crc32_file(file, "soon") end,
       "bad argument #2 to 'crc32_file' (number expected, got string)"},
      {function() zutil.compress(nil) end,
       "bad argument #1 to 'compress' (string expected, got nil)"},
      {function() zutil.compress("x", 10) end,
       "bad argument #2 to 'compress' (level must be -1..9)"},
      {function() zutil.compress("x", 1.5) end,
       "bad argument #2 to 'compress' (number has no integer "
         .. "representation)"},
      {function() zutil.compress("x", nil, -2) end,
       "bad argument #3 to 'compress' (timeout must be a non-negative"},
      {function() zutil.uncompress("x") end,
       "bad argument #2 to 'uncompress' (number expected, got no value)"},
      {function() zutil.uncompress("x", -1) end,
       "bad argument #2 to 'uncompress' (size must be 0..2^30)"},
      {function() zutil.uncompress(true, 1) end,
       "bad argument #1 to 'uncompress' (string expected, got boolean)"},
    }
    for _, case in ipairs(cases) do
      assert.matches(case[2], errmsg(case[1]), 1, true)
    end
    assert.equal(0, zutil.pending())
  end)

  it("refuses a call between ums.park_begin and ums.park_wait", function()
    run(function()
      ums.park_begin(0)
      local msg = errmsg(zutil.crc32_file, file)
      ums.park_wait()
      assert.matches("crc32_file: cannot call between ums.park_begin and "
                     .. "ums.park_wait", msg, 1, true)
      assert.equal(0, zutil.pending())
    end)
  end)

  describe("without ums", function()
    it("the module fails at require, a loaded one at its call", function()
      local reg = debug.getregistry()
      local api = reg[API_KEY]
      assert.equal("userdata", type(api))
      reg[API_KEY] = nil
      package.loaded.zutil = nil
      local ok, err = pcall(require, "zutil")
      local call_err = errmsg(function() zutil.crc32_file(file) end)
      reg[API_KEY] = api
      package.loaded.zutil = zutil
      assert.is_false(ok)
      assert.matches("zutil: ums is not loaded in this Lua state "
                     .. "(require \"ums\" before using this module)",
                     err, 1, true)
      assert.matches("crc32_file: ums is not loaded in this Lua state",
                     call_err, 1, true)
      -- The request of the call that could not start was released.
      assert.equal(0, zutil.pending())
      assert.equal(lua_crc32(content), (zutil.crc32_file(file)))
    end)

    sp.guard(it, pending)("in a fresh interpreter, require fails clearly",
                          function()
      local script = sp.temp(([[
        package.path = %q
        package.cpath = %q
        local ok, err = pcall(require, "zutil")
        assert(not ok)
        io.write(err)
        require "ums"
        local zutil = require "zutil"
        io.write("\nloaded after ums: ", type(zutil.crc32_file))
      ]]):format(package.path, package.cpath), ".lua")
      local r = sp.lua_run({script}, {timeout = 20})
      sp.assert_exit(r, 0)
      assert.matches("zutil: ums is not loaded in this Lua state", r.stdout,
                     1, true)
      assert.matches("loaded after ums: function", r.stdout, 1, true)
    end)
  end)
end)
