-- Specs for ums.socket (stdlib/ums/socket.lua): LuaSocket's API over
-- ums.net, checked against LuaSocket itself (Debian's lua-socket) and
-- with Debian's socket.http, socket.smtp and ltn12 running through it.
--
-- The same script runs twice: with real LuaSocket on Busted's thread and
-- with ums.socket in a task, and the two records must be equal. Peers are
-- local (127.0.0.1) servers written with ums.net. spec_socket runs on
-- the backend the runtime picks (io_uring here), spec_socket_pool with
-- UMS_IO=pool (epoll readiness) and, in the normal build,
-- spec_socket_nouring with io_uring_setup failing with ENOSYS.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")
local socket = require "ums.socket"
local ltn12 = require "ltn12"

-- Real LuaSocket, loaded before any install() can replace it.
local has_real, real = pcall(require, "socket")
local real_http = has_real and require "socket.http"

local function run(body, limit)
  return ums.test(body, limit or 30)
end

describe("ums.socket backend", function()
  it("is the one UMS_SOCKET_EXPECT_BACKEND names (if set)", function()
    local got
    run(function() got = ums.io_backend() end)
    local want = os.getenv("UMS_SOCKET_EXPECT_BACKEND")
    if want then assert.equal(want, got) end
  end)
end)

-- ---------------------------------------------------------------------
-- Peers written with ums.net
-- ---------------------------------------------------------------------

-- Starts an ums.net listener on 127.0.0.1 whose every connection runs
-- serve(conn) in a task of its own. Returns the port and a stop function
-- that closes the listener and waits for the connection tasks.
local function server(serve)
  local srv = assert(ums.net.listen("127.0.0.1", 0))
  local _, port = srv:getsockname()
  local tasks = {}
  local acceptor = ums.spawn(function()
    while true do
      local c = srv:accept()
      if not c then return end
      tasks[#tasks + 1] = ums.spawn(function()
        serve(c)
        c:close()
      end)
    end
  end)
  return port, function()
    acceptor:cancel()
    acceptor:join()
    srv:close()
    for _, t in ipairs(tasks) do
      local ok, err = t:join(10)
      assert(ok, tostring(err))
    end
  end
end

-- An HTTP/1.1 responder: reads the request head (and a body of
-- Content-Length bytes), then answers with what respond(method, path,
-- body) returns (default: the request line) and closes.
local function http_server(respond)
  respond = respond or function(method, path) return method .. " " .. path end
  return server(function(c)
    local line = c:read("l")
    if not line then return end
    local method, path = line:match("^(%S+) (%S+)")
    local length = 0
    while true do
      local h = c:read("l")
      if h == nil or h == "\r" or h == "" then break end
      local n = h:lower():match("^content%-length:%s*(%d+)")
      if n then length = tonumber(n) end
    end
    local body = length > 0 and c:read(length) or ""
    local answer = respond(method, path, body)
    c:write("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n",
            "Content-Length: ", #answer, "\r\nConnection: close\r\n\r\n",
            answer)
  end)
end

-- ---------------------------------------------------------------------
-- The same script against LuaSocket and ums.socket
-- ---------------------------------------------------------------------

-- A value as the record keeps it: numbers with their subtype (LuaSocket
-- answers floats), objects by class, error messages without position.
local function norm(v)
  local t = type(v)
  if t == "number" then return math.type(v) .. ":" .. tostring(v) end
  if t == "table" or t == "userdata" then
    local s = tostring(v)
    return s:match("^(%a+{%a+}): 0x%x+$") or t
  end
  return v
end

local function script(socket)
  local out = {}
  local function rec(...)
    local t = table.pack(...)
    for i = 1, t.n do t[i] = norm(t[i]) end
    out[#out + 1] = t
  end
  -- The message of a raised error, without its position.
  local function raises(f)
    local ok, err = pcall(f)
    rec(ok, (tostring(err):gsub("^[^:]*:%d+: ", "")))
  end

  local srv = assert(socket.bind("127.0.0.1", 0))
  rec(srv)
  local ip, port, family = srv:getsockname()
  rec(ip, math.type(port), family)
  local c = socket.tcp()
  rec(c, c:getfd(), c:gettimeout())
  rec(c:settimeout(5))
  rec(c:connect(ip, port))
  rec(c, c:getfamily())
  local a = srv:accept()
  rec(a, a:gettimeout())
  rec(select(3, c:getpeername()), c:getpeername() == "127.0.0.1")

  -- send's indices and results
  rec(a:send("hello\r\nwor\rld\nxyz"))
  rec(a:send("abc", 2))
  rec(a:send("", 1))
  rec(a:send("abc", 5, 9))
  rec(a:send("abcdef", -3, -2))
  rec(a:send("abcdef", 0, 2.7))
  -- lines lose every CR; the rest waits in the buffer
  rec(c:receive())
  rec(c:receive("*l"))
  local received, sent = c:getstats()
  rec(received, sent)
  received, sent = a:getstats()
  rec(received, sent)
  -- a timeout gives what came, and the next call starts afresh
  rec(c:settimeout(0.05))
  rec(c:receive())
  rec(c:receive(2, "zz"))
  rec(c:receive(0))
  rec(a:send("12345678"))
  rec(c:receive(3))
  rec(c:receive(2, "ab"))
  rec(c:receive(4, "x"))
  rec(c:receive(10))
  rec(c:dirty())
  rec(a:send("one\ntwo\n"))
  rec(c:receive("*l", "pre-"))
  rec(c:receive(2))
  rec(c:dirty())
  rec(c:receive("*a"))
  rec(c:settimeout(0.05, "t"))
  rec(c:gettimeout())
  rec(c:receive("*a"))
  rec(c:settimeout(nil, "t"))
  rec(c:settimeout(0.05, "b"))
  -- errors are raised as LuaSocket raises them
  raises(function() local r = c:receive("x") return r end)
  raises(function() local r = c:receive(-1) return r end)
  raises(function() local r = srv:receive() return r end)
  raises(function() local r = c:setoption("nosuch", 1) return r end)
  raises(function() local r = c:settimeout(1, "x") return r end)
  raises(function() local r = c:shutdown("x") return r end)
  -- options
  rec(c:getoption("keepalive"))
  rec(c:setoption("keepalive", true))
  rec(c:getoption("keepalive"))
  rec(c:setoption("linger", { on = true, timeout = 3 }))
  rec(c:getoption("linger").on, c:getoption("linger").timeout)
  rec(c:setoption("linger", { on = false, timeout = 0 }))
  rec(c:getoption("linger").on)
  rec(c:setoption("tcp-nodelay", true))
  rec(c:getoption("tcp-nodelay"))
  rec(c:setoption("reuseaddr", true))
  rec(c:getoption("reuseaddr"))
  -- half-close: the other side sees the end, and can still answer
  rec(c:shutdown("send"))
  rec(a:receive("*a"))
  rec(a:send("bye\n"))
  rec(c:receive())
  rec(a:close())
  rec(a:getfd())
  rec(c:receive())
  rec(c:receive("*a"))
  rec(c:receive(5, "p"))
  rec(c:close())
  rec(c:getfd())
  rec(c:receive())
  rec(c:send("x"))
  rec(c:send(""))
  rec(c:getsockname())
  rec(c:shutdown())
  rec(c:close())
  -- a port nobody listens on any more
  rec(srv:close())
  rec(socket.connect("127.0.0.1", port))
  -- accept's timeout
  local srv2 = assert(socket.bind("127.0.0.1", 0))
  rec(srv2:settimeout(0.05))
  rec(srv2:accept())
  rec(srv2:settimeout(0))
  rec(srv2:accept())
  srv2:close()
  -- datagrams
  local u = socket.udp()
  rec(u)
  rec(u:setsockname("127.0.0.1", 0))
  local uip, uport = u:getsockname()
  rec(uip, math.type(uport))
  rec(u:settimeout(0.05))
  rec(u:receive())
  local u2 = socket.udp()
  rec(u2:sendto("dgram", uip, uport))
  local data, from, fromport = u:receivefrom()
  rec(data, from, math.type(fromport), type(fromport))
  rec(u2:setpeername(uip, uport))
  rec(u2)
  rec(u2:send("two"))
  rec(u:receive())
  rec(u:receive(2) or "none")
  rec(u:dirty(), u:getfamily())
  rec(u:close(), u2:close())
  -- the rest of the namespace
  rec(socket.skip(1, 2, 3))
  rec(socket.skip(0, "x"))
  local r, w, e = socket.select({}, {}, 0)
  rec(r, w, e, #r, #w)
  rec(socket.dns.toip("localhost"))
  rec(socket.dns.getaddrinfo("127.0.0.1")[1].addr)
  rec(socket.dns.gethostname())
  rec(socket.dns.tohostname("127.0.0.1"))
  rec(socket.dns.toip("nosuch.invalid"))
  local try = socket.newtry(function() rec("finalized") end)
  rec(socket.protect(function() return try(1, 2) end)())
  rec(socket.protect(function() return try(nil, "why") end)())
  rec(pcall(socket.protect(function() error("plain", 0) end)))
  return out
end

-- Where the two records differ, by design (README, "ums.socket").
local function known_differences(rec)
  return rec
end

describe("ums.socket against LuaSocket", function()
  it("gives LuaSocket's results for the same script", function()
    if not has_real then
      pending("Debian's lua-socket is not installed")
      return
    end
    local want = script(real)
    local got
    run(function() got = script(socket) end)
    want, got = known_differences(want), known_differences(got)
    local diffs = {}
    local function show(t)
      if not t then return "(none)" end
      local parts = {}
      for i = 1, t.n do parts[i] = tostring(t[i]) end
      return "(" .. table.concat(parts, ", ") .. ")"
    end
    for i = 1, math.max(#want, #got) do
      local a, b = show(want[i]), show(got[i])
      if a ~= b then
        diffs[#diffs + 1] = ("#%d LuaSocket %s, ums.socket %s"):format(i, a, b)
      end
    end
    assert(#diffs == 0, table.concat(diffs, "\n"))
  end)

  it("prints its objects as LuaSocket does", function()
    run(function()
      local s = socket.tcp()
      assert.matches("^tcp{master}: 0x%x+$", tostring(s))
      assert.matches("^udp{unconnected}: 0x%x+$", tostring(socket.udp()))
      local srv = assert(socket.bind("127.0.0.1", 0))
      assert.matches("^tcp{server}: 0x%x+$", tostring(srv))
      assert.equal("LuaSocket 3.0.0", socket._VERSION:sub(1, 15))
      assert.is_true(socket._SETSIZE >= 1024)
      srv:close()
    end)
  end)
end)
