-- The select() loop of bench/net/select_server.lua and select_inproc.lua:
-- a line echo over one LuaSocket select loop with every connection in
-- its read list, written for LuaSocket (it runs unchanged on
-- ums.socket).
--
--   local serve = dofile("bench/net/select_loop.lua")
--   serve(socket, server, timeout [, stop])
--
-- server: a bound server socket; serves until stop() is true (checked at
-- every wake-up), or without stop until a select of `timeout` seconds
-- finds nothing.
return function(socket, server, timeout, stop)
  server:settimeout(0)
  local recvt = { server }
  while not (stop and stop()) do
    local readable = socket.select(recvt, nil, timeout)
    if #readable == 0 and not stop then break end
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
  server:close()
end
