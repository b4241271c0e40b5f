-- The luv peer of the echo benchmark (Debian's lua-luv): one libuv loop,
-- a read callback per connection writing back what it got.
--   lua5.4 bench/net/echo_luv.lua PORT
local uv = require "luv"

local port = assert(tonumber(arg[1]), "usage: echo_luv.lua PORT")
local server = uv.new_tcp()
assert(server:bind("127.0.0.1", port))
assert(server:listen(1024, function(err)
  assert(not err, err)
  local c = uv.new_tcp()
  server:accept(c)
  c:nodelay(true)
  c:read_start(function(rerr, data)
    if rerr or not data then
      c:close()
    else
      c:write(data)
    end
  end)
end))
local function stop() uv.stop() end
for _, name in ipairs({"sigterm", "sigint"}) do
  local s = uv.new_signal()
  s:start(name, stop)
end
uv.run()
