-- A concurrent fetcher: Debian's socket.http (LuaSocket) fetches 20 pages
-- at once through ums.socket, from a small HTTP server this program
-- starts itself with ums.net on 127.0.0.1. Each fetch parks only its own
-- task, so the fetches overlap: the server sees them all in flight.
--
--   lua5.4 examples/http_fetch.lua
--
-- Needs Debian's lua-socket (socket.http, ltn12).
local ums = require "ums"
local socket = require "ums.socket"
local http = require "socket.http"
local ltn12 = require "ltn12"

local PAGES = 20

-- The server: one task per connection, answering every GET with a page
-- naming its path; it waits a little before answering so that the
-- fetches have to overlap to finish quickly.
local function serve(conn, stats)
  stats.in_flight = stats.in_flight + 1
  stats.most = math.max(stats.most, stats.in_flight)
  local request = conn:read("l")
  repeat local header = conn:read("l") until header == nil or header == "\r"
  local path = request and request:match("^GET (%S+)") or "?"
  ums.sleep(0.05)
  local body = "this is page " .. path .. "\n"
  conn:write("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n",
             "Content-Length: ", #body, "\r\nConnection: close\r\n\r\n", body)
  conn:close()
  stats.in_flight = stats.in_flight - 1
end

ums.run(function()
  local listener = assert(ums.net.listen("127.0.0.1", 0))
  local _, port = listener:getsockname()
  local stats = { in_flight = 0, most = 0 }
  local acceptor = ums.spawn(function()
    while true do
      local conn = listener:accept()
      if not conn then return end
      ums.spawn(serve, conn, stats)
    end
  end)

  local started = socket.gettime()
  local pages = {}
  local group = ums.group()
  for i = 1, PAGES do
    group:spawn(function()
      local chunks = {}
      local ok, code = http.request{
        url = ("http://127.0.0.1:%d/page/%d"):format(port, i),
        create = socket.tcp,            -- the one change from LuaSocket
        sink = ltn12.sink.table(chunks),
      }
      assert(ok, code)
      assert(code == 200, "status " .. tostring(code))
      pages[i] = table.concat(chunks)
    end)
  end
  assert(group:wait())
  local took = socket.gettime() - started

  acceptor:cancel()
  listener:close()
  for i = 1, PAGES do
    assert(pages[i] == ("this is page /page/%d\n"):format(i), pages[i])
  end
  print(("fetched %d pages, at most %d in flight at the server, %.2f s")
        :format(PAGES, stats.most, took))
  assert(stats.most > 1, "the fetches did not overlap")
end)
