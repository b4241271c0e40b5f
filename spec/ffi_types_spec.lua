-- Specs for ums.ffi's C types (lua-binding/lcdecl.c): struct, union,
-- enum, typedef, arrays, pointers and function pointers declared with
-- ffi.cdef, and their layout (ffi.sizeof, ffi.alignof, ffi.offsetof)
-- checked against the C compiler's for the same declarations, including
-- glibc's own headers pasted as the preprocessor gives them.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")
local ffi = ums.ffi

-- Declarations shared by the C program and cdef. The program prints each
-- type's size and alignment and each field's offset, compiled by cc.
local DECLS = [[
struct t_small { char c; int i; short s; };
struct t_nested { char tag; struct t_small inner; double d; char tail; };
struct t_arrays { char name[13]; int grid[3][4]; long long ll; char end; };
union t_union { char c; int i; double d; char bytes[11]; };
struct t_ptrs { char **argv; void *p; struct t_ptrs *next; const char *s; };
typedef int (*t_cmp)(const void *, const void *);
struct t_fp { t_cmp cmp; void (*cb)(int, void *); char c; };
typedef struct { unsigned char r, g, b; } t_rgb;
struct t_anon { int kind; union { int i; double d; }; char c; };
enum t_color { T_RED, T_GREEN = 5, T_BLUE, T_MASK = 1 << 4 | 3 };
struct t_enum { char c; enum t_color color; };
struct t_flex { int n; char data[]; };
typedef unsigned long t_size;
struct t_typedefs { t_size n; t_rgb rgb; t_size m; };
]]

local LAYOUT = {
  {"struct t_small", "c", "i", "s"},
  {"struct t_nested", "tag", "inner", "d", "tail"},
  {"struct t_arrays", "name", "grid", "ll", "end"},
  {"union t_union", "c", "i", "d", "bytes"},
  {"struct t_ptrs", "argv", "p", "next", "s"},
  {"struct t_fp", "cmp", "cb", "c"},
  {"t_rgb", "r", "g", "b"},
  {"struct t_anon", "kind", "i", "d", "c"},
  {"struct t_enum", "c", "color"},
  {"struct t_flex", "n", "data"},
  {"struct t_typedefs", "n", "rgb", "m"},
  {"struct timespec", "tv_sec", "tv_nsec"},
  {"struct stat", "st_dev", "st_ino", "st_mode", "st_nlink", "st_uid",
   "st_size", "st_blksize", "st_blocks", "st_atim", "st_mtim", "st_ctim"},
  {"struct tm", "tm_sec", "tm_min", "tm_year", "tm_isdst", "tm_gmtoff",
   "tm_zone"},
}

local function sh(cmd)
  -- The compiler runs without the sanitizer preload of the test's Lua.
  local p = assert(io.popen("env -u LD_PRELOAD " .. cmd .. " 2>&1"))
  local out = p:read("a")
  local ok = p:close()
  return ok, out
end

local function tmpname(ext)
  local n = os.tmpname()
  os.remove(n)
  return n .. ext
end

-- What cc says, as "type size align" and "type.field offset" lines.
local function compiler_layout()
  local src, exe = tmpname(".c"), tmpname(".bin")
  local lines = {"#include <stdio.h>", "#include <stddef.h>",
                 "#include <sys/stat.h>", "#include <time.h>", DECLS,
                 "int main(void) {"}
  for _, t in ipairs(LAYOUT) do
    lines[#lines + 1] = ('printf("%s %%zu %%zu\\n", sizeof(%s), '
      .. '_Alignof(%s));'):format(t[1], t[1], t[1])
    for i = 2, #t do
      lines[#lines + 1] = ('printf("%s.%s %%zu\\n", offsetof(%s, %s));')
        :format(t[1], t[i], t[1], t[i])
    end
  end
  lines[#lines + 1] = 'printf("T_BLUE %d\\nT_MASK %d\\n", T_BLUE, T_MASK);'
  lines[#lines + 1] = "return 0; }"
  local f = assert(io.open(src, "w"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  local ok, out = sh(("cc -std=gnu11 -o %s %s"):format(exe, src))
  os.remove(src)
  assert(ok, out)
  local ran, printed = sh(exe)
  os.remove(exe)
  assert(ran, printed)
  return printed
end

-- What ums.ffi says, in the same form.
local function ffi_layout()
  local out = {}
  for _, t in ipairs(LAYOUT) do
    out[#out + 1] = ("%s %d %d"):format(t[1], ffi.sizeof(t[1]),
                                         ffi.alignof(t[1]))
    for i = 2, #t do
      out[#out + 1] = ("%s.%s %d"):format(t[1], t[i], ffi.offsetof(t[1], t[i]))
    end
  end
  out[#out + 1] = ("T_BLUE %d"):format(ffi.C.T_BLUE)
  out[#out + 1] = ("T_MASK %d"):format(ffi.C.T_MASK)
  return table.concat(out, "\n") .. "\n"
end

describe("ums.ffi types", function()
  setup(function()
    -- glibc's declarations exactly as the preprocessor gives them: what a
    -- user pastes from a header.
    local ok, pp = sh("printf '#include <sys/stat.h>\\n#include <time.h>\\n'"
                      .. " | cc -E -P -")
    assert(ok, pp)
    ffi.cdef(pp)
    ffi.cdef(DECLS)
  end)

  it("lays structs out as the C compiler does", function()
    assert.equal(compiler_layout(), ffi_layout())
  end)

  it("typeof names types and accepts a ctype", function()
    local t = ffi.typeof("struct t_small *[2]")
    assert.equal("ctype<struct t_small *[2]>", tostring(t))
    assert.equal(2 * ffi.sizeof("void *"), ffi.sizeof(t))
    assert.equal(12, ffi.sizeof(ffi.typeof("struct t_small")))
    assert.equal(ffi.sizeof("void *"), ffi.sizeof("t_cmp"))
  end)

  it("sizes arrays, variable-length arrays and incomplete types", function()
    assert.equal(16, ffi.sizeof("int[4]"))
    assert.equal(48, ffi.sizeof("int[3][4]"))
    assert.equal(10, ffi.sizeof("char[?]", 10))
    assert.equal(40, ffi.sizeof("struct t_small[?]", 3) + 4)
    ffi.cdef("typedef struct t_opaque t_opaque;")
    assert.is_nil(ffi.sizeof("t_opaque"))
    assert.is_nil(ffi.sizeof("void"))
    assert.equal(ffi.sizeof("void *"), ffi.sizeof("t_opaque **"))
  end)

  it("reads enum constants through ffi.C", function()
    assert.equal(0, ffi.C.T_RED)
    assert.equal(6, ffi.C.T_BLUE)
    assert.equal(4, ffi.sizeof("enum t_color"))
    ffi.cdef("enum { T_DERIVED = T_MASK * 2 - (T_GREEN % 3) };")
    assert.equal(36, ffi.C.T_DERIVED)
  end)

  it("completes a forward declaration in place", function()
    ffi.cdef[[
      struct t_list;
      struct t_holder { struct t_list *head; };
      struct t_list { struct t_list *next; int v[2]; };
    ]]
    assert.equal(16, ffi.sizeof("struct t_list"))
    assert.equal(8, ffi.offsetof("struct t_list", "v"))
  end)

  it("binds functions using declared types", function()
    ffi.cdef[[
      typedef int t_clockid;
      int clock_gettime(t_clockid clk, struct timespec *tp)
        __attribute__((__nothrow__));
    ]]
    local buf = ffi.buffer(ffi.sizeof("struct timespec"))
    assert.equal(0, ffi.C.clock_gettime(1, buf))
  end)

  it("a type name means what the latest cdef says", function()
    ffi.cdef("typedef int t_redef;")
    assert.equal(4, ffi.sizeof("t_redef"))
    ffi.cdef("typedef long long t_redef;")
    assert.equal(8, ffi.sizeof("t_redef"))
  end)

  it("makes a type name's types once, however often it is used", function()
    -- Types live as long as the VM: a loop must not make new ones.
    for _ = 1, 10 do ffi.new("struct t_small *[1]") end
    collectgarbage()
    collectgarbage()
    local before = collectgarbage("count")
    for _ = 1, 20000 do
      ffi.typeof("struct t_small *[1]")
      ffi.sizeof("char[?]", 16)
    end
    collectgarbage()
    collectgarbage()
    -- Each new ctype would take a few hundred bytes: 20,000 of them
    -- several MB. The bound is generous.
    assert.is_true(collectgarbage("count") - before < 1024,
                   "grew by " .. (collectgarbage("count") - before) .. " KB")
  end)

  it("raises naming the argument or the line for bad input", function()
    local cases = {
      {ffi.sizeof, {"struct t_undeclared"}, "bad argument #1 to "
       .. "'ums.ffi.sizeof' (undeclared type"},
      {ffi.sizeof, {"int int"}, "invalid combination"},
      {ffi.sizeof, {42}, "C type name, ctype or cdata expected"},
      {ffi.sizeof, {"char[?]"}, "bad argument #2"},
      {ffi.sizeof, {"char[?]", -1}, "element count out of range"},
      {ffi.offsetof, {"struct t_small", "nope"},
       "bad argument #2 to 'ums.ffi.offsetof' ('struct t_small' has no "
       .. "field 'nope')"},
      {ffi.offsetof, {"int", "x"}, "'int32_t' is not a struct or union"},
      {ffi.offsetof, {"t_opaque", "x"}, "is incomplete"},
      {ffi.typeof, {"struct t_small x y"}, "type name expected"},
      {ffi.typeof, {"enum { A1 }"}, "declare it with cdef"},
      {ffi.cdef, {"struct t_small { int again; };"}, "redefinition"},
      {ffi.cdef, {"union t_small *f(void);"}, "different kind of tag"},
      {ffi.cdef, {"struct q { int a; int a; };"}, "duplicate field"},
      {ffi.cdef, {"struct q { int f(void); };"}, "cannot be a function"},
      {ffi.cdef, {"enum { T_RED };"}, "redefinition of a constant"},
      {ffi.cdef, {"enum { Q = 1 / 0 };"}, "division by zero"},
      {ffi.cdef, {"int a[99999999999999999999];"}, "bad integer constant"},
      {ffi.cdef, {"struct q { char c[1099511627776][1099511627776]; };"},
       "too large"},
      {ffi.cdef, {"union t_union f(void);"},
       "union passed by value is not supported"},
      {ffi.cdef, {"struct q { char c; int i; } __attribute__((packed));"},
       "attribute changes layout"},
    }
    for _, c in ipairs(cases) do
      local ok, e = pcall(c[1], table.unpack(c[2]))
      assert.is_false(ok)
      assert.matches(c[3], e, 1, true)
    end
    -- A malformed chunk declares none of its types or constants.
    assert.is_false(pcall(ffi.cdef, "struct t_half { int a; }; "
                                    .. "enum { T_HALF }; int ("))
    assert.is_false(pcall(ffi.sizeof, "struct t_half"))
    assert.matches("missing declaration",
                   select(2, pcall(function() return ffi.C.T_HALF end)))
  end)
end)
