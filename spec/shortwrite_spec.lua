-- Short writes through ums.fs: every kind of write (writefile, write,
-- flush, close, many small writes, pwrite) crossing a file size limit
-- (`ulimit -f`, EFBIG) and filling a small file system (a 1 MiB tmpfs,
-- ENOSPC), outside a task and in one, on both file-I/O backends. Each must
-- report the error with the count it wrote, that count must be what the
-- file holds, and the file must hold the first bytes of the data in order
-- (a retry at a wrong position would leave another part, or overwrite the
-- start).
--
-- The writes run in a child (spec/shortwrite_child.lua) under bash's
-- `ulimit -f` with SIGXFSZ ignored, or in a private mount namespace with
-- the tmpfs mounted (`unshare -m`, root only: pending elsewhere, and the
-- mount goes with the child). ctest labels this spec "fault".

local sp = require "subprocess"

local it = sp.guard(it, pending)

local HERE = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local CHILD = HERE .. "shortwrite_child.lua"
local LIMIT = 1024 * 1024
local EFBIG, ENOSPC = 27, 28

-- This process does not load ums: in TSan builds only the children get
-- the sanitizer runtime the module needs.

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  assert(os.execute("mkdir -m 700 " .. sp.q(d)))
  return d
end

-- A preload meant for the child lua5.4 only (TSan builds): bash and sh
-- cannot start with it, so it goes on the child's own command line, and
-- sp.sh is run without it.
local CHILD_PRELOAD = sp.child_preload

-- sp.sh(cmdline, opts) with nothing preloaded into the shells.
local function sh(cmdline, opts)
  sp.child_preload = nil
  local ok, r = pcall(sp.sh, cmdline, opts)
  sp.child_preload = CHILD_PRELOAD
  assert(ok, r)
  return r
end

-- Runs the child in a shell line made by wrap(dir, child command), in a
-- fresh directory; returns sp.sh's result.
local function run_child(wrap, where, backend)
  local env = {}
  if backend == "pool" then env.UMS_IO = "pool" end
  local dir = tmpdir()
  local child = sp.q(sp.lua) .. " " .. sp.q(CHILD) .. " " .. where .. " "
    .. sp.q(dir) .. " " .. LIMIT
  if CHILD_PRELOAD then
    child = "env LD_PRELOAD=" .. sp.q(CHILD_PRELOAD) .. " " .. child
  end
  local r = sh(wrap(dir, child), {env = env, timeout = 60})
  os.remove(dir)
  return r
end

-- The backend the runtime picks here by default, asked of a child without
-- limits: the child's default run must get the same (io_uring where the
-- kernel has it).
local default_backend
do
  local r = run_child(function(_, child) return child end, "backend",
                      "default")
  default_backend = r.stdout:match("^backend\t(%a+)")
end

-- Returns the child's lines as lists of fields, by label (a label may
-- repeat), and its "file" lines by file name.
local function parse(r)
  local by, files = {}, {}
  for line in r.stdout:gmatch("[^\n]+") do
    local t = {}
    for field in (line .. "\t"):gmatch("([^\t]*)\t") do t[#t + 1] = field end
    local label = table.remove(t, 1)
    if label == "file" then
      files[t[1]] = {size = tonumber(t[2]), prefix = t[3] == "true"}
    else
      by[label] = by[label] or {}
      table.insert(by[label], t)
    end
  end
  return by, files
end

-- One failure result: nil, message, errno, written.
local function failed(t, errno, written, ctx)
  assert(t, "no result for " .. ctx)
  assert.are.equal("nil", t[1], ctx)
  assert.are.equal(tostring(errno), t[3], ctx .. ": " .. tostring(t[2]))
  assert.are.equal(tostring(written), t[4], ctx)
end

local function ok(t, ctx)
  assert(t, "no result for " .. ctx)
  assert.are.equal("true", t[1], ctx .. ": " .. table.concat(t, " "))
end

local function check(r, errno, where, backend)
  sp.assert_exit(r, 0)
  local by, files = parse(r)
  local function ctx(s)
    return s .. " (" .. where .. ", " .. backend .. ")"
  end
  assert(by.done, ctx("the child did not finish") .. "\n" .. sp.describe(r))
  if where == "task" then
    local want = backend == "pool" and "pool" or default_backend
    assert.are.equal(want, by.backend[1][1], ctx("backend"))
  end
  -- Every file holds exactly the first LIMIT bytes of the data.
  for _, name in ipairs{"writefile", "write", "pieces", "flush", "close",
                        "small", "pwrite"} do
    local f = files[name]
    assert(f, ctx("no file " .. name) .. "\n" .. sp.describe(r))
    assert.are.equal(LIMIT, f.size, ctx(name .. ": size"))
    assert(f.prefix, ctx(name .. ": not the first bytes of the data"))
  end
  failed(by.writefile[1], errno, LIMIT, ctx("writefile"))
  failed(by["write.write"][1], errno, LIMIT, ctx("write"))
  assert.are.equal(tostring(LIMIT), by["write.pos"][1][1], ctx("write.pos"))
  ok(by["write.flush"][1], ctx("write.flush"))
  ok(by["write.close"][1], ctx("write.close"))
  local piece = LIMIT // 10 * 3
  for i = 1, 3 do ok(by["pieces." .. i][1], ctx("piece " .. i)) end
  failed(by["pieces.4"][1], errno, LIMIT - 3 * piece, ctx("piece 4"))
  failed(by["pieces.5"][1], errno, 0, ctx("piece 5"))
  ok(by["pieces.close"][1], ctx("pieces.close"))
  ok(by["flush.first"][1], ctx("flush.first"))
  for i = 1, 3 do ok(by["flush.small"][i], ctx("flush.small")) end
  failed(by["flush.flush"][1], errno, 1000, ctx("flush"))
  assert.are.equal(tostring(LIMIT), by["flush.pos"][1][1], ctx("flush.pos"))
  ok(by["flush.close"][1], ctx("flush.close"))
  ok(by["close.first"][1], ctx("close.first"))
  ok(by["close.small"][1], ctx("close.small"))
  failed(by["close.close"][1], errno, 1000, ctx("close"))
  -- Many small writes: the one whose flush crosses the limit says how
  -- much of its flush fitted; the position is then at the limit.
  local sf = by["small.fail"][1]
  assert.are.equal("nil", sf[1], ctx("small writes"))
  assert.are.equal(tostring(errno), sf[3], ctx("small writes"))
  local n = tonumber(sf[4])
  assert(n and n > 0 and n <= 65536, ctx("small writes: count " .. sf[4]))
  assert.are.equal(tostring(LIMIT), by["small.pos"][1][1], ctx("small.pos"))
  failed(by["small.close"][1], errno, 0, ctx("small.close"))
  failed(by.pwrite[1], errno, LIMIT, ctx("pwrite"))
  failed(by["pwrite.again"][1], errno, 0, ctx("pwrite.again"))
  ok(by["pwrite.close"][1], ctx("pwrite.close"))
end

-- The child under a file size limit of LIMIT.
local function ulimit(_, child)
  return "bash -c " .. sp.q("ulimit -f " .. LIMIT // 1024 ..
                            " && trap '' XFSZ && exec " .. child)
end

-- The child in a mount namespace of its own, its directory the mount
-- point of a tmpfs of LIMIT bytes.
local function tmpfs(dir, child)
  return "unshare -m sh -c " .. sp.q("mount -t tmpfs -o size=" ..
    LIMIT // 1024 .. "k none " .. sp.q(dir) .. " && exec " .. child)
end

-- Whether this process may make a mount namespace with a tmpfs in it.
local can_mount
do
  local r = sh("unshare -m sh -c 'mount -t tmpfs -o size=4k none /mnt'",
               {timeout = 20})
  can_mount = r.how == "exit" and r.code == 0
end

for _, backend in ipairs{"default", "pool"} do
  for _, where in ipairs{"host", "task"} do
    local what = " (" .. backend .. " backend, " .. where .. ")"
    describe("a write crossing the file size limit" .. what, function()
      it("reports EFBIG with the count written, the file holding the "
         .. "first part", function()
        check(run_child(ulimit, where, backend), EFBIG, where, backend)
      end)
    end)
    describe("a write filling the file system" .. what, function()
      it("reports ENOSPC with the count written, the file holding the "
         .. "first part", function()
        if not can_mount then
          return pending("no tmpfs mount here (needs root and unshare)")
        end
        check(run_child(tmpfs, where, backend), ENOSPC, where, backend)
      end)
    end)
  end
end

teardown(function() sp.cleanup() end)
