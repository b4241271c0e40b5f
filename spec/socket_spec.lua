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

-- A record and the function that adds a line of values to it.
local function recorder()
  local out = {}
  return out, function(...)
    local t = table.pack(...)
    for i = 1, t.n do t[i] = norm(t[i]) end
    out[#out + 1] = t
  end
end

local function script(socket)
  local out, rec = recorder()
  -- The message of a raised error, without its position.
  local function raises(f)
    local ok, err = pcall(f)
    rec(ok, (tostring(err):gsub("^[^:]*:%d+: ", "")))
  end

  local srv = assert(socket.bind("127.0.0.1", 0))
  rec(srv, srv.class)
  local ip, port, family = srv:getsockname()
  rec(ip, math.type(port), family)
  local c = socket.tcp()
  rec(c, c:getfd(), c:gettimeout())
  rec(c:settimeout(5))
  rec(c.class)
  rec(c:connect(ip, port))
  rec(c, c:getfamily(), c.class)
  local a = srv:accept()
  rec(a, a:gettimeout(), a.class)
  local u = socket.udp()
  rec(u.class, u:close())
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
  -- "*" forgets the peer: sendto works again
  rec(u2:setpeername("*"))
  rec(u2, u2.class)
  rec(u2:sendto("three", uip, uport))
  rec(u:receive())
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

-- The same for socket.unix (LuaSocket's Unix-domain module): stream and
-- datagram sockets on paths under base.
local function unix_script(unix, base)
  local out, rec = recorder()
  local path = base .. ".s"
  os.remove(path)
  local m = unix.stream()
  rec(m, m.class)
  rec(m:bind(path))
  rec(m:listen(5))
  rec(m, m.class)
  rec(m:getsockname() == path)
  local c = unix()
  rec(c:settimeout(5))
  rec(c:connect(path))
  rec(c, c.class)
  local a = m:accept()
  rec(a, a.class)
  rec(c:send("line one\r\nrest"))
  rec(a:receive())
  rec(a:settimeout(0.05))
  rec(a:receive())
  rec(c:send("abcdef"))
  rec(a:receive(3))
  rec(a:receive(10, "x"))
  rec(c:send("tail"))
  rec(c:close())
  rec(a:receive("*a"))
  rec(a:receive())
  rec(a:close(), m:close())
  os.remove(path)
  -- a path nobody listens on, one too long
  local d = unix()
  rec(d:connect(path))
  rec(d:connect(string.rep("x", 200)))
  rec(d:bind(string.rep("x", 200)))
  rec(d:close())
  -- datagrams
  local p1, p2 = base .. ".d1", base .. ".d2"
  os.remove(p1)
  os.remove(p2)
  local u1 = unix.dgram()
  rec(u1, u1.class)
  rec(u1:bind(p1))
  local u2 = unix.udp()
  rec(u2:setsockname(p2))
  rec(u2:sendto("hello", p1))
  rec(u1:settimeout(1))
  rec(u1:receivefrom())
  rec(u1:sendto("back", p2))
  rec(u2:settimeout(1))
  rec(u2:receive())
  rec(u2:connect(p1))
  rec(u2, u2.class)
  rec(u2:send("conn"))
  rec(u1:receive())
  rec(u1:settimeout(0.05))
  rec(u1:receive())
  rec(u1:sendto("x", base .. ".nobody"))
  rec(u1:close(), u2:close())
  os.remove(p1)
  os.remove(p2)
  -- A zero-timeout connect to a listener whose backlog of 0 is full:
  -- "timeout", and the object stays a master.
  local l = unix.stream()
  rec(l:bind(p1))
  rec(l:listen(0))
  local held = {}
  for i = 1, 3 do
    held[i] = unix.stream()
    held[i]:settimeout(0)
    rec(held[i]:connect(p1))
    rec(held[i], held[i].class)
  end
  for i = 1, 3 do held[i]:close() end
  rec(l:close())
  os.remove(p1)
  return out
end

-- LuaSocket's non-blocking connect (a zero timeout, as copas and other
-- select loops use it): "timeout" at once, writable once made, then 1;
-- a refused one; a listener's backlog; a service that does not resolve.
local function connect_script(socket)
  local out, rec = recorder()
  local srv = assert(socket.bind("127.0.0.1", 0))
  local ip, port = srv:getsockname()
  local c = socket.tcp()
  rec(c:settimeout(0))
  rec(c:connect(ip, port))
  rec(c, c.class)
  local _, w = socket.select(nil, { c }, 5)
  rec(#w)
  rec(c:connect(ip, port))
  rec(c:connect(ip, port))
  rec(c:send("hi\n"))
  local a = srv:accept()
  a:settimeout(5)
  rec(a:receive())
  a:close()
  c:close()
  srv:close()
  -- Nothing listens on the port now.
  local d = socket.tcp()
  d:settimeout(0)
  rec(d:connect(ip, port))
  _, w = socket.select(nil, { d }, 5)
  rec(#w)
  rec(d:connect(ip, port))
  rec(d, d:receive())
  d:close()
  -- A backlog of 0 holds one connection not accepted; the next waits.
  local l = socket.tcp()
  rec(l:bind("127.0.0.1", 0))
  rec(l:listen(0))
  local ip2, port2 = l:getsockname()
  local f1 = socket.tcp()
  f1:settimeout(5)
  rec(f1:connect(ip2, port2))
  local f2 = socket.tcp()
  f2:settimeout(0.05)
  rec(f2:connect(ip2, port2))
  local f3 = socket.tcp()
  f3:settimeout(0)
  rec(f3:connect(ip2, port2))
  f3:settimeout(1)
  rec(f3:connect(ip2, port2))
  f1:close(); f2:close(); f3:close(); l:close()
  rec(socket.connect("127.0.0.1", "no-such-service-ums"))
  return out
end


describe("ums.socket, the field", function()
  it("is the module require \"ums.socket\" gives", function()
    assert.equal(socket, ums.socket)
    assert.is_function(ums.socket.tcp)
    assert.is_function(ums.socket.install)
  end)
end)

-- Fails with every record where ums.socket's differs from LuaSocket's.
local function same_records(want, got)
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
end

-- Runs script_of(socket) through LuaSocket and through ums.socket (in a
-- task), and fails where the records differ.
local function against_luasocket(script_of)
  if not has_real then
    pending("Debian's lua-socket is not installed")
    return
  end
  local want = script_of(real)
  local got
  run(function() got = script_of(socket) end)
  same_records(want, got)
end

describe("ums.socket against LuaSocket", function()
  it("gives LuaSocket's results for the same script", function()
    against_luasocket(script)
  end)

  it("connects without waiting as LuaSocket does, for select loops", function()
    against_luasocket(connect_script)
  end)

  it("gives socket.unix's results for the same script", function()
    local ok, real_unix = pcall(require, "socket.unix")
    if not ok then
      pending("Debian's lua-socket has no socket.unix")
      return
    end
    local base = os.tmpname()
    local want = unix_script(real_unix, base)
    local got
    run(function() got = unix_script(socket.unix, base) end)
    os.remove(base)
    same_records(want, got)
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

-- ---------------------------------------------------------------------
-- Debian's socket.http, ltn12 and socket.smtp through ums.socket
-- ---------------------------------------------------------------------

describe("socket.http over ums.socket", function()
  it("runs 20 GETs at once while a ticker task keeps ticking", function()
    if not has_real then pending("no lua-socket") return end
    run(function()
      -- Every request is held by the server until all 20 are in and the
      -- ticker has ticked 3 more times: with LuaSocket's blocking calls
      -- one request at a time could reach the server, and nothing else,
      -- the ticker included, would run meanwhile.
      local ticks, stop = 0, false
      local tick = ums.event()
      local ticker = ums.spawn(function()
        while not stop do
          ums.sleep(0.01)
          ticks = ticks + 1
          tick:set()
        end
      end)
      local arrived, most, all_in = 0, 0, ums.event(true)
      local port, halt = http_server(function(_, path)
        arrived = arrived + 1
        most = math.max(most, arrived)
        if arrived == 20 then all_in:set() end
        assert(all_in:wait(20), "the 20 requests never were in at once")
        local seen = ticks
        while ticks < seen + 3 do tick:wait(5) end
        return "page " .. path
      end)
      local bodies, codes = {}, {}
      local g = ums.group()
      for i = 1, 20 do
        g:spawn(function()
          local t = {}
          local ok, code = real_http.request{
            url = ("http://127.0.0.1:%d/%d"):format(port, i),
            create = socket.tcp, sink = ltn12.sink.table(t)}
          assert(ok, code)
          bodies[i], codes[i] = table.concat(t), code
        end)
      end
      assert(g:wait(25))
      stop = true
      ticker:join()
      halt()
      assert.equal(20, most)
      for i = 1, 20 do
        assert.equal(200, codes[i])
        assert.equal("page /" .. i, bodies[i])
      end
      assert.is_true(ticks >= 3)
    end)
  end)

  it("sends a body from an ltn12 source and fills an ltn12 sink", function()
    if not has_real then pending("no lua-socket") return end
    run(function()
      local port, halt = http_server(function(method, _, body)
        return method .. ":" .. body:upper()
      end)
      local body = ("payload "):rep(5000)
      local out = {}
      local ok, code, headers = real_http.request{
        url = ("http://127.0.0.1:%d/post"):format(port),
        method = "POST", create = socket.tcp,
        source = ltn12.source.string(body),
        headers = { ["content-length"] = #body },
        sink = ltn12.sink.table(out)}
      halt()
      assert.equal(1, ok)
      assert.equal(200, code)
      assert.equal(tostring(#body + 5), headers["content-length"])
      assert.equal("POST:" .. body:upper(), table.concat(out))
    end)
  end)

  it("pumps a socket source into a socket sink with ltn12", function()
    if not has_real then pending("no lua-socket") return end
    run(function()
      -- An echo server in ums.socket itself: by-length source from the
      -- client, close-when-done sink back.
      local srv = assert(socket.bind("127.0.0.1", 0))
      local _, port = srv:getsockname()
      local data = ("0123456789"):rep(7000)
      local echo = ums.spawn(function()
        local c = assert(srv:accept())
        assert(ltn12.pump.all(socket.source("by-length", c, #data),
                              socket.sink("close-when-done", c)))
      end)
      local c = assert(socket.connect("127.0.0.1", port))
      -- A writer task pumps the data out while this task reads the echo
      -- (a connection is full duplex).
      local writer = ums.spawn(function()
        return ltn12.pump.all(ltn12.source.string(data),
                              socket.sink("keep-open", c))
      end)
      local got = {}
      assert(ltn12.pump.all(socket.source("until-closed", c),
                            (ltn12.sink.table(got))))
      assert(writer:join())
      assert(echo:join())
      assert.equal(data, table.concat(got))
      srv:close()
    end)
  end)
end)

describe("socket.smtp over ums.socket", function()
  it("sends a message to a local SMTP responder task", function()
    if not has_real then pending("no lua-socket") return end
    local smtp = require "socket.smtp"
    run(function()
      local dialog, message = {}, {}
      local port, halt = server(function(c)
        c:write("220 ums test\r\n")
        while true do
          local line = c:read("l")
          if not line then return end
          line = line:gsub("\r$", "")
          dialog[#dialog + 1] = line:match("^%u+") or line
          local verb = line:match("^%u+")
          if verb == "EHLO" then
            c:write("250-localhost\r\n250 8BITMIME\r\n")
          elseif verb == "DATA" then
            c:write("354 go ahead\r\n")
            while true do
              local l = assert(c:read("l")):gsub("\r$", "")
              if l == "." then break end
              message[#message + 1] = l
            end
            c:write("250 queued\r\n")
          elseif verb == "QUIT" then
            c:write("221 bye\r\n")
            return
          else
            c:write("250 ok\r\n")
          end
        end
      end)
      local ok, err = smtp.send{
        from = "<a@example.org>", rcpt = { "<b@example.org>" },
        server = "127.0.0.1", port = port, create = socket.tcp,
        source = smtp.message{
          headers = { subject = "hello", to = "b@example.org" },
          body = "line one\r\nline two"},
      }
      halt()
      assert.equal(1, ok, err)
      assert.same({ "EHLO", "MAIL", "RCPT", "DATA", "QUIT" }, dialog)
      local text = table.concat(message, "\n")
      assert.matches("Subject: hello", text, 1, true)
      assert.matches("line one\nline two", text, 1, true)
    end)
  end)
end)

-- ---------------------------------------------------------------------
-- install
-- ---------------------------------------------------------------------

describe("ums.socket.install", function()
  it("gives require 'socket' and socket.http over ums.socket until undone",
     function()
    if not has_real then pending("no lua-socket") return end
    local before_socket = package.loaded.socket
    local before_http = package.loaded["socket.http"]
    local before_unix = package.loaded["socket.unix"]
    run(function()
      local port, halt = http_server()
      local undo = socket.install()
      assert.equal(socket, require "socket")
      assert.equal(socket, require "socket.core")
      assert.equal(socket.unix, require "socket.unix")
      local http = require "socket.http"
      assert.are_not.equal(real_http, http)
      -- The simple string form uses the module's default socket.tcp.
      local body, code = http.request(("http://127.0.0.1:%d/s"):format(port))
      assert.equal("GET /s", body)
      assert.equal(200, code)
      -- url and headers stay Debian's.
      assert.equal("x", require("socket.url").parse("http://x/").host)
      undo()
      halt()
      assert.equal(before_socket, package.loaded.socket)
      assert.equal(before_unix, package.loaded["socket.unix"])
    end)
    assert.equal(before_http, package.loaded["socket.http"])
    assert.equal(real, require "socket")
  end)
end)

describe("socket.ftp over ums.socket", function()
  it("gets a file from a local FTP responder task (through install)",
     function()
    if not has_real then pending("no lua-socket") return end
    run(function()
      local content = ("file content line\r\n"):rep(300)
      local commands = {}
      local port, halt = server(function(c)
        local data
        c:write("220 ums ftp\r\n")
        while true do
          local line = c:read("l")
          if not line then return end
          line = line:gsub("\r$", "")
          local verb, arg = line:match("^(%a+)%s*(.*)$")
          verb = verb:upper()
          commands[#commands + 1] = verb
          if verb == "USER" then c:write("331 password please\r\n")
          elseif verb == "PASS" then c:write("230 logged in\r\n")
          elseif verb == "EPSV" then
            data = assert(ums.net.listen("127.0.0.1", 0))
            local _, dport = data:getsockname()
            c:write(("229 Entering Extended Passive Mode (|||%d|)\r\n")
                    :format(dport))
          elseif verb == "RETR" then
            assert.equal("file.txt", arg)
            c:write("150 here it comes\r\n")
            local d = assert(data:accept(10))
            d:write(content)
            d:close()
            data:close()
            c:write("226 done\r\n")
          elseif verb == "QUIT" then
            c:write("221 bye\r\n")
            return
          else
            c:write("502 no\r\n")
          end
        end
      end)
      local undo = socket.install()
      local ftp = require "socket.ftp"
      local got, err = ftp.get(("ftp://127.0.0.1:%d/file.txt"):format(port))
      undo()
      halt()
      assert.equal(content, got, err)
      assert.same({ "USER", "PASS", "EPSV", "RETR", "QUIT" }, commands)
    end)
  end)
end)

-- ---------------------------------------------------------------------
-- select and timeouts
-- ---------------------------------------------------------------------

-- A connected pair: the ums.socket client and the ums.net conn the
-- server accepted.
local function pair()
  local srv = assert(ums.net.listen("127.0.0.1", 0))
  local _, port = srv:getsockname()
  local c = assert(socket.connect("127.0.0.1", port))
  local peer = assert(srv:accept(5))
  srv:close()
  return c, peer
end

describe("ums.socket.select", function()
  it("returns the sockets that become readable, by list and by key",
     function()
    run(function()
      local a, pa = pair()
      local b, pb = pair()
      local writer = ums.spawn(function()
        ums.sleep(0.02)
        pb:write("x")
        pb:flush()
      end)
      local r, w, err = socket.select({ a, b }, nil, 10)
      assert.is_nil(err)
      assert.equal(1, #r)
      assert.equal(b, r[1])
      assert.equal(1, r[b])
      assert.same({}, w)
      writer:join()
      assert.equal("x", b:receive(1))
      a:close(); b:close(); pa:close(); pb:close()
    end)
  end)

  it("times out with empty lists and 'timeout'", function()
    run(function()
      local a, pa = pair()
      local r, w, err = socket.select({ a }, nil, 0.05)
      assert.same({}, r)
      assert.same({}, w)
      assert.equal("timeout", err)
      -- timeout 0 looks and returns at once
      r, w, err = socket.select({ a }, {}, 0)
      assert.equal("timeout", err)
      a:close(); pa:close()
    end)
  end)

  it("reports writable sockets, and readable ones with buffered data at once",
     function()
    run(function()
      local a, pa = pair()
      local r, w, err = socket.select(nil, { a }, 5)
      assert.is_nil(err)
      assert.equal(a, w[1])
      pa:write("one\ntwo\n")
      pa:flush()
      assert.equal("one", a:receive())
      -- "two\n" waits in the buffer, not in the kernel
      assert.is_true(a:dirty())
      r = socket.select({ a }, nil, 0)
      assert.equal(a, r[1])
      assert.equal("two", a:receive())
      assert.is_false(a:dirty())
      a:close(); pa:close()
    end)
  end)

  it("with a zero timeout sees data the kernel holds (a polling loop ends)",
     function()
    run(function()
      local a, pa = pair()
      assert.equal("timeout", select(3, socket.select({ a }, nil, 0)))
      pa:write("ready\n")
      pa:flush()
      local r
      for _ = 1, 1000 do
        r = socket.select({ a }, nil, 0)
        if r[1] then break end
        ums.sleep(0.001)
      end
      assert.equal(a, r[1])
      assert.equal("ready", a:receive())
      a:close(); pa:close()
    end)
  end)

  -- One socket waits on itself, up to 16 on an epoll set made for the
  -- call, more on the C-call pool's poll(2) (lua-binding/lsocket.c).
  -- The process's sockets and epoll sets, as "fd what" lines (what a
  -- select could leave behind).
  local function nfds()
    local ls <close> = io.popen("ls -l /proc/" .. ums.ffi.C.getpid() ..
                                "/fd | awk 'NR > 1 {print $9, $11}'")
    local kept = {}
    for line in ls:lines() do
      if line:find("socket:", 1, true) or line:find("eventpoll", 1, true)
      then
        kept[#kept + 1] = line
      end
    end
    return table.concat(kept, "\n")
  end
  ums.ffi.cdef("int getpid(void);")

  for _, n in ipairs({ 1, 5, 40 }) do
    it("waits once for any of " .. n .. " sockets, and times out", function()
      run(function()
        -- (the backend's own descriptors exist once a socket has waited)
        local c0, p0 = pair()
        p0:write("w")
        assert.equal("w", c0:receive(1))
        c0:close(); p0:close()
        local before = nfds()
        local cs, ps = {}, {}
        for i = 1, n do cs[i], ps[i] = pair() end
        for _, k in ipairs({ n, 1, (n + 1) // 2 }) do
          local writer = ums.spawn(function()
            ums.sleep(0.02)
            ps[k]:write("x")
            ps[k]:flush()
          end)
          local r, w, err = socket.select(cs, nil, 10)
          assert.is_nil(err)
          assert.equal(1, #r)
          assert.equal(cs[k], r[1])
          assert.equal(1, r[cs[k]])
          assert.same({}, w)
          writer:join()
          assert.equal("x", cs[k]:receive(1))
        end
        -- readable and writable lists together: every socket is
        -- writable, so the look answers at once
        local r, w = socket.select(cs, cs, 10)
        assert.same({}, r)
        assert.equal(n, #w)
        -- the timeout, with no data anywhere
        local t0 = ums.now()
        local r2, w2, err = socket.select(cs, nil, 0.05)
        assert.same({}, r2)
        assert.same({}, w2)
        assert.equal("timeout", err)
        assert.is_true(ums.now() - t0 >= 0.045)
        -- a task cancelled in the wait: nothing of the call is left
        local waiter = ums.spawn(socket.select, cs, nil, 30)
        ums.sleep(0.02)
        waiter:cancel()
        local ok, e = waiter:join()
        assert.is_false(ok)
        assert.equal(ums.CANCELLED, e)
        -- and data that comes after a wait ended early still wakes
        -- the next one
        local writer = ums.spawn(function()
          ums.sleep(0.02)
          ps[1]:write("y")
          ps[1]:flush()
        end)
        r = socket.select(cs, nil, 10)
        assert.equal(cs[1], r[1])
        writer:join()
        for i = 1, n do cs[i]:close(); ps[i]:close() end
        assert.equal(before, nfds())
      end)
    end)
  end

  it("skips closed sockets", function()
    run(function()
      local a, pa = pair()
      a:close()
      local r, _, err = socket.select({ a }, nil, 0.02)
      assert.same({}, r)
      assert.equal("timeout", err)
      pa:close()
    end)
  end)
end)

describe("ums.socket timeouts", function()
  it("keep LuaSocket's partial results, and zero does not wait", function()
    run(function()
      local c, peer = pair()
      peer:write("abc")
      peer:flush()
      c:settimeout(0.05)
      assert.same({ nil, "timeout", "abc" }, { c:receive() })
      peer:write("def\n")
      peer:flush()
      assert.equal("def", c:receive())
      peer:write("ab")
      peer:flush()
      assert.same({ nil, "timeout", "ab" }, { c:receive(5) })
      -- a zero timeout is LuaSocket's non-blocking mode: nothing there,
      -- "timeout" at once (the run's limit fails a hang)
      c:settimeout(0)
      for _ = 1, 100 do
        assert.same({ nil, "timeout", "" }, { c:receive() })
      end
      peer:write("now\n")
      peer:flush()
      local line, err
      for _ = 1, 1000 do
        line, err = c:receive()
        if line then break end
        assert.equal("timeout", err)
        ums.sleep(0.001)
      end
      assert.equal("now", line)
      -- a total timeout counts from the start of the call
      c:settimeout(nil)
      c:settimeout(0.05, "t")
      assert.same({ nil, "timeout", "" }, { c:receive("*a") })
      c:close(); peer:close()
    end)
  end)

  it("gives 'closed' with the partial data when the peer goes", function()
    run(function()
      local c, peer = pair()
      peer:write("no newline")
      peer:close()
      assert.same({ nil, "closed", "no newline" }, { c:receive() })
      assert.same({ nil, "closed", "" }, { c:receive() })
      c:close()
      -- a reset (linger 0) is "closed" too, as LuaSocket words it
      c, peer = pair()
      peer:setoption("linger", 0)
      peer:close()
      local ok, err = c:receive()
      assert.is_nil(ok)
      assert.equal("closed", err)
      local n, err2, last
      for _ = 1, 10 do
        n, err2, last = c:send("data")
        if not n then break end
      end
      assert.is_nil(n)
      assert.equal("closed", err2)
      assert.equal(0, last)
      c:close()
    end)
  end)

  it("ends a send to a peer that does not read with 'timeout' and the index",
     function()
    run(function()
      local c, peer = pair()
      c:setoption("send-buffer-size", 4096)
      c:settimeout(0.1)
      local chunk = ("x"):rep(1 << 20)
      local n, err, last
      for _ = 1, 64 do
        n, err, last = c:send(chunk)
        if not n then break end
      end
      assert.is_nil(n)
      assert.equal("timeout", err)
      assert.is_true(last >= 0 and last < #chunk)
      c:close(); peer:close()
    end)
  end)
end)

describe("ums.socket with a reader and a writer task", function()
  it("sends while another task's receive waits, and close ends it",
     function()
    run(function()
      local c, peer = pair()
      local reader = ums.spawn(function() return c:receive() end)
      ums.sleep(0.02)
      -- The send does not wait for the pending receive.
      local writer = ums.spawn(function() return c:send("ping\n") end)
      assert.same({true, 5}, {writer:join(5)})
      assert.equal("ping", peer:read("l"))
      peer:write("pong\n")
      assert.same({true, "pong"}, {reader:join(5)})
      -- A close from another task ends a pending receive with "closed".
      local waiting = ums.spawn(function() return c:receive() end)
      ums.sleep(0.02)
      assert.equal(1, c:close())
      assert.same({true, nil, "closed", ""}, {waiting:join(5)})
      peer:close()
    end)
  end)
end)

describe("ums.socket over IPv6", function()
  it("connects, binds and sends datagrams on ::1", function()
    run(function()
      local srv = assert(socket.bind("::1", 0))
      local ip, port, family = srv:getsockname()
      assert.equal("::1", ip)
      assert.equal("inet6", family)
      local c = socket.tcp6()
      assert.equal(1, c:connect("::1", port))
      assert.equal("inet6", c:getfamily())
      local a = assert(srv:accept())
      assert.equal(3, a:send("v6\n"))
      assert.equal("v6", c:receive())
      c:close(); a:close(); srv:close()
      local u, u2 = socket.udp6(), socket.udp6()
      assert.equal(1, u:setsockname("::1", 0))
      local _, uport = u:getsockname()
      assert.equal(2, u2:sendto("hi", "::1", uport))
      u:settimeout(5)
      local data, from = u:receivefrom()
      assert.equal("hi", data)
      assert.equal("::1", from)
      u:close(); u2:close()
    end)
  end)
end)

describe("ums.socket outside LuaSocket's reach", function()
  it("sleeps only its task and tells the time as LuaSocket's gettime",
     function()
    run(function()
      local t0 = socket.gettime()
      assert.is_true(math.abs(t0 - os.time()) < 2)
      local other = 0
      local t = ums.spawn(function()
        for _ = 1, 3 do other = other + 1 ums.yield() end
      end)
      socket.sleep(0.02)
      assert.equal(3, other)
      assert.is_true(socket.gettime() > t0)
      t:join()
    end)
  end)

  it("raises LuaSocket's errors for a wrong object", function()
    run(function()
      local s = socket.tcp()
      local ok, err = pcall(function() local r = s:receive() return r end)
      assert.is_false(ok)
      assert.matches("calling 'receive' on bad self %(tcp{client} expected%)",
                     err)
      -- a socket that is not bound cannot listen: a result, not an error
      local r, msg = s:listen()
      assert.is_nil(r)
      assert.is_string(msg)
    end)
  end)
end)
