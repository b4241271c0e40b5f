-- The engine of the API fuzzer (test/fuzz/api_fuzz.lua): random calls of
-- the public ums API, valid ones and misuses, from a seeded generator.
--
-- Every call runs under pcall: a Lua error is an answer, not a finding.
-- What the fuzzer hunts is what pcall cannot catch: a crash, a hang, a
-- sanitizer report, or a run that does not end. So nothing here may wait
-- without a bound: every wait has a timeout, every task does a bounded
-- number of steps, and the main task cancels what is left at the end.
-- One deadlock is still possible, as in any program: a task that ends
-- holding a mutex leaves a later condition wait on that mutex unable to
-- take it back (that wait has no bound, as in C). ums.run then ends with
-- its deadlock report, which api_fuzz.lua counts as an outcome. A hang is
-- a runtime bug, never the fuzzer's own deadlock.
--
-- The same engine runs in other schedulers' VMs (`fuzzlib.work`, reached
-- by ums.submit by name), where it touches only objects that may cross
-- VMs: shared objects passed as arguments, files, and its own tasks.
local ums = require "ums"

local M = {}

local random = math.random

local function pick(t) return t[random(#t)] end

-- The longest any single wait may take: short, so that thousands of calls
-- fit in a few seconds.
local function short() return pick{0, 0, 0.0001, 0.001, 0.003} end

local odd_strings = {"", "x", "0", "-1", "nan", "\0", ("s"):rep(300),
                     "r", "w", "a+", "rb", "*l", "n", "L", "a", "l"}

--- A context: the pools of objects this VM made so far, and the counters
-- the driver prints. `shared` holds the objects passed in from another VM.
function M.new(seed, dir, shared)
  local ctx = {
    seed = seed, dir = dir, calls = 0, raised = 0, failed = 0,
    tasks = {}, works = {}, chans = {}, schans = shared or {},
    mutexes = {}, sems = {}, events = {}, conds = {}, wgs = {},
    files = {}, groups = {},
  }
  return ctx
end

-- Any value at all: the inputs a careless caller passes.
local function any(ctx)
  local r = random(24)
  if r == 1 then return nil
  elseif r == 2 then return true
  elseif r == 3 then return false
  elseif r == 4 then return 0
  elseif r == 5 then return -1
  elseif r == 6 then return random(-3, 10)
  elseif r == 7 then return 1.5
  elseif r == 8 then return 0 / 0
  elseif r == 9 then return math.huge
  elseif r == 10 then return -math.huge
  elseif r == 11 then return math.mininteger
  elseif r == 12 then return math.maxinteger
  elseif r == 13 then return pick(odd_strings)
  elseif r == 14 then return {}
  elseif r == 15 then return {1, {2, {3}}, x = "y"}
  elseif r == 16 then return function() end
  elseif r == 17 then return coroutine.create(function() end)
  elseif r == 18 then return io.stderr
  elseif r == 19 then return ums.CANCELLED
  elseif r == 20 then return ctx.tasks[random(math.max(1, #ctx.tasks))]
  elseif r == 21 then return ctx.chans[random(math.max(1, #ctx.chans))]
  elseif r == 22 then return ctx.mutexes[random(math.max(1, #ctx.mutexes))]
  elseif r == 23 then return ctx.files[random(math.max(1, #ctx.files))]
  else return 2 ^ 53 end
end

-- A timeout: usually short and valid, sometimes a bad value. Never nil,
-- infinite or huge: those mean "wait for ever", which a bounded fuzzer
-- cannot afford where the awaited thing may never come.
local function timeout(ctx)
  local r = random(12)
  if r == 1 then return -1
  elseif r == 2 then return 0 / 0
  elseif r == 3 then return "0.001"
  elseif r == 4 then return {}
  elseif r == 5 then return true
  else return short() end
end

-- A value to send or return: plain data, sometimes nested, sometimes not
-- copyable across VMs (a function with upvalues, a coroutine, a file).
local function value(ctx)
  local r = random(10)
  if r <= 3 then return random(1000)
  elseif r == 4 then return pick(odd_strings)
  elseif r == 5 then
    local t = {n = random(5), s = "v"}
    t.self = t
    return t
  elseif r == 6 then return {1, 2, {3, {4, {5}}}}
  elseif r == 7 then return nil
  elseif r == 8 then return function() return ctx end
  else return any(ctx) end
end

local function obj(list)
  if #list == 0 then return nil end
  return list[random(#list)]
end

local function keep(list, v, max)
  if v == nil then return end
  if #list >= (max or 16) then
    list[random(#list)] = v
  else
    list[#list + 1] = v
  end
end

local actions = {}
local weights = {}

-- `where`: "main" (the first VM only: spawns, submits, files, ffi), "any"
-- (also in other VMs and in spawned tasks).
local function action(name, w, where, fn)
  actions[#actions + 1] = {name = name, fn = fn, where = where}
  weights[#weights + 1] = w
end

-- Tasks. A task's body does a bounded number of steps, so that it always
-- ends unless cancelled; cancellation stops it at its next wait.
local function body(ctx, depth, steps)
  for _ = 1, steps do
    M.step(ctx, depth + 1, "task")
  end
  local r = random(8)
  if r == 1 then error("fuzz error in a task") end
  if r == 2 then error({code = 42}) end
  return random(100), "result"
end

action("spawn", 6, "any", function(ctx, depth)
  if depth > 2 or #ctx.tasks > 200 then return end
  local fn = body
  if random(10) == 1 then fn = any(ctx) end
  local t = ums.spawn(fn, ctx, depth, random(0, 8))
  keep(ctx.tasks, t, 64)
  if random(4) == 1 then t:name(pick{"a", "fuzz task", ("n"):rep(80)}) end
end)

action("join", 4, "any", function(ctx)
  local t = obj(ctx.tasks)
  if t then return t:join(timeout(ctx)) end
end)

action("cancel", 2, "any", function(ctx)
  local t = obj(ctx.tasks)
  if t and t ~= ums.self() then return t:cancel() end
end)

action("task-query", 3, "any", function(ctx)
  local t = obj(ctx.tasks)
  if not t then return end
  local r = random(5)
  if r == 1 then return t:status()
  elseif r == 2 then return t:info()
  elseif r == 3 then return t:id(), t:name()
  elseif r == 4 then t:locals().x = random(10)
  else return t:name(any(ctx)) end
end)

action("sleep-yield", 4, "any", function(ctx)
  local r = random(4)
  if r == 1 then return ums.yield()
  elseif r == 2 then return ums.sleep(short())
  elseif r == 3 then return ums.sleep(timeout(ctx))
  else return ums.now(), ums.self(), ums.locals() end
end)

-- Computing without a wait for a while: the quantum (when on) must cut it
-- at a safe point, and a cancel must reach it there.
action("compute", 2, "any", function(ctx)
  local x, n = 0, random(1000, 300000)
  for i = 1, n do x = x + i % 7 end
  return x
end)

-- Channels, plain and shared.
action("channel", 3, "any", function(ctx)
  local r = random(6)
  if r == 1 then keep(ctx.chans, ums.channel(any(ctx)))
  else keep(ctx.chans, ums.channel(random(0, 4))) end
end)

local function chan_op(ctx, ch)
  local r = random(11)
  if r == 1 then return ch:send(value(ctx), timeout(ctx))
  elseif r == 2 then return ch:recv(timeout(ctx))
  elseif r == 3 then return ch:try_send(value(ctx))
  elseif r == 4 then return ch:try_recv()
  elseif r == 5 then if random(6) == 1 then return ch:close() end
  elseif r == 6 then return ch:len(), ch:cap(), ch:closed()
  elseif r == 7 then return ch.send(any(ctx), value(ctx), timeout(ctx))
  elseif r == 8 then return ch:recv(timeout(ctx))
  elseif r == 9 then return ch:send(nil, short())
  else return ch:recv(short()) end
end

action("chan-op", 8, "any", function(ctx)
  local ch = obj(ctx.chans)
  if ch then return chan_op(ctx, ch) end
end)

action("shared-chan-op", 4, "any", function(ctx)
  local ch = obj(ctx.schans)
  if ch then return chan_op(ctx, ch) end
end)

action("select", 4, "any", function(ctx)
  if #ctx.chans == 0 then return end
  local cases = {}
  for i = 1, random(3) do
    local ch = obj(ctx.chans)
    if random(2) == 1 then cases[i] = {ch, "recv"}
    else cases[i] = {ch, "send", value(ctx)} end
  end
  if random(8) == 1 then cases[#cases + 1] = any(ctx) end
  return ums.select(cases, timeout(ctx))
end)

-- Locks and the other primitives.
action("mutex", 5, "any", function(ctx)
  if #ctx.mutexes < 4 then keep(ctx.mutexes, ums.mutex()) end
  local m = obj(ctx.mutexes)
  local r = random(5)
  if r == 1 then
    if m:lock(timeout(ctx)) then
      if random(3) > 1 then ums.yield() end
      m:unlock()
    end
  elseif r == 2 then
    if m:trylock() then m:unlock() end
  elseif r == 3 then return m:unlock()
  elseif r == 4 then return m.lock(any(ctx), short())
  else return m:lock(short()) and m:unlock() end
end)

action("semaphore", 4, "any", function(ctx)
  if #ctx.sems < 3 then
    keep(ctx.sems, ums.semaphore(random(3) == 1 and any(ctx) or random(0, 2)))
  end
  local s = obj(ctx.sems)
  if not s then return end
  local r = random(4)
  if r == 1 then
    if s:acquire(timeout(ctx)) then ums.yield() s:release() end
  elseif r == 2 then return s:release(pick{1, 2, 0, -1, any(ctx)})
  elseif r == 3 then return s:value()
  else return s:acquire(timeout(ctx)) end
end)

action("event", 4, "any", function(ctx)
  if #ctx.events < 3 then keep(ctx.events, ums.event(any(ctx))) end
  local e = obj(ctx.events)
  local r = random(5)
  if r == 1 then return e:set()
  elseif r == 2 then return e:reset()
  elseif r == 3 then return e:wait(timeout(ctx))
  elseif r == 4 then return e:is_set()
  else return e.wait(any(ctx), short()) end
end)

action("cond", 3, "any", function(ctx)
  if #ctx.conds < 2 then keep(ctx.conds, ums.cond()) end
  if #ctx.mutexes == 0 then keep(ctx.mutexes, ums.mutex()) end
  local c, m = obj(ctx.conds), obj(ctx.mutexes)
  local r = random(4)
  if r == 1 then
    if m:lock(short()) then
      local ok, err = pcall(c.wait, c, m, timeout(ctx))
      m:unlock()
      if not ok then error(err, 0) end
    end
  elseif r == 2 then return c:signal()
  elseif r == 3 then return c:broadcast()
  else return c:wait(m, short()) end  -- without holding it: must raise
end)

action("waitgroup", 3, "any", function(ctx)
  if #ctx.wgs < 2 then keep(ctx.wgs, ums.waitgroup()) end
  local wg = obj(ctx.wgs)
  local r = random(4)
  if r == 1 then return wg:add(pick{1, 2, -1, 0, any(ctx)})
  elseif r == 2 then return wg:done()
  elseif r == 3 then return wg:wait(timeout(ctx))
  else return wg.add(any(ctx), 1) end
end)

action("group", 2, "any", function(ctx, depth)
  if depth > 2 then return end
  local r = random(3)
  if r == 1 then
    local g = ums.group(random(2) == 1 and {cancel_on_error = false} or nil)
    for _ = 1, random(3) do g:spawn(body, ctx, depth + 1, random(0, 3)) end
    keep(ctx.groups, g, 4)
    if random(2) == 1 then return g:wait(timeout(ctx)) end
  elseif r == 2 then
    local g = obj(ctx.groups)
    if not g then return end
    local q = random(5)
    if q == 1 then return g:cancel()
    elseif q == 2 then return g:errors(), g:tasks(), g:live()
    elseif q == 3 then return g:wait(timeout(ctx))
    elseif q == 4 then return g.spawn(any(ctx), body, ctx, depth + 1, 0)
    else return g:spawn(any(ctx)) end
  else
    return ums.group(any(ctx))
  end
end)

action("applock", 2, "any", function(ctx)
  local name = pick{"a", "b", "fuzz lock"}
  local mode = pick{"S", "X", "U", "IS", "IX", "bogus", any(ctx)}
  local ok = ums.applock.acquire(name, mode, timeout(ctx))
  if ok then ums.yield() return ums.applock.release(name) end
end)

-- Observation.
action("observe", 3, "any", function(ctx)
  local r = random(8)
  if r == 1 then return ums.stats()
  elseif r == 2 then return ums.tasks()
  elseif r == 3 then return ums.waits()
  elseif r == 4 then return ums.waits_reset()
  elseif r == 5 then return ums.io_backend(), ums.scheduler(), ums.schedulers()
  elseif r == 6 then return ums.run_until_idle(short())
  elseif r == 7 then return ums.config()
  else return ums.config(any(ctx)) end  -- inside a run: must raise
end)

-- Files, in the scratch directory only.
local modes = {"r", "w", "a", "r+", "w+", "a+", "rb", "wb", "x", "", "rw"}

local function path(ctx)
  local r = random(12)
  if r == 1 then return ctx.dir end
  if r == 2 then return ctx.dir .. "/nodir/f" end
  if r == 3 then return any(ctx) end
  return ctx.dir .. "/f" .. random(4)
end

action("fs-open", 3, "any", function(ctx)
  if #ctx.files > 12 then
    local f = table.remove(ctx.files, 1)
    return f:close()
  end
  local f, err = ums.fs.open(path(ctx), pick(modes))
  keep(ctx.files, f, 13)
  return f, err
end)

action("fs-file", 10, "any", function(ctx)
  local f = obj(ctx.files)
  if not f then return end
  local r = random(16)
  if r == 1 then return f:write(value(ctx), ("w"):rep(random(0, 5000)))
  elseif r == 2 then return f:read(pick{"n", "l", "L", "a", 1, 100, 0})
  elseif r == 3 then return f:read(any(ctx))
  elseif r == 4 then return f:seek(pick{"set", "cur", "end", "bogus"},
                                   pick{0, 3, -2, 100000, any(ctx)})
  elseif r == 5 then return f:flush()
  elseif r == 6 then return f:close()
  elseif r == 7 then
    local n = 0
    for l in f:lines(pick{"l", "L", 4}) do
      n = n + 1
      if n > 50 then break end
    end
  elseif r == 8 then return f:pread(random(0, 200), random(0, 300))
  elseif r == 9 then return f:pwrite(value(ctx), random(0, 300))
  elseif r == 10 then return f:pread(any(ctx), any(ctx))
  elseif r == 11 then return f:sync()
  elseif r == 12 then
    local buf = ums.ffi.buffer(random(1, 256))
    return f:read_into(buf, pick{nil, 1, #buf, #buf + 1, any(ctx)})
  elseif r == 13 then
    local buf = ums.ffi.buffer(random(1, 256))
    return f:pread_into(buf, pick{1, #buf, #buf + 1, -1}, random(0, 100))
  elseif r == 14 then return f:setvbuf(pick{"no", "full", "line", "x"})
  elseif r == 15 then return tostring(f), ums.fs.type(f)
  else return f:write(any(ctx)) end
end)

action("fs-path", 4, "any", function(ctx)
  local r = random(9)
  if r == 1 then return ums.fs.readfile(path(ctx))
  elseif r == 2 then return ums.fs.writefile(path(ctx),
                                             ("z"):rep(random(0, 70000)))
  elseif r == 3 then return ums.fs.stat(path(ctx), any(ctx))
  elseif r == 4 then return ums.fs.remove(path(ctx))
  elseif r == 5 then return ums.fs.rename(path(ctx), path(ctx))
  elseif r == 6 then return ums.fs.mkdir(ctx.dir .. "/d" .. random(3),
                                         pick{nil, 448, "x"})
  elseif r == 7 then
    local n = 0
    for name in ums.fs.dir(ctx.dir) do
      n = n + 1
      if n > 20 or random(4) == 1 then break end
    end
  elseif r == 8 then
    for _ in ums.fs.lines(path(ctx)) do
      if random(3) == 1 then break end
    end
  else return ums.fs.type(any(ctx)) end
end)

-- Calls into libc through ums.ffi: each goes preemptive inside a task.
-- The sizes passed to C stay inside the buffers: an overflow the caller
-- asks C for is the caller's bug, not one the binding could catch.
local ffi_ready = false
local function ffi_setup()
  if ffi_ready then return end
  ffi_ready = true
  ums.ffi.cdef[[
    size_t strlen(const char *s);
    int abs(int j);
    int getpid(void);
    int usleep(unsigned int usec);
    void *memset(void *s, int c, size_t n);
    int snprintf(char *str, size_t size, const char *format, ...);
    long strtol(const char *nptr, char **endptr, int base);
    double sqrt(double x);
  ]]
end

action("ffi", 4, "any", function(ctx)
  ffi_setup()
  local C = ums.ffi.C
  local r = random(11)
  if r == 1 then return C.strlen(pick{"abc", "", ("x"):rep(5000)})
  elseif r == 2 then return C.abs(any(ctx))
  elseif r == 3 then return C.getpid()
  elseif r == 4 then return C.usleep(random(0, 2000))
  elseif r == 5 then
    local buf = ums.ffi.buffer(random(1, 64))
    C.memset(buf, 65, #buf - 1)
    return ums.ffi.string(buf), ums.ffi.string(buf, random(0, #buf))
  elseif r == 6 then
    local buf = ums.ffi.buffer(64)
    C.snprintf(buf, #buf, "%ld %s %f", random(1000), "s", 1.5)
    return ums.ffi.string(buf)
  elseif r == 7 then return C.strtol(pick(odd_strings), nil, pick{10, 0, 16})
  elseif r == 8 then return C.sqrt(any(ctx))
  elseif r == 9 then
    local f = ums.ffi.timeout(C.usleep, pick{0.0005, 0.002, any(ctx)})
    return f(random(0, 3000))
  elseif r == 10 then return ums.ffi.errno(), ums.ffi.buffer(any(ctx))
  else return ums.ffi.string(any(ctx), any(ctx)) end
end)

-- Work on other schedulers, by value.
local function plain_work(n, ch, fail)
  local u = require "ums"
  u.sleep(0.0005)
  if ch then ch:send(n, 0.001) end
  if fail then error("fuzz error in work") end
  return n, {n, {n}}, "done"
end

action("submit", 4, "main", function(ctx)
  if #ctx.works > 200 then return end
  local r = random(8)
  local w
  local ch = obj(ctx.schans)
  if r <= 3 then
    w = ums.submit(plain_work, random(100), ch, random(6) == 1)
  elseif r <= 5 then
    w = ums.submit("fuzzlib.work", ctx.seed * 7919 + random(1e6),
                   random(0, 40), ctx.dir, ctx.schans)
  elseif r == 6 then
    w = ums.submit_on(pick{1, 2, 0, 3, any(ctx)}, plain_work, 1)
  elseif r == 7 then
    w = ums.submit(any(ctx), value(ctx))
  else
    w = ums.submit(plain_work, value(ctx))
  end
  keep(ctx.works, w, 64)
end)

action("work-op", 4, "main", function(ctx)
  local w = obj(ctx.works)
  if not w then return end
  local r = random(4)
  if r == 1 then return w:join(timeout(ctx))
  elseif r == 2 then return w:cancel()
  elseif r == 3 then return w:status(), w:scheduler(), w:name()
  else return w.join(any(ctx), short()) end
end)

-- Misuse: a public function called with arguments of random types. Calls
-- that would wait without a bound on valid input are left out.
local misuse = {
  function(ctx) return ums.spawn(any(ctx), any(ctx)) end,
  function(ctx) return ums.sleep(timeout(ctx)) end,
  function(ctx) return ums.yield(any(ctx)) end,
  function(ctx) return ums.run(any(ctx)) end,
  function(ctx) return ums.channel(any(ctx), any(ctx)) end,
  function(ctx) return ums.semaphore(any(ctx), any(ctx)) end,
  function(ctx) return ums.event(any(ctx), any(ctx)) end,
  function(ctx) return ums.mutex(any(ctx)) end,
  function(ctx) return ums.waitgroup(any(ctx)) end,
  function(ctx) return ums.select(any(ctx), timeout(ctx)) end,
  function(ctx) return ums.select({{any(ctx), any(ctx)}}, timeout(ctx)) end,
  function(ctx) return ums.on_error(any(ctx)) end,
  function(ctx) return ums.on_stall(any(ctx)) end,
  function(ctx) return ums.fs.open(any(ctx), any(ctx)) end,
  function(ctx) return ums.fs.writefile(any(ctx), any(ctx)) end,
  function(ctx) return ums.fs.stat(any(ctx)) end,
  function(ctx) return ums.ffi.cdef(pick{"int", "int f(", "void g(void);",
                                         "struct x;", any(ctx)}) end,
  function(ctx) return ums.ffi.buffer(any(ctx)) end,
  function(ctx) return ums.ffi.load(pick{"nosuchlib", "", "m", any(ctx)}) end,
  function(ctx) return ums.submit(any(ctx), any(ctx)) end,
  function(ctx) return ums.submit_on(any(ctx), any(ctx)) end,
  function(ctx) return ums.shared.channel(any(ctx)) end,
  function(ctx) return ums.park_wait() end,
  function(ctx) return ums.unpark(any(ctx), any(ctx), any(ctx)) end,
  function(ctx) return ums.test(any(ctx), any(ctx)) end,
  function(ctx) return ums.workqueue(any(ctx)) end,
  function(ctx) return ums.applock.release(any(ctx)) end,
}

action("misuse", 8, "any", function(ctx)
  return pick(misuse)(ctx)
end)

-- A method of one kind of object called on another (or on any value):
-- every method must check its self. The other arguments are short
-- timeouts, so that a self that happens to fit cannot wait for ever.
local function methods(o)
  local found, seen = {}, {}
  local function scan(t)
    if type(t) ~= "table" or seen[t] then return end
    seen[t] = true
    for k, v in pairs(t) do
      if type(k) == "string" and type(v) == "function" and k:sub(1, 2) ~= "__"
      then found[#found + 1] = v end
    end
  end
  if type(o) == "table" then scan(o) end
  local mt = getmetatable(o)
  if type(mt) == "table" then scan(rawget(mt, "__index")) end
  return found
end

action("wrong-self", 5, "any", function(ctx)
  local kinds = {ctx.tasks, ctx.chans, ctx.schans, ctx.mutexes, ctx.sems,
                 ctx.events, ctx.conds, ctx.wgs, ctx.files, ctx.groups,
                 ctx.works}
  local src = obj(pick(kinds))
  if src == nil then return end
  local m = methods(src)
  if #m == 0 then return end
  local self = random(3) == 1 and any(ctx) or obj(pick(kinds))
  return pick(m)(self, short(), short())
end)

local total = 0
for _, w in ipairs(weights) do total = total + w end

--- One random call, under pcall. `where` is "main" in the first task of
-- the first VM, "task" in spawned tasks and "work" in other VMs' work.
function M.step(ctx, depth, where)
  local r = random(total)
  local i = 1
  while r > weights[i] do
    r = r - weights[i]
    i = i + 1
  end
  local a = actions[i]
  if a.where == "main" and where ~= "main" then return end
  ctx.calls = ctx.calls + 1
  if ctx.trace then
    io.stderr:write(("fuzz: %d %s %s\n"):format(ctx.calls, where, a.name))
  end
  local ok, err = pcall(a.fn, ctx, depth or 0)
  if not ok then
    if err == ums.CANCELLED then error(err, 0) end
    ctx.raised = ctx.raised + 1
    -- A raised error must say something: a string (or the error value a
    -- task raised, passed on by join).
    if err == nil then error("an API call raised nil", 0) end
  end
end

--- Ends what this context started: open files closed, tasks cancelled
-- and joined, work cancelled and joined. Joins have no time limit here:
-- every task ends at its next wait once cancelled.
function M.finish(ctx)
  for _, f in ipairs(ctx.files) do pcall(f.close, f) end
  for _, g in ipairs(ctx.groups) do pcall(g.cancel, g) end
  for _, t in ipairs(ctx.tasks) do
    if t ~= ums.self() then pcall(t.cancel, t) end
  end
  for _, t in ipairs(ctx.tasks) do
    if t ~= ums.self() then t:join() end
  end
  for _, w in ipairs(ctx.works) do pcall(w.cancel, w) end
  for _, w in ipairs(ctx.works) do w:join() end
end

--- The entry point of work submitted by name: the engine once more in
-- another VM, with its own generator and the shared channels it was given.
function M.work(seed, steps, dir, schans)
  math.randomseed(seed)
  local ctx = M.new(seed, dir, schans)
  for _ = 1, steps do M.step(ctx, 2, "work") end
  M.finish(ctx)
  return ctx.calls
end

return M
