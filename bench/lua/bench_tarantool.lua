--[[
bench_tarantool.lua: the peer figures for bench_ums.lua, with Tarantool
fibers. Tarantool's Lua is LuaJIT 2.1 (Lua 5.1 language), so this file is
Lua 5.1 and the raw-coroutine floors it prints are LuaJIT's, not Lua
5.4's: they say how fast this VM is, for context only.

Usage: tarantool bench/lua/bench_tarantool.lua [--quick] [--json] [--reps N]
Same counts, repetitions (medians), clocks (process CPU time first,
wall time next to it) and options as bench_ums.lua.

Figures (same shapes as bench_ums.lua)
  spawn    one fiber creates N fibers (an empty function) with fiber.new in
           batches of 1000 and joins each batch (set_joinable + join);
           also not joined (a counter, the creator yields until it is
           reached). Tarantool keeps dead fibers for reuse too.
  switch   N fiber.yield() calls between two fibers, ns per switch.
  channel  N messages on fiber.channel(0) from one fiber to another.
  memory   fibers parked in fiber.sleep, created one by one in a child
           process until N or until creation fails (here Tarantool maps a
           stack + guard per fiber and vm.max_map_count stops it near
           32,000): reports how many were alive and Lua heap / RSS growth
           per fiber, and the same for bare LuaJIT coroutines.
]]

local fiber = require 'fiber'
local clock = require 'clock'

local now = clock.monotonic
-- Process CPU time, the primary figure (see bench_ums.lua).
local cputime = os.clock

local function per(n, w0, c0)
  return (cputime() - c0) * 1e9 / n, (now() - w0) * 1e9 / n
end
local fmt = string.format
local floor = math.floor

local opt = { quick = false, json = false, reps = 5 }
do
  local i = 1
  while arg and i <= #arg do
    local a = arg[i]
    if a == '--quick' then opt.quick = true
    elseif a == '--json' then opt.json = true
    elseif a == '--reps' then
      i = i + 1
      opt.reps = tonumber(arg[i])
      if not opt.reps or opt.reps < 1 then
        io.stderr:write('bench_tarantool: --reps needs a positive integer\n')
        os.exit(2)
      end
    elseif a == '--child' then
      opt.child = arg[i + 1]
      opt.child_n = tonumber(arg[i + 2])
      i = i + 2
    else
      io.stderr:write('bench_tarantool: unknown option ' .. a .. '\n')
      os.exit(2)
    end
    i = i + 1
  end
end

local scale = opt.quick and 100 or 1
local N = {
  spawn = floor(1000000 / scale),
  switch = floor(10000000 / scale),
  channel = floor(1000000 / scale),
  memory = floor(1000000 / scale),
}
local SPAWN_BATCH = 1000

-- ---------------------------------------------------------------------
-- Helpers
-- ---------------------------------------------------------------------

local function rss_kb()
  local f = io.open('/proc/self/status', 'r')
  if not f then return 0 end
  local s = f:read('*a')
  f:close()
  return tonumber(s:match('VmRSS:%s*(%d+)%s*kB')) or 0
end

local function full_gc()
  collectgarbage('collect')
  collectgarbage('collect')
end

local function median(t)
  local s = {}
  for i = 1, #t do s[i] = t[i] end
  table.sort(s)
  local n = #s
  if n == 0 then return nil end
  if n % 2 == 1 then return s[(n + 1) / 2] end
  return (s[n / 2] + s[n / 2 + 1]) / 2
end

local function minmax(t)
  local lo, hi = math.huge, -math.huge
  for i = 1, #t do
    if t[i] < lo then lo = t[i] end
    if t[i] > hi then hi = t[i] end
  end
  return lo, hi
end

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- The interpreter running this script (the lowest index of arg).
local function interpreter()
  local lo = 0
  while arg[lo - 1] do lo = lo - 1 end
  return lo < 0 and arg[lo] or 'tarantool'
end

local function progress(s)
  io.stderr:write(s, '\n')
  io.stderr:flush()
end

local results, by_id, failed = {}, {}, false

local function add(r)
  if r.samples and #r.samples > 0 then
    r.median = median(r.samples)
    r.min, r.max = minmax(r.samples)
  end
  if r.unit == 'ns/op' and r.median and r.median > 0 then
    r.ops_per_s = 1e9 / r.median
  end
  if r.wall_samples and #r.wall_samples > 0 then
    r.wall_median = median(r.wall_samples)
  end
  if r.ratio_samples and #r.ratio_samples > 0 then
    r.ratio = median(r.ratio_samples)
  end
  results[#results + 1] = r
  by_id[r.id] = r
  return r
end

local function interleaved(fns)
  local samples, walls = {}, {}
  for _, f in ipairs(fns) do samples[f[1]], walls[f[1]] = {}, {} end
  for rep = 1, opt.reps do
    for _, f in ipairs(fns) do
      full_gc()
      local ok, v, w = pcall(f[2])
      if not ok then
        io.stderr:write(fmt('bench_tarantool: %s failed: %s\n', f[1],
          tostring(v)))
        failed = true
        v = nil
      end
      if v then
        table.insert(samples[f[1]], v)
        table.insert(walls[f[1]], w)
      end
    end
    progress(fmt('  rep %d/%d done', rep, opt.reps))
  end
  return samples, walls
end

local function ratios(a, b)
  local r = {}
  for i = 1, math.min(#a, #b) do r[i] = a[i] / b[i] end
  return r
end

local function joinable(fn, ...)
  local f = fiber.new(fn, ...)
  f:set_joinable(true)
  return f
end

local function join_ok(f)
  local ok, err = f:join()
  if not ok then error(err, 0) end
end

-- ---------------------------------------------------------------------
-- (a) spawn
-- ---------------------------------------------------------------------

local function empty() end

local function floor_spawn()
  local n = N.spawn
  local create, resume = coroutine.create, coroutine.resume
  local w0, c0 = now(), cputime()
  for _ = 1, n do resume(create(empty)) end
  return per(n, w0, c0)
end

local function fiber_spawn_join()
  local n, b = N.spawn, SPAWN_BATCH
  local new = fiber.new
  local fs = {}
  local w0, c0 = now(), cputime()
  local done = 0
  while done < n do
    local k = math.min(b, n - done)
    for i = 1, k do
      local f = new(empty)
      f:set_joinable(true)
      fs[i] = f
    end
    for i = 1, k do join_ok(fs[i]) end
    done = done + k
  end
  return per(n, w0, c0)
end

local function fiber_spawn_detached()
  local n, b = N.spawn, SPAWN_BATCH
  local new, yield = fiber.new, fiber.yield
  local count = 0
  local function work() count = count + 1 end
  local w0, c0 = now(), cputime()
  local started = 0
  while started < n do
    local k = math.min(b, n - started)
    for _ = 1, k do new(work) end
    started = started + k
    while count < started do yield() end
  end
  return per(n, w0, c0)
end

local function bench_spawn()
  progress(fmt('spawn: %d fibers', N.spawn))
  local s, sw = interleaved {
    {'floor', floor_spawn},
    {'join', fiber_spawn_join},
    {'detached', fiber_spawn_detached},
  }
  add { id = 'luajit.spawn', group = 'spawn', kind = 'floor',
        what = 'LuaJIT coroutine.create + resume, empty function',
        n = N.spawn, unit = 'ns/op', samples = s.floor, wall_samples = sw.floor }
  add { id = 'tarantool.spawn_join', group = 'spawn', kind = 'peer',
        what = fmt('fiber.new + join, batches of %d', SPAWN_BATCH),
        n = N.spawn, unit = 'ns/op', samples = s.join, wall_samples = sw.join,
        floor = 'luajit.spawn', ratio_samples = ratios(s.join, s.floor) }
  add { id = 'tarantool.spawn_detached', group = 'spawn', kind = 'peer',
        what = fmt('fiber.new, batches of %d, not joined', SPAWN_BATCH),
        n = N.spawn, unit = 'ns/op', samples = s.detached, wall_samples = sw.detached,
        floor = 'luajit.spawn', ratio_samples = ratios(s.detached, s.floor) }
end

-- ---------------------------------------------------------------------
-- (b) switch
-- ---------------------------------------------------------------------

local function floor_switch()
  local n = floor(N.switch / 2)
  local yield, resume = coroutine.yield, coroutine.resume
  local function body() while true do yield() end end
  local a, b = coroutine.create(body), coroutine.create(body)
  local w0, c0 = now(), cputime()
  for _ = 1, n do resume(a) resume(b) end
  return per(2 * n, w0, c0)
end

local function fiber_switch()
  local n = floor(N.switch / 2)
  local yield = fiber.yield
  local function body() for _ = 1, n do yield() end end
  local w0, c0 = now(), cputime()
  local a, b = joinable(body), joinable(body)
  join_ok(a)
  join_ok(b)
  return per(2 * n, w0, c0)
end

local function bench_switch()
  progress(fmt('switch: %d yields', N.switch))
  local s, sw = interleaved { {'floor', floor_switch}, {'fiber', fiber_switch} }
  add { id = 'luajit.switch', group = 'switch', kind = 'floor',
        what = 'LuaJIT: two coroutines resumed by a Lua loop',
        n = N.switch, unit = 'ns/op', samples = s.floor, wall_samples = sw.floor }
  add { id = 'tarantool.switch', group = 'switch', kind = 'peer',
        what = 'fiber.yield between two fibers',
        n = N.switch, unit = 'ns/op', samples = s.fiber, wall_samples = sw.fiber,
        floor = 'luajit.switch', ratio_samples = ratios(s.fiber, s.floor) }
end

-- ---------------------------------------------------------------------
-- (c) channel
-- ---------------------------------------------------------------------

local function floor_message()
  local n = N.channel
  local yield, resume = coroutine.yield, coroutine.resume
  local co = coroutine.create(function()
    for i = 1, n do yield(i) end
  end)
  local w0, c0 = now(), cputime()
  for i = 1, n do
    local _, v = resume(co)
    if v ~= i then error('floor_message: lost a value') end
  end
  return per(n, w0, c0)
end

local function fiber_channel()
  local n = N.channel
  local ch = fiber.channel(0)
  local w0, c0 = now(), cputime()
  local p = joinable(function()
    for i = 1, n do
      if not ch:put(i) then error('put failed') end
    end
  end)
  local c = joinable(function()
    for i = 1, n do
      local v = ch:get()
      if v ~= i then error('channel: got ' .. tostring(v)) end
    end
  end)
  join_ok(p)
  join_ok(c)
  return per(n, w0, c0)
end

local function bench_channel()
  progress(fmt('channel: %d messages', N.channel))
  local s, sw = interleaved { {'floor', floor_message},
                          {'fiber', fiber_channel} }
  add { id = 'luajit.message', group = 'channel', kind = 'floor',
        what = 'LuaJIT: a value carried by resume/yield',
        n = N.channel, unit = 'ns/op', samples = s.floor, wall_samples = sw.floor }
  add { id = 'tarantool.channel', group = 'channel', kind = 'peer',
        what = 'fiber.channel(0), put -> get',
        n = N.channel, unit = 'ns/op', samples = s.fiber, wall_samples = sw.fiber,
        floor = 'luajit.message', ratio_samples = ratios(s.fiber, s.floor) }
end

-- ---------------------------------------------------------------------
-- (d) memory per parked fiber, in child processes
-- ---------------------------------------------------------------------

local function child_mem_bare(n)
  local yield = coroutine.yield
  local function park() yield() end
  local cos = {}
  full_gc()
  local kb0, rss0 = collectgarbage('count'), rss_kb()
  for i = 1, n do
    local co = coroutine.create(park)
    coroutine.resume(co)
    cos[i] = co
  end
  full_gc()
  local kb1, rss1 = collectgarbage('count'), rss_kb()
  print(fmt('return {n = %d, lua_kb = %.3f, rss_kb = %d}', #cos,
    kb1 - kb0, rss1 - rss0))
end

-- Creates parked fibers until n or until creation fails; prints progress
-- so that the parent knows how far it got even if the process dies.
local function child_mem_fiber(n)
  local function park() fiber.sleep(3600) end
  local fs = {}
  full_gc()
  local kb0, rss0 = collectgarbage('count'), rss_kb()
  local err
  for i = 1, n do
    local ok, f = pcall(fiber.create, park)
    if not ok then
      err = tostring(f)
      break
    end
    fs[i] = f
    if i % 1000 == 0 then
      io.stdout:write('progress ', i, '\n')
      io.stdout:flush()
    end
  end
  full_gc()
  local kb1, rss1 = collectgarbage('count'), rss_kb()
  print(fmt('return {n = %d, lua_kb = %.3f, rss_kb = %d, error = %q}', #fs,
    kb1 - kb0, rss1 - rss0, err or ''))
end

local function run_child(kind, n)
  local cmd = fmt('%s %s --child %s %d 2>&1; echo "exit=$?"',
    shell_quote(interpreter()), shell_quote(arg[0]), kind, n)
  local p = io.popen(cmd, 'r')
  local out = p:read('*a')
  p:close()
  local line = out:match('(return {[^\n]*})')
  local code = out:match('exit=(%d+)%s*$')
  if line and code == '0' then return (loadstring or load)(line)() end
  local last
  for k in out:gmatch('progress (%d+)') do last = tonumber(k) end
  return nil, fmt('child %s exited %s after %s fibers: %s', kind,
    tostring(code), tostring(last or 0), out:sub(-300)), last
end

local function bench_memory()
  progress(fmt('memory: up to %d parked fibers (child processes)', N.memory))
  local bare = { lua = {}, rss = {} }
  local fib = { lua = {}, rss = {}, n = {} }
  local extra = { rss = {}, lua = {} }
  local errors = {}
  for rep = 1, opt.reps do
    local b, err1 = run_child('mem_bare', N.memory)
    local f, err2, last = run_child('mem_fiber', N.memory)
    if not b then
      io.stderr:write('bench_tarantool: memory: ', tostring(err1), '\n')
      failed = true
      break
    end
    if not f then
      -- The process died: report how far it got.
      table.insert(fib.n, last or 0)
      errors[#errors + 1] = err2
    else
      table.insert(fib.n, f.n)
      if f.error ~= '' then errors[#errors + 1] = f.error end
      table.insert(bare.lua, b.lua_kb * 1024 / b.n)
      table.insert(bare.rss, b.rss_kb * 1024 / b.n)
      if f.n > 0 then
        table.insert(fib.lua, f.lua_kb * 1024 / f.n)
        table.insert(fib.rss, f.rss_kb * 1024 / f.n)
        table.insert(extra.lua, f.lua_kb * 1024 / f.n - b.lua_kb * 1024 / b.n)
        table.insert(extra.rss, f.rss_kb * 1024 / f.n - b.rss_kb * 1024 / b.n)
      end
    end
    progress(fmt('  rep %d/%d done', rep, opt.reps))
  end
  local r = add { id = 'tarantool.mem_max', group = 'memory', kind = 'peer',
        what = fmt('parked fibers alive (asked for %d)', N.memory),
        n = N.memory, unit = 'tasks', samples = fib.n }
  if errors[1] then r.note = errors[1] end
  add { id = 'luajit.mem_lua', group = 'memory', kind = 'floor',
        what = 'LuaJIT bare coroutine parked: Lua heap',
        n = N.memory, unit = 'B/task', samples = bare.lua }
  add { id = 'luajit.mem_rss', group = 'memory', kind = 'floor',
        what = 'LuaJIT bare coroutine parked: RSS',
        n = N.memory, unit = 'B/task', samples = bare.rss }
  add { id = 'tarantool.mem_lua', group = 'memory', kind = 'peer',
        what = 'fiber parked in fiber.sleep: Lua heap',
        n = N.memory, unit = 'B/task', samples = fib.lua }
  add { id = 'tarantool.mem_rss', group = 'memory', kind = 'peer',
        what = 'fiber parked in fiber.sleep: RSS',
        n = N.memory, unit = 'B/task', samples = fib.rss }
  add { id = 'tarantool.mem_extra_lua', group = 'memory', kind = 'peer',
        what = 'fiber - bare coroutine: Lua heap',
        n = N.memory, unit = 'B/task', samples = extra.lua }
  add { id = 'tarantool.mem_extra_rss', group = 'memory', kind = 'peer',
        what = 'fiber - bare coroutine: RSS',
        n = N.memory, unit = 'B/task', samples = extra.rss }
end

-- ---------------------------------------------------------------------
-- Output
-- ---------------------------------------------------------------------

local function num(v)
  if v == nil then return '-' end
  if math.abs(v) >= 100 then return fmt('%.0f', v) end
  return fmt('%.1f', v)
end

local function rate(v)
  if not v then return '' end
  if v >= 1e6 then return fmt('%.2f M/s', v / 1e6) end
  if v >= 1e3 then return fmt('%.1f k/s', v / 1e3) end
  return fmt('%.0f /s', v)
end

if opt.child then
  if opt.child == 'mem_bare' then child_mem_bare(opt.child_n)
  elseif opt.child == 'mem_fiber' then child_mem_fiber(opt.child_n)
  else error('unknown child ' .. tostring(opt.child)) end
  os.exit(0)
end

local cmdline = {}
do
  local lo = 0
  while arg[lo - 1] do lo = lo - 1 end
  for i = lo, #arg do cmdline[#cmdline + 1] = arg[i] end
end
cmdline = table.concat(cmdline, ' ')

local t_start = now()
bench_spawn()
bench_switch()
bench_channel()
bench_memory()

local version = require('tarantool').version or '?'
local luajit = jit and jit.version or _VERSION
if opt.json then
  local clean = {}
  for i, r in ipairs(results) do
    local c = {}
    for k, v in pairs(r) do
      if k ~= 'ratio_samples' then c[k] = v end
    end
    clean[i] = c
  end
  print(require('json').encode({
    tool = 'bench_tarantool', tarantool = version, lua = luajit,
    quick = opt.quick, reps = opt.reps, command = cmdline,
    seconds = now() - t_start, failed = failed, results = clean,
  }))
else
  print(fmt('bench_tarantool  Tarantool %s, %s  reps=%d, medians%s',
    version, luajit, opt.reps, opt.quick and ', --quick: counts / 100' or ''))
  print('command: ' .. cmdline)
  print()
  local h = fmt('%-26s %-46s %10s %10s %7s %11s %7s', 'figure', 'what',
    'median', 'wall', 'unit', 'ops/s', 'ratio')
  print(h)
  print(string.rep('-', #h))
  local group
  for _, r in ipairs(results) do
    if r.group ~= group then
      if group then print() end
      group = r.group
    end
    print(fmt('%-26s %-46s %10s %10s %7s %11s %7s', r.id, r.what,
      num(r.median), num(r.wall_median), r.unit, rate(r.ops_per_s),
      r.ratio and fmt('%.2f', r.ratio) or ''))
    if r.note then print('    note: ' .. r.note) end
  end
  print()
  print('median = process CPU time (os.clock), wall = wall-clock time')
  print('ratio = CPU time / CPU time of the LuaJIT floor of the same shape')
  print(fmt('total %.1f s%s', now() - t_start,
    failed and '; SOME BENCHMARKS FAILED' or ''))
end
os.exit(failed and 1 or 0)
