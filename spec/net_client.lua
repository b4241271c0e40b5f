-- spec/net_client.lua: the client side of spec/net_limits_spec.lua, run
-- in a process of its own (the server's process would otherwise hold both
-- ends of every connection: 20,000 descriptors for 10,000 connections).
--
--   lua5.4 net_client.lua hold PORT N
--     N tasks each connect to 127.0.0.1:PORT, send "ping <i>\n", check the
--     echo, and keep the connection open until all N have been echoed;
--     then all close. Prints "echoed N".
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local ums = dofile(here .. "helper.lua")
local net = ums.net

local mode, port, n = arg[1], tonumber(arg[2]), tonumber(arg[3])
assert(mode == "hold" and port and n, "usage: net_client.lua hold PORT N")

ums.run(function()
  local echoed, failed = 0, nil
  local all = ums.event(true)
  local tasks = {}
  for i = 1, n do
    tasks[i] = ums.spawn(function()
      local c, msg = net.connect("127.0.0.1", port, {timeout = 60})
      if not c then
        failed = failed or ("connect: " .. msg)
        all:set()
        return
      end
      c:write("ping ", i, "\n")
      local line = c:read("l")
      if line ~= "ping " .. i then
        failed = failed or ("echo " .. tostring(line))
      end
      echoed = echoed + 1
      if echoed == n then all:set() end
      all:wait()
      c:close()
    end)
  end
  for _, t in ipairs(tasks) do assert(t:join(120)) end
  assert(not failed, failed)
  print("echoed " .. echoed)
end)
