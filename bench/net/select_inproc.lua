-- A LuaSocket select() loop and its clients in one process: the server
-- task selects over IDLE silent connections and one busy one, whose
-- client makes ROUNDS line round trips; prints the microseconds a round
-- trip took. Each round trip waits in select, so this measures select's
-- wait itself (bench/net/select.sh puts the client in another process).
--
--   lua5.4 bench/net/select_inproc.lua [IDLE [ROUNDS]]
local ums = require "ums"
local serve = dofile((arg[0]:match("^(.*/)") or "./") .. "select_loop.lua")
local NIDLE, NROUND = tonumber(arg[1] or 1000), tonumber(arg[2] or 2000)
ums.run(function()
  local socket = require "ums.socket"
  local server = assert(socket.bind("127.0.0.1", 0))
  local _, port = server:getsockname()
  local stop = false
  ums.spawn(serve, socket, server, 0.5, function() return stop end)
  local idle = {}
  for i = 1, NIDLE do idle[i] = assert(socket.connect("127.0.0.1", port)) end
  local c = assert(socket.connect("127.0.0.1", port))
  ums.sleep(0.2)
  local t0 = ums.now()
  for _ = 1, NROUND do
    assert(c:send("ping\n"))
    assert(c:receive())
  end
  local dt = ums.now() - t0
  print(("%d idle, %d round trips: %.1f us each"):format(NIDLE, NROUND,
                                                       dt / NROUND * 1e6))
  stop = true
  c:close()
  for _, x in ipairs(idle) do x:close() end
end)
