-- Specs for ums.fs (lua-binding/lfs.c): files for tasks, following Lua's
-- io. Lua's own io is the oracle wherever it applies: the same reads,
-- writes and seeks are made with io.open and with ums.fs.open on the same
-- file contents, outside a task and inside one, and every return value and
-- the final contents must match.
--
-- ctest runs this file several times (spec/CMakeLists.txt): spec_fs (the
-- backend the runtime picks, io_uring here), spec_fs_pool (UMS_IO=pool),
-- and in the normal build spec_fs_nouring (io_uring_setup fails with
-- ENOSYS under strace: the runtime must fall back to the pool) and
-- spec_fs_eintr (io_uring_enter fails with EINTR every second call: nothing
-- may hang). UMS_FS_EXPECT_BACKEND=uring|pool makes the run check which
-- backend was in force, so a fallback cannot pass by accident.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")
local fs = ums.fs

local pack, unpack = table.pack, table.unpack
local GiB = 1024 * 1024 * 1024

-- /bin/sh cannot start under a TSan preload (spec/subprocess.lua).
local NO_SHELL = (os.getenv("LD_PRELOAD") or ""):find("libtsan", 1, true)

-- ---------------------------------------------------------------------
-- Helpers
-- ---------------------------------------------------------------------

-- with_config(settings, f, ...): f with those ums.config settings.
local with_config = require "with_config"

-- Runs body as the first task of a fresh run (ums.test): the spec fails
-- when body raises, when it or a task it started has not ended after
-- `limit` seconds (15 by default; everything left is then cancelled, so a
-- deadlock fails the spec instead of hanging Busted), or when a task
-- raised and nobody joined it. With a full collection at its end (gc):
-- files a spec drops are closed by their finalizers inside its own run,
-- with its own I/O pool, not in a later spec's.
local function run(body, limit)
  return ums.test(body, {timeout = limit or 15, gc = true})
end

-- Joins t and returns its results; fails if it did not end normally.
local function results(t)
  local r = pack(t:join(10))
  assert(r[1] == true, "task did not end normally: " .. tostring(r[2])
    .. "\n" .. tostring(r[3]))
  return unpack(r, 2, r.n)
end

-- it() twice: the body outside a task, and as a task of a run.
local function both(name, body)
  it(name .. " (outside a task)", body)
  it(name .. " (in a task)", function() run(body) end)
end

-- A fresh temporary directory for the whole file, removed at the end.
local TMP = os.tmpname()
os.remove(TMP)
TMP = TMP .. ".umsfs"
assert(fs.mkdir(TMP, 448))

local seq = 0
local function tmpname(tag)
  seq = seq + 1
  return ("%s/%s%d"):format(TMP, tag or "f", seq)
end

local function rmtree(path)
  local st = fs.stat(path, true)
  if not st then return end
  if st.type == "directory" then
    for name in fs.dir(path) do rmtree(path .. "/" .. name) end
  end
  assert(fs.remove(path))
end

local function put(path, s)
  local f = assert(io.open(path, "wb"))
  assert(f:write(s))
  assert(f:close())
  return path
end

local function get(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- Number of open descriptors of this process.
local function nfds()
  local n = 0
  for _ in fs.dir("/proc/self/fd") do n = n + 1 end
  return n - 1  -- the directory listing's own descriptor is closed by now,
                -- but count it the same way every time
end

-- Descriptors that are anonymous inodes (io_uring rings, eventfds).
local function anon_fds()
  local n = 0
  for name in fs.dir("/proc/self/fd") do
    local st = fs.stat("/proc/self/fd/" .. name)
    if st and st.type == "other" then n = n + 1 end
  end
  return n
end

-- Values a result is compared by: file objects of either library become
-- "<file>", so that io's results and ums.fs's can be compared.
local function norm(v)
  if io.type(v) or fs.type(v) then return "<file>" end
  return v
end

local function packn(...)
  local r = pack(...)
  for i = 1, r.n do r[i] = norm(r[i]) end
  return r
end

-- Describes a packed result for failure messages.
local function show(r)
  local out = {}
  for i = 1, r.n do
    local v = r[i]
    if type(v) == "string" then
      v = #v > 60 and ("%q.. (%d bytes)"):format(v:sub(1, 40), #v)
          or ("%q"):format(v)
    end
    out[i] = tostring(v)
  end
  return "(" .. table.concat(out, ", ") .. ")"
end

local function same_result(want, got, what)
  local ok = want.n == got.n
  for i = 1, want.n do
    local a, b = want[i], got[i]
    if a ~= b and not (a ~= a and b ~= b) then ok = false end
    if math.type(a) ~= math.type(b) then ok = false end
  end
  if not ok then
    error(("%s: io gave %s, ums.fs gave %s"):format(what, show(want),
      show(got)), 2)
  end
end

-- ---------------------------------------------------------------------
-- Which backend is in force
-- ---------------------------------------------------------------------

describe("ums.fs backend", function()
  it("is the one UMS_FS_EXPECT_BACKEND names (if set)", function()
    local outside = anon_fds()
    local inside, said
    run(function()
      inside = anon_fds()
      said = ums.io_backend and ums.io_backend()
    end)
    -- a ring shows as anonymous-inode descriptors (the ring, its eventfd)
    local backend = inside > outside and "uring" or "pool"
    if said then assert.equal(said, backend) end
    local want = os.getenv("UMS_FS_EXPECT_BACKEND")
    if want then assert.equal(want, backend) end
    if os.getenv("UMS_IO") == "pool" then assert.equal("pool", backend) end
  end)
end)

-- ---------------------------------------------------------------------
-- Reading, with io as the oracle
-- ---------------------------------------------------------------------

local function bytes_0_255()
  local t = {}
  for i = 0, 255 do t[#t + 1] = string.char(i) end
  return table.concat(t)
end

local CONTENTS = {
  empty = "",
  no_newline = "hello",
  one_newline = "\n",
  lines = "line1\nline2\n\nline4\n",
  last_unterminated = "a\nbb\nccc",
  crlf = "a\r\nb\r\n\r\nc",
  numbers = "1 2.5 -3 +7 0x1F 0X1p4 1e10 -2.5E-3 .5 5. 0x.8 007 "
    .. "\t\n\v\f\r 42\n99",
  nul_after_digit = "1\0" .. "5 7\0.5 \0" .. "8",
  garbage = "12abc 0x1g 1e 1e+ --1 0x inf nan - + . 1..2 1e+5x",
  huge_number = ("1"):rep(300) .. " 5",
  long_number = ("9"):rep(199) .. " " .. ("9"):rep(201) .. " 3",
  number_at_boundary = (" "):rep(65533) .. "12345.5e2\n7",
  line_at_boundary = ("a"):rep(65535) .. "\nb\n" .. ("c"):rep(65536)
    .. "\n" .. ("d"):rep(65537),
  long_lines = ("x"):rep(70000) .. "\n" .. ("y"):rep(140000)
    .. "\nshort\n" .. ("z"):rep(200000),
  binary = bytes_0_255():rep(300) .. "\0\n\0\r\n\0",
  -- past 1 MiB: read("a") goes from the file buffer to direct chunks
  big = ("0123456789abcde\n"):rep(150000) .. "tail",
}

local FORMATS = {
  {}, {"l"}, {"L"}, {"n"}, {"a"}, {"*l"}, {"*L"}, {"*n"}, {"*a"},
  {1}, {5}, {0, 3}, {"n", "n"}, {"n", "l"}, {"l", "l", "l"},
  {"L", "n", "a"}, {0, "a", 0}, {70000}, {70000, "l"}, {3, "n", 2},
  {"a", "a"}, {"n", 0, "L"}, {65536}, {65537, 1, "L"},
}

local function fmt_name(f)
  local t = {}
  for i, v in ipairs(f) do t[i] = ("%q"):format(v) end
  return "read(" .. table.concat(t, ", ") .. ")"
end

-- Reads the file at path with the formats until the first result is nil
-- (then once more), at most 60 times, then the position and the rest.
local function read_trace(open, path, formats)
  local f = assert(open(path, "rb"))
  local out = {}
  for _ = 1, 60 do
    local r = packn(f:read(unpack(formats)))
    out[#out + 1] = r
    if r[1] == nil then
      out[#out + 1] = packn(f:read(unpack(formats)))
      break
    end
  end
  out[#out + 1] = packn(f:seek())
  out[#out + 1] = packn(f:read("a"))
  out[#out + 1] = packn(f:read(0))
  out[#out + 1] = packn(f:close())
  return out
end

local function compare_traces(a, b, what)
  for i = 1, math.max(#a, #b) do
    same_result(a[i] or {n = 0}, b[i] or {n = 0}, what .. " step " .. i)
  end
end

describe("ums.fs file:read matches io", function()
  local paths = {}
  setup(function()
    for name, s in pairs(CONTENTS) do paths[name] = put(tmpname(name), s) end
  end)

  local function check_all()
    for name in pairs(CONTENTS) do
      for _, formats in ipairs(FORMATS) do
        local what = name .. " " .. fmt_name(formats)
        compare_traces(read_trace(io.open, paths[name], formats),
                       read_trace(fs.open, paths[name], formats), what)
      end
    end
  end

  it("for every format sequence and content (outside a task)", check_all)
  it("for every format sequence and content (in a task)", function()
    run(check_all, 60)
  end)

  both("file:lines and ums.fs.lines give io's lines", function()
    for name in pairs(CONTENTS) do
      for _, formats in ipairs{{}, {"L"}, {"n"}, {1}, {"l", 2}, {70000}} do
        local want, got = {}, {}
        local f = io.open(paths[name], "rb")
        for a, b in f:lines(unpack(formats)) do
          want[#want + 1] = {a, b}
          if #want > 200 then break end
        end
        f:close()
        local g = fs.open(paths[name], "rb")
        for a, b in g:lines(unpack(formats)) do
          got[#got + 1] = {a, b}
          if #got > 200 then break end
        end
        assert.equal("file", fs.type(g))
        g:close()
        assert.same(want, got, name)
        got = {}
        for a, b in fs.lines(paths[name], unpack(formats)) do
          got[#got + 1] = {a, b}
          if #got > 200 then break end
        end
        assert.same(want, got, name)
      end
    end
  end)

  both("ums.fs.readfile gives the whole file", function()
    for name, s in pairs(CONTENTS) do
      assert.equal(s, fs.readfile(paths[name]), name)
    end
  end)

  -- read("a") ends where a read comes back short exactly at the size
  -- fstat gave (the file position followed by the file object), without
  -- the read that would return 0: one request for a small file. A file
  -- that grew meanwhile, or a pseudo-file whose reads are short before
  -- its end (st_size 0), is still read to the end.
  local function io_requests()
    local n = 0
    for _, r in ipairs(ums.stats()) do
      if not r.hidden then n = n + r.io_requests end
    end
    return n
  end

  it("read('a') of a regular file spares the read at its end (in a task)",
     function()
    run(function()
      local path = put(tmpname(), ("r"):rep(4096))
      local f = assert(fs.open(path, "r+"))
      local function read_all(want, requests, what)
        local before = io_requests()
        assert.equal(want, f:read("a"), what)
        assert.equal(requests, io_requests() - before, what)
      end
      read_all(("r"):rep(4096), 1, "whole file")
      read_all("", 1, "at the end")
      local g = assert(io.open(path, "ab"))
      g:write("grown")
      g:close()
      read_all("grown", 1, "after it grew")
      assert.equal(10, f:seek("set", 10))
      read_all(("r"):rep(4086) .. "grown", 1, "after a seek")
      assert.equal(5, f:seek("set", 5))
      assert.equal("rrr", f:read(3))
      f:write("WW")  -- drops the read-ahead: the position moves back
      -- two requests: the write of "WW" goes out first, then one read
      read_all(("r"):rep(4086) .. "grown", 2, "after a write")
      f:close()
      assert.equal(("r"):rep(5) .. "rrrWW" .. ("r"):rep(4086) .. "grown",
                   get(path))
    end)
  end)

  both("read('a') of a pseudo-file whose reads are short before its end",
       function()
    -- /proc/kallsyms: st_size 0, about 4 KiB per read, megabytes in all,
    -- the same at every read (absent on some kernels: nothing to check).
    local want = io.open("/proc/kallsyms", "rb")
    if not want then return end
    local a = want:read("a")
    want:close()
    assert.is_true(#a > 100000)
    local f = assert(fs.open("/proc/kallsyms"))
    local got = f:read("a")
    f:close()
    assert.equal(#a, #got)
    assert.is_true(a == got)
  end)

  -- readfile is one request for a file of up to 64 KiB (ums_fs_readfile),
  -- and goes on through a file beyond that, or for what is not a regular
  -- file (the runtime hands its descriptor over, nothing read from it).
  both("ums.fs.readfile around its one-request size, and a device",
       function()
    for _, n in ipairs{65535, 65536, 65537, 131073} do
      local s = ("%07d\n"):rep(n // 8 + 1):sub(1, n)
      assert.equal(s, fs.readfile(put(tmpname(), s)), n)
    end
    assert.equal("", fs.readfile("/dev/null"))
    assert.equal(get("/proc/self/stat"):match("^%d+"),
                 fs.readfile("/proc/self/stat"):match("^%d+"))
  end)

  -- In a task the task holds readfile's buffer while it is parked, not a
  -- Lua object: a call makes nothing for the collector but its string
  -- (an empty file's "" is interned, so nothing at all). A boxed buffer
  -- (a userdata with a __gc, ~40 bytes) per call would show here as ~40
  -- KiB for the 1,000 calls.
  it("ums.fs.readfile in a task allocates nothing but its string",
     function()
    local empty = put(tmpname(), "")
    run(function()
      assert.equal("", fs.readfile(empty))  -- the first call's growth
      collectgarbage("stop")
      local before = collectgarbage("count")
      for _ = 1, 1000 do assert(fs.readfile(empty) == "") end
      local grown = (collectgarbage("count") - before) * 1024
      collectgarbage("restart")
      assert(grown < 8192, ("%d bytes for 1,000 calls"):format(grown))
    end)
  end)

  -- A finalizer that runs inside a readfile (the collector steps after
  -- the string is made) and reads a file itself finds the task's buffer
  -- slot taken: it must use its own buffer and leave the outer call's
  -- alone (releasing it would free the buffer twice: ASan).
  it("ums.fs.readfile from a finalizer run inside a readfile",
     function()
    local A, B = ("a"):rep(3000), ("b"):rep(5000)
    local a, b = put(tmpname(), A), put(tmpname(), B)
    run(function()
      local inside, nested, got = false, 0, {}
      local mt = {__gc = function()
        if inside then nested = nested + 1 end
        got[#got + 1] = fs.readfile(b)
      end}
      -- The incremental collector with a pause of 0, which counts from
      -- the end of a cycle: after the full collection it runs without a
      -- pause, whatever mode (lua5.4 starts in generational mode) and
      -- state an earlier test left it in.
      local mode = collectgarbage("incremental")
      local pause = collectgarbage("setpause", 0)
      local mul = collectgarbage("setstepmul", 1000)
      collectgarbage()
      for _ = 1, 2000 do setmetatable({}, mt) end
      -- From here the loop allocates nothing but readfile's strings, so
      -- every collector step, and every finalizer, runs inside one.
      for _ = 1, 400 do
        inside = true
        local s = fs.readfile(a)
        inside = false
        if s ~= A then error("wrong contents") end
      end
      collectgarbage("setpause", pause)
      collectgarbage("setstepmul", mul)
      collectgarbage(mode)
      collectgarbage()
      assert(nested > 0, "no finalizer ran inside a readfile")
      for i = 1, #got do assert(got[i] == B, i) end
    end)
  end)
end)

-- ---------------------------------------------------------------------
-- Writing, seeking and mixing, with io as the oracle
-- ---------------------------------------------------------------------

local BIG = ("0123456789abcdef"):rep(5000)  -- 80,000 bytes
local INITIAL = "first line\nsecond line\n" .. ("x"):rep(100) .. "\nend"

-- Each: mode, then method calls {name, args...}.
local WRITE_SEQS = {
  {"w", {"write", "abc", 1, 2.5, "\n", -0.0, 1e100, math.mininteger},
   {"seek"}, {"seek", "set", 1}, {"write", "X"}, {"seek", "end", -1},
   {"write", "YZ"}, {"seek", "set"}, {"seek", "end"}, {"flush"},
   {"read", "a"}, {"write", ""}},
  {"w", {"seek", "set", 10}, {"write", "after a hole"}, {"seek", "cur", -3},
   {"write", "!"}, {"seek", "set", -1}, {"seek", "cur", 0}},
  {"w", {"write", BIG}, {"seek", "cur", -70000}, {"write", "mid"},
   {"write", BIG, BIG}, {"seek", "set", 3}, {"write", ("q"):rep(65536)}},
  {"wb", {"write", "\0\1\2"}, {"write"}, {"seek", "end", 5}, {"write", "\0"}},
  {"w+", {"write", "hello\nworld\n"}, {"seek", "set"}, {"read", "l"},
   {"seek", "cur"}, {"write", "WORLD"}, {"seek", "set", 0}, {"read", "a"},
   {"seek", "cur", -3}, {"read", 1}, {"write", "Z"}, {"seek", "set"},
   {"read", "L", "L", "L"}},
  {"w+", {"write", BIG}, {"seek", "set", 1}, {"read", 70000}, {"write", "!"},
   {"seek", "set", 69999}, {"read", 4}, {"seek", "end", -2}, {"read", "a"},
   {"read", 0}},
  {"r+", {"read", 3}, {"seek", "cur"}, {"write", "XY"}, {"seek", "cur"},
   {"read", "l"}, {"seek", "cur", 2}, {"write", "--"}, {"read", "a"},
   {"seek", "set"}, {"read", "n"}, {"seek", "end"}, {"write", "tail"}},
  {"r+", {"read", "l"}, {"seek", "cur", 0}, {"write", "SECOND"},
   {"seek", "cur", 0}, {"read", "L"}, {"seek", "cur", 0},
   {"write", BIG}, {"seek", "set", 5}, {"read", 10}},
  {"r+b", {"seek", "end", -3}, {"read", 1}, {"seek", "cur"},
   {"write", "N"}, {"seek", "set"}, {"read", "a"}},
  {"a", {"write", "one\n"}, {"seek", "set", 0}, {"write", "two\n"},
   {"seek", "cur"}, {"write", BIG}, {"seek", "end", -1}},
  {"a+", {"write", "x"}, {"seek", "set"}, {"read", "a"}, {"write", "y"},
   {"seek", "set", 0}, {"read", 2}, {"seek", "cur"}, {"write", "z"},
   {"seek", "set"}, {"read", "a"}, {"read", 1}},
  {"a+b", {"read", "l"}, {"seek", "cur"}, {"write", "w"}, {"seek", "set", 3},
   {"read", 2}},
  {"r", {"write", "no"}, {"read", "l"}, {"seek", "set", 2}, {"read", 3}},
  {"w", {"read", "l"}, {"read", 1}, {"write", "ok"}, {"read", "a"}},
}

local function seq_name(s)
  local t = {s[1]}
  for i = 2, #s do
    local c = s[i]
    local args = {}
    for j = 2, #c do
      local v = c[j]
      args[#args + 1] = type(v) == "string" and #v > 10
        and ("<%d bytes>"):format(#v) or ("%q"):format(v)
    end
    t[#t + 1] = c[1] .. "(" .. table.concat(args, ",") .. ")"
  end
  return table.concat(t, " ")
end

local function write_trace(open, path, s)
  put(path, INITIAL)
  local f = assert(open(path, s[1]))
  local out = {}
  for i = 2, #s do
    local c = s[i]
    out[#out + 1] = packn(f[c[1]](f, unpack(c, 2)))
  end
  out[#out + 1] = packn(f:close())
  out[#out + 1] = packn(get(path))
  return out
end

describe("ums.fs writes, seeks and mixed reads match io", function()
  local function check_all()
    local path = tmpname("w")
    for _, s in ipairs(WRITE_SEQS) do
      compare_traces(write_trace(io.open, path, s),
                     write_trace(fs.open, path, s), seq_name(s))
    end
  end
  it("on r+, w+, a+, r, w, a files (outside a task)", check_all)
  it("on r+, w+, a+, r, w, a files (in a task)", function() run(check_all) end)

  both("write returns the file and accepts numbers like io", function()
    local path = tmpname()
    local f = assert(fs.open(path, "w"))
    assert.equal(f, f:write(1, " ", 2^63, " ", 0.1, " ", -7, " ", 1/0))
    assert.is_true(f:flush())
    assert.is_true(f:close())
    local g = assert(io.open(path .. ".io", "w"))
    g:write(1, " ", 2^63, " ", 0.1, " ", -7, " ", 1/0)
    g:close()
    assert.equal(get(path .. ".io"), get(path))
  end)

  both("ums.fs.writefile truncates and replaces the contents", function()
    local path = tmpname()
    put(path, ("old"):rep(100))
    assert.is_true(fs.writefile(path, "new"))
    assert.equal("new", get(path))
    assert.is_true(fs.writefile(path, BIG .. "\0" .. BIG))
    assert.equal(BIG .. "\0" .. BIG, get(path))
    assert.is_true(fs.writefile(path, ""))
    assert.equal("", get(path))
  end)

  both("pwrite and pread address the file and do not move it", function()
    local path = tmpname()
    local f = assert(fs.open(path, "w+"))
    assert.equal(5, f:pwrite("hello", 0))
    assert.equal(0, f:seek())
    assert.equal(5, f:pwrite("world", 10))
    assert.equal("hello\0\0\0\0\0world", get(path))
    assert.equal("llo", f:pread(3, 2))
    assert.equal("world", f:pread(100, 10))
    assert.is_nil(f:pread(1, 15))
    assert.is_nil(f:pread(1, 1000))
    assert.equal("", f:pread(0, 3))
    assert.equal(0, f:seek())
    assert.equal("hello", f:read(5))
    assert.equal(0, f:pwrite("", 3))
    assert.equal(#BIG, f:pwrite(BIG, 1))
    assert.equal(BIG, f:pread(#BIG, 1))
    assert.is_true(f:sync())
    assert.is_true(f:close())
    assert.equal("h" .. BIG, get(path))
  end)

  both("pread of more than 16 MiB returns all of it", function()
    local path = tmpname()
    local s = ("0123456789abcdef"):rep(20 * 65536)  -- 20 MiB
    put(path, s)
    local f = assert(fs.open(path))
    local got = f:pread(#s + 10, 0)
    assert.equal(#s, #got)
    assert.is_true(got == s)
    got = f:pread(#s, 5)
    assert.equal(#s - 5, #got)
    assert.is_true(f:close())
  end)

  both("pread and pwrite keep program order with buffered writes",
       function()
    local path = tmpname()
    local f = assert(fs.open(path, "w+"))
    f:write("aaaa")           -- buffered
    assert.equal("aaaa", f:pread(10, 0))
    f:write("bbbb")
    assert.equal(2, f:pwrite("XY", 1))
    assert.is_true(f:close())
    assert.equal("aXYabbbb", get(path))
    -- a pwrite into read-ahead is seen by the next read
    put(path, "0123456789")
    f = assert(fs.open(path, "r+"))
    assert.equal("0", f:read(1))   -- reads ahead the whole file
    assert.equal(1, f:pwrite("!", 1))
    assert.equal("!2", f:read(2))
    assert.equal(3, f:seek())
    assert.is_true(f:close())
  end)

  both("flush makes writes visible to others; sync returns true", function()
    local path = tmpname()
    local f = assert(fs.open(path, "w"))
    f:write("abc")
    assert.equal("", get(path))
    assert.is_true(f:flush())
    assert.equal("abc", get(path))
    assert.is_true(f:sync())
    f:write("d")
    assert.is_true(f:sync())
    assert.equal("abcd", get(path))
    assert.is_true(f:close())
  end)
end)

-- ---------------------------------------------------------------------
-- The file system
-- ---------------------------------------------------------------------

describe("ums.fs file-system functions", function()
  both("stat describes files, directories and links", function()
    local path = put(tmpname(), "12345")
    local st = assert(fs.stat(path))
    assert.equal("file", st.type)
    assert.equal(5, st.size)
    assert.equal(1, st.nlink)
    for _, k in ipairs{"mode", "ino", "dev", "uid", "gid", "blocks",
                       "blksize"} do
      assert.equal("integer", math.type(st[k]), k)
    end
    for _, k in ipairs{"atime", "mtime", "ctime"} do
      assert.equal("number", type(st[k]), k)
      assert.is_true(math.abs(st[k] - os.time()) < 3600, k)
    end
    local d = assert(fs.stat(TMP))
    assert.equal("directory", d.type)
    assert.equal(448, d.mode)
    assert.equal(st.dev, d.dev)
    assert.are_not.equal(st.ino, d.ino)
    assert.equal("char device", fs.stat("/dev/null").type)
    -- nofollow: /proc/self is a link
    assert.equal("link", fs.stat("/proc/self", true).type)
    assert.equal("directory", fs.stat("/proc/self").type)
    local r = pack(fs.stat(path .. "-missing"))
    assert.same({n = 3, nil, path .. "-missing: No such file or directory", 2},
                r)
  end)

  both("mkdir, dir, rename and remove", function()
    local d = tmpname("d")
    assert.is_true(fs.mkdir(d))
    assert.equal("directory", fs.stat(d).type)
    assert.same({n = 3, nil, d .. ": File exists", 17}, pack(fs.mkdir(d)))
    assert.is_true(fs.mkdir(d .. "/sub", 448))
    assert.equal(448, fs.stat(d .. "/sub").mode)
    put(d .. "/a", "A")
    put(d .. "/b", "B")
    local names = {}
    for name in fs.dir(d) do names[#names + 1] = name end
    table.sort(names)
    assert.same({"a", "b", "sub"}, names)
    -- the iterator keeps returning nil at the end
    local it_ = fs.dir(d .. "/sub")
    assert.is_nil(it_())
    assert.is_nil(it_())
    assert.same({n = 3, nil, d .. "/x: No such file or directory", 2},
                pack(fs.dir(d .. "/x")))
    assert.same({n = 3, nil, d .. "/a: Not a directory", 20},
                pack(fs.dir(d .. "/a")))
    assert.is_true(fs.rename(d .. "/a", d .. "/c"))
    assert.equal("A", get(d .. "/c"))
    assert.is_nil(fs.stat(d .. "/a"))
    assert.same({n = 3, nil, d .. "/a: No such file or directory", 2},
                pack(fs.rename(d .. "/a", d .. "/e")))
    -- remove: like os.remove, with the same messages
    local want = pack(os.remove(d))
    assert.same(want, pack(fs.remove(d)))
    assert.equal(d .. ": Directory not empty", want[2])
    assert.is_true(fs.remove(d .. "/sub"))
    assert.is_true(fs.remove(d .. "/b"))
    assert.is_true(fs.remove(d .. "/c"))
    assert.is_true(fs.remove(d))
    assert.same(pack(os.remove(d)), pack(fs.remove(d)))
  end)

  both("type tells files, closed files and anything else", function()
    local f = assert(fs.open(put(tmpname(), "")))
    assert.equal("file", fs.type(f))
    f:close()
    assert.equal("closed file", fs.type(f))
    for _, v in ipairs{io.stdout, 1, "file", {}, print, false} do
      assert.is_nil(fs.type(v))
    end
    assert.has_error(function() fs.type() end)
    assert.matches("^ums.fs.file %(", tostring(assert(fs.open(TMP))))
    assert.equal("ums.fs.file (closed)", tostring(f))
  end)

  both("a <close> variable closes the file and flushes it", function()
    local path = tmpname()
    do
      local f <close> = assert(fs.open(path, "w"))
      f:write("tbc")
    end
    assert.equal("tbc", get(path))
    local g
    for l in fs.lines(put(path, "1\n2\n3\n")) do
      if l == "2" then break end
    end
    -- the generic for closed the file at its break: nothing to check but
    -- that nothing raised; and ums.fs.lines raises for a missing file
    local ok, err = pcall(fs.lines, path .. "-none")
    assert.is_false(ok)
    assert.equal(path .. "-none: No such file or directory", err)
    assert.is_nil(g)
  end)
end)

-- ---------------------------------------------------------------------
-- Files larger than 4 GiB
-- ---------------------------------------------------------------------

describe("ums.fs beyond 4 GiB", function()
  both("pwrite, pread, seek, read and stat at 5 GiB (sparse)", function()
    local path = tmpname("big")
    local f = assert(fs.open(path, "w+"))
    local off = 5 * GiB
    assert.equal(9, f:pwrite("5 GiB mark", off) - 1)
    assert.equal("5 GiB mark", f:pread(10, off))
    assert.equal("GiB", f:pread(3, off + 2))
    assert.equal("\0\0", f:pread(2, 4 * GiB + 7))
    assert.is_nil(f:pread(1, off + 10))
    assert.equal(off, f:seek("set", off))
    assert.equal("5 GiB", f:read(5))
    assert.equal(off + 5, f:seek())
    assert.equal(" mark", f:read("a"))
    assert.equal(off + 10, f:seek("end"))
    assert.equal(off - 1, f:seek("end", -11))
    assert.equal("\0" .. "5", f:read(2))
    assert.equal(off + 2, f:seek("cur", 1))
    f:write("!")
    assert.equal(off + 3, f:seek())
    assert.equal(4 * GiB + 1, f:seek("set", 4 * GiB + 1))
    f:write("4G")
    assert.is_true(f:close())
    local st = fs.stat(path)
    assert.equal(off + 10, st.size)
    assert.is_true(st.blocks < 1000)  -- still sparse
    local g = assert(fs.open(path))
    assert.equal("\0" .. "4G\0", g:pread(4, 4 * GiB))
    assert.equal("5 !iB mark", g:pread(100, off))
    g:close()
    assert.is_true(fs.remove(path))
  end)
end)

-- ---------------------------------------------------------------------
-- Tasks sharing files
-- ---------------------------------------------------------------------

local function record(i) return ("%07d\n"):format(i) end

local function expected(n)
  local t = {}
  for i = 1, n do t[i] = record(i) end
  return table.concat(t)
end

describe("ums.fs with several tasks", function()
  it("a reader of another file object sees what the writer flushed, "
     .. "never torn or lost", function()
    run(function()
      local path = tmpname()
      local N = 3000
      local all = expected(N)
      local flushed = 0   -- bytes flushed by the writer so far
      local done = false
      local w = assert(fs.open(path, "w"))
      local writer = ums.spawn(function()
        for i = 1, N do
          w:write(record(i))
          if i % 7 == 0 then
            w:flush()
            flushed = i * 8
          end
          if i % 50 == 0 then ums.yield() end
        end
        w:close()
        flushed = N * 8
        done = true
      end)
      local readers = {}
      for k = 1, 2 do
        readers[k] = ums.spawn(function()
          local r = assert(fs.open(path, "r"))
          local got, seen = {}, 0
          local checks = 0
          repeat
            local at_least = flushed
            local finished = done
            -- k == 1: positional reads of everything; k == 2: a stream
            local s
            if k == 1 then
              s = r:pread(N * 8 + 100, 0) or ""
            else
              local chunk = r:read(4096 + checks % 5000)
              if chunk then got[#got + 1] = chunk; seen = seen + #chunk end
              s = table.concat(got)
              got = {s}
            end
            assert(#s <= #all, "more than was written")
            if k == 1 then
              assert(#s >= at_least, "lost flushed data")
            end
            assert(s == all:sub(1, #s), "torn or wrong data")
            checks = checks + 1
            if finished and #s == #all then break end
            ums.yield()
          until false
          r:close()
          return checks
        end)
      end
      results(writer)
      assert.is_true(results(readers[1]) > 1)
      assert.is_true(results(readers[2]) > 1)
      assert.equal(all, get(path))
    end)
  end)

  it("a reader of the same file object (pread) sees every write made "
     .. "before it, flushed or not", function()
    run(function()
      local path = tmpname()
      local N = 3000
      local all = expected(N)
      local written = 0
      local f = assert(fs.open(path, "w+"))
      local writer = ums.spawn(function()
        for i = 1, N do
          f:write(record(i))
          written = i * 8
          if i % 20 == 0 then ums.yield() end
          if i % 333 == 0 then f:write(""):flush() end
        end
        return true
      end)
      local reader = ums.spawn(function()
        local checks = 0
        while true do
          local at_least = written
          local s = f:pread(N * 8, 0) or ""
          assert(#s >= at_least, ("lost: %d < %d"):format(#s, at_least))
          assert(s == all:sub(1, #s), "torn or wrong data")
          checks = checks + 1
          if #s == #all then return checks end
          ums.yield()
        end
      end)
      results(writer)
      assert.is_true(results(reader) > 10)
      assert.is_true(f:close())
      assert.equal(all, get(path))
    end)
  end)

  it("many tasks writing lines to one file object: every line whole, each "
     .. "task's lines in order", function()
    run(function()
      local path = tmpname()
      local f = assert(fs.open(path, "w"))
      local T, L = 16, 150
      local tasks = {}
      for t = 1, T do
        tasks[t] = ums.spawn(function()
          for l = 1, L do
            local pad = ("."):rep((t * 37 + l * 101) % 300)
            if l % 50 == t % 50 then pad = ("#"):rep(70000) end  -- > buffer
            f:write("task ", t, " line ", l, " ", pad, " end\n")
            if l % 3 == 0 then ums.yield() end
            if l % 40 == 0 then f:flush() end
          end
        end)
      end
      for t = 1, T do results(tasks[t]) end
      assert.is_true(f:close())
      local next_line = {}
      for t = 1, T do next_line[t] = 1 end
      local n = 0
      for line in io.lines(path) do
        local t, l, pad = line:match("^task (%d+) line (%d+) ([.#]*) end$")
        assert(t, "torn line: " .. line:sub(1, 80))
        t, l = tonumber(t), tonumber(l)
        assert.equal(next_line[t], l)
        next_line[t] = l + 1
        if pad:find("#") then
          assert.equal(70000, #pad)
        else
          assert.equal((t * 37 + l * 101) % 300, #pad)
        end
        n = n + 1
      end
      assert.equal(T * L, n)
    end)
  end)

  it("a method that waited for the file while another task closed it "
     .. "raises, and writes nothing", function()
    run(function()
      local path = tmpname()
      local f = assert(fs.open(path, "w+"))
      local closer = ums.spawn(function()
        f:write("pending")
        return f:close()        -- parks in the flush, holding the file
      end)
      local calls = {{"write", "late"}, {"read", "a"}, {"pread", 1, 0},
                     {"pwrite", "x", 0}, {"seek", "set"}, {"flush"},
                     {"sync"}, {"close"}}
      local waiters = {}
      for i, c in ipairs(calls) do
        waiters[i] = ums.spawn(function()
          return pcall(f[c[1]], f, unpack(c, 2))
        end)
      end
      assert.is_true(results(closer))
      for i, c in ipairs(calls) do
        local ok, err = results(waiters[i])
        assert.is_false(ok, c[1])
        assert.matches("attempt to use a closed file", err, 1, true)
      end
      assert.equal("closed file", fs.type(f))
      assert.equal("pending", get(path))
    end)
  end)

  it("tasks reading one file object with lines() share its position",
     function()
    run(function()
      local path = put(tmpname(), expected(2000))
      local f = assert(fs.open(path))
      local got = {}
      local tasks = {}
      for t = 1, 4 do
        tasks[t] = ums.spawn(function()
          for l in f:lines() do
            -- One call, not got[#got + 1] = ...: the quantum may preempt
            -- a task between any two instructions, and another task
            -- appending between the length and the store would lose a
            -- line (seen under load).
            table.insert(got, tonumber(l))
            if #got % 10 == t then ums.yield() end
          end
        end)
      end
      for t = 1, 4 do results(tasks[t]) end
      table.sort(got)
      assert.equal(2000, #got)
      for i = 1, 2000 do assert.equal(i, got[i]) end
      f:close()
    end)
  end)
end)

-- ---------------------------------------------------------------------
-- Cancellation and unusual calling contexts
-- ---------------------------------------------------------------------

local function mkfifo()
  local path = tmpname("fifo")
  assert(os.execute("mkfifo " .. path))
  return path
end

describe("ums.fs and cancellation", function()
  local it_shell = NO_SHELL and pending or it

  it_shell("cancelling a task with a FIFO read in flight; the file still "
           .. "works", function()
    local fifo = mkfifo()
    run(function()
      local f = assert(fs.open(fifo, "r+"))
      local reader = ums.spawn(function() return f:read(10) end)
      -- another task waits for the file while the reader holds it
      local waiter = ums.spawn(function() return f:read(1) end)
      ums.sleep(0.05)
      assert.equal("suspended", reader:status())
      waiter:cancel()
      local ok, err = waiter:join(5)
      assert.is_false(ok)
      assert.equal(ums.CANCELLED, err)
      reader:cancel()
      ok, err = reader:join(5)
      assert.is_false(ok)
      assert.equal(ums.CANCELLED, err)
      -- the file is free again: data written now is read by a new task
      local w = assert(fs.open(fifo, "w"))
      assert(w:write("0123456789abc"):flush())
      local t = ums.spawn(function() return f:read(13) end)
      local ok2, s = t:join(5)
      assert.is_true(ok2)
      assert.equal("0123456789abc", s)
      w:close()
      f:close()
      collectgarbage()
    end)
    assert.is_true(fs.remove(fifo))
  end)

  it_shell("a close cancelled while a read holds the file still closes "
           .. "it, once", function()
    local fifo = mkfifo()
    run(function()
      local before = nfds()
      local f = assert(fs.open(fifo, "r+"))
      local reader = ums.spawn(function() return f:read(3) end)
      ums.sleep(0.02)
      -- The close waits for the file the reader holds; cancelled there,
      -- it leaves the close to the reader's end.
      local closer = ums.spawn(function() return f:close() end)
      ums.yield()
      closer:cancel()
      local ok, err = closer:join(5)
      assert.is_false(ok)
      assert.equal(ums.CANCELLED, err)
      assert.equal("suspended", reader:status())
      local w = assert(fs.open(fifo, "w"))
      assert(w:write("abc"):flush())
      assert.equal("abc", results(reader))
      w:close()
      assert.equal("ums.fs.file (closed)", tostring(f))
      assert.has_error(function() f:close() end,
                       "attempt to use a closed file")
      assert.equal(before, nfds())
    end)
    assert.is_true(fs.remove(fifo))
  end)

  it_shell("cancelling many tasks parked in FIFO reads, repeatedly",
           function()
    local fifo = mkfifo()
    run(function()
      for _ = 1, 20 do
        local files, tasks = {}, {}
        for i = 1, 5 do
          files[i] = assert(fs.open(fifo, "r+"))
          tasks[i] = ums.spawn(function() return files[i]:read("a") end)
        end
        ums.yield()
        for i = 1, 5 do tasks[i]:cancel() end
        for i = 1, 5 do
          assert.equal(ums.CANCELLED, select(2, tasks[i]:join(5)))
          files[i]:close()
        end
      end
      collectgarbage()
    end)
    assert.is_true(fs.remove(fifo))
  end)

  it("a <close> file unwound by cancellation is flushed and closed",
     function()
    local path = tmpname()
    local before = nfds()
    run(function()
      local written = false
      local t = ums.spawn(function()
        local f <close> = assert(fs.open(path, "w"))
        f:write("written before the cancel")
        written = true
        ums.sleep(100)
      end)
      -- Cancelled in its sleep, not in the open (a loaded machine).
      while not written do ums.sleep(0.001) end
      t:cancel()
      assert.equal(ums.CANCELLED, select(2, t:join(5)))
    end)
    assert.equal("written before the cancel", get(path))
    assert.equal(before, nfds())
  end)

  it("a cancelled task that catches the cancel can still close its file",
     function()
    local path = tmpname()
    local before = nfds()
    run(function()
      local written = false
      local t = ums.spawn(function()
        local f = assert(fs.open(path, "w"))
        f:write("data")
        written = true
        local ok = pcall(ums.sleep, 100)
        assert(not ok)
        return pack(f:close())
      end)
      while not written do ums.sleep(0.001) end
      t:cancel()
      local ok, r = t:join(5)
      assert.is_true(ok)
      assert.is_true(r[1])
    end)
    assert.equal("data", get(path))
    assert.equal(before, nfds())
  end)

  it("calls work inside table.sort comparators, pcall, coroutine.wrap and "
     .. "gsub callbacks", function()
    run(function()
      local names = {}
      for i = 1, 8 do
        names[i] = put(tmpname("s"), ("x"):rep((i * 5) % 8))
      end
      table.sort(names, function(a, b)
        return fs.stat(a).size < fs.stat(b).size
      end)
      for i = 2, 8 do
        assert.is_true(fs.stat(names[i - 1]).size <= fs.stat(names[i]).size)
      end
      table.sort(names, function(a, b)
        return fs.readfile(a) > fs.readfile(b)
      end)
      assert.equal(("x"):rep(7), fs.readfile(names[1]))
      local ok, s = pcall(fs.readfile, names[1])
      assert.is_true(ok)
      assert.equal(("x"):rep(7), s)
      local path = tmpname()
      local f = assert(fs.open(path, "w+"))
      local co = coroutine.wrap(function(x)
        f:write(x)
        x = coroutine.yield(f:seek())
        f:write(x)
        f:seek("set")
        return f:read("a")
      end)
      assert.equal(3, co("abc"))
      assert.equal("abcdef", co("def"))
      local out = ("hello"):gsub(".", function(c)
        f:write(c)
        return f:pread(1, 0)
      end)
      assert.equal("aaaaa", out)
      assert.equal(xpcall(function() return f:pread(3, 0) end, debug.traceback),
                   true)
      -- a metamethod
      local mt = setmetatable({}, {__index = function(_, k)
        return fs.readfile(k)
      end})
      assert.equal(("x"):rep(7), mt[names[1]])
      f:close()
      -- lines() of one file in a task while another task writes
      local t = ums.spawn(function()
        local n = 0
        for _ in fs.lines(names[1]) do n = n + 1; ums.yield() end
        return n
      end)
      assert.equal(1, results(t))
    end)
  end)
end)

-- ---------------------------------------------------------------------
-- Waiting without a worker
-- ---------------------------------------------------------------------

-- A FIFO made with mkfifo(3) through ums.ffi (no shell: /bin/sh cannot
-- start under a TSan preload). Opened "r+", it does not wait for a
-- writer, and a read from it stays in flight until data comes.
ums.ffi.cdef[[ int mkfifo(const char *path, unsigned int mode); ]]
local function fifo_path()
  local path = tmpname("fifo")
  assert(ums.ffi.C.mkfifo(path, 384) == 0, "mkfifo " .. path)
  return path
end

-- Yields until cond() holds (at most 5 s).
local function wait_for(cond, what)
  local limit = ums.now() + 5
  while not cond() do
    assert(ums.now() < limit, "timed out waiting for " .. what)
    ums.sleep(0.001)
  end
end

describe("ums.fs waits without holding a worker", function()
  -- With the pool backend every read in flight blocks a pool thread:
  -- room for the readers and for the writers that end their reads.
  before_each(function() ums.config{io_threads = 100} end)
  after_each(function() ums.config{io_threads = 0} end)

  it("64 tasks each with a read in flight have all yielded (their "
     .. "coroutines are suspended, not running on a worker); one inside a "
     .. "table.sort comparator keeps its worker", function()
    run(function()
      local N = 64
      local fifos, cos, state, tasks = {}, {}, {}, {}
      for i = 1, N + 1 do fifos[i] = fifo_path() end
      for i = 1, N do
        tasks[i] = ums.spawn(function()
          cos[i] = coroutine.running()
          local f <close> = assert(fs.open(fifos[i], "r+"))
          state[i] = "reading"
          local s = f:read(6)
          state[i] = "done"
          return s
        end)
      end
      -- Where Lua cannot yield, the task waits on its worker.
      local bound_co
      local bound = ums.spawn(function()
        bound_co = coroutine.running()
        local f <close> = assert(fs.open(fifos[N + 1], "r+"))
        local got
        table.sort({2, 1}, function(a, b)
          state.bound = "reading"
          got = got or f:read(6)
          return a < b
        end)
        return got
      end)
      wait_for(function()
        for i = 1, N do if state[i] ~= "reading" then return false end end
        return state.bound == "reading"
      end, "every read to start")
      ums.sleep(0.02)
      for i = 1, N do
        assert.equal("reading", state[i])
        -- yielded to the scheduler from inside the read: no C frame kept
        assert.equal("suspended", coroutine.status(cos[i]))
      end
      -- in the middle of a C call on its own worker
      assert.equal("normal", coroutine.status(bound_co))
      for i = 1, N + 1 do
        local w <close> = assert(fs.open(fifos[i], "w"))
        assert(w:write(("r%05d"):format(i)):flush())
      end
      for i = 1, N do
        assert.equal(("r%05d"):format(i), results(tasks[i]))
      end
      assert.equal(("r%05d"):format(N + 1), results(bound))
      for i = 1, N + 1 do assert(fs.remove(fifos[i])) end
    end)
  end)

  it("a join that times out leaves a yielded read alone; a cancel ends "
     .. "it, and the file works on", function()
    run(function()
      local fifo = fifo_path()
      local f = assert(fs.open(fifo, "r+"))
      local w = assert(fs.open(fifo, "w"))
      local co, reading
      local t = ums.spawn(function()
        co = coroutine.running()
        reading = true
        return f:read(3)
      end)
      wait_for(function() return reading end, "the read to start")
      ums.sleep(0.01)
      assert.equal("suspended", coroutine.status(co))
      assert.same({nil, "timeout"}, {t:join(0.05)})
      assert.equal("suspended", coroutine.status(co))
      assert(w:write("abc"):flush())
      assert.same({true, "abc"}, {t:join(5)})

      -- Cancelled while yielded in the read; its lines() loop too.
      for _, body in ipairs{
        function() reading = true; return f:read(3) end,
        function() reading = true; for l in f:lines() do return l end end,
        function() reading = true; return f:read("n") end,
      } do
        reading = false
        local t2 = ums.spawn(function()
          co = coroutine.running()
          return body()
        end)
        wait_for(function() return reading end, "the read to start")
        ums.sleep(0.01)
        assert.equal("suspended", coroutine.status(co))
        assert.is_true(t2:cancel())
        local ok, err = t2:join(5)
        assert.is_false(ok)
        assert.equal(ums.CANCELLED, err)
      end
      -- The abandoned reads ended (cancelled in the kernel, or
      -- interrupted on the pool): data written now reaches a new reader.
      assert(w:write("xyz"):flush())
      local t3 = ums.spawn(function() return f:read(3) end)
      assert.same({true, "xyz"}, {t3:join(5)})
      assert.is_true(w:close())
      assert.is_true(f:close())
      assert(fs.remove(fifo))
    end)
  end)

  it("a task waiting for the file held by a yielded reader has yielded "
     .. "too, and a cancel while it waits leaves the file to the others",
     function()
    run(function()
      local fifo = fifo_path()
      local f = assert(fs.open(fifo, "r+"))
      local cos, started = {}, {}
      local ts = {}
      for i = 1, 3 do
        ts[i] = ums.spawn(function()
          cos[i] = coroutine.running()
          started[i] = true
          return f:read(2)
        end)
        wait_for(function() return started[i] end, "task " .. i)
      end
      ums.sleep(0.01)
      for i = 1, 3 do assert.equal("suspended", coroutine.status(cos[i])) end
      ts[2]:cancel()
      assert.equal(ums.CANCELLED, select(2, ts[2]:join(5)))
      local w = assert(fs.open(fifo, "w"))
      assert(w:write("aabb"):flush())
      assert.same({true, "aa"}, {ts[1]:join(5)})
      assert.same({true, "bb"}, {ts[3]:join(5)})
      w:close()
      f:close()
      assert(fs.remove(fifo))
    end)
  end)
end)

-- ---------------------------------------------------------------------
-- Reading into a buffer (read_into, pread_into)
-- ---------------------------------------------------------------------

local ffi = ums.ffi

-- n bytes of a pattern no two offsets of which look alike for long.
local function pattern(n)
  local t, i = {}, 0
  while i < n do
    local rec = ("%012d\n"):format(i)
    t[#t + 1] = rec
    i = i + #rec
  end
  return table.concat(t):sub(1, n)
end

-- Reads f to its end with read_into(buf): the bytes, as one string.
local function read_rest(f, buf)
  local parts = {}
  while true do
    local n = assert(f:read_into(buf))
    if n == 0 then break end
    parts[#parts + 1] = ffi.string(buf, n)
  end
  return table.concat(parts)
end

describe("ums.fs reads into a buffer", function()
  both("read_into reads at the file position, after what read read ahead",
       function()
    local text = "hello world, this is a test\nsecond line\n"
    local f = assert(fs.open(put(tmpname(), text)))
    local buf = ffi.buffer(8)
    assert.equal("hel", f:read(3))
    assert.equal(5, f:read_into(buf, 5))
    assert.equal("lo wo", ffi.string(buf, 5))
    assert.equal(8, f:read_into(buf))       -- n defaults to #buf
    assert.equal("rld, thi", ffi.string(buf, 8))
    assert.equal(16, f:seek())
    assert.equal("s is", f:read(4))         -- the position moved
    assert.equal(0, f:read_into(buf, 0))
    assert.equal(text:sub(21), read_rest(f, buf))
    assert.equal(0, f:read_into(buf))       -- still at the end
    f:close()
  end)

  both("read_into and pread_into of several MiB, chunk by chunk", function()
    local MiB = 1024 * 1024
    local text = pattern(3 * MiB + 12345)
    local path = put(tmpname(), text)
    local f = assert(fs.open(path))
    assert.equal(text, read_rest(f, ffi.buffer(MiB)))
    local big = ffi.buffer(#text + 100)
    assert.equal(#text, f:pread_into(big, nil, 0))
    assert.equal(text, ffi.string(big, #text))
    assert.equal(#text - 7, f:pread_into(big, #text, 7))
    assert.equal(text:sub(8), ffi.string(big, #text - 7))
    f:close()
  end)

  both("pread_into reads at an offset and does not move the file",
       function()
    local f = assert(fs.open(put(tmpname(), "hello world"), "r+"))
    local buf = ffi.buffer(32)
    assert.equal(4, f:pread_into(buf, 4, 6))
    assert.equal("worl", ffi.string(buf, 4))
    assert.equal(0, f:seek())
    assert.equal(11, f:pread_into(buf, nil, 0))   -- short only at the end
    assert.equal("hello world", ffi.string(buf, 11))
    assert.equal(0, f:pread_into(buf, 1, 11))
    -- the kernel's answer for an offset + count past the largest file
    assert.same({n = 3, nil, "Invalid argument", 22},
                pack(f:pread_into(buf, 1, math.maxinteger)))
    -- this file's pending writes reach the kernel first
    assert(f:write("HELLO"))
    assert.equal(5, f:pread_into(buf, 5, 0))
    assert.equal("HELLO", ffi.string(buf, 5))
    -- beyond 4 GiB (sparse)
    assert.equal(4, f:pwrite("5GiB", 5 * GiB))
    assert.equal(4, f:pread_into(buf, 4, 5 * GiB))
    assert.equal("5GiB", ffi.string(buf, 4))
    assert.equal(2, f:pread_into(buf, 2, 5 * GiB - 2))
    assert.equal("\0\0", ffi.string(buf, 2))
    f:close()
  end)

  both("bad input: wrong buffer, too large a count, negative offsets, a "
       .. "closed or write-only file", function()
    local path = put(tmpname(), "some bytes")
    local f = assert(fs.open(path))
    local buf = ffi.buffer(4)
    for _, call in ipairs{
        {"read_into", "ums.ffi.buffer expected", "string"},
        {"read_into", "ums.ffi.buffer expected", {}},
        {"read_into", "ums.ffi.buffer expected", nil},
        {"read_into", "ums.ffi.buffer expected", f},
        {"pread_into", "ums.ffi.buffer expected", "s", 1, 0},
        {"read_into", "count larger than the buffer", buf, 5},
        {"pread_into", "count larger than the buffer", buf, 5, 0},
        {"read_into", "must not be negative", buf, -1},
        {"pread_into", "must not be negative", buf, -1, 0},
        {"pread_into", "offset must not be negative", buf, 1, -1},
        {"pread_into", "offset must not be negative", buf, 1,
         math.mininteger},
        {"pread_into", "number expected", buf, 1},
        {"read_into", "number has no integer representation", buf, 1.5}} do
      local ok, err = pcall(f[call[1]], f, unpack(call, 3, 5))
      assert.is_false(ok, call[2])
      assert.matches(call[2], err, 1, true)
    end
    assert.equal("some", f:read(4))   -- the bad calls read nothing
    f:close()
    for _, call in ipairs{{"read_into", buf}, {"pread_into", buf, 1, 0}} do
      local ok, err = pcall(f[call[1]], f, unpack(call, 2))
      assert.is_false(ok)
      assert.matches("attempt to use a closed file", err, 1, true)
    end
    local w = assert(fs.open(path, "a"))
    assert.same({n = 3, nil, "Bad file descriptor", 9},
                pack(w:read_into(buf)))
    assert.same({n = 3, nil, "Bad file descriptor", 9},
                pack(w:pread_into(buf, 1, 0)))
    w:close()
    local d = assert(fs.open(TMP))
    assert.same({n = 3, nil, "Is a directory", 21}, pack(d:read_into(buf)))
    assert.same({n = 3, nil, "Is a directory", 21},
                pack(d:pread_into(buf, 1, 0)))
    d:close()
  end)

  it("many tasks read one file object side by side, with pread_into and "
     .. "pread, while it is closed under them", function()
    local MiB = 1024 * 1024
    local text = pattern(4 * MiB)
    local path = put(tmpname(), text)
    local before = nfds()
    -- The quantum off: it could stop a reader between counting itself and
    -- its call (a slow run, strace's EINTR injection, did), and the close
    -- would then come before that call.
    with_config({quantum = 0}, run, function()
      local f = assert(fs.open(path))
      local N, slice = 16, #text // 16
      -- first each task reads its slice in pieces, all of them in flight
      -- together (a spec of what they read, not of timing)
      local function reader(k, buf)
        local off, parts = k * slice, {}
        while off < (k + 1) * slice do
          local want = math.min(#buf, (k + 1) * slice - off)
          local s
          if k % 2 == 0 then
            local n = assert(f:pread_into(buf, want, off))
            s = ffi.string(buf, n)
          else
            s = assert(f:pread(want, off))
          end
          parts[#parts + 1] = s
          off = off + #s
          ums.yield()
        end
        return table.concat(parts)
      end
      local ts = {}
      for k = 0, N - 1 do
        ts[#ts + 1] = ums.spawn(reader, k, ffi.buffer(64 * 1024 + 3))
      end
      for k = 0, N - 1 do
        assert.equal(text:sub(k * slice + 1, (k + 1) * slice),
                     results(ts[k + 1]))
      end
      -- then each reads its whole slice with one pread_into, and the file
      -- is closed once every call has begun (a task runs until it parks,
      -- so a reader that counted itself is inside its call or done):
      -- closed for Lua at once, the readers keep the descriptor until the
      -- last one is done. (A pread, under the file lock, would make the
      -- others wait for the lock, and the close may take a free lock
      -- before a woken waiter does: that waiter then raises, as any
      -- method that waited for a file closed meanwhile.)
      local begun = 0
      local function whole(k)
        local buf = ffi.buffer(slice)
        begun = begun + 1
        return ffi.string(buf, assert(f:pread_into(buf, slice, k * slice)))
      end
      ts = {}
      for k = 0, N - 1 do ts[#ts + 1] = ums.spawn(whole, k) end
      while begun < N do ums.yield() end
      assert.is_true(f:close())
      assert.equal("closed file", fs.type(f))
      local ok, err = pcall(f.pread_into, f, ffi.buffer(1), 1, 0)
      assert.is_false(ok)
      assert.matches("attempt to use a closed file", err, 1, true)
      for k = 0, N - 1 do
        local got = results(ts[k + 1])
        assert.equal(text:sub(k * slice + 1, (k + 1) * slice), got)
      end
    end)
    assert.equal(before, nfds())
  end)

  it("cancelling tasks with reads into buffers in flight: the buffers stay "
     .. "valid until the kernel is done, and nothing else is written",
     function()
    local MiB = 1024 * 1024
    local text = pattern(4 * MiB)
    local path = put(tmpname(), text)
    local before = nfds()
    run(function()
      for _ = 1, 5 do
        local f = assert(fs.open(path))
        local ts = {}
        for k = 1, 8 do
          ts[k] = ums.spawn(function()
            local buf = ffi.buffer(4 * MiB)
            if k % 2 == 0 then
              return f:pread_into(buf, nil, 0)
            end
            return f:read_into(buf)
          end)
        end
        ums.yield()
        for k = 1, 8 do ts[k]:cancel() end
        for k = 1, 8 do
          local ok, r = ts[k]:join(5)
          -- a read that completed before the cancel was seen returns
          assert(ok == false and r == ums.CANCELLED or ok == true, r)
        end
        ts = nil
        collectgarbage()
        collectgarbage()
        -- Fresh buffers of the same size class take the memory back if a
        -- request had let go of its buffer early: a late kernel write
        -- would then show here (ASan, UMS_IO=pool: read(2) into freed
        -- memory is reported).
        local fresh = {}
        for k = 1, 8 do fresh[k] = ffi.buffer(4 * MiB) end
        ums.sleep(0.02)
        for k = 1, 8 do
          assert.equal(("\0"):rep(64), ffi.string(fresh[k], 64))
        end
        assert.is_true(f:close())
      end
    end)
    assert.equal(before, nfds())
  end)

  local it_shell = NO_SHELL and pending or it
  it_shell("ums.fs.readfile of a FIFO takes nothing before it reads it "
           .. "as a stream", function()
    local fifo = mkfifo()
    run(function()
      -- the holder is a writer, so the open does not wait
      local holder = assert(io.open(fifo, "r+"))
      assert(holder:write("abc"):flush())
      local t = ums.spawn(function() return fs.readfile(fifo) end)
      -- Only once the reader has the FIFO open: a reader that opens it
      -- after the last writer closed would wait for the next writer.
      local ino = assert(fs.stat(fifo)).ino
      wait_for(function()
        local n = 0
        for name in fs.dir("/proc/self/fd") do
          local st = fs.stat("/proc/self/fd/" .. name)
          if st and st.type == "fifo" and st.ino == ino then n = n + 1 end
        end
        return n >= 2  -- the holder and the reader
      end, "the reader to open the FIFO")
      holder:close()  -- the last writer: the reader then finds the end
      assert.equal("abc", results(t))
    end)
    assert.is_true(fs.remove(fifo))
  end)

  it("cancelling tasks in ums.fs.readfile: nothing leaks, later calls "
     .. "work", function()
    local path = put(tmpname(), ("r"):rep(4096))
    local before = nfds()
    run(function()
      for round = 1, 20 do
        local ts = {}
        for k = 1, 16 do
          ts[k] = ums.spawn(function() return fs.readfile(path) end)
        end
        if round % 2 == 0 then ums.yield() end
        for k = 1, 16 do ts[k]:cancel() end
        for k = 1, 16 do
          local ok, r = ts[k]:join(5)
          assert(ok == false and r == ums.CANCELLED or ok == true
                 and r == ("r"):rep(4096), r)
        end
      end
      assert.equal(4096, #fs.readfile(path))
    end)
    collectgarbage()
    assert.equal(before, nfds())
  end)

  it_shell("cancelling a FIFO read_into in flight, then the writer writes: "
           .. "the dropped buffer is still the kernel's", function()
    local fifo = mkfifo()
    run(function()
      local f = assert(fs.open(fifo, "r+"))
      for round = 1, 10 do
        local t = ums.spawn(function()
          local buf = ffi.buffer(64 * 1024)
          return f:read_into(buf, 10)
        end)
        ums.yield()
        t:cancel()
        -- the data arrives while the cancel is on its way (plain write on
        -- this thread: no park)
        local w = assert(io.open(fifo, "w"))
        w:write(("%010d"):format(round))
        w:close()
        local ok, r = t:join(5)
        assert(ok == false and r == ums.CANCELLED or ok == true and r == 10,
               r)
        -- (a read the cancel gave up may have taken the data or not: the
        -- next round's read may find it)
        collectgarbage()
        local fresh = ffi.buffer(64 * 1024)
        ums.sleep(0.001)
        assert.equal(("\0"):rep(16), ffi.string(fresh, 16))
      end
      f:close()
    end)
    assert.is_true(fs.remove(fifo))
  end)
end)

-- ---------------------------------------------------------------------
-- Bad input
-- ---------------------------------------------------------------------

-- A message is clear when it names the argument or the rule.
-- fs.lines raises io.lines's "path: message" when it cannot open.
local CLEAR = {"bad argument", "attempt to use a closed file", "invalid",
  "must not be negative", "expected", "no integer representation",
  ": No such file or directory", ": Is a directory"}
local function clear(msg)
  if type(msg) ~= "string" then return false end
  for _, p in ipairs(CLEAR) do
    if msg:find(p, 1, true) then return true end
  end
  return false
end

describe("ums.fs bad input", function()
  both("a missing file, a directory opened for writing", function()
    local missing = TMP .. "/no/such"
    assert.same(pack(io.open(missing)), pack(fs.open(missing)))
    assert.same({n = 3, nil, missing .. ": No such file or directory", 2},
                pack(fs.open(missing)))
    assert.same(pack(io.open(missing, "w")), pack(fs.open(missing, "w")))
    for _, m in ipairs{"w", "a", "r+", "w+", "a+"} do
      assert.same(pack(io.open(TMP, m)), pack(fs.open(TMP, m)))
      assert.same({n = 3, nil, TMP .. ": Is a directory", 21},
                  pack(fs.open(TMP, m)))
    end
    -- a directory opened for reading: reads fail like io's
    local d = assert(fs.open(TMP))
    local iod = assert(io.open(TMP))
    assert.same(pack(iod:read("a")), pack(d:read("a")))
    assert.same(pack(iod:read("l")), pack(d:read("l")))
    assert.same({n = 3, nil, "Is a directory", 21}, pack(d:read(1)))
    iod:close()
    d:close()
    assert.same(pack(io.open("")), pack(fs.open("")))
    assert.same(pack(fs.readfile(missing)),
                {n = 3, nil, missing .. ": No such file or directory", 2})
    assert.same(pack(fs.writefile(missing, "x")),
                {n = 3, nil, missing .. ": No such file or directory", 2})
    assert.same(pack(fs.writefile(TMP, "x")),
                {n = 3, nil, TMP .. ": Is a directory", 21})
    assert.same(pack(fs.readfile(TMP)),
                {n = 3, nil, TMP .. ": Is a directory", 21})
  end)

  both("invalid modes raise like io's", function()
    local path = put(tmpname(), "keep")
    for _, m in ipairs{"x", "rw", "r+x", "", "rb+", "+", "r++", "ab+c"} do
      local ok1, e1 = pcall(io.open, path, m)
      local ok2, e2 = pcall(fs.open, path, m)
      assert.is_false(ok1, m)
      assert.is_false(ok2, m)
      assert.matches("invalid mode", e2)
    end
    for _, m in ipairs{"r", "rb", "r+b", "rbbb", "w+b", "a+", "ab"} do
      local f = assert(fs.open(path, m))
      assert.equal("file", fs.type(f))
      f:close()
      if m:find("w") then put(path, "keep") end
    end
    assert.equal("keep", get(path))
  end)

  both("a closed file: every method raises", function()
    local f = assert(fs.open(put(tmpname(), "abc"), "r+"))
    assert.is_true(f:close())
    for _, call in ipairs{{"read"}, {"read", "a"}, {"write", "x"},
                          {"lines"}, {"seek"}, {"flush"}, {"close"},
                          {"pread", 1, 0}, {"pwrite", "x", 0}, {"sync"},
                          {"read_into", ffi.buffer(1)},
                          {"pread_into", ffi.buffer(1), 1, 0}} do
      local ok, err = pcall(f[call[1]], f, unpack(call, 2))
      assert.is_false(ok, call[1])
      assert.matches("attempt to use a closed file", err, 1, true)
    end
    -- a lines iterator of a file closed meanwhile
    local g = assert(fs.open(put(tmpname(), "1\n2\n")))
    local iter = g:lines()
    assert.equal("1", iter())
    g:close()
    assert.has_error(iter, "file is already closed")
    -- a file is closed after fs.lines ends
    local it2, _, _, h = fs.lines(put(tmpname(), "z\n"))
    assert.equal("z", it2())
    assert.is_nil(it2())
    assert.equal("closed file", fs.type(h))
  end)

  both("negative offsets and counts raise; a huge count reads the file",
       function()
    local path = put(tmpname(), "small file\n")
    local f = assert(fs.open(path, "r+"))
    for _, call in ipairs{{"pread", -1, 0}, {"pread", 1, -1},
                          {"pwrite", "x", -1}, {"read", -1},
                          {"read", 1, -5}, {"pread", math.mininteger, 0},
                          {"pwrite", "x", math.mininteger}} do
      local ok, err = pcall(f[call[1]], f, unpack(call, 2))
      assert.is_false(ok)
      assert.matches("must not be negative", err)
    end
    assert.same(pack(io.open(path):seek("set", -1)), pack(f:seek("set", -1)))
    assert.same({n = 3, nil, "Invalid argument", 22}, pack(f:seek("cur", -100)))
    assert.equal("small file\n", f:read(2^40))
    assert.is_nil(f:read(2^40))
    assert.equal("small file\n", f:pread(2^40, 0))
    assert.equal("all file\n", f:pread(math.maxinteger, 2))
    assert.is_nil(f:pread(1, math.maxinteger))
    f:close()
    assert.equal("small file\n", get(path))
  end)

  both("reading a write-only file and writing a read-only one fail like io",
       function()
    local path = put(tmpname(), "ro")
    for _, m in ipairs{"r", "w", "a"} do
      local g = assert(io.open(path, m))
      local f = assert(fs.open(path, m))
      if m == "r" then
        same_result(packn(g:write("x")), packn(f:write("x")), "write on r")
        assert.same({n = 3, nil, "Bad file descriptor", 9},
                    pack(f:pwrite("x", 0)))
      else
        same_result(packn(g:read("l")), packn(f:read("l")), "read on " .. m)
        same_result(packn(g:read(0)), packn(f:read(0)), "read(0) on " .. m)
        assert.same({n = 3, nil, "Bad file descriptor", 9},
                    pack(f:pread(1, 0)))
      end
      g:close()
      f:close()
    end
  end)

  both("a bad argument raises before anything is written", function()
    local path = put(tmpname(), "original")
    assert.has_error(function() fs.writefile(path, {}) end)
    assert.equal("original", get(path))
    local f = assert(fs.open(path, "a"))
    assert.has_error(function() f:write("half", {}) end)
    assert.has_error(function() f:write("half", nil) end)
    f:close()
    assert.equal("original", get(path))
    f = assert(fs.open(path, "r"))
    assert.has_error(function() f:read("l", "x") end)
    assert.equal("original", f:read("a"))   -- the bad call read nothing
    f:close()
  end)

  -- Every function and method with each kind of value in each position:
  -- a Lua error with a clear message, nil + message + errno, or a result.
  local co = coroutine.create(function() end)
  local VALUES = {
    {"nil", nil}, {"true", true}, {"0", 0}, {"-1", -1}, {"1.5", 1.5},
    {"''", ""}, {"{}", {}}, {"function", print}, {"coroutine", co},
    {"nan", 0 / 0}, {"mininteger", math.mininteger},
    {"2^63", 2^63}, {"io.stdout", io.stdout},
  }
  -- Names in the working directory that a number used as a path creates.
  local CWD_NAMES = {"0", "-1", "1.5", "nan", "-nan", "-9223372036854775808",
    "9.2233720368548e+18"}

  local function sweep()
    local base = tmpname("sweep")
    local file_path = base .. "-file"
    local function fresh() put(file_path, "line 1\nline 2\n") end
    local dir_path = base .. "-dir"
    local existed = {}
    for _, n in ipairs(CWD_NAMES) do existed[n] = fs.stat(n) ~= nil end
    local entries = {
      {"open", fs.open, {file_path, "r"}},
      {"lines", fs.lines, {file_path, "l"}},
      {"readfile", fs.readfile, {file_path}},
      {"writefile", fs.writefile, {file_path, "x"}},
      {"stat", fs.stat, {file_path, true}},
      {"remove", fs.remove, {file_path}},
      {"rename", fs.rename, {file_path, file_path .. "2"}},
      {"mkdir", fs.mkdir, {dir_path, 448}},
      {"dir", fs.dir, {TMP}},
      {"type", fs.type, {1}},
      {"f:read", "read", {"FILE", "l", 1}},
      {"f:write", "write", {"FILE", "s", 1}},
      {"f:lines", "lines", {"FILE", "l"}},
      {"f:seek", "seek", {"FILE", "set", 0}},
      {"f:flush", "flush", {"FILE"}},
      {"f:close", "close", {"FILE"}},
      {"f:pread", "pread", {"FILE", 1, 0}},
      {"f:pwrite", "pwrite", {"FILE", "s", 0}},
      {"f:sync", "sync", {"FILE"}},
      {"f:read_into", "read_into", {"FILE", ffi.buffer(16), 1}},
      {"f:pread_into", "pread_into", {"FILE", ffi.buffer(16), 1, 0}},
    }
    local calls, bad = 0, {}
    for _, e in ipairs(entries) do
      local name, fn, valid = e[1], e[2], e[3]
      for pos = 1, #valid + 1 do
        for _, v in ipairs(VALUES) do
          fresh()
          fs.remove(dir_path)
          fs.remove(file_path .. "2")
          local file = assert(fs.open(file_path, "r+"))
          local args = {}
          for i = 1, #valid do
            args[i] = valid[i] == "FILE" and file or valid[i]
          end
          args[pos] = v[2]
          local f = fn
          if type(fn) == "string" then
            f = getmetatable(file).__index[fn]
          end
          local r = pack(pcall(f, unpack(args, 1, #valid + 1)))
          calls = calls + 1
          local what = ("%s arg %d = %s"):format(name, pos, v[1])
          if not r[1] then
            if not clear(r[2]) then
              bad[#bad + 1] = what .. ": unclear error " .. tostring(r[2])
            end
          elseif r[2] == nil and r.n > 2 then
            if type(r[3]) ~= "string" or math.type(r[4]) ~= "integer" then
              bad[#bad + 1] = what .. ": nil without message and errno"
            end
          end
          if fs.type(file) == "file" then file:close() end
          if type(r[2]) == "function" and name == "lines" then
            -- close the file fs.lines opened
            if fs.type(r[5]) == "file" then r[5]:close() end
          end
        end
      end
    end
    for _, n in ipairs(CWD_NAMES) do
      if not existed[n] and fs.stat(n) then rmtree(n) end
    end
    assert.equal(0, #bad, table.concat(bad, "\n"))
    assert.is_true(calls > 500)
  end

  it("a sweep of wrong types in every argument position (outside a task)",
     sweep)
  it("a sweep of wrong types in every argument position (in a task)",
     function() run(sweep, 60) end)
end)

-- ---------------------------------------------------------------------
-- Garbage collection
-- ---------------------------------------------------------------------

describe("ums.fs and the garbage collector", function()
  both("a dropped file has its writes flushed and its fd closed", function()
    local path = tmpname()
    do
      local f = assert(fs.open(path, "w"))
      f:write("pending ", 42)
    end
    collectgarbage()
    collectgarbage()
    assert.equal("pending 42", get(path))
    local before = nfds()
    for i = 1, 1000 do
      local f = assert(fs.open(path, "a"))
      f:write(i % 10)
      if i % 2 == 0 then f:read(0) end   -- a failed read: still pending
      if i % 100 == 0 then collectgarbage() end
    end
    collectgarbage()
    collectgarbage()
    assert.is_true(nfds() <= before, "descriptors leaked")
    local s = get(path)
    assert.equal(10 + 1000, #s)
  end)
end)

teardown(function()
  rmtree(TMP)
end)
