-- Specs for ums.ffi cdata (lua-binding/lcdata.c): ffi.new and field and
-- index access, ffi.copy/fill/string/istype, and cdata passed to calls as
-- out-parameters (struct timespec to clock_gettime, sqlite3 *[1] to
-- sqlite3_open), preemptively from several tasks while a ticker runs, and
-- kept alive by a call its task gave up on.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")
local ffi = ums.ffi
local C = ffi.C

local SYS_gettid = 186 -- x86-64
local CLOCK_MONOTONIC = 1

ffi.cdef[[
typedef long time_t;
struct timespec { time_t tv_sec; long tv_nsec; };
int clock_gettime(int clk, struct timespec *tp);
struct c_pt { int x, y; };
struct c_box { struct c_pt a, b; char name[8]; uint8_t flags; double d;
               struct c_pt *link; };
struct c_node { int v; struct c_node *next; void *data; int (*fn)(int); };
typedef struct sqlite3 sqlite3;
int pipe(int fds[2]);
ssize_t read(int fd, void *buf, size_t n);
int close(int fd);
long syscall(long number, ...);
UMS_INLINE ssize_t c_write_inline(int fd, const void *buf, size_t n)
  __asm__("write");
void *malloc(size_t n);
void free(void *p);
]]

local function run(body, limit)
  return ums.test(body, limit or 30)
end

local function errmsg(f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok, "expected an error")
  return tostring(err)
end

-- sqlite3 is a dependency of Debian's base tools; the spec says when it
-- is not there rather than failing.
local sqlite_ok, sqlite = pcall(ffi.load, "sqlite3")
if sqlite_ok then
  ffi.cdef[[
    int sqlite3_open(const char *filename, sqlite3 **ppDb);
    int sqlite3_close(sqlite3 *);
    const char *sqlite3_libversion(void);
    int sqlite3_exec(sqlite3 *, const char *sql, void *callback, void *arg,
                     char **errmsg);
  ]]
end

describe("ums.ffi cdata", function()
  it("ffi.new zero-fills and takes an initializer", function()
    local b = ffi.new("struct c_box")
    assert.equal(0, b.a.x)
    assert.equal(0, b.d)
    assert.is_nil(b.link)
    assert.equal(ffi.sizeof("struct c_box"), ffi.sizeof(b))
    assert.equal("ctype<struct c_box>", tostring(ffi.typeof(b)))
    b = ffi.new("struct c_box", {a = {x = 1, y = -2}, name = "box",
                                 flags = 255, d = 0.5})
    assert.same({1, -2, 0, "box", 255, 0.5},
                {b.a.x, b.a.y, b.b.x, ffi.string(b.name), b.flags, b.d})
    local a = ffi.new("int[4]", {1, 2, 3})
    assert.same({1, 2, 3, 0}, {a[0], a[1], a[2], a[3]})
    assert.equal(4, #a)
    local v = ffi.new("double[?]", 3, {1.5})
    assert.equal(3, #v)
    assert.equal(24, ffi.sizeof(v))
    assert.equal(1.5, v[0])
  end)

  it("reads and writes fields and elements", function()
    local b = ffi.new("struct c_box")
    b.a.x = 7
    b.b = {x = 3, y = 4}
    b.flags = 200
    b.name[0] = 65
    assert.same({7, 3, 4, 200, "A"},
                {b.a.x, b.b.x, b.b.y, b.flags, ffi.string(b.name)})
    -- A field cdata shares its parent's memory and keeps it alive.
    local inner = b.b
    inner.y = 40
    assert.equal(40, b.b.y)
    b = nil -- luacheck: ignore
    collectgarbage()
    collectgarbage()
    assert.equal(40, inner.y)
    -- Pointers: a stored cdata's address, read back as a pointer.
    local p = ffi.new("struct c_pt")
    local box = ffi.new("struct c_box", {link = p})
    assert.is_not_nil(box.link)
    box.link = nil
    assert.is_nil(box.link)
    -- A struct copied from a cdata of its type.
    local q = ffi.new("struct c_pt", {x = 9})
    box.a = q
    assert.equal(9, box.a.x)
  end)

  it("copy, fill, string and istype", function()
    local c = ffi.new("char[8]")
    ffi.copy(c, "abc")
    assert.equal("abc", ffi.string(c))
    assert.equal("ab", ffi.string(c, 2))
    ffi.fill(c, 8, 0x41)
    assert.equal("AAAAAAAA", ffi.string(c))
    local d = ffi.new("char[8]")
    ffi.copy(d, c, 4)
    assert.equal("AAAA", ffi.string(d))
    local buf = ffi.buffer(4)
    ffi.copy(buf, "xyz")
    assert.equal("xyz", ffi.string(buf))
    assert.is_true(ffi.istype("char[8]", c))
    assert.is_true(ffi.istype(ffi.typeof(c), d))
    assert.is_false(ffi.istype("int[2]", c))
    assert.is_false(ffi.istype("int", 1))
  end)

  it("reads a pointer to a declared type as a typed pointer, as LuaJIT",
     function()
    -- A list walked the LuaJIT way, with no cast: n.next.v.
    local nodes = ffi.new("struct c_node[3]", {{v = 1}, {v = 2}, {v = 3}})
    local a, b, c = nodes[0], nodes[1], nodes[2]
    a.next, b.next = b, c
    local seen, n = {}, a
    while n do
      seen[#seen + 1] = n.v
      n = n.next
    end
    assert.same({1, 2, 3}, seen)
    assert.is_true(ffi.istype("struct c_node *", a.next))
    assert.equal(3, a.next.next.v)
    assert.equal(2, a.next[0].v)
    -- Reads of one pointer are equal, and equal the cdata they point to.
    assert.is_true(a.next == a.next)
    assert.is_true(a.next == b)
    assert.is_false(a.next == c)
    -- NULL is nil; void and function pointers stay ums.ffi.pointer.
    assert.is_nil(c.next)
    c.data = a
    assert.matches("^ums%.ffi%.pointer: ", tostring(c.data))
    assert.is_true(c.data == a)
    -- An element of an array of pointers reads the same way.
    local arr = ffi.new("struct c_node *[2]")
    arr[0] = b
    assert.equal(2, arr[0].v)
    assert.is_nil(arr[1])
    assert.matches("has no field 'nope'",
                   errmsg(function() return a.next.nope end), 1, true)
  end)

  it("cast makes typed pointers and converts numbers", function()
    local arr = ffi.new("struct c_pt[3]", {{x = 1}, {x = 2}, {x = 3, y = 4}})
    local p = ffi.cast("struct c_pt *", arr)
    assert.same({1, 2, 3, 4}, {p.x, p[1].x, p[2].x, p[2].y})
    p[1].y = 20
    assert.equal(20, arr[1].y)
    -- A pointer into a cdata is bounded by that cdata's memory.
    assert.matches("out of bounds", errmsg(function() return p[3].x end),
                   1, true)
    assert.matches("out of bounds", errmsg(function() return p[-1].x end),
                   1, true)
    -- It keeps that memory alive.
    arr = nil -- luacheck: ignore
    collectgarbage()
    collectgarbage()
    assert.equal(4, p[2].y)
    assert.equal(44, ffi.cast("uint8_t", 300))
    assert.equal(-1, ffi.cast("int8_t", 255))
    assert.equal(2, ffi.cast("int", 2.9))
    assert.is_true(ffi.cast("bool", 7))
    assert.is_true(ffi.cast("uintptr_t", p) ~= 0)
    local null = ffi.cast("struct c_pt *", nil)
    assert.matches("NULL struct c_pt * dereferenced",
                   errmsg(function() return null.x end), 1, true)
    assert.matches("cannot cast to struct c_pt",
                   errmsg(ffi.cast, "struct c_pt", 1), 1, true)
    assert.matches("incomplete target",
                   errmsg(function() return ffi.cast("sqlite3 *", 8)[0] end),
                   1, true)
  end)

  it("gc runs a finalizer when the cdata is collected", function()
    local freed = 0
    do
      local m = ffi.gc(ffi.cast("struct c_pt *", C.malloc(8)), function(c)
        freed = freed + 1
        C.free(c)
      end)
      m.x = 5
      assert.equal(5, m.x)
    end
    collectgarbage()
    collectgarbage()
    assert.equal(1, freed)
    -- nil removes the finalizer.
    local n = ffi.gc(ffi.new("int[1]"), function() freed = freed + 1 end)
    ffi.gc(n, nil)
    n = nil -- luacheck: ignore
    collectgarbage()
    collectgarbage()
    assert.equal(1, freed)
    assert.matches("bad argument #2", errmsg(ffi.gc, ffi.new("int[1]"), 5),
                   1, true)
  end)

  it("raises for bad input, never crashes", function()
    local a = ffi.new("int[4]")
    local p = ffi.new("struct c_pt")
    local cases = {
      {function() return a[4] end, "index 4 out of bounds for int32_t[4]"},
      {function() return a[-1] end, "index -1 out of bounds"},
      {function() return a.x end, "index of int32_t[4] must be an integer"},
      {function() a[0] = 1 << 40 end, "out of range for int32_t"},
      {function() a[0] = "1" end, "number expected, got string"},
      {function() a[0] = 1.5 end, "no integer representation"},
      {function() return p.z end, "'struct c_pt' has no field 'z'"},
      {function() p.z = 1 end, "'struct c_pt' has no field 'z'"},
      {function() p.x = {} end, "number expected, got table"},
      {function() return ffi.new("struct c_pt", {z = 1}) end,
       "bad argument #2 to 'ums.ffi.new' ('struct c_pt' has no field 'z')"},
      {function() return ffi.new("int[2]", {1, 2, 3}) end,
       "3 values for int32_t[2]"},
      {function() return ffi.new("char[2]", "abc") end, "longer than"},
      {function() return ffi.new("sqlite3") end, "'struct sqlite3' is "
       .. "incomplete"},
      {function() return ffi.new("char[?]") end, "bad argument #2"},
      {function() return ffi.new("char[?]", -1) end, "out of range"},
      {function() return ffi.new("char[?]", 1 << 40) end, "out of range"},
      {function() return ffi.new("struct c_nope") end, "undeclared type"},
      {function() return ffi.new("void") end, "incomplete"},
      {function() ffi.copy(a, "0123456789abcdefXYZ") end,
       "beyond the end of the destination"},
      {function() ffi.copy(a, "x", 99) end, "beyond the end of the source"},
      {function() ffi.fill(a, 17) end, "beyond the end of the destination"},
      {function() ffi.fill(a, -1) end, "must not be negative"},
      {function() return ffi.string(a, 17) end, "beyond the end"},
      {function() return ffi.string(42) end, "cdata expected"},
      {function() return #p end, "length of a cdata of type struct c_pt"},
      {function() return C.clock_gettime(CLOCK_MONOTONIC, 5) end,
       "bad argument #2 to 'clock_gettime'"},
    }
    for _, c in ipairs(cases) do
      assert.matches(c[2], errmsg(c[1]), 1, true)
    end
  end)

  it("passes a struct pointer out-parameter (clock_gettime)", function()
    local ts = ffi.new("struct timespec")
    assert.equal(0, C.clock_gettime(CLOCK_MONOTONIC, ts))
    assert.is_true(ts.tv_sec > 0 or ts.tv_nsec > 0)
    assert.is_true(ts.tv_nsec >= 0 and ts.tv_nsec < 1000000000)
  end)

  it("calls preemptively from several tasks while a ticker ticks", function()
    run(function()
      local ticks, done = 0, false
      local ticker = ums.spawn(function()
        while not done do
          ticks = ticks + 1
          ums.sleep(0.001)
        end
      end)
      local tasks = {}
      for i = 1, 8 do
        tasks[i] = ums.spawn(function()
          local last = 0
          for _ = 1, 20 do
            local ts = ffi.new("struct timespec")
            assert.equal(0, C.clock_gettime(CLOCK_MONOTONIC, ts))
            local now = ts.tv_sec * 1000000000 + ts.tv_nsec
            assert.is_true(now >= last)
            last = now
            if sqlite_ok then
              local db = ffi.new("sqlite3 *[1]")
              assert.equal(0, sqlite.sqlite3_open(":memory:", db))
              assert.is_not_nil(db[0])
              assert.equal(0, sqlite.sqlite3_exec(db[0],
                "create table t(x); insert into t values (1);", nil, nil,
                nil))
              assert.equal(0, sqlite.sqlite3_close(db[0]))
              assert.matches("^3%.", sqlite.sqlite3_libversion())
            end
          end
        end)
      end
      for _, t in ipairs(tasks) do assert.is_true(t:join(20)) end
      done = true
      assert.is_true(ticker:join(5))
      assert.is_true(ticks > 0)
    end)
  end)

  describe("held by a call its task gave up on", function()
    before_each(function() ums.config{preempt_threads = 1} end)
    after_each(function() ums.config{preempt_threads = 0} end)

    it("stays allocated until the call returns", function()
      run(function()
        local fds = ffi.new("int[2]")
        assert.equal(0, C.pipe(fds))
        local r, w = fds[0], fds[1]
        local tid = C.syscall(SYS_gettid)
        local started = false
        local reader = ums.spawn(function()
          local box = ffi.new("struct c_box")
          started = true
          C.read(r, box.name, 8)
          error("not reached")
        end)
        while not started do ums.yield() end
        ums.sleep(0.02)
        assert.is_true(reader:cancel())
        assert.is_false(reader:join(5))
        reader = nil -- luacheck: ignore
        collectgarbage()
        collectgarbage()
        -- The detached read writes into the cdata's memory now: it must
        -- still be allocated (ASan checks).
        assert.equal(8, C.c_write_inline(w, "12345678", 8))
        -- The pool's one thread is free again once that read ended.
        assert.equal(tid, C.syscall(SYS_gettid))
        C.close(r)
        C.close(w)
      end)
    end)
  end)
end)
