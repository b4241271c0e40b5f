--- ums.socket: LuaSocket's API over ums.net, so that code written for
-- LuaSocket (and Debian's socket.http, socket.smtp, socket.ftp, ltn12)
-- runs unchanged inside tasks, parking only its task where LuaSocket
-- would block the whole thread.
--
--   local socket = require "ums.socket"
--   local http = require "socket.http"
--   ums.run(function()
--     local t = {}
--     http.request{url = "http://127.0.0.1:8080/", create = socket.tcp,
--                  sink = ltn12.sink.table(t)}
--   end)
--
-- This file holds no socket code of its own: every object wraps an
-- ums.net connection, server or datagram socket and only translates
-- names, results and timeouts to LuaSocket's (3.1, lunarmodules), and
-- M.unix is its socket.unix over ums.net's Unix sockets. The
-- read buffer is the ums.net connection's; `receive` takes its partial
-- result out of it with conn:drain(). LuaSocket's own Lua helpers
-- (socket.lua: sink, source, choose, connect4/6, try) are loaded over
-- this core when LuaSocket is installed, so they are LuaSocket's code.
--
-- What differs from LuaSocket, and why:
-- * A master object (tcp()) has no descriptor before connect or bind
--   (ums.net makes the socket and connects or listens in one call);
--   options set on it are kept and applied then. bind() already listens
--   (with the system's backlog): listen() sets LuaSocket's backlog and
--   turns the object into a server.
-- * Every waiting call needs a task, as ums.net's calls do.
local ums = require "ums"
local net = require "ums.net"
local wq = require "ums.waitq"
-- buffered(conn), connected(conn), select(rfds, wfds, t): lsocket.c.
local helpers = require("ums.core").socket

local error, getmetatable, ipairs, math_type, pairs, pcall, rawequal,
  select, setmetatable, tonumber, tostring, type =
  error, getmetatable, ipairs, math.type, pairs, pcall, rawequal,
  select, setmetatable, tonumber, tostring, type
local format, gsub, find, sub = string.format, string.gsub, string.find,
  string.sub
local floor, huge = math.floor, math.huge
local argerror, typename = wq.argerror, wq.typename

local M = {}

M._VERSION = "LuaSocket 3.0.0 (ums.socket)"
-- LuaSocket's select is bound by FD_SETSIZE; this one takes any number
-- of sockets. Code that checks its lists against _SETSIZE sees that.
M._SETSIZE = math.maxinteger

-- ---------------------------------------------------------------------
-- Results as LuaSocket words them
-- ---------------------------------------------------------------------

local E = net.errno or {}

-- LuaSocket's socket_strerror (pierror.h): a reset or aborted connection
-- and a broken pipe are "closed", a timeout is "timeout"; the other
-- messages are ums.net's, which are strerror's in lower case.
local words = {}
local function word(code, text)
  if code then words[code] = text end
end
word(E.ECONNRESET, "closed")
word(E.ECONNABORTED, "closed")
word(E.EPIPE, "closed")
word(E.ETIMEDOUT, "timeout")
word(E.EADDRINUSE, "address already in use")
word(E.EISCONN, "already connected")
word(E.EACCES, "permission denied")
word(E.ECONNREFUSED, "connection refused")

-- LuaSocket's words for a failed resolution (socket_gaistrerror), keyed
-- by ums.net's (gai_strerror's, in lower case); a failure not here is
-- gai_strerror's as it stands, as LuaSocket's default is.
local gai_words = {
  ["name or service not known"] = "host or service not provided, or not known",
  ["temporary failure in name resolution"] =
    "temporary failure in name resolution",
  ["non-recoverable failure in name resolution"] =
    "non-recoverable failure in name resolution",
  ["ai_family not supported"] = "ai_family not supported",
  ["ai_socktype not supported"] = "ai_socktype not supported",
  ["servname not supported for ai_socktype"] =
    "service not supported for socket type",
  ["bad value for ai_flags"] = "invalid value for ai_flags",
}

local function message(msg, code)
  -- ums.net's end of stream (nil without a message) is LuaSocket's
  -- "closed".
  if msg == nil then return "closed" end
  -- ums.net's own words: its timeout, and "closed" for a socket another
  -- task closed.
  if msg == "timeout" or msg == "closed" then return msg end
  if gai_words[msg] then return gai_words[msg] end
  if not code then return msg end
  -- The other system errors are strerror's words, as LuaSocket gives
  -- them (ums.net's are the same in lower case).
  return words[code] or (gsub(msg, "^%l", string.upper))
end

-- strerror(ENOTCONN), LuaSocket's answer on a socket not connected.
local NOTCONN = "Transport endpoint is not connected"

-- LuaSocket answers with lua_pushnumber: floats, in Lua 5.4.
local ONE = 1.0

-- ---------------------------------------------------------------------
-- Time
-- ---------------------------------------------------------------------

-- Seconds since the epoch as LuaSocket's gettime, anchored once to
-- os.time() and advancing with ums.now(), so that differences between
-- two readings are exact (and follow the virtual clock in a run on it).
local epoch = os.time() - ums.now()

function M.gettime()
  return epoch + ums.now()
end
local gettime = M.gettime

function M.sleep(s)
  if type(s) ~= "number" then
    argerror(2, 1, "sleep", "number expected, got " .. typename(s))
  end
  if s ~= s or s < 0 then s = 0 end
  if s == huge then s = nil end
  return ums.sleep(s)
end

-- ---------------------------------------------------------------------
-- Exceptions: skip, newtry, protect (LuaSocket's except.c, in Lua)
-- ---------------------------------------------------------------------

function M.skip(d, ...)
  if math_type(d) ~= "integer" then
    if type(d) == "number" and d == floor(d) then d = floor(d)
    else argerror(2, 1, "skip", "number has no integer representation") end
  end
  if d < 0 then d = 0 end
  return select(d + 1, ...)
end

-- The wrapper of an error raised by a try: protect returns its value.
local wrapped = { __metatable = false }

function M.newtry(finalizer)
  if finalizer == nil then finalizer = function() end end
  return function(...)
    if not ... then
      finalizer()
      error(setmetatable({ (select(2, ...)) }, wrapped), 0)
    end
    return ...
  end
end

local function finish(ok, ...)
  if ok then return ... end
  local e = ...
  if type(e) == "table" and rawequal(debug.getmetatable(e), wrapped) then
    return nil, e[1]
  end
  error(e, 0)
end

function M.protect(f)
  return function(...)
    return finish(pcall(f, ...))
  end
end

-- ---------------------------------------------------------------------
-- Timeouts: LuaSocket's block and total timeouts, both counted from the
-- start of each method call as LuaSocket counts them, become one ums.net
-- per-call timeout.
-- ---------------------------------------------------------------------

-- The timeout of a call starting now: nil (none) or seconds.
local function call_timeout(s)
  local b, t = s.block, s.total
  if b < 0 and t < 0 then return nil end
  if b < 0 then return t end
  if t < 0 then return b end
  return b < t and b or t
end

-- Sets ums.net's per-call timeout of o (a conn, server or udp) to t.
local function arm(s, o, t)
  if s.armed ~= t or s.armed_on ~= o then
    o:settimeout(t)
    s.armed, s.armed_on = t, o
  end
end

-- ---------------------------------------------------------------------
-- Objects
-- ---------------------------------------------------------------------

-- One method table for every class of a kind, as LuaSocket has; each
-- method checks the classes it accepts.
local tcp = {}
local udp = {}

-- Each class has its own method table, as LuaSocket's, with the field
-- `class` naming it (sock.class == "tcp{client}"); the methods are copied
-- in from the shared table once they are all defined (fill_classes),
-- with the class's own aliases (alias name -> method name).
local classes = {}
local function class(name, methods, aliases)
  local mt = { __name = name, __index = { class = name } }
  mt.__tostring = function(s) return format("%s: %p", name, s) end
  classes[mt] = { methods, aliases }
  return mt
end

local function fill_classes()
  for mt, c in pairs(classes) do
    local methods, aliases = c[1], c[2]
    for k, f in pairs(methods) do mt.__index[k] = f end
    for k, name in pairs(aliases or {}) do mt.__index[k] = methods[name] end
  end
end

local MASTER = class("tcp{master}", tcp)
local CLIENT = class("tcp{client}", tcp)
local SERVER = class("tcp{server}", tcp)
local UNCONNECTED = class("udp{unconnected}", udp)
local CONNECTED = class("udp{connected}", udp)
-- socket.unix's classes (LuaSocket's unixstream.c and unixdgram.c): the
-- same methods over Unix paths, on ums.net's Unix sockets.
local UMASTER = class("unixstream{master}", tcp)
local UCLIENT = class("unixstream{client}", tcp)
local USERVER = class("unixstream{server}", tcp)
-- unixdgram objects also have bind and connect, as LuaSocket's do.
local dgram_aliases = { bind = "setsockname", connect = "setpeername" }
local UUNCONNECTED = class("unixdgram{unconnected}", udp, dgram_aliases)
local UCONNECTED = class("unixdgram{connected}", udp, dgram_aliases)

-- The classes of each role, over IP and over Unix paths; methods check
-- the role.
local IS_MASTER = { [MASTER] = true, [UMASTER] = true }
local IS_CLIENT = { [CLIENT] = true, [UCLIENT] = true }
local IS_SERVER = { [SERVER] = true, [USERVER] = true }
local IS_UNCONNECTED = { [UNCONNECTED] = true, [UUNCONNECTED] = true }
local IS_CONNECTED = { [CONNECTED] = true, [UCONNECTED] = true }
local TCP_ANY = { [MASTER] = true, [CLIENT] = true, [SERVER] = true,
                  [UMASTER] = true, [UCLIENT] = true, [USERVER] = true }
local UDP_ANY = { [UNCONNECTED] = true, [CONNECTED] = true,
                  [UUNCONNECTED] = true, [UCONNECTED] = true }
-- Every class of this module (select reads their fields directly).
local OURS = {}
for mt in pairs(TCP_ANY) do OURS[mt] = true end
for mt in pairs(UDP_ANY) do OURS[mt] = true end

-- Whether s is a socket.unix object: its family says so from its
-- creation on (unix.stream, unix.dgram).
local function is_unix(s)
  return s.family == "unix"
end

-- The class of role `role` for s's kind (IP or Unix).
local IP_ROLES = { client = CLIENT, server = SERVER, connected = CONNECTED,
                   unconnected = UNCONNECTED }
local UNIX_ROLES = { client = UCLIENT, server = USERVER,
                     connected = UCONNECTED, unconnected = UUNCONNECTED }
local function class_of(s, role)
  return (is_unix(s) and UNIX_ROLES or IP_ROLES)[role]
end

-- Checks that self is of class mt (or of a group: a set of classes).
local function check(s, want, fname, what)
  local mt = getmetatable(s)
  if mt == want or (type(want) == "table" and want[mt] and not want.__name)
  then
    return s
  end
  if type(s) == "table" and is_unix(s) then
    what = gsub(gsub(what, "^tcp", "unixstream"), "^udp", "unixdgram")
  end
  argerror(3, 1, fname, what .. " expected")
end

local function new(mt, family)
  return setmetatable({
    -- fd: the descriptor of the ums.net object it holds (conn, server or
    -- udp), kept beside it (getfd, select); nil without one.
    family = family,     -- "inet", "inet6" or nil (the first that works)
    block = -1, total = -1,
    received = 0, sent = 0, birthday = gettime(),
    options = {},        -- a master's options, applied when it connects
  }, mt)
end

local function create(family)
  return function() return new(MASTER, family) end
end
M.tcp = create(nil)
M.tcp4 = create("inet")
M.tcp6 = create("inet6")

-- ---------------------------------------------------------------------
-- Options: LuaSocket's names over ums.net's
-- ---------------------------------------------------------------------

local option_names = {
  ["tcp-nodelay"] = "nodelay",
  keepalive = "keepalive",
  reuseaddr = "reuseaddr",
  linger = "linger",
  ["recv-buffer-size"] = "rcvbuf",
  ["send-buffer-size"] = "sndbuf",
}
-- Options LuaSocket knows that only make sense before bind or connect,
-- kept for ums.net.listen and ums.net.connect.
local early = { reuseaddr = true, reuseport = true, ["ipv6-v6only"] = true,
                ["tcp-nodelay"] = true }

local function to_net(name, value)
  if name == "linger" then
    if type(value) ~= "table" then
      argerror(3, 2, "setoption", "table expected, got " .. typename(value))
    end
    if not value.on then return false end
    return tonumber(value.timeout) or 0
  end
  if name == "recv-buffer-size" or name == "send-buffer-size" then
    return tonumber(value)
  end
  return not not value
end

local function from_net(name, value)
  if name == "linger" then
    if not value then return { on = false, timeout = 0 } end
    return { on = true, timeout = value }
  end
  -- LuaSocket's numbers are floats (lua_pushnumber).
  if type(value) == "number" then return value + 0.0 end
  return value
end

-- Checks an option's name (argument 2 of method `what`) against `ok`, a
-- predicate: LuaSocket's errors for a non-string and an unknown name,
-- raised at the method's caller (level 3: through this helper).
local function option_name(name, what, ok)
  if type(name) ~= "string" then
    argerror(3, 2, what, "string expected, got " .. typename(name))
  end
  if not ok(name) then
    argerror(3, 2, what, format("unsupported option `%.35s'", name))
  end
end

-- tcp options: ums.net's, and those only a master keeps until it has a
-- descriptor (`early`). udp options: ums.net's alone.
local function known(name)
  return option_names[name] or early[name]
end

local function known_net(name)
  return option_names[name]
end

-- The object's ums.net object, whichever it has.
local function handle(s)
  return s.conn or s.server or s.udp
end

function tcp.setoption(s, name, value)
  check(s, TCP_ANY, "setoption", "tcp{any}")
  option_name(name, "setoption", known)
  local o = handle(s)
  if not o then
    s.options[name] = value
    return ONE
  end
  local net_name = option_names[name]
  if not net_name then
    return nil, "ums.socket: option '" .. name .. "' can only be set " ..
      "before bind or connect"
  end
  local ok, msg, code = o:setoption(net_name, to_net(name, value))
  if not ok then return nil, message(msg, code) end
  return ONE
end

function tcp.getoption(s, name)
  check(s, TCP_ANY, "getoption", "tcp{any}")
  option_name(name, "getoption", known)
  local o = handle(s)
  local net_name = option_names[name]
  if not o or not net_name then
    local v = s.options[name]
    if name == "linger" then return v or { on = false, timeout = 0 } end
    if v == nil then return false end
    return v
  end
  local v, msg, code = o:getoption(net_name)
  if v == nil then return nil, message(msg, code) end
  return from_net(name, v)
end

-- ---------------------------------------------------------------------
-- tcp: connect, bind, listen, accept
-- ---------------------------------------------------------------------

local function check_host(h, narg, fname)
  if type(h) == "number" then return tostring(h) end
  if type(h) ~= "string" then
    argerror(3, narg, fname, "string expected, got " .. typename(h))
  end
  return h
end

local function check_port(p, narg, fname)
  if type(p) == "string" then
    local n = tonumber(p)
    if n then return n end
    return p
  end
  if type(p) ~= "number" then
    argerror(3, narg, fname, "string expected, got " .. typename(p))
  end
  return p
end

-- A Unix socket's path: LuaSocket's answer for one that does not fit in
-- sockaddr_un's sun_path (108 bytes with its NUL), else nil.
local function path_error(path)
  if #path >= 108 then return "path too long" end
end

-- A datagram method's port argument (argument narg of fname): nil for a
-- Unix socket, whose host is its path (then bad is LuaSocket's answer for
-- a path too long), else the checked port.
local function dgram_port(s, host, port, narg, fname)
  if is_unix(s) then return nil, path_error(host) end
  return check_port(port, narg, fname)
end

-- Opens s's connection (s: a master) to host, port (a Unix socket: to
-- the path host); returns 1 or nil, err.
local function open(s, host, port)
  local o = s.options
  local t = call_timeout(s)
  -- A zero timeout starts the connection and returns "timeout" while the
  -- kernel makes it, as LuaSocket's non-blocking connect does: the
  -- object is a client from then on, select() sees it writable once the
  -- connection is made, and connect() again tells how it went.
  local wait = t ~= 0
  if not wait then t = nil end
  local conn, msg, code
  if is_unix(s) then
    local bad = path_error(host)
    if bad then return nil, bad end
    conn, msg, code = net.connect_unix(host, { timeout = t, wait = wait })
  else
    local nodelay = o["tcp-nodelay"]
    conn, msg, code = net.connect(host, port, {
      timeout = t, family = s.family, wait = wait,
      nodelay = nodelay ~= nil and not not nodelay or nil,
    })
  end
  if not conn then
    -- A Unix listener's full backlog refuses a connect that may not
    -- wait: LuaSocket's "timeout", and the next connect tries again.
    if not wait and code == E.EAGAIN then return nil, "timeout" end
    return nil, message(msg, code)
  end
  -- (a connection handed over: whether the kernel is still making it)
  local pending = msg == true
  s.conn, s.fd = conn, conn:fileno()
  s.family = select(3, conn:getsockname()) or s.family
  for name, value in pairs(o) do
    local net_name = option_names[name]
    if net_name and name ~= "tcp-nodelay" then
      conn:setoption(net_name, to_net(name, value))
    end
  end
  setmetatable(s, class_of(s, "client"))
  if pending then
    s.connecting = true
    return nil, "timeout"
  end
  return ONE
end

-- connect() again on an object whose connection open() handed over while
-- being made: the kernel's answers to connect(2) again, as LuaSocket
-- gives them: in progress, then 1 once made (and "already connected"
-- after that), or the connection's error.
local function connect_again(s)
  local made, msg, code = helpers.connected(s.conn)
  if made == false then return nil, "Operation already in progress" end
  s.connecting = nil
  if made then return ONE end
  -- The connection failed: the object stays a client without one (its
  -- socket is not connected) until a connect starts afresh.
  s.conn:close()
  s.conn, s.fd, s.unconnected = nil, nil, true
  return nil, message(msg, code)
end

function tcp.connect(s, host, port)
  check(s, TCP_ANY, "connect", "tcp{any}")
  host = check_host(host, 2, "connect")
  if not is_unix(s) then port = check_port(port, 3, "connect") end
  if s.closed then return nil, "closed" end
  if s.connecting then return connect_again(s) end
  if s.conn then return nil, "already connected" end
  s.unconnected = nil
  if s.server then return nil, "ums.socket: a bound socket cannot connect" end
  return open(s, host, port)
end
tcp.setpeername = tcp.connect

function tcp.bind(s, host, port)
  check(s, IS_MASTER, "bind", "tcp{master}")
  host = check_host(host, 2, "bind")
  if not is_unix(s) then port = check_port(port, 3, "bind") end
  if s.server then return nil, "ums.socket: the socket is bound already" end
  if s.closed then return nil, "closed" end
  local server, msg, code
  if is_unix(s) then
    local bad = path_error(host)
    if bad then return nil, bad end
    server, msg, code = net.listen_unix(host)
  else
    if host == "*" then host = s.family == "inet6" and "::" or "0.0.0.0" end
    local o = s.options
    server, msg, code = net.listen(host, port, {
      family = s.family,
      reuseaddr = not not o.reuseaddr,
      reuseport = not not o.reuseport,
    })
  end
  if not server then return nil, message(msg, code) end
  s.server, s.fd = server, server:fileno()
  s.family = select(3, server:getsockname()) or s.family
  return ONE
end
tcp.setsockname = tcp.bind

function tcp.listen(s, backlog)
  check(s, IS_MASTER, "listen", "tcp{master}")
  if backlog ~= nil and type(backlog) ~= "number" then
    argerror(2, 2, "listen", "number expected, got " .. typename(backlog))
  end
  if not s.server then
    return nil, "ums.socket: bind before listen (ums.net binds and " ..
      "listens in one call)"
  end
  -- LuaSocket's default backlog.
  local ok, msg, code = s.server:setbacklog(backlog and floor(backlog) or 32)
  if not ok then return nil, message(msg, code) end
  setmetatable(s, class_of(s, "server"))
  return ONE
end

function tcp.accept(s)
  check(s, IS_SERVER, "accept", "tcp{server}")
  if s.closed then return nil, "closed" end
  local conn, msg, code = s.server:accept(call_timeout(s))
  if not conn then return nil, message(msg, code) end
  local c = new(class_of(s, "client"), s.family)
  c.conn, c.fd = conn, conn:fileno()
  return c
end

-- ---------------------------------------------------------------------
-- tcp: receive and send (buffer.c's semantics over ums.net's buffer)
-- ---------------------------------------------------------------------

-- The failed end of a receive: nil, the error, and what was received
-- (prefix included), as LuaSocket returns it.
local function partial(s, prefix, msg, code, got, cr)
  local rest = s.conn and s.conn:drain() or ""
  if cr then rest = gsub(rest, "\r", "") end
  s.received = s.received + #rest
  return nil, message(msg, code), prefix .. (got or "") .. rest
end

function tcp.receive(s, pattern, prefix)
  check(s, IS_CLIENT, "receive", "tcp{client}")
  if prefix == nil then prefix = ""
  elseif type(prefix) == "number" then prefix = tostring(prefix)
  elseif type(prefix) ~= "string" then
    argerror(2, 3, "receive", "string expected, got " .. typename(prefix))
  end
  local kind, n
  if type(pattern) == "number" then
    if pattern < 0 or pattern ~= pattern then
      argerror(2, 2, "receive", "invalid receive pattern")
    end
    kind, n = "count", floor(pattern)
  elseif pattern == nil then kind = "line"
  elseif type(pattern) == "string" and find(pattern, "^%*?l") then
    kind = "line"
  elseif type(pattern) == "string" and find(pattern, "^%*?a") then
    kind = "all"
  elseif type(pattern) == "string" and tonumber(pattern) then
    -- luaL_checknumber takes numeric strings; so does LuaSocket.
    return tcp.receive(s, tonumber(pattern), prefix)
  else
    argerror(2, 2, "receive", "invalid receive pattern")
  end
  local conn = s.conn
  if not conn then
    return nil, s.unconnected and NOTCONN or "closed", prefix
  end
  arm(s, conn, call_timeout(s))
  if kind == "line" then
    local line, msg, code = conn:read("L")
    if line == nil then return partial(s, prefix, msg, code, nil, true) end
    s.received = s.received + #line
    if sub(line, -1) ~= "\n" then
      -- The stream ended inside a line: LuaSocket's partial result.
      return nil, "closed", prefix .. gsub(line, "\r", "")
    end
    return prefix .. gsub(sub(line, 1, -2), "\r", ""), nil, nil
  elseif kind == "all" then
    local data, msg, code = conn:read("a")
    if data == nil then return partial(s, prefix, msg, code) end
    s.received = s.received + #data
    if data == "" then return nil, "closed", prefix end
    return prefix .. data, nil, nil
  end
  -- A count: what the prefix holds counts towards it.
  if #prefix > 0 and n <= #prefix then return prefix, nil, nil end
  local want = n - #prefix
  local data, msg, code = conn:read(want)
  if data == nil then return partial(s, prefix, msg, code) end
  s.received = s.received + #data
  if #data < want then return nil, "closed", prefix .. data end
  return prefix .. data, nil, nil
end

function tcp.send(s, data, i, j)
  check(s, IS_CLIENT, "send", "tcp{client}")
  if type(data) == "number" then data = tostring(data)
  elseif type(data) ~= "string" then
    argerror(2, 2, "send", "string expected, got " .. typename(data))
  end
  if i ~= nil and type(i) ~= "number" then
    argerror(2, 3, "send", "number expected, got " .. typename(i))
  end
  if j ~= nil and type(j) ~= "number" then
    argerror(2, 4, "send", "number expected, got " .. typename(j))
  end
  local size = #data
  -- LuaSocket truncates the indices to C longs, towards zero.
  local first = i and (i < 0 and -floor(-i) or floor(i)) or 1
  local last = j and (j < 0 and -floor(-j) or floor(j)) or -1
  if first < 0 then first = size + first + 1 end
  if last < 0 then last = size + last + 1 end
  if first < 1 then first = 1 end
  if last > size then last = size end
  if first > last then return first - 1.0, nil, nil end
  local conn = s.conn
  if not conn then return nil, "closed", first - 1.0 end
  arm(s, conn, call_timeout(s))
  local n, msg, code, sent = conn:send(data, first, last)
  if not n then
    sent = sent or 0
    s.sent = s.sent + sent
    return nil, message(msg, code), first - 1.0 + sent
  end
  s.sent = s.sent + n
  return first - 1.0 + n, nil, nil
end

function tcp.shutdown(s, how)
  check(s, IS_CLIENT, "shutdown", "tcp{client}")
  local map = { receive = "r", send = "w", both = "rw" }
  if how == nil then how = "both" end
  local h = map[how]
  if not h then
    argerror(2, 2, "shutdown", format("invalid option '%s'", tostring(how)))
  end
  if s.conn then s.conn:shutdown(h) end
  return ONE
end

-- ---------------------------------------------------------------------
-- tcp: the rest
-- ---------------------------------------------------------------------

function tcp.close(s)
  check(s, TCP_ANY, "close", "tcp{any}")
  local o = handle(s)
  s.conn, s.server, s.fd, s.closed = nil, nil, nil, true
  if o then o:close() end
  return ONE
end

-- Whether the object's read buffer holds data (select treats such a
-- socket as readable at once).
local function dirty(s)
  local conn = s.conn
  return conn ~= nil and helpers.buffered(conn) > 0
end

function tcp.dirty(s)
  check(s, TCP_ANY, "dirty", "tcp{any}")
  return dirty(s)
end

function tcp.getfd(s)
  check(s, TCP_ANY, "getfd", "tcp{any}")
  return (s.fd or -1) + 0.0
end

-- LuaSocket's setfd swaps the descriptor under the object; an ums.net
-- object owns its descriptor for its whole life.
local function no_setfd()
  argerror(3, 2, "setfd", "ums.socket objects own their ums.net " ..
    "socket and cannot adopt a descriptor")
end

function tcp.setfd(s)
  check(s, TCP_ANY, "setfd", "tcp{any}")
  no_setfd()
end

function tcp.getfamily(s)
  check(s, TCP_ANY, "getfamily", "tcp{any}")
  return s.family == "inet6" and "inet6" or "inet4"
end

local function names(s, which, fname)
  local o = handle(s)
  if not o or not o[which] then return nil, "Bad file descriptor" end
  local addr, port, family = o[which](o)
  if not addr then return nil, message(port, family) end
  -- socket.unix answers the path alone.
  if family == "unix" then return addr end
  -- LuaSocket 3.1 gives the port as getnameinfo's string.
  return addr, tostring(port), family
end

function tcp.getsockname(s)
  check(s, TCP_ANY, "getsockname", "tcp{any}")
  return names(s, "getsockname")
end

function tcp.getpeername(s)
  check(s, TCP_ANY, "getpeername", "tcp{any}")
  if not s.conn then
    return nil, (s.server or s.unconnected) and NOTCONN or
      "Bad file descriptor"
  end
  return names(s, "getpeername")
end

local function getstats(s)
  return s.received + 0.0, s.sent + 0.0, gettime() - s.birthday
end

local function setstats(s, received, sent, age)
  s.received = received and floor(received) or s.received
  s.sent = sent and floor(sent) or s.sent
  if type(age) == "number" then s.birthday = gettime() - age end
  return ONE
end

function tcp.getstats(s)
  check(s, IS_CLIENT, "getstats", "tcp{client}")
  return getstats(s)
end

function tcp.setstats(s, received, sent, age)
  check(s, IS_CLIENT, "setstats", "tcp{client}")
  return setstats(s, received, sent, age)
end

local function settimeout(s, t, mode, fname)
  if t == nil then t = -1
  elseif type(t) ~= "number" then
    argerror(3, 2, fname, "number expected, got " .. typename(t))
  end
  if t ~= t then argerror(3, 2, fname, "timeout is NaN") end
  if t == huge then t = -1 end
  if mode == nil then mode = "b" end
  if type(mode) ~= "string" then
    argerror(3, 3, fname, "string expected, got " .. typename(mode))
  end
  local c = sub(mode, 1, 1)
  if c == "b" then s.block = t
  elseif c == "t" or c == "r" then s.total = t
  else argerror(3, 3, fname, "invalid timeout mode") end
  return ONE
end

function tcp.settimeout(s, t, mode)
  check(s, TCP_ANY, "settimeout", "tcp{any}")
  local one = settimeout(s, t, mode, "settimeout")  -- not a tail call:
  return one                                        -- argerror's level
end

function tcp.gettimeout(s)
  check(s, TCP_ANY, "gettimeout", "tcp{any}")
  return s.block + 0.0, s.total + 0.0
end

-- ---------------------------------------------------------------------
-- connect and bind, the functions
-- ---------------------------------------------------------------------

local families = { inet = "inet", inet6 = "inet6", unspec = false }

function M.connect(address, port, locaddr, locport, family)
  address = check_host(address, 1, "connect")
  port = check_port(port, 2, "connect")
  local fam = nil
  if family ~= nil then
    fam = families[family]
    if fam == nil then
      argerror(2, 5, "connect", format("invalid option '%s'",
                                       tostring(family)))
    end
    fam = fam or nil
  end
  if locaddr ~= nil then
    return nil, "ums.socket: connect from a local address is not supported"
  end
  local s = new(MASTER, fam)
  local ok, err = open(s, address, port)
  if not ok then return nil, err end
  return s
end

function M.bind(host, port, backlog)
  host = check_host(host, 1, "bind")
  port = check_port(port, 2, "bind")
  local s = new(MASTER, nil)
  s.options.reuseaddr = true
  local ok, err = tcp.bind(s, host, port)
  if not ok then return nil, err end
  tcp.listen(s, backlog)
  return s
end

-- ---------------------------------------------------------------------
-- udp
-- ---------------------------------------------------------------------

local function udp_create(family)
  return function()
    local u, msg, code = net.udp({ family = family or "inet" })
    if not u then return nil, message(msg, code) end
    local s = new(UNCONNECTED, family or "inet")
    s.udp, s.fd = u, u:fileno()
    return s
  end
end
M.udp = udp_create(nil)
M.udp4 = udp_create("inet")
M.udp6 = udp_create("inet6")

-- socket.unix: LuaSocket's Unix-domain module (require "socket.unix"),
-- unix.stream() and unix.dgram() (aliases tcp and udp; calling the
-- module is stream()), over ums.net's Unix sockets; addresses are paths.
local unix = {}
function unix.stream()
  return new(UMASTER, "unix")
end
function unix.dgram()
  local u, msg, code = net.udp_unix()
  if not u then return nil, message(msg, code) end
  local s = new(UUNCONNECTED, "unix")
  s.udp, s.fd = u, u:fileno()
  return s
end
unix.tcp, unix.udp = unix.stream, unix.dgram
setmetatable(unix, { __call = function(_, ...) return unix.stream(...) end })
M.unix = unix

-- LuaSocket's UDP_DATAGRAMSIZE, the default receive size.
local DATAGRAM = 8192

local function check_size(size, narg, fname)
  if size == nil then return DATAGRAM end
  if type(size) ~= "number" then
    argerror(3, narg, fname, "number expected, got " .. typename(size))
  end
  return floor(size)
end

function udp.setsockname(s, host, port)
  check(s, IS_UNCONNECTED, "setsockname", "udp{unconnected}")
  host = check_host(host, 2, "setsockname")
  local bad
  port, bad = dgram_port(s, host, port, 3, "setsockname")
  if bad then return nil, bad end
  if host == "*" and not is_unix(s) then
    host = s.family == "inet6" and "::" or "0.0.0.0"
  end
  if not s.udp then return nil, "closed" end
  local ok, msg, code = s.udp:bind(host, port)
  if not ok then return nil, message(msg, code) end
  return ONE
end

function udp.setpeername(s, host, port)
  check(s, UDP_ANY, "setpeername", "udp{any}")
  host = check_host(host, 2, "setpeername")
  if not s.udp then return nil, "closed" end
  if host == "*" then
    local ok, msg, code = s.udp:disconnect()
    if not ok then return nil, message(msg, code) end
    setmetatable(s, class_of(s, "unconnected"))
    return ONE
  end
  local bad
  port, bad = dgram_port(s, host, port, 3, "setpeername")
  if bad then return nil, bad end
  local ok, msg, code = s.udp:connect(host, port)
  if not ok then return nil, message(msg, code) end
  setmetatable(s, class_of(s, "connected"))
  return ONE
end

function udp.send(s, data)
  check(s, IS_CONNECTED, "send", "udp{connected}")
  if type(data) ~= "string" then
    argerror(2, 2, "send", "string expected, got " .. typename(data))
  end
  if not s.udp then return nil, "closed" end
  arm(s, s.udp, call_timeout(s))
  local n, msg, code = s.udp:send(data)
  if not n then return nil, message(msg, code) end
  return n + 0.0
end

function udp.sendto(s, data, host, port)
  check(s, IS_UNCONNECTED, "sendto", "udp{unconnected}")
  if type(data) ~= "string" then
    argerror(2, 2, "sendto", "string expected, got " .. typename(data))
  end
  host = check_host(host, 3, "sendto")
  local bad
  port, bad = dgram_port(s, host, port, 4, "sendto")
  if bad then return nil, bad end
  if not s.udp then return nil, "closed" end
  arm(s, s.udp, call_timeout(s))
  local n, msg, code = s.udp:sendto(data, host, port)
  if not n then return nil, message(msg, code) end
  return n + 0.0
end

function udp.receive(s, size)
  check(s, UDP_ANY, "receive", "udp{any}")
  size = check_size(size, 2, "receive")
  if not s.udp then return nil, "closed" end
  arm(s, s.udp, call_timeout(s))
  local data, msg, code
  if IS_CONNECTED[getmetatable(s)] then
    data, msg, code = s.udp:recv(size)
  else
    data, msg, code = s.udp:recvfrom(size)
  end
  if not data then return nil, message(msg, code) end
  return data
end

function udp.receivefrom(s, size)
  check(s, IS_UNCONNECTED, "receivefrom", "udp{unconnected}")
  size = check_size(size, 2, "receivefrom")
  if not s.udp then return nil, "closed" end
  arm(s, s.udp, call_timeout(s))
  local data, host, port = s.udp:recvfrom(size)
  if not data then return nil, message(host, port) end
  -- socket.unix's datagrams come from a path alone.
  if is_unix(s) then return data, host end
  return data, host, port
end

function udp.close(s)
  check(s, UDP_ANY, "close", "udp{any}")
  local u = s.udp
  s.udp, s.fd, s.closed = nil, nil, true
  if u then u:close() end
  return ONE
end

function udp.dirty(s)
  check(s, UDP_ANY, "dirty", "udp{any}")
  return false
end

function udp.getfd(s)
  check(s, UDP_ANY, "getfd", "udp{any}")
  return (s.fd or -1) + 0.0
end
function udp.setfd(s)
  check(s, UDP_ANY, "setfd", "udp{any}")
  no_setfd()
end

function udp.getfamily(s)
  check(s, UDP_ANY, "getfamily", "udp{any}")
  return s.family == "inet6" and "inet6" or "inet4"
end

function udp.getsockname(s)
  check(s, UDP_ANY, "getsockname", "udp{any}")
  return names(s, "getsockname")
end

function udp.getpeername(s)
  check(s, IS_CONNECTED, "getpeername", "udp{connected}")
  return names(s, "getpeername")
end

function udp.setoption(s, name, value)
  check(s, UDP_ANY, "setoption", "udp{any}")
  option_name(name, "setoption", known_net)
  local net_name = option_names[name]
  if not s.udp then return nil, "closed" end
  local ok, msg, code = s.udp:setoption(net_name, to_net(name, value))
  if not ok then return nil, message(msg, code) end
  return ONE
end

function udp.getoption(s, name)
  check(s, UDP_ANY, "getoption", "udp{any}")
  option_name(name, "getoption", known_net)
  local net_name = option_names[name]
  if not s.udp then return nil, "closed" end
  local v, msg, code = s.udp:getoption(net_name)
  if v == nil then return nil, message(msg, code) end
  return from_net(name, v)
end

function udp.settimeout(s, t, mode)
  check(s, UDP_ANY, "settimeout", "udp{any}")
  local one = settimeout(s, t, mode, "settimeout")
  return one
end

function udp.gettimeout(s)
  check(s, UDP_ANY, "gettimeout", "udp{any}")
  return s.block + 0.0, s.total + 0.0
end

-- ---------------------------------------------------------------------
-- select
-- ---------------------------------------------------------------------

-- The descriptors' readiness: one look at all of them, then one park
-- (lua-binding/lsocket.c).
local select_fds = helpers.select

-- Collects the sockets of a select list and their descriptors, skipping
-- objects without one (closed ones), as LuaSocket does.
local function gather(list, narg)
  local socks, fds = {}, {}
  if list == nil then return socks, fds end
  if type(list) ~= "table" then
    argerror(3, narg, "select", "table expected, got " .. typename(list))
  end
  local i, n = 1, 0
  while true do
    local sock = list[i]
    if sock == nil then break end
    local fd
    if OURS[getmetatable(sock)] then fd = sock.fd  -- no method call
    else
      fd = sock:getfd()
      if type(fd) ~= "number" or fd < 0 then fd = nil else fd = floor(fd) end
    end
    if fd then
      n = n + 1
      socks[n], fds[n] = sock, fd
    end
    i = i + 1
  end
  return socks, fds
end

local function add(t, sock)
  if t[sock] == nil then
    t[#t + 1] = sock
    t[sock] = #t
  end
end

function M.select(recvt, sendt, timeout)
  local rs, rfds = gather(recvt, 1)
  local ws, wfds = gather(sendt, 2)
  if timeout ~= nil and type(timeout) ~= "number" then
    argerror(2, 3, "select", "number expected, got " .. typename(timeout))
  end
  if timeout == nil or timeout < 0 or timeout == huge then timeout = nil end
  local rout, wout = {}, {}
  -- A socket whose buffer holds data is readable without a wait.
  for _, sock in ipairs(rs) do
    local mt = getmetatable(sock)
    if OURS[mt] then
      if TCP_ANY[mt] and dirty(sock) then add(rout, sock) end
    elseif sock.dirty and sock:dirty() then add(rout, sock)
    end
  end
  if #rout > 0 then return rout, wout end
  if #rs == 0 and #ws == 0 then
    -- Nothing to wait for: LuaSocket's select sleeps out its timeout
    -- (forever without one).
    if timeout == 0 then return rout, wout, "timeout" end
    if timeout == nil then ums.event():wait() end
    ums.sleep(timeout)
    return rout, wout, "timeout"
  end
  local rready, wready = select_fds(rfds, wfds, timeout)
  for _, i in ipairs(rready) do add(rout, rs[i]) end
  for _, i in ipairs(wready) do add(wout, ws[i]) end
  if #rout == 0 and #wout == 0 then return rout, wout, "timeout" end
  return rout, wout
end

wq.methods(tcp)
wq.methods(udp)

-- ---------------------------------------------------------------------
-- DNS
-- ---------------------------------------------------------------------

local dns = {}
M.dns = dns

-- LuaSocket's words for getaddrinfo's failures (pierror.h).
local function dns_message(msg)
  if msg == nil then return "host not found" end
  return msg
end

function dns.getaddrinfo(host)
  host = check_host(host, 1, "getaddrinfo")
  local list, msg = net.resolve(host, nil, { socktype = "stream" })
  if not list then return nil, dns_message(msg) end
  local out = {}
  for i, a in ipairs(list) do
    out[i] = { family = a.family, addr = a.addr }
  end
  return out
end

function dns.toip(name)
  name = check_host(name, 1, "toip")
  local list, msg = net.resolve(name, nil, { family = "inet",
                                             socktype = "stream" })
  if not list or #list == 0 then return nil, "host not found" end
  local ips = {}
  for i, a in ipairs(list) do ips[i] = a.addr end
  return ips[1], { name = name, alias = {}, ip = ips }
end

function dns.gethostname()
  local s = ums.fs.readfile("/proc/sys/kernel/hostname")
  if not s then return nil, "host not found" end
  return (gsub(s, "%s+$", ""))
end

-- The name of a numeric address, by getnameinfo(3) through ums.ffi: on
-- the C-call pool, since a reverse lookup may ask a name server.
local C
local function reverse(addr)
  local ffi = ums.ffi
  if not C then
    ffi.cdef([[
      UMS_INLINE int inet_pton(int af, const char *src, char *dst);
      UMS_INLINE void *memcpy(char *dst, const char *src, size_t n);
      int getnameinfo(const char *sa, unsigned int salen, char *host,
                      unsigned int hostlen, char *serv,
                      unsigned int servlen, int flags);
    ]])
    C = ffi.C
  end
  local raw = ffi.buffer(16)
  local sa
  if C.inet_pton(2, addr, raw) == 1 then         -- AF_INET
    sa = string.pack("=I2>I2", 2, 0) .. ffi.string(raw, 4) ..
      string.rep("\0", 8)
  elseif C.inet_pton(10, addr, raw) == 1 then    -- AF_INET6
    sa = string.pack("=I2>I2I4", 10, 0, 0) .. ffi.string(raw, 16) ..
      string.pack("=I4", 0)
  else
    return nil, "host not found"
  end
  local buf, host = ffi.buffer(#sa), ffi.buffer(1025)
  C.memcpy(buf, sa, #sa)
  -- NI_NAMEREQD (8): an address without a name is an error, as
  -- LuaSocket's gethostbyaddr has it.
  if C.getnameinfo(buf, #sa, host, 1025, nil, 0, 8) ~= 0 then
    return nil, "host not found"
  end
  return ffi.string(host)
end

function dns.tohostname(addr)
  addr = check_host(addr, 1, "tohostname")
  local name, msg = reverse(addr)
  if not name then return nil, msg end
  return name, { name = name, alias = {}, ip = { addr } }
end

-- ---------------------------------------------------------------------
-- LuaSocket's Lua helpers (socket.lua) over this core
-- ---------------------------------------------------------------------

-- LuaSocket's socket.lua builds sink, source, choose, connect4/6 and try
-- on the table require("socket.core") returns; run it on this module so
-- that they call ums.socket. bind stays ours (it listens in one call).
local function load_helpers()
  local path = package.searchpath("socket", package.path)
  if not path then return end
  local env = setmetatable({
    require = function(name)
      if name == "socket.core" then return M end
      return require(name)
    end,
  }, { __index = _G })
  local chunk = loadfile(path, "t", env)
  if not chunk then return end
  local own_bind = M.bind
  local ok = pcall(chunk)
  M.bind = own_bind
  return ok
end
load_helpers()
if M.try == nil then M.try = M.newtry() end
fill_classes()

-- ---------------------------------------------------------------------
-- install: LuaSocket's module names, for libraries that require them
-- ---------------------------------------------------------------------

-- Modules that capture `require "socket"` when they load and use its
-- sockets: they are loaded again over ums.socket after install.
local users = { "socket.http", "socket.smtp", "socket.ftp", "socket.tp" }

--- Makes require "socket" and require "socket.core" give ums.socket in
-- this VM, require "socket.unix" its unix module (M.unix), and makes the
-- next require of socket.http, socket.smtp,
-- socket.ftp and socket.tp load them over it. Returns a function that
-- puts back what package.loaded held before.
function M.install()
  local saved = {}
  local function keep(name)
    saved[name] = { package.loaded[name] }
  end
  keep("socket")
  keep("socket.core")
  keep("socket.unix")
  for _, name in ipairs(users) do keep(name) end
  package.loaded["socket"] = M
  package.loaded["socket.core"] = M
  package.loaded["socket.unix"] = M.unix
  for _, name in ipairs(users) do package.loaded[name] = nil end
  local restored = false
  return function()
    if restored then return end
    restored = true
    for name, v in pairs(saved) do package.loaded[name] = v[1] end
  end
end

return M
