-- A small HTTP/1.1 keep-alive server on ums.net that answers every request
-- with the same "Hello, World!" response, on every scheduler.
--
--   lua5.4 examples/http_server.lua                 a self-test: serve on a
--        free port, make keep-alive requests from client tasks, check the
--        answers, stop (this is how the example runs as a test)
--   lua5.4 examples/http_server.lua --port 8080 [--schedulers 2]
--        serve 127.0.0.1:8080 until killed (bench/net/http.sh drives it
--        with wrk); --port 0 picks a free port; the first line printed
--        names the port and the schedulers listening
--
-- A listener per scheduler, all on the same port with SO_REUSEPORT, rather
-- than one acceptor handing connections on: the kernel spreads incoming
-- connections over the listeners, and each connection is served by a task
-- of the scheduler that accepted it, in that scheduler's VM. A single
-- acceptor would have to pass every connection's descriptor to another
-- VM by value (ums.submit), a wake-up of another thread per connection, and
-- would be one scheduler's work that limits the others. The price: the
-- kernel balances by a hash of the connection's addresses, not by load, so
-- a few long connections may land on one scheduler.
--
-- A request is read with the connection's buffered reads (a line at a
-- time, then the body by its Content-Length, which is skipped) and
-- answered with one raw send. HTTP/1.1 connections stay open until the
-- client closes them or sends "Connection: close"; HTTP/1.0 ones only with
-- "Connection: keep-alive".
local ums = require "ums"

-- One scheduler's listener: the work submitted to each scheduler (a task
-- of the caller's own scheduler for that one). Its only upvalue is _ENV, as
-- ums.submit requires; it reports its scheduler and port on ready, serves
-- until stop is set, and returns how many connections it accepted.
local function listen_on(port, stop, ready)
  local ums = require "ums"  -- this VM's own: the only upvalue is _ENV
  local body = "Hello, World!\n"
  local response = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" ..
                   "Content-Length: " .. #body .. "\r\n\r\n" .. body
  local response_close = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" ..
                         "Connection: close\r\nContent-Length: " .. #body ..
                         "\r\n\r\n" .. body

  -- Serves one connection until the client closes it or asks to.
  local function serve(conn)
    while true do
      local request = conn:read("l")
      if not request then break end  -- end of stream, reset or timeout
      local keep = not request:find("HTTP/1.0", 1, true)
      local length = 0
      while true do
        local header = conn:read("l")
        if not header then
          conn:close()
          return
        end
        header = header:gsub("\r$", "")
        if header == "" then break end
        local name, value = header:match("^([^:]+):%s*(.-)%s*$")
        if name then
          name, value = name:lower(), value:lower()
          if name == "content-length" then
            length = tonumber(value) or 0
          elseif name == "connection" then
            if value == "close" then keep = false end
            if value == "keep-alive" then keep = true end
          end
        end
      end
      if length > 0 and not conn:read(length) then break end
      if not conn:send(keep and response or response_close) or not keep then
        break
      end
    end
    conn:close()
  end

  local server = assert(ums.net.listen("127.0.0.1", port, {reuseport = true}))
  local _, bound = server:getsockname()
  ready:send({scheduler = ums.scheduler(), port = bound})
  local accepted = 0
  -- accept wakes up twice a second to look at stop: a stop needs no
  -- descriptor shared across VMs, and an idle listener costs nothing else.
  while not stop:is_set() do
    local conn, err = server:accept(0.5)
    if conn then
      accepted = accepted + 1
      ums.spawn(serve, conn)
    elseif err ~= "timeout" then
      -- Out of descriptors (EMFILE) and the like: the connection stays
      -- queued, so wait a little rather than spin on it.
      ums.sleep(0.05)
    end
  end
  server:close()
  return accepted
end

-- Starts a listener on every scheduler, all on one port (port 0: the
-- first listener picks a free one). Returns the port, the listeners (a
-- task on this scheduler, works on the others) and the schedulers they
-- run on.
local function start(port, stop)
  local ready = ums.shared.channel(ums.schedulers())
  local first = ums.spawn(listen_on, port, stop, ready)
  local at = ready:recv()
  local listeners, schedulers = {first}, {at.scheduler}
  for i = 0, ums.schedulers() - 1 do
    if i ~= at.scheduler then
      local work = ums.submit_on(i, listen_on, at.port, stop, ready)
      -- An idle scheduler may steal work that has not started; this task
      -- keeps its own scheduler busy until scheduler i has taken the work.
      while work:status() == "pending" do ums.yield() end
      listeners[#listeners + 1] = work
      schedulers[#schedulers + 1] = ready:recv().scheduler
    end
  end
  return at.port, listeners, schedulers
end

-- A client making n requests on one keep-alive connection, the last one
-- with "Connection: close"; returns the count of good answers, or raises.
local function client(port, n)
  local conn = assert(ums.net.connect("127.0.0.1", port, {timeout = 10,
                                                           io_timeout = 10}))
  local good = 0
  for i = 1, n do
    local last = i == n
    assert(conn:write("GET /", i, " HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                      last and "Connection: close\r\n" or "", "\r\n"))
    assert(conn:flush())
    local status = assert(conn:read("l"))
    assert(status == "HTTP/1.1 200 OK\r", "bad status line: " .. status)
    local length, close = nil, false
    while true do
      local header = assert(conn:read("l")):gsub("\r$", "")
      if header == "" then break end
      length = length or tonumber(header:match("^Content%-Length: (%d+)$"))
      close = close or header == "Connection: close"
    end
    local body = assert(conn:read(length))
    assert(body == "Hello, World!\n", "bad body: " .. body)
    assert(close == last, "Connection: close answered wrongly")
    good = good + 1
  end
  -- The server closes after "Connection: close": end of stream.
  assert(conn:read("a") == "", "data after the last response")
  conn:close()
  return good
end

local function self_test()
  local stop = ums.shared.event(true)
  local port, listeners, schedulers = start(0, stop)
  local clients, requests = 4 * #listeners, 5
  local tasks = {}
  for i = 1, clients do tasks[i] = ums.spawn(client, port, requests) end
  local answered = 0
  for _, t in ipairs(tasks) do
    local ok, good = t:join()
    assert(ok, good)
    answered = answered + good
  end
  stop:set()
  local accepted = 0
  for _, l in ipairs(listeners) do
    local ok, n = l:join()
    assert(ok, n)
    accepted = accepted + n
  end
  assert(answered == clients * requests and accepted == clients)
  table.sort(schedulers)
  print(("http_server: %d requests on %d keep-alive connections answered; " ..
         "listeners on schedulers %s"):format(answered, clients,
                                             table.concat(schedulers, ", ")))
end

local function serve_forever(port)
  local bound, listeners, schedulers = start(port, ums.shared.event(true))
  table.sort(schedulers)
  print(("http_server: serving http://127.0.0.1:%d/ on schedulers %s")
        :format(bound, table.concat(schedulers, ", ")))
  io.stdout:flush()
  for _, l in ipairs(listeners) do assert(l:join()) end
end

local port, nsched
local i = 1
while arg and arg[i] do
  if arg[i] == "--port" then
    port = assert(math.tointeger(tonumber(arg[i + 1])), "--port N")
  elseif arg[i] == "--schedulers" then
    nsched = assert(math.tointeger(tonumber(arg[i + 1])), "--schedulers N")
  else
    error("usage: http_server.lua [--port N] [--schedulers N]")
  end
  i = i + 2
end

-- Two schedulers unless told, so that the self-test has listeners to
-- share the port. Under the ums command (or inside another run) the run is
-- already there, with its schedulers; ums.run then runs the function as
-- one of its tasks.
if not ums.scheduler() then ums.config{schedulers = nsched or 2} end
if port then
  ums.run(serve_forever, port)
else
  ums.run(self_test)
end
