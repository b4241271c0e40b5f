-- The Tarantool peer of the echo benchmark: a fiber per connection on
-- Tarantool's socket module (its Lua is LuaJIT).
--   tarantool bench/net/echo_tarantool.lua PORT
local socket = require "socket"

local port = assert(tonumber(arg[1]), "usage: echo_tarantool.lua PORT")
local server = socket.tcp_server("127.0.0.1", port, function(s)
  s:nonblock(true)
  s:setsockopt("SOL_TCP", "TCP_NODELAY", true)
  while true do
    local data = s:sysread(4096)
    if data == nil then
      if not s:readable() then break end
    elseif data == "" then
      break
    else
      s:write(data)
    end
  end
  -- tcp_server closes the socket when the handler returns.
end)
assert(server, "tcp_server failed")
