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

local function serve(socket)
  local server = assert(socket.bind("127.0.0.1", port))
  server:settimeout(0)
  local recvt = { server }
  while true do
    local readable = socket.select(recvt, nil, 5)
    if #readable == 0 then break end
    for _, s in ipairs(readable) do
      if s == server then
        local c = server:accept()
        if c then
          c:settimeout(0)
          recvt[#recvt + 1] = c
        end
      else
        local line, err = s:receive("*l")
        if line then
          s:send(line .. "\n")
        elseif err == "closed" then
          for i, x in ipairs(recvt) do
            if x == s then table.remove(recvt, i) break end
          end
          s:close()
        end
      end
    end
  end
end

if mode == "luasocket" then
  serve(require "socket")
else
  local ums = require "ums"
  ums.run(function() serve(require "ums.socket") end)
end
