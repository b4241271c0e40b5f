-- Driver for spec/badinput_spec.lua (not a spec itself): calls one public
-- function of ums with every kind of value in every argument position,
-- outside a run or inside a task, and prints one line per call:
--   OK <call> raised: <message>      a Lua error with a clear message
--   OK <call> returned nil: <msg>    the nil, msg convention
--   OK <call> returned <n> values    accepted (the value was valid there)
--   BAD <call> <why>                 anything else
-- then "DONE <calls>". It runs in a child process, so that a crash shows
-- as that function's failure instead of taking Busted down with it.
--
-- usage: lua5.4 badinput_driver.lua <function> outside|inside
local fname, where = arg[1], arg[2]
local ums = require "ums"
local core = require "ums.core"

io.stdout:setvbuf("line")

-- A message is clear when it says what went wrong in words a user can
-- act on: which argument, what was expected, or which rule was broken.
local CLEAR = {
  "bad argument", "expected", "not inside a task", "must", "cannot",
  "number has no integer representation", "unknown setting", "no park",
  "ums%.", "ums:", "timeout", "too long", "longer than",
}
local function clear(msg)
  if type(msg) ~= "string" or #msg < 8 then return false end
  for _, p in ipairs(CLEAR) do
    if msg:find(p) then return true end
  end
  return false
end

local co = coroutine.create(function() end)
local values = {
  {"nil", nil}, {"true", true}, {"false", false},
  {"0", 0}, {"-1", -1}, {"1.5", 1.5}, {"nan", 0 / 0},
  {"mininteger", math.mininteger}, {"-inf", -math.huge},
  {"''", ""}, {"'x'", "x"}, {"'0'", "0"}, {"long string", ("s"):rep(100)},
  {"{}", {}}, {"{1,2}", {1, 2}},
  {"function", function() end},
  {"coroutine", co},
  {"userdata", io.stdout},
}

-- A finished task, for the task methods (a live one would make a nil
-- timeout block forever, which is valid input); a finished work request
-- and a shared channel, for theirs.
local done_task
local objects = {}

-- Each entry: the function and its valid arguments; each position from 1
-- to #valid + 1 gets every value in turn, the others keeping valid ones.
-- `after` undoes what a successful call set up.
local prev_handler = debug.getregistry()["ums.on_error"]
-- ums.ffi calls with structs by value, callbacks and interruptible
-- declarations: C functions that are safe with any valid value (qsort of
-- 0 elements never reads its base or calls its comparator).
ums.ffi.cdef[[
struct badinput_in { uint32_t s_addr; };
char *badinput_ntoa(struct badinput_in a) __asm__("inet_ntoa");
struct badinput_in badinput_mkaddr(uint32_t net, uint32_t host)
  __asm__("inet_makeaddr");
UMS_INLINE void badinput_qsort(void *base, size_t n, size_t size,
                               int (*cmp)(const void *, const void *))
  __asm__("qsort");
void badinput_qsort_pool(void *base, size_t n, size_t size,
                         int (*cmp)(const void *, const void *))
  __asm__("qsort");
UMS_INTERRUPTIBLE int badinput_usleep(unsigned int us) __asm__("usleep");
]]
objects.INADDR = ums.ffi.new("struct badinput_in")
objects.FN = function() return 0 end
objects.CB = ums.ffi.cast("int (*)(const void *, const void *)", objects.FN)
local entries = {
  run = {ums.run, {function() end, 1}},
  spawn = {ums.spawn, {function() end, 1}},
  yield = {ums.yield, {}},
  sleep = {ums.sleep, {0}},
  self = {ums.self, {}},
  now = {ums.now, {}},
  config = {ums.config, {{}}, after = function()
    ums.config{schedulers = 1, max_workers = 0, quantum = 0.004}
  end},
  on_error = {ums.on_error, {function() end}, after = function()
    ums.on_error(prev_handler)
  end},
  locals = {ums.locals, {}},
  test = {ums.test, {function() end, 1}},
  park_begin = {core.park_begin, {0}, after = function(r)
    -- a park that began must end before the task does anything else
    if type(r[1]) == "number" and core.self() then
      core.unpark(core.self(), r[1])
      core.park_wait()
    end
  end},
  park_wait = {core.park_wait, {}},
  unpark = {core.unpark, {"TASK", 1, 0}},
  run_until_idle = {ums.run_until_idle, {0}},
  applock_acquire = {ums.applock.acquire, {"badinput", "S", 0},
    after = function(r)
      if getmetatable(r[1]) == ums.applock.Lock then r[1]:release() end
    end},
  applock_release = {ums.applock.release, {"badinput"}},
  applock_compatible = {ums.applock.compatible, {"S", "IX"}},
  workqueue = {ums.workqueue, {{readers = 1}}},
  group = {ums.group, {{cancel_on_error = true}}},
  join = {"join", {"TASK", 0}},
  cancel = {"cancel", {"TASK"}},
  status = {"status", {"TASK"}},
  name = {"name", {"TASK", "n"}},
  id = {"id", {"TASK"}},
  task_locals = {"locals", {"TASK"}},
  -- many VMs (lvm.c, lshared.c)
  submit = {ums.submit, {function() end, 1}},
  submit_on = {ums.submit_on, {0, function() end, 1}},
  scheduler = {ums.scheduler, {}},
  schedulers = {ums.schedulers, {}},
  work_join = {"join", {"WORK", 0}, of = "WORK"},
  work_cancel = {"cancel", {"WORK"}, of = "WORK"},
  work_status = {"status", {"WORK"}, of = "WORK"},
  work_scheduler = {"scheduler", {"WORK"}, of = "WORK"},
  shared_channel = {ums.shared.channel, {1}},
  shared_mutex = {ums.shared.mutex, {}},
  shared_semaphore = {ums.shared.semaphore, {1}},
  shared_event = {ums.shared.event, {true}},
  shared_waitgroup = {ums.shared.waitgroup, {}},
  -- a buffer that never fills: a send never waits
  shared_send = {"send", {"SCHAN", 1, 0}, of = "SCHAN"},
  shared_try_send = {"try_send", {"SCHAN", 1}, of = "SCHAN"},
  -- ums.ffi's types and cdata (CDATA: a struct badinput_pt[2])
  ffi_new = {ums.ffi.new, {"struct badinput_pt[?]", 2}},
  ffi_typeof = {ums.ffi.typeof, {"struct badinput_pt *"}},
  ffi_sizeof = {ums.ffi.sizeof, {"int[?]", 2}},
  ffi_alignof = {ums.ffi.alignof, {"double"}},
  ffi_offsetof = {ums.ffi.offsetof, {"struct badinput_pt", "y"}},
  ffi_cast = {ums.ffi.cast, {"struct badinput_pt *", "CDATA"}},
  ffi_copy = {ums.ffi.copy, {"CDATA", "CDATA", 8}},
  ffi_fill = {ums.ffi.fill, {"CDATA", 8, 0}},
  ffi_string = {ums.ffi.string, {"CDATA", 4}},
  ffi_istype = {ums.ffi.istype, {"struct badinput_pt[2]", "CDATA"}},
  ffi_gc = {ums.ffi.gc, {"CDATA", function() end}},
  ffi_cdef = {ums.ffi.cdef, {"int badinput_f(void);", {interruptible = true}}},
  ffi_struct_arg = {ums.ffi.C.badinput_ntoa, {"INADDR"}},
  ffi_struct_ret = {ums.ffi.C.badinput_mkaddr, {127, 1}},
  ffi_callback_arg = {ums.ffi.C.badinput_qsort, {"CDATA", 0, 4, "FN"}},
  ffi_callback_pool = {ums.ffi.C.badinput_qsort_pool, {"CDATA", 0, 4, "CB"}},
  ffi_callback_cast = {ums.ffi.cast, {"int (*)(const void *, const void *)",
                                      "FN"}},
  ffi_callback_set = {"set", {"CB", "FN"}, of = "CB"},
  ffi_callback_free = {"free", {"CB"}, of = "CB"},
  ffi_interruptible = {ums.ffi.C.badinput_usleep, {0}},
}

local function describe_call(pos, vname, n)
  local parts = {}
  for i = 1, n do parts[i] = i == pos and vname or "ok" end
  return ("%s(%s) %s"):format(fname, table.concat(parts, ", "), where)
end

local function sweep()
  local e = assert(entries[fname], "no such function: " .. tostring(fname))
  local f, valid = e[1], e[2]
  if type(f) == "string" then
    f = getmetatable(objects[e.of or "TASK"]).__index[f]
  end
  local calls = 0
  for pos = 1, #valid + 1 do
    for _, v in ipairs(values) do
      local args = {}
      for i = 1, #valid do
        args[i] = objects[valid[i]] or valid[i]
      end
      args[pos] = v[2]
      local n = math.max(#valid, pos)
      local call = describe_call(pos, v[1], n)
      local r = table.pack(pcall(f, table.unpack(args, 1, n)))
      calls = calls + 1
      if r[1] then
        table.remove(r, 1)
        r.n = r.n - 1
        if e.after then e.after(r) end
        if r.n >= 1 and r[1] == nil and r.n >= 2 then
          if type(r[2]) == "string" and #r[2] > 0 then
            print(("OK %s returned nil: %s"):format(call, r[2]))
          else
            print(("BAD %s returned nil with a %s message"):format(
              call, type(r[2])))
          end
        else
          print(("OK %s returned %d values"):format(call, r.n))
        end
      else
        local msg = r[2]
        if clear(msg) then
          print(("OK %s raised: %s"):format(call,
            (tostring(msg):gsub("\n.*", ""))))
        elseif rawequal(msg, ums.CANCELLED) then
          print(("BAD %s raised ums.CANCELLED"):format(call))
        else
          print(("BAD %s raised an unclear error: %s (%s)"):format(
            call, tostring(msg), type(msg)))
        end
      end
    end
  end
  return calls
end

ums.run(function()
  done_task = ums.spawn(function() return 1 end)
  done_task:join()
  objects.WORK = ums.submit(function() return 1 end)
  objects.WORK:join()
end)
objects.TASK = done_task
objects.SCHAN = ums.shared.channel(100000)
ums.ffi.cdef("struct badinput_pt { int x, y; };")
objects.CDATA = ums.ffi.new("struct badinput_pt[2]")

local calls
if where == "outside" then
  calls = sweep()
else
  calls = ums.run(sweep)
end
print("DONE " .. calls)
os.exit(0, true)
