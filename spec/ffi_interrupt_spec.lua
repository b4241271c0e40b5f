-- Specs for interruptible ums.ffi calls (UMS_INTERRUPTIBLE, or cdef's
-- {interruptible = true}): a task that gives up on such a call (timeout,
-- cancel) interrupts the pool thread's system call, so the thread comes
-- back at once; a call not marked keeps running detached. Each case runs
-- on a C-call pool of one thread, so a second call completes only if the
-- first one let the thread go.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")
local ffi = ums.ffi
local C = ffi.C

ffi.cdef[[
int pipe(int fds[2]);
int close(int fd);
ssize_t write(int fd, const void *buf, size_t n);
ssize_t read(int fd, void *buf, size_t n);
UMS_INTERRUPTIBLE ssize_t read_intr(int fd, void *buf, size_t n)
  __asm__("read");
int getpid(void);
UMS_INLINE ssize_t write_inline(int fd, const void *buf, size_t n)
  __asm__("write");
]]
ffi.cdef([[ ssize_t read_intr2(int fd, void *buf, size_t n)
              __asm__("read"); ]], {interruptible = true})

local function errmsg(f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected an error")
  return tostring(err)
end

local function pipe()
  local fds = ffi.new("int[2]")
  assert.equal(0, C.pipe(fds))
  return fds[0], fds[1]
end

-- Whether the pool's one thread takes a new call within 10 seconds.
local function pool_free()
  local r = ffi.timeout(C.getpid, 10)()
  return r ~= nil
end

describe("ums.ffi interruptible calls", function()
  before_each(function() ums.config{preempt_threads = 1} end)
  after_each(function() ums.config{preempt_threads = 0} end)

  it("a timed-out read of an empty pipe frees its pool thread", function()
    ums.test(function()
      local r, w = pipe()
      local buf = ffi.new("char[8]")
      for _, read in ipairs{C.read_intr, C.read_intr2} do
        local a, b = ffi.timeout(read, 0.05)(r, buf, 8)
        assert.is_nil(a)
        assert.equal("timeout", b)
        assert.is_true(pool_free())
      end
      -- Nothing was read: a later reader gets what is written.
      assert.equal(3, C.write(w, "abc", 3))
      assert.equal(3, C.read(r, buf, 8))
      assert.equal("abc", ffi.string(buf, 3))
      C.close(r)
      C.close(w)
    end, 60)
  end)

  it("cancelling the task frees its pool thread", function()
    ums.test(function()
      local r, w = pipe()
      local started = false
      local reader = ums.spawn(function()
        started = true
        C.read_intr(r, ffi.new("char[8]"), 8)
        error("not reached")
      end)
      while not started do ums.yield() end
      ums.sleep(0.02)
      assert.is_true(reader:cancel())
      assert.is_false(reader:join(5))
      assert.is_true(pool_free())
      C.close(r)
      C.close(w)
    end, 60)
  end)

  it("a call not marked keeps running detached", function()
    ums.test(function()
      local r, w = pipe()
      local buf = ffi.new("char[8]")
      assert.is_nil(ffi.timeout(C.read, 0.05)(r, buf, 8))
      -- The one thread is still in that read: a new call waits for it.
      assert.is_nil(ffi.timeout(C.getpid, 0.1)())
      -- Inline: a preemptive write would queue behind that read.
      assert.equal(1, C.write_inline(w, "x", 1))
      assert.is_true(pool_free())
      C.close(r)
      C.close(w)
    end, 60)
  end)

  it("refuses an inline interruptible declaration", function()
    assert.matches("line 1: an inline call cannot be interruptible",
                   errmsg(ffi.cdef,
                          "UMS_INLINE UMS_INTERRUPTIBLE int f_x(void);"))
    assert.matches("bad argument #2 to 'ums.ffi.cdef' %(an inline call cannot be "
                   .. "interruptible%)",
                   errmsg(ffi.cdef, "int f_y(void);",
                          {inline = true, interruptible = true}))
  end)
end)
