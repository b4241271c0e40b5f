-- The client of bench/net/select.sh: IDLE connections that stay silent
-- and one that makes ROUNDS line round trips; prints the microseconds a
-- round trip took.
--
--   lua5.4 bench/net/select_client.lua PORT IDLE ROUNDS
local ums = require "ums"
local port, nidle, rounds =
  tonumber(arg[1]), tonumber(arg[2]), tonumber(arg[3])
ums.run(function()
  local idle = {}
  for i = 1, nidle do idle[i] = assert(ums.net.connect("127.0.0.1", port)) end
  local c = assert(ums.net.connect("127.0.0.1", port))
  ums.sleep(0.3)  -- the server has accepted them all
  local t0 = ums.now()
  for _ = 1, rounds do
    assert(c:write("ping\n"))
    assert(c:read("l") == "ping")
  end
  print(string.format("%.1f", (ums.now() - t0) / rounds * 1e6))
  c:close()
  for _, x in ipairs(idle) do x:close() end
end)
