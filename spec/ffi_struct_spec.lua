-- Specs for structs passed and returned by value through ums.ffi
-- (lua-binding/lcdecl.c describes them to libffi, lccall.c copies them into
-- a preemptive call's request): libc's div, ldiv, lldiv and inet_ntoa, and
-- a small C library (spec/ffi_testlib.c), whose structs cover each
-- way the x86-64 and AArch64 ABIs pass them (integer registers, SSE
-- registers, both, and memory for a struct larger than 16 bytes), nested
-- structs and arrays inside structs (spec/ffi_testlib.c). Each call is made outside a task
-- (directly), inline in a task and preemptively from several tasks.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")
local ffi = ums.ffi

local DECLS = [[
struct s_pair { int a; int b; };
struct s_mixed { float x; float y; double z; };
struct s_idf { int i; double d; };
struct s_big { long long v[3]; char tag; };
struct s_nested { struct s_pair p; short arr[3]; char c; };
struct s_fa { float f[3]; };
]]

local PROTOS = [[
struct s_pair pair_make(int a, int b);
int pair_sum(struct s_pair p);
struct s_mixed mixed_scale(struct s_mixed m, double k);
struct s_idf idf_next(struct s_idf v);
struct s_big big_add(struct s_big a, struct s_big b);
struct s_nested nested_bump(struct s_nested n);
struct s_fa fa_rev(struct s_fa v);
double spread(struct s_mixed a, int x, struct s_idf b, struct s_big c,
              struct s_pair d);
]]

-- The C test library and an error catcher (spec/ffi_testlib.lua).
local testlib_helper = dofile((debug.getinfo(1, "S").source:match("^@(.*/)")
  or "./") .. "ffi_testlib.lua")
local errmsg = testlib_helper.errmsg

local lib

-- body() outside a task, then as the first task of a run.
local function both(name, body)
  it(name .. " (outside a task)", body)
  it(name .. " (in a task)", function() ums.test(body, 30) end)
end


describe("ums.ffi structs by value", function()
  setup(function()
    ffi.cdef(DECLS)
    ffi.cdef(PROTOS)
    -- The same functions declared inline: called on the scheduler.
    ffi.cdef((PROTOS:gsub("([%w_]+)(%b());", function(name, params)
      return ("%s_inline%s __asm__(\"%s\");"):format(name, params, name)
    end)), {inline = true})
    ffi.cdef[[
typedef struct { int quot; int rem; } div_t;
typedef struct { long quot; long rem; } ldiv_t;
typedef struct { long long quot; long long rem; } lldiv_t;
div_t div(int, int);
ldiv_t ldiv(long, long);
lldiv_t lldiv(long long, long long);
typedef uint32_t in_addr_t;
struct in_addr { in_addr_t s_addr; };
char *inet_ntoa(struct in_addr in);
uint32_t htonl(uint32_t);
]]
    ffi.cdef([[
UMS_INLINE div_t div_inline(int, int) __asm__("div");
UMS_INLINE char *inet_ntoa_inline(struct in_addr in) __asm__("inet_ntoa");
]])
    lib = testlib_helper.open()
  end)

  teardown(function()
    lib = nil
    testlib_helper.close()
  end)

  both("returns libc's div_t, ldiv_t and lldiv_t as new cdata", function()
    local d = ffi.C.div(17, 5)
    assert.is_true(ffi.istype("div_t", d))
    assert.equal(3, d.quot)
    assert.equal(2, d.rem)
    local l = ffi.C.ldiv(-7000000000, 3)
    assert.equal(-2333333333, l.quot)
    assert.equal(-1, l.rem)
    local ll = ffi.C.lldiv(1 << 62, 7)
    assert.equal((1 << 62) // 7, ll.quot)
    assert.equal((1 << 62) % 7, ll.rem)
    local i = ffi.C.div_inline(-9, 4)
    assert.equal(-2, i.quot)
    assert.equal(-1, i.rem)
    -- Each result is its own memory.
    local d2 = ffi.C.div(1, 1)
    assert.equal(3, d.quot)
    assert.equal(1, d2.quot)
  end)

  both("passes struct in_addr to inet_ntoa, as cdata or table", function()
    local a = ffi.new("struct in_addr")
    a.s_addr = ffi.C.htonl(0x7f000001)
    assert.equal("127.0.0.1", ffi.string(ffi.C.inet_ntoa(a)))
    assert.equal("10.1.2.3", ffi.string(ffi.C.inet_ntoa(
      {s_addr = ffi.C.htonl(0x0a010203)})))
    assert.equal("127.0.0.1", ffi.string(ffi.C.inet_ntoa_inline(a)))
  end)

  local function check_all(sfx)
    local p = lib["pair_make" .. sfx](3, 4)
    assert.is_true(ffi.istype("struct s_pair", p))
    assert.same({3, 4}, {p.a, p.b})
    assert.equal(7, lib["pair_sum" .. sfx](p))
    assert.equal(-1, lib["pair_sum" .. sfx]({a = 2, b = -3}))

    local m = lib["mixed_scale" .. sfx]({x = 1.5, y = -2, z = 0.25}, 4)
    assert.same({6, -8, 1}, {m.x, m.y, m.z})

    local v = lib["idf_next" .. sfx]({i = 41, d = 1.25})
    assert.same({42, 1.75}, {v.i, v.d})

    -- 32 bytes: passed and returned in memory.
    local a = ffi.new("struct s_big", {v = {1, 2, 3}, tag = 10})
    local b = ffi.new("struct s_big", {v = {1 << 40, -5, 7}, tag = 20})
    local s = lib["big_add" .. sfx](a, b)
    assert.same({(1 << 40) + 1, -3, 10, 30},
                {s.v[0], s.v[1], s.v[2], s.tag})
    assert.same({1, 2, 3, 10}, {a.v[0], a.v[1], a.v[2], a.tag})

    local n = lib["nested_bump" .. sfx]({p = {a = 1, b = 1},
                                         arr = {1, -2, 300}, c = 64})
    assert.same({2, 0, 2, -4, 600, 65},
                {n.p.a, n.p.b, n.arr[0], n.arr[1], n.arr[2], n.c})

    local r = lib["fa_rev" .. sfx]({f = {0.5, 1.5, 2.5}})
    assert.same({2.5, 1.5, 0.5}, {r.f[0], r.f[1], r.f[2]})

    assert.equal(1 + 2 + 0.5 + 5 + 7 + 0.25 + 100 + 200 + 300 + 1 + 3 + 4,
                 lib["spread" .. sfx]({x = 1, y = 2, z = 0.5}, 5,
                                      {i = 7, d = 0.25},
                                      {v = {100, 200, 300}, tag = 1},
                                      {a = 3, b = 4}))
  end

  both("passes and returns every class of struct", function()
    check_all("")
  end)

  it("inline declarations in a task", function()
    ums.test(function() check_all("_inline") end, 30)
  end)

  it("from 8 tasks at once, preemptively", function()
    ums.test(function()
      local tasks = {}
      for i = 1, 8 do
        tasks[i] = ums.spawn(function()
          for j = 1, 50 do
            local s = lib.big_add({v = {i, j, i * j}, tag = 1},
                                  {v = {j, i, 1}, tag = 2})
            assert.same({i + j, j + i, i * j + 1, 3},
                        {s.v[0], s.v[1], s.v[2], s.tag})
            local d = ffi.C.div(i * 100 + j, 7)
            assert.equal((i * 100 + j) // 7, d.quot)
            check_all("")
          end
          return true
        end)
      end
      for i = 1, 8 do assert.same({true, true}, {tasks[i]:join()}) end
    end, 60)
  end)

  it("names the argument of a mismatched struct", function()
    local e = errmsg(lib.pair_sum, ffi.new("struct s_idf"))
    assert.matches("bad argument #1 to 'pair_sum' %(struct s_pair expected, "
                   .. "got ums.ffi.cdata%)", e)
    e = errmsg(lib.pair_sum, 5)
    assert.matches("bad argument #1 to 'pair_sum' %(struct s_pair expected, "
                   .. "got number%)", e)
    e = errmsg(lib.spread, {}, 1, {}, {v = {1, 2, 3, 4}}, {})
    assert.matches("bad argument #4 to 'spread' %(4 values for "
                   .. "int64_t%[3%]%)", e)
    e = errmsg(lib.pair_sum, {a = 1, c = 2})
    assert.matches("bad argument #1 to 'pair_sum'.*no field 'c'", e)
  end)

  it("refuses what libffi cannot pass by value, naming the line", function()
    local e = errmsg(ffi.cdef, [[
union s_u { int i; float f; };
int takes_union(union s_u u);
]])
    assert.matches("line 2: union passed by value is not supported", e)
    e = errmsg(ffi.cdef, [[
struct s_anon_m { char c; struct { char d; int e; }; };
int takes_anon(struct s_anon_m u);
]])
    assert.matches("line 2: struct with anonymous or overlapping", e)
    e = errmsg(ffi.cdef, [[
struct s_fwd;
struct s_fwd make_fwd(void);
]])
    assert.matches("line 2: struct passed by value is incomplete", e)
    e = errmsg(ffi.cdef, "struct s_empty {}; int takes_empty(struct s_empty);")
    assert.matches("empty struct passed by value", e)
  end)
end)
