-- spec/net_emfile_child.lua: run by spec/net_limits_spec.lua under a low
-- `ulimit -n`. Connections wait in a listener's queue while every free
-- descriptor is taken, so accept meets EMFILE. The accept must wait (not
-- spin: its CPU time stays a fraction of the wait) and fail with EMFILE
-- at its timeout, and the listener must then accept them all once
-- descriptors are free again. Prints "ok <cpu seconds> <wall seconds>".
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local ums = dofile(here .. "helper.lua")
local net = ums.net

local K = 3
ums.run(function()
  local srv = assert(net.listen("127.0.0.1", 0))
  local _, port = srv:getsockname()
  local clients = {}
  for i = 1, K do clients[i] = assert(net.connect("127.0.0.1", port)) end
  -- Take every descriptor left.
  local hold = {}
  while true do
    local f = io.open("/dev/null")
    if not f then break end
    hold[#hold + 1] = f
  end
  local cpu0, wall0 = os.clock(), ums.now()
  local c, msg, code = srv:accept(1.0)
  local cpu, wall = os.clock() - cpu0, ums.now() - wall0
  assert(c == nil, "accepted with no descriptor free")
  assert(code == net.errno.EMFILE, tostring(msg) .. " " .. tostring(code))
  assert(msg == "too many open files", msg)
  -- Free descriptors: the same listener accepts every queued connection.
  for _, f in ipairs(hold) do f:close() end
  for i = 1, K do
    local s = assert(srv:accept(5))
    clients[i]:write("hi ", i, "\n")
    assert(s:read("l") == "hi " .. i)
    s:close()
    clients[i]:close()
  end
  srv:close()
  print(("ok %.3f %.3f"):format(cpu, wall))
end)
