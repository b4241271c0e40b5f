--[[
bench_fs.lua: file I/O from Lua, ums.fs next to its floors, luv and
Tarantool's fio, in one run (fio runs in its own process,
bench_fs_tarantool.lua, started from here when tarantool is installed).

usage: lua5.4 bench/lua/bench_fs.lua [--quick] [--reps N] [--dir DIR]
                                     [--only big|small] [--json]

Warm cache: the files are read once before anything is timed. Figures are
wall-clock medians of --reps repetitions (default 5), each shape's
contenders interleaved so that drift hits all alike.

  big1     one 1 GiB file (DIR/big.dat) read in 1 MiB chunks by one task:
           ums.fs file:read(1 MiB) until the end (a Lua string per read),
           and file:read_into(buf) into one 1 MiB ums.ffi.buffer (no
           string: the kernel's copy only); floor: read(2) in C
           (bench_floor.read_file); also Lua's io (f:read(1 MiB)), which
           pays the same copy into a Lua string as ums.fs's string path.
  big64    the same file read by 64 tasks, each a contiguous slice, on one
           shared file: file:pread(1 MiB, offset) (strings) and
           file:pread_into(buf, 1 MiB, offset) (a 1 MiB buffer per task);
           luv: 64 chains of uv.fs_read callbacks.
  small64  10,000 files of 4 KiB (DIR/small/NN/fNNNNN) each opened, read
           whole and closed, by 64 tasks: ums.fs.open, f:read("a"),
           f:close(), and ums.fs.readfile(path) (the same three steps in
           one call); floor: the same in a C loop on one thread
           (bench_floor.small_files); luv: 64 chains of fs_open -> fs_read
           -> fs_close callbacks. readfile also once with the 64 tasks
           split over two schedulers (two VMs, ums.submit_on), so that
           the second CPU takes half the Lua and kernel work.

ums runs with both backends (io = "uring" and "pool"). The files are
created when missing (bench/bench_io.c uses the same layout). Every Lua
task of a run is on scheduler 0, so ums.fs has one thread for the Lua
work and the kernel's; bench_io's small64_1s and small64_step_1s are the
same shape in C on one scheduler, the ceiling for this one.
--quick: a 64 MiB file and 500 small files (ctest: bench_fs_smoke).
--only big: big1 and big64 alone; --only small: small64 alone (for A/B
runs of one shape; no Tarantool then).
]]

local ums = require "ums"
local floor = require "bench_floor"
local has_luv, uv = pcall(require, "luv")

local fmt = string.format
local now = floor.now

local opt = { quick = false, json = false, reps = 5,
              dir = "/tmp/ums-bench-io", only = nil }
do
  local i = 1
  while i <= #arg do
    local a = arg[i]
    if a == "--quick" then opt.quick = true
    elseif a == "--json" then opt.json = true
    elseif a == "--reps" then
      i = i + 1
      opt.reps = math.tointeger(tonumber(arg[i]))
      if not opt.reps or opt.reps < 1 then
        io.stderr:write("bench_fs: --reps needs a positive integer\n")
        os.exit(2)
      end
    elseif a == "--dir" then
      i = i + 1
      opt.dir = arg[i]
    elseif a == "--only" then
      i = i + 1
      opt.only = arg[i]
      if opt.only ~= "big" and opt.only ~= "small" then
        io.stderr:write("bench_fs: --only takes big or small\n")
        os.exit(2)
      end
    elseif a == "-h" or a == "--help" then
      print("usage: lua5.4 bench_fs.lua [--quick] [--reps N] [--dir DIR]"
        .. " [--only big|small] [--json]")
      os.exit(0)
    else
      io.stderr:write("bench_fs: unknown option " .. a .. "\n")
      os.exit(2)
    end
    i = i + 1
  end
end
if opt.quick then opt.reps = math.min(opt.reps, 2) end

local MiB = 1024 * 1024
local BIG_SIZE = opt.quick and 64 * MiB or 1024 * MiB
local NSMALL = opt.quick and 500 or 10000
local CHUNK = MiB
local TASKS = 64

local function progress(s) io.stderr:write("bench_fs: ", s, "\n") end

-- ---------------------------------------------------------------------
-- Files
-- ---------------------------------------------------------------------

local big_path = opt.dir .. "/big.dat"
local small_paths = {}
for i = 0, NSMALL - 1 do
  small_paths[#small_paths + 1] = fmt("%s/small/%02d/f%05d", opt.dir,
    i % 100, i)
end

local function size_of(p)
  local f = io.open(p, "rb")
  if not f then return nil end
  local n = f:seek("end")
  f:close()
  return n
end

local function make_files()
  os.execute("mkdir -p '" .. opt.dir .. "/small'")
  if size_of(big_path) ~= BIG_SIZE then
    progress(fmt("creating %s (%d MiB)", big_path, BIG_SIZE // MiB))
    local f = assert(io.open(big_path, "wb"))
    local block = {}
    for i = 0, CHUNK // 8 - 1 do block[#block + 1] = fmt("%08x", i) end
    block = table.concat(block)
    for _ = 1, BIG_SIZE // CHUNK do assert(f:write(block)) end
    assert(f:close())
  end
  local block = string.rep("s", 4096)
  for i = 0, 99 do os.execute(fmt("mkdir -p '%s/small/%02d'", opt.dir, i)) end
  for _, p in ipairs(small_paths) do
    if size_of(p) ~= 4096 then
      local f = assert(io.open(p, "wb"))
      f:write(block)
      f:close()
    end
  end
end

-- ---------------------------------------------------------------------
-- Contenders (each returns its wall time in seconds)
-- ---------------------------------------------------------------------

local function timed(fn, ...)
  local t0 = now()
  fn(...)
  return now() - t0
end

local function c_big()
  assert(floor.read_file(big_path, CHUNK) == BIG_SIZE)
end

local function io_big()
  local f = assert(io.open(big_path, "rb"))
  local total = 0
  while true do
    local s = f:read(CHUNK)
    if not s then break end
    total = total + #s
  end
  f:close()
  assert(total == BIG_SIZE)
end

local function in_run(io_backend, fn)
  return function()
    ums.config{io = io_backend}
    local t = ums.run(function() return timed(fn) end)
    ums.config{io = "auto"}
    return t
  end
end

local function ums_big1()
  local f = assert(ums.fs.open(big_path))
  local total = 0
  while true do
    local s = f:read(CHUNK)
    if not s then break end
    total = total + #s
  end
  f:close()
  assert(total == BIG_SIZE, total)
end

local function ums_big1_into()
  local f = assert(ums.fs.open(big_path))
  local buf = ums.ffi.buffer(CHUNK)
  local total = 0
  while true do
    local n = assert(f:read_into(buf))
    if n == 0 then break end
    total = total + n
  end
  f:close()
  assert(total == BIG_SIZE, total)
end

local function big64(into)
  local f = assert(ums.fs.open(big_path))
  local slice = BIG_SIZE // TASKS
  local ts = {}
  for k = 0, TASKS - 1 do
    ts[#ts + 1] = ums.spawn(function()
      local off, stop, got = k * slice, (k + 1) * slice, 0
      local buf = into and ums.ffi.buffer(CHUNK)
      while off < stop do
        local n
        if into then
          n = assert(f:pread_into(buf, math.min(CHUNK, stop - off), off))
        else
          n = #assert(f:pread(math.min(CHUNK, stop - off), off))
        end
        off = off + n
        got = got + n
      end
      return got
    end)
  end
  local total = 0
  for _, t in ipairs(ts) do
    local ok, got = t:join()
    assert(ok, got)
    total = total + got
  end
  f:close()
  assert(total == BIG_SIZE)
end

local function ums_big64() big64(false) end
local function ums_big64_into() big64(true) end

local function small64(readfile)
  local ts = {}
  for k = 1, TASKS do
    ts[k] = ums.spawn(function()
      for i = k, NSMALL, TASKS do
        if readfile then
          assert(#ums.fs.readfile(small_paths[i]) == 4096)
        else
          local f = assert(ums.fs.open(small_paths[i]))
          assert(#f:read("a") == 4096)
          f:close()
        end
      end
    end)
  end
  for _, t in ipairs(ts) do assert(t:join()) end
end

local function ums_small64() small64(false) end
local function ums_small64_rf() small64(true) end

-- The same 64 tasks split over two schedulers (two VMs): each VM runs 32
-- of them through ums.fs.readfile, so the second CPU does Lua and kernel
-- work too. Each VM gets the paths of its own files before the timing,
-- as the VM of the other rows and the floor get theirs (copying the
-- table into the work item, or formatting each path in the loop, would
-- time work that no other row pays: formatting was ~0.5 us a file, a
-- tenth of readfile's). Only its own: a VM holding all 10,000 paths
-- while reading half the files marks and sweeps twice the live strings
-- per file read in each collection cycle the 4 KiB strings start,
-- against the one-VM rows (callgrind: readfile's lua_pushlstring,
-- collector steps included, is ~1,500 instructions per file).

-- Warm-up work for one VM: makes the VM (the first work item a scheduler
-- runs does) and the path lists of the tasks of the half it will read:
-- the half numbered as its scheduler plus one (1 or 2; an idle scheduler may steal
-- a work item queued for the other one, so the half goes by where the
-- work ran, not by what it was queued for). Task k of half h (k = h,
-- h + 2, ... up to tasks) reads files k, k + tasks, ... Says where it ran.
local function small_warm(dir, nsmall, tasks)
  local ums = require "ums"
  local half = ums.scheduler() + 1
  if not package.loaded["bench_fs.small_lists"] then
    local lists = {}
    for k = half, tasks, 2 do
      local list = {}
      for i = k, nsmall, tasks do
        list[#list + 1] = string.format("%s/small/%02d/f%05d", dir,
          (i - 1) % 100, i - 1)
      end
      lists[#lists + 1] = list
    end
    package.loaded["bench_fs.small_lists"] = lists
  end
  -- Busy for 5 ms, not asleep: a scheduler whose tasks all sleep is idle
  -- and steals the other's work item before that one wakes up (on a VM
  -- with slow wake-ups no item ever reached the second scheduler in 10
  -- attempts).
  local t0 = ums.now()
  while ums.now() - t0 < 0.005 do end
  return half
end

-- Reads this VM's half (its 32 tasks); returns the half.
local function small_half()
  local ums = require "ums"
  local lists = assert(package.loaded["bench_fs.small_lists"],
    "small_warm has not run on this VM")
  local ts = {}
  for _, list in ipairs(lists) do
    ts[#ts + 1] = ums.spawn(function()
      for i = 1, #list do
        assert(#ums.fs.readfile(list[i]) == 4096)
      end
    end)
  end
  for _, t in ipairs(ts) do assert(t:join()) end
  return ums.scheduler() + 1
end

local function ums_small64_rf_2s()
  local saved = ums.config()
  ums.config{schedulers = 2, io = "uring"}
  local t = ums.run(function()
    -- Both VMs made first (a VM is created the first time its scheduler
    -- runs work), each with its path lists: the timing is of the reading,
    -- as in the other rows.
    local seen = {}
    for _ = 1, 50 do
      local warm = {}
      for i = 1, 2 do warm[i] = ums.submit_on(i - 1, small_warm, opt.dir,
                                              NSMALL, TASKS) end
      for _, x in ipairs(warm) do
        local ok, where = x:join()
        assert(ok, where)
        seen[where] = true
      end
      if seen[1] and seen[2] then break end
    end
    assert(seen[1] and seen[2], "no work item ever ran on one scheduler")
    -- Both halves must be read, one by each VM: if a scheduler stole the
    -- other's work item before it started (one VM read its half twice),
    -- the attempt is not this row's measurement and is made again.
    for _ = 1, 20 do
      local halves = {}
      local dt = timed(function()
        local w = { ums.submit_on(0, small_half), ums.submit_on(1, small_half) }
        for i, x in ipairs(w) do
          local ok, h = x:join()
          assert(ok, h)
          halves[i] = h
        end
      end)
      if halves[1] ~= halves[2] then return dt end
      progress("readfile on 2 schedulers: both halves ran on scheduler "
        .. halves[1] .. " (stolen): measured again")
    end
    error("readfile on 2 schedulers: the halves kept running on one scheduler")
  end)
  ums.config{schedulers = saved.schedulers, io = saved.io}
  return t
end

local function c_small()
  assert(floor.small_files(small_paths) == NSMALL)
end

local function io_small()
  for _, p in ipairs(small_paths) do
    local f = assert(io.open(p, "rb"))
    assert(#f:read("a") == 4096)
    f:close()
  end
end

-- luv: callback chains, as a luv program would read concurrently.
local function luv_big(chains)
  local fd = assert(uv.fs_open(big_path, "r", 0))
  local slice = BIG_SIZE // chains
  local total = 0
  for k = 0, chains - 1 do
    local off, stop = k * slice, (k + 1) * slice
    local function step()
      if off >= stop then return end
      uv.fs_read(fd, math.min(CHUNK, stop - off), off, function(err, s)
        assert(not err, err)
        off = off + #s
        total = total + #s
        step()
      end)
    end
    step()
  end
  uv.run()
  uv.fs_close(fd)
  assert(total == BIG_SIZE)
end

local function luv_small()
  local done = 0
  for k = 1, TASKS do
    local i = k
    local function step()
      if i > NSMALL then return end
      local p = small_paths[i]
      i = i + TASKS
      uv.fs_open(p, "r", 0, function(err, fd)
        assert(not err, err)
        uv.fs_read(fd, 65536, 0, function(err2, s)
          assert(not err2 and #s == 4096, err2)
          uv.fs_close(fd, function()
            done = done + 1
            step()
          end)
        end)
      end)
    end
    step()
  end
  uv.run()
  assert(done == NSMALL)
end

-- ---------------------------------------------------------------------
-- Running and reporting
-- ---------------------------------------------------------------------

local function median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n = #s
  if n % 2 == 1 then return s[(n + 1) // 2] end
  return (s[n // 2] + s[n // 2 + 1]) / 2
end

-- Runs each contender once per repetition, interleaved; returns medians.
local function interleaved(list)
  local samples = {}
  for _, c in ipairs(list) do samples[c[1]] = {} end
  for _ = 1, opt.reps do
    for _, c in ipairs(list) do
      local t = c[2]
      local secs = c.in_run and t() or timed(t)
      table.insert(samples[c[1]], secs)
    end
  end
  local med = {}
  for k, v in pairs(samples) do med[k] = median(v) end
  return med
end

local results = {}
local function add(id, what, value, unit, floor_id, target)
  local r = { id = id, what = what, value = value, unit = unit,
              floor = floor_id, target = target }
  results[#results + 1] = r
  return r
end

local function want(shape) return not opt.only or opt.only == shape end

make_files()
progress("warming the page cache")
if want("big") then c_big() end
if want("small") then c_small() end

local m
if want("big") then
  progress(fmt("big1: %d MiB in 1 MiB chunks", BIG_SIZE // MiB))
  local big1 = {
    {"c", c_big}, {"io", io_big},
    {"uring", in_run("uring", ums_big1), in_run = true},
    {"pool", in_run("pool", ums_big1), in_run = true},
    {"uring_into", in_run("uring", ums_big1_into), in_run = true},
    {"pool_into", in_run("pool", ums_big1_into), in_run = true},
  }
  if has_luv then big1[#big1 + 1] = {"luv", function() luv_big(1) end} end
  m = interleaved(big1)
  local mbs = function(s) return BIG_SIZE / MiB / s end
  add("floor.big1", "C read(2) loop, 1 MiB chunks", mbs(m.c), "MB/s")
  add("io.big1", "Lua io f:read(1 MiB)", mbs(m.io), "MB/s", "floor.big1")
  add("ums.big1_uring", "ums.fs f:read(1 MiB), one task, io_uring",
    mbs(m.uring), "MB/s", "floor.big1", 0.8)
  add("ums.big1_pool", "ums.fs f:read(1 MiB), one task, pool",
    mbs(m.pool), "MB/s", "floor.big1", 0.8)
  add("ums.big1_into_uring", "ums.fs f:read_into(buf), one task, io_uring",
    mbs(m.uring_into), "MB/s", "floor.big1", 0.8)
  add("ums.big1_into_pool", "ums.fs f:read_into(buf), one task, pool",
    mbs(m.pool_into), "MB/s", "floor.big1", 0.8)
  if m.luv then
    add("luv.big1", "luv uv.fs_read(1 MiB) chain", mbs(m.luv), "MB/s",
      "floor.big1")
  end

  progress(fmt("big64: %d tasks, slices", TASKS))
  local big64 = {
    {"uring", in_run("uring", ums_big64), in_run = true},
    {"pool", in_run("pool", ums_big64), in_run = true},
    {"uring_into", in_run("uring", ums_big64_into), in_run = true},
    {"pool_into", in_run("pool", ums_big64_into), in_run = true},
  }
  if has_luv then
    big64[#big64 + 1] = {"luv", function() luv_big(TASKS) end}
  end
  m = interleaved(big64)
  add("ums.big64_uring", "ums.fs pread(1 MiB), 64 tasks, io_uring",
    mbs(m.uring), "MB/s", "floor.big1", 0.8)
  add("ums.big64_pool", "ums.fs pread(1 MiB), 64 tasks, pool", mbs(m.pool),
    "MB/s", "floor.big1", 0.8)
  add("ums.big64_into_uring", "ums.fs pread_into(buf), 64 tasks, io_uring",
    mbs(m.uring_into), "MB/s", "floor.big1", 0.8)
  add("ums.big64_into_pool", "ums.fs pread_into(buf), 64 tasks, pool",
    mbs(m.pool_into), "MB/s", "floor.big1", 0.8)
  if m.luv then
    add("luv.big64", "luv uv.fs_read, 64 chains", mbs(m.luv), "MB/s",
      "floor.big1")
  end
end

if want("small") then
  progress(fmt("small64: %d files of 4 KiB, %d tasks", NSMALL, TASKS))
  local small = {
    {"c", c_small}, {"io", io_small},
    {"uring", in_run("uring", ums_small64), in_run = true},
    {"pool", in_run("pool", ums_small64), in_run = true},
    {"uring_rf", in_run("uring", ums_small64_rf), in_run = true},
    {"pool_rf", in_run("pool", ums_small64_rf), in_run = true},
    {"uring_rf2", ums_small64_rf_2s, in_run = true},
  }
  if has_luv then small[#small + 1] = {"luv", luv_small} end
  m = interleaved(small)
  local fps = function(s) return NSMALL / s end
  add("floor.small", "C open/read/close loop, one thread", fps(m.c),
    "files/s")
  add("io.small", "Lua io open/read('a')/close loop", fps(m.io), "files/s",
    "floor.small")
  add("ums.small64_uring", "ums.fs open/read('a')/close, 64 tasks, io_uring",
    fps(m.uring), "files/s", "floor.small", 1.0)
  add("ums.small64_pool", "ums.fs open/read('a')/close, 64 tasks, pool",
    fps(m.pool), "files/s", "floor.small", 1.0)
  add("ums.small64_rf_uring", "ums.fs.readfile, 64 tasks, io_uring",
    fps(m.uring_rf), "files/s", "floor.small", 1.0)
  add("ums.small64_rf_pool", "ums.fs.readfile, 64 tasks, pool",
    fps(m.pool_rf), "files/s", "floor.small", 1.0)
  add("ums.small64_rf_2s", "ums.fs.readfile, 64 tasks on 2 schedulers",
    fps(m.uring_rf2), "files/s", "floor.small", 1.0)
  if m.luv then
    add("luv.small64", "luv fs_open/read/close, 64 chains", fps(m.luv),
      "files/s", "floor.small")
  end
end

-- Tarantool's fio, in its own process on the same files, now.
local tt = {}
if not opt.only then
  local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
  -- (without a sanitizer preloaded into it: the ASan smoke run)
  local cmd = fmt("command -v tarantool >/dev/null && env -u LD_PRELOAD "
    .. "tarantool '%s/bench_fs_tarantool.lua' --reps %d --dir '%s'%s "
    .. "2>/dev/null",
    here, opt.reps, opt.dir, opt.quick and " --quick" or "")
  progress("tarantool fio (if installed)")
  local p = io.popen(cmd)
  for line in p:lines() do
    local id, v = line:match("^tarantool%.(%S+) (%S+)")
    if id then tt[id] = tonumber(v) end
  end
  p:close()
end
if tt.big1 then
  add("tarantool.big1", "Tarantool fio fh:read(1 MiB), one fiber", tt.big1,
    "MB/s", "floor.big1")
  add("tarantool.big64", "Tarantool fio fh:pread(1 MiB), 64 fibers",
    tt.big64, "MB/s", "floor.big1")
  add("tarantool.small64", "Tarantool fio open/read/close, 64 fibers",
    tt.small64, "files/s", "floor.small")
end

-- Report: value, ratio to the floor (higher is better for both units).
local by_id = {}
for _, r in ipairs(results) do by_id[r.id] = r end
for _, r in ipairs(results) do
  if r.floor then r.ratio = r.value / by_id[r.floor].value end
  if r.target then r.pass = r.ratio >= r.target end
end
for _, id in ipairs{"ums.small64_uring", "ums.small64_rf_uring",
                    "ums.small64_rf_2s"} do
  local u = by_id[id] or {}
  if by_id["luv.small64"] then
    u.vs_luv = u.value / by_id["luv.small64"].value
  end
  if by_id["tarantool.small64"] then
    u.vs_tt = u.value / by_id["tarantool.small64"].value
  end
end

if opt.json then
  local parts = {}
  for _, r in ipairs(results) do
    local f = {}
    for _, k in ipairs{"id", "what", "unit", "floor"} do
      if r[k] then f[#f + 1] = fmt("%q: %q", k, r[k]) end
    end
    for _, k in ipairs{"value", "ratio", "target", "vs_luv", "vs_tt"} do
      if r[k] then f[#f + 1] = fmt("%q: %.6g", k, r[k]) end
    end
    if r.pass ~= nil then f[#f + 1] = fmt('"pass": %s', tostring(r.pass)) end
    parts[#parts + 1] = "  {" .. table.concat(f, ", ") .. "}"
  end
  print("[\n" .. table.concat(parts, ",\n") .. "\n]")
else
  print(fmt("%-22s %-46s %14s %9s  %s", "figure", "what", "value",
    "x floor", "target"))
  for _, r in ipairs(results) do
    local target = ""
    if r.target then
      target = fmt("%s (>= %.1fx floor)", r.pass and "PASS" or "MISS",
        r.target)
    end
    if r.vs_luv then target = target .. fmt("; %.2fx luv", r.vs_luv) end
    if r.vs_tt then
      target = target .. fmt(", %.2fx tarantool (target >= 2x both)",
        r.vs_tt)
    end
    print(fmt("%-22s %-46s %10.0f %-4s %8s  %s", r.id, r.what, r.value,
      r.unit == "MB/s" and "MB/s" or "/s",
      r.ratio and fmt("%.2f", r.ratio) or "-", target))
  end
  print(fmt("(%d repetitions, medians of wall time; files in %s)",
    opt.reps, opt.dir))
end
