-- A classic LuaSocket select() server: a line echo over one select loop
-- with every connection in its read list (bench/net/select.sh runs it).
--
--   lua5.4 bench/net/select_server.lua luasocket|ums PORT
--
-- luasocket: Debian's LuaSocket, plain Lua; ums: the same code unchanged
-- on ums.socket inside ums.run. Ends 5 s after its last event.
local mode, port = arg[1], tonumber(arg[2])
if (mode ~= "luasocket" and mode ~= "ums") or not port then
  io.stderr:write("usage: select_server.lua luasocket|ums PORT\n")
  os.exit(2)
end

local serve = dofile((arg[0]:match("^(.*/)") or "./") .. "select_loop.lua")

local function run(socket)
  serve(socket, assert(socket.bind("127.0.0.1", port)), 5)
end

if mode == "luasocket" then
  run(require "socket")
else
  local ums = require "ums"
  ums.run(function() run(require "ums.socket") end)
end
