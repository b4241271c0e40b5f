-- pipewait_demo.lua: the example module pipewait (pipewait.c) waits on its
-- own pipe with ums_lua_wait_fd. Checks its own results: a reader parks
-- only its task (a ticker keeps running), a timeout, a cancel, the end of
-- the pipe, and the call outside a task.
local ums = require "ums"
local pw = require "pipewait"

ums.run(function()
  local r, w = pw.pipe()
  local ticks = 0
  local ticker = ums.spawn(function()
    for _ = 1, 5 do
      ums.sleep(0.01)
      ticks = ticks + 1
    end
  end)
  local reader = ums.spawn(function() return pw.read(r) end)
  assert(ticker:join(10))
  assert(ticks == 5, "the ticker stood still while the reader waited")
  pw.write(w, "hello")
  local ok, data = reader:join(10)
  assert(ok and data == "hello", tostring(data))

  -- the timeout
  local v, msg = pw.read(r, 0.02)
  assert(v == nil and msg == "timeout", tostring(msg))

  -- a cancel while waiting
  local t = ums.spawn(function() return pw.read(r) end)
  ums.sleep(0.02)
  t:cancel()
  assert(t:join(10) == false, "the cancelled reader did not end so")

  -- the end of the pipe
  pw.close(w)
  assert(pw.read(r) == "")
  pw.close(r)
end)

-- Outside a task: poll(2) on this thread.
local r, w = pw.pipe()
pw.write(w, "x")
assert(pw.read(r, 1) == "x")
local v, msg = pw.read(r, 0.01)
assert(v == nil and msg == "timeout")
pw.close(r)
pw.close(w)
print("pipewait_demo: ok")
