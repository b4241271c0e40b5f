-- Specs for ums.ffi callbacks (lua-binding/lccb.c): Lua functions passed
-- where a declaration has a function pointer (libc's qsort and bsearch,
-- and a small C library, spec/ffi_testlib.c), callback objects
-- made by ffi.cast with :set and :free, errors raised inside a callback
-- (kept until the C function returned, then raised), and the refusal of a
-- callback by a call that would run on a pool thread.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")
local ffi = ums.ffi
local C = ffi.C

ffi.cdef[[
typedef int (*cmp_fn)(const void *, const void *);
UMS_INLINE void qsort(void *base, size_t n, size_t size,
                      int (*compar)(const void *, const void *));
UMS_INLINE void *bsearch(const void *key, const void *base, size_t n,
                         size_t size, cmp_fn compar);
void qsort_pool(void *base, size_t n, size_t size, cmp_fn compar)
  __asm__("qsort");
]]

-- The C test library and an error catcher (spec/ffi_testlib.lua).
local testlib_helper = dofile((debug.getinfo(1, "S").source:match("^@(.*/)")
  or "./") .. "ffi_testlib.lua")
local errmsg = testlib_helper.errmsg

local function ints(t)
  return ffi.new("int[?]", #t, t)
end

local function totable(a, n)
  local t = {}
  for i = 0, n - 1 do t[#t + 1] = a[i] end
  return t
end

local function asc(a, b)
  local x, y = ffi.cast("int *", a)[0], ffi.cast("int *", b)[0]
  return x < y and -1 or x > y and 1 or 0
end


local lib

-- body() outside a task, then as the first task of a run.
local function both(name, body)
  it(name .. " (outside a task)", body)
  it(name .. " (in a task)", function() ums.test(body, 30) end)
end


describe("ums.ffi callbacks", function()
  setup(function()
    ffi.cdef[[
struct ops {
  double (*scale)(double, float);
  int (*pick)(signed char, _Bool, unsigned short);
  const char *(*name)(const char *);
  void (*note)(int);
};
UMS_INLINE double ops_run(const struct ops *o, double x);
UMS_INLINE int call_int(int (*f)(int), int x);
double ops_run_pool(const struct ops *o, double x) __asm__("ops_run");
]]
    lib = testlib_helper.open()
  end)

  teardown(function()
    lib = nil
    testlib_helper.close()
  end)

  both("qsort and bsearch take a Lua comparator", function()
    local a = ints{5, -1, 9, 3, 3, 0, 42, -7}
    C.qsort(a, 8, ffi.sizeof("int"), asc)
    assert.same({-7, -1, 0, 3, 3, 5, 9, 42}, totable(a, 8))
    C.qsort(a, 8, 4, function(x, y) return -asc(x, y) end)
    assert.same({42, 9, 5, 3, 3, 0, -1, -7}, totable(a, 8))
    C.qsort(a, 8, 4, asc)
    local key = ffi.new("int[1]", {9})
    local hit = C.bsearch(key, a, 8, 4, asc)
    assert.is_not_nil(hit)
    assert.equal(9, ffi.cast("int *", hit)[0])
    key[0] = 4
    assert.is_nil(C.bsearch(key, a, 8, 4, asc))
  end)

  both("ffi.cast makes a callback object with :set and :free", function()
    local cb = ffi.cast("int (*)(const void *, const void *)", asc)
    assert.matches("^ums.ffi.callback", tostring(cb))
    local a = ints{3, 1, 2}
    C.qsort(a, 3, 4, cb)
    assert.same({1, 2, 3}, totable(a, 3))
    cb:set(function(x, y) return asc(y, x) end)
    C.qsort(a, 3, 4, cb)
    assert.same({3, 2, 1}, totable(a, 3))
    local typed = ffi.cast("cmp_fn", asc)
    C.qsort(a, 3, 4, typed)
    assert.same({1, 2, 3}, totable(a, 3))
    typed:free()
    cb:free()
    assert.matches("use of a freed callback", errmsg(C.qsort, a, 3, 4, cb))
    assert.matches("use of a freed callback", errmsg(cb.free, cb))
    assert.matches("freed", tostring(cb))
  end)

  both("callbacks of every scalar class, stored in a struct", function()
    local seen = {}
    local scale = ffi.cast("double (*)(double, float)", function(x, f)
      return x * f
    end)
    local ops = ffi.new("struct ops")
    ops.scale = scale
    ops.pick = ffi.cast("int (*)(signed char, _Bool, unsigned short)",
      function(c, b, u)
        seen.pick = {c, b, u}
        return 100
      end)
    ops.name = ffi.cast("const char *(*)(const char *)", function(s)
      seen.name = s
      return nil
    end)
    ops.note = ffi.cast("void (*)(int)", function(n) seen.note = n end)
    assert.equal(10 * 0.5 + 100, lib.ops_run(ops, 10))
    assert.same({-3, true, 65535}, seen.pick)
    assert.equal("abc", seen.name)
    assert.equal(7, seen.note)
    -- A bare function cannot be stored: nothing would keep it alive.
    assert.matches("callback or nil expected, got function",
                   errmsg(function() ops.note = print end))
  end)

  both("an error in a callback is raised after C returned", function()
    local calls = 0
    local a = ints{4, 3, 2, 1, 0}
    local e = errmsg(C.qsort, a, 5, 4, function(x, y)
      calls = calls + 1
      error("comparator failed")
    end)
    assert.matches("comparator failed", e)
    -- The first error stopped Lua for the rest of the call: qsort went on
    -- with zeros.
    assert.equal(1, calls)
    table.sort(totable(a, 5))
    -- Still usable afterwards.
    C.qsort(a, 5, 4, asc)
    assert.same({0, 1, 2, 3, 4}, totable(a, 5))
    -- An error object that is not a string comes back as it was.
    local obj = {}
    local ok, got = pcall(lib.call_int, function() error(obj) end, 1)
    assert.is_false(ok)
    assert.equal(obj, got)
  end)

  both("a bad result raises naming the callback", function()
    assert.matches("bad result from callback 'compar' %(number expected, "
                   .. "got string%)",
                   errmsg(C.qsort, ints{1, 2}, 2, 4, function() return "x" end))
    assert.matches("bad result from callback 'f' %(number 4294967296 out of "
                   .. "range for int32_t%)",
                   errmsg(lib.call_int, function() return 1 << 32 end, 1))
    assert.equal(43, lib.call_int(function(x) return x + 1 end, 42))
  end)

  it("a callback may wait; other tasks make their own inline calls",
     function()
    ums.test(function()
      local other_done = false
      local other = ums.spawn(function()
        local a = ints{3, 2, 1}
        C.qsort(a, 3, 4, function(x, y)
          ums.yield()
          return asc(x, y)
        end)
        assert.same({1, 2, 3}, totable(a, 3))
        other_done = true
      end)
      local a = ints{9, 8, 7, 6, 5, 4}
      C.qsort(a, 6, 4, function(x, y)
        ums.sleep(0.001)
        return asc(x, y)
      end)
      assert.same({4, 5, 6, 7, 8, 9}, totable(a, 6))
      assert.is_true(other:join(10))
      assert.is_true(other_done)
    end, 30)
  end)

  it("a preemptive call refuses callbacks before it starts", function()
    ums.test(function()
      local a = ints{2, 1}
      local e = errmsg(C.qsort_pool, a, 2, 4, asc)
      assert.matches("bad argument #4 to 'qsort_pool' %(a Lua callback "
                     .. "cannot run on a pool thread", e)
      local cb = ffi.cast("cmp_fn", asc)
      e = errmsg(C.qsort_pool, a, 2, 4, cb)
      assert.matches("bad argument #4 to 'qsort_pool' %(a Lua callback", e)
      assert.same({2, 1}, totable(a, 2))
      cb:free()
      -- A callback reached on a pool thread through a struct runs no Lua:
      -- it returns 0.
      local ops = ffi.new("struct ops")
      local ran = false
      ops.scale = ffi.cast("double (*)(double, float)", function()
        ran = true
        return 1
      end)
      ops.pick = ffi.cast("int (*)(signed char, _Bool, unsigned short)",
                          function() ran = true return 1 end)
      assert.equal(0, lib.ops_run_pool(ops, 3))
      assert.is_false(ran)
    end, 30)
    -- Outside a task the same declaration runs directly: allowed.
    local a = ints{2, 1}
    C.qsort_pool(a, 2, 4, asc)
    assert.same({1, 2}, totable(a, 2))
  end)

  it("refuses functions where no callback can go", function()
    ffi.cdef[[
UMS_INLINE void *memchr(const void *s, int c, size_t n);
typedef int (*va_fn)(int, ...);
]]
    assert.matches("bad argument #1 to 'memchr' %(.*not a function pointer",
                   errmsg(C.memchr, asc, 0, 1))
    assert.matches("bad argument #1 to 'ums.ffi.cast' %('int32_t %*' cannot "
                   .. "take a Lua callback",
                   errmsg(ffi.cast, "int *", asc))
    assert.matches("cannot take a Lua callback",
                   errmsg(ffi.cast, "va_fn", asc))
  end)
end)
