-- Specs for ums.net (lua-binding/lnet.c over the stream of lfs.c): sockets
-- for tasks, on loopback addresses and Unix paths only.
--
-- ctest runs this file on each socket backend (spec/CMakeLists.txt):
-- spec_net (io_uring here), spec_net_pool (UMS_IO=pool: epoll readiness),
-- and in the normal build spec_net_nouring (io_uring_setup fails with
-- ENOSYS under strace: the runtime must fall back to epoll) and
-- spec_net_eintr (io_uring_enter fails with EINTR every second call).
-- UMS_NET_EXPECT_BACKEND=uring|pool makes the run check the backend.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")
local net = ums.net

local function run(body, limit)
  return ums.test(body, {timeout = limit or 20, gc = true})
end

-- Joins t and returns its results; fails if it did not end normally.
local function results(t)
  local r = table.pack(t:join(15))
  assert(r[1] == true, "task did not end normally: " .. tostring(r[2])
    .. "\n" .. tostring(r[3]))
  return table.unpack(r, 2, r.n)
end

local TMP = os.tmpname()
os.remove(TMP)
local function unix_path(tag)
  return TMP .. "." .. tag .. ".sock"
end
-- The Unix listeners' paths stay after their close, as bind(2) leaves
-- them.
teardown(function() os.remove(unix_path("s")) end)

-- A listener on each kind of address, and how to reach it.
local kinds = {
  {name = "127.0.0.1",
   listen = function() return net.listen("127.0.0.1", 0) end,
   connect = function(srv, opts)
     local _, port = srv:getsockname()
     return net.connect("127.0.0.1", port, opts)
   end},
  {name = "::1",
   listen = function() return net.listen("::1", 0) end,
   connect = function(srv, opts)
     local _, port = srv:getsockname()
     return net.connect("::1", port, opts)
   end},
  {name = "a Unix path",
   listen = function()
     local path = unix_path("s")
     os.remove(path)
     return net.listen_unix(path)
   end,
   connect = function(srv, opts)
     return net.connect_unix((srv:getsockname()), opts)
   end},
}

-- A server task that accepts one connection and runs handler(conn).
-- A port on 127.0.0.1 that nothing listens on now (one a listener had).
-- Call from a task.
local function closed_port()
  local srv = assert(net.listen("127.0.0.1", 0))
  local _, port = srv:getsockname()
  srv:close()
  return port
end

-- Connects to port on 127.0.0.1 (at most n times, timeout t each) until a
-- connect fails, as one does once a listener that never accepts has a
-- full backlog: the connections made, and that failure's message.
local function fill_backlog(port, n, t)
  local held = {}
  for _ = 1, n do
    local c, msg = net.connect("127.0.0.1", port, {timeout = t})
    if not c then return held, msg end
    held[#held + 1] = c
  end
  return held, nil
end

local function serve_one(srv, handler)
  return ums.spawn(function()
    local c = assert(srv:accept(10))
    local r = table.pack(handler(c))
    c:close()
    return table.unpack(r, 1, r.n)
  end)
end

-- A TCP connection whose peer never reads, with a small send buffer, so
-- that sends soon block: returns the connection and a function that lets
-- the peer end and closes both sides. Call from a task.
-- Sleeps until task t waits on its socket: inside a method, holding its
-- side of the connection (a task between two methods, e.g. yielding at
-- its quantum, holds none).
local function until_net_wait(t)
  for _ = 1, 1000 do
    for _, row in ipairs(ums.tasks()) do
      if row.id == t:id() and row.wait_type == "network" then return end
    end
    ums.sleep(0.005)
  end
  error("the task never waited on its socket")
end

local function unread_peer()
  local srv = assert(net.listen("127.0.0.1", 0))
  local stop = ums.channel()
  local t = serve_one(srv, function() stop:recv() end)
  local c = assert(kinds[1].connect(srv))
  c:setoption("sndbuf", 4096)
  return c, function()
    stop:send(true)
    results(t)
    c:close()
    srv:close()
  end
end

describe("ums.net backend", function()
  it("is the one UMS_NET_EXPECT_BACKEND names (if set)", function()
    local said
    run(function() said = ums.io_backend() end)
    local want = os.getenv("UMS_NET_EXPECT_BACKEND")
    if want then assert.equal(want, said) end
    if os.getenv("UMS_IO") == "pool" then assert.equal("pool", said) end
  end)
end)

describe("ums.net streams", function()
  for _, kind in ipairs(kinds) do
    describe("on " .. kind.name, function()
      it("echo, lines and 'a' to the end of the stream", function()
        run(function()
          local srv = assert(kind.listen())
          local t = serve_one(srv, function(c)
            local n = 0
            for line in c:lines("L") do
              c:write(line:upper())
              n = n + 1
            end
            return n
          end)
          local c = assert(kind.connect(srv))
          assert.equal(c, c:write("hello\n", "wor", "ld\n", 42, "\n"))
          assert.equal("HELLO", c:read("l"))
          assert.equal("WORLD\n", c:read("L"))
          assert.equal(42, c:read("n"))
          assert.is_true(c:shutdown("w"))
          assert.equal("\n", c:read("a"))
          -- at the end of the stream, as io: nil for "l", "" for "a"
          assert.is_nil(c:read("l"))
          assert.equal("", c:read("a"))
          assert.is_nil(c:recv())
          assert.equal(3, results(t))
          assert.is_true(c:close())
          assert.equal("ums.net.conn (closed)", tostring(c))
          srv:close()
        end)
      end)

      it("counts, raw send/recv and a big transfer", function()
        run(function()
          local big = ("0123456789abcdef"):rep(1 << 16)  -- 1 MiB
          local srv = assert(kind.listen())
          local t = serve_one(srv, function(c)
            local got = assert(c:read(#big))
            -- all read before the close: unread data would make it a
            -- reset, which may discard what is still on its way
            assert.equal("yz", c:read(2))
            assert.equal(#big, c:send(got))
            return #got
          end)
          local c = assert(kind.connect(srv))
          assert.equal(#big, c:send(big))
          assert.equal(2, c:send("xyz", 2, -1))
          local got = assert(c:read(#big))
          assert.is_true(got == big, "the data came back changed")
          assert.equal(#big, results(t))
          c:close()
          srv:close()
        end)
      end)
    end)
  end

  it("tells the end of the stream, a reset and a timeout apart", function()
    run(function()
      local srv = assert(net.listen("127.0.0.1", 0))
      -- end of stream: a clean close
      local t = serve_one(srv, function(c) c:write("last") end)
      local c = assert(kinds[1].connect(srv))
      assert.equal("last", c:read("L"))  -- no "\n": the stream ended
      local r = table.pack(c:read("l"))
      assert.equal(1, r.n)
      assert.is_nil(r[1])
      results(t)
      c:close()
      -- reset: the peer closes with linger 0
      t = ums.spawn(function()
        local s = assert(srv:accept(10))
        assert.is_true(s:setoption("linger", 0))
        assert.equal(0, s:getoption("linger"))
        assert.equal("ping", s:read("l"))
        s:close()
      end)
      c = assert(kinds[1].connect(srv))
      c:write("ping\n")
      results(t)
      local v, msg, code = c:read("l")
      assert.is_nil(v)
      assert.equal("connection reset by peer", msg)
      assert.equal(net.errno.ECONNRESET, code)
      c:close()
      -- timeout
      t = ums.spawn(function()
        local s = assert(srv:accept(10))
        s:read("a")
        s:close()
      end)
      c = assert(kinds[1].connect(srv, {io_timeout = 0.05}))
      assert.equal(0.05, c:gettimeout())
      v, msg, code = c:read("l")
      assert.is_nil(v)
      assert.equal("timeout", msg)
      assert.equal(net.errno.ETIMEDOUT, code)
      c:close()
      results(t)
      srv:close()
    end)
  end)

  it("keeps data received before a timeout for the next read", function()
    run(function()
      local srv = assert(net.listen("127.0.0.1", 0))
      local go = ums.channel()
      local t = serve_one(srv, function(c)
        c:write("abc")
        go:recv()
        c:write("def\nrest")
        go:recv()
        c:write("more")
        return true
      end)
      local c = assert(kinds[1].connect(srv))
      c:settimeout(0.05)
      local v, msg = c:read("l")
      assert.is_nil(v)
      assert.equal("timeout", msg)
      v, msg = c:read("l")
      assert.equal("timeout", msg)
      go:send(true)
      c:settimeout(nil)
      assert.equal("abcdef", c:read("l"))
      -- drain takes the buffer without waiting
      ums.sleep(0.05)
      c:settimeout(0.05)
      v, msg = c:read(100)
      assert.is_nil(v)
      assert.equal("timeout", msg)
      assert.equal("rest", c:drain())
      assert.equal("", c:drain())
      go:send(true)
      c:settimeout(nil)
      assert.equal("more", c:read("a"))
      results(t)
      c:close()
      srv:close()
    end)
  end)

  it("keeps what came of a count past the read buffer on a timeout",
    function()
    run(function()
      local srv = assert(net.listen("127.0.0.1", 0))
      local go = ums.channel()
      local N = 300000
      local t = serve_one(srv, function(c)
        c:write(string.rep("a", N))
        go:recv()
        c:write(string.rep("b", N))
        return true
      end)
      local c = assert(kinds[1].connect(srv))
      c:settimeout(0.2)
      -- Read straight into the result (no bytes buffered, a count past
      -- the buffer): a short count would mean the end of the stream.
      local v, msg, code = c:read(2 * N)
      assert.is_nil(v and #v)
      assert.equal("timeout", msg)
      assert.equal(net.errno.ETIMEDOUT, code)
      go:send(true)
      c:settimeout(nil)
      local all = assert(c:read(2 * N))
      assert.equal(2 * N, #all)
      assert.is_true(all == string.rep("a", N) .. string.rep("b", N))
      results(t)
      assert.is_nil(c:read(1))
      c:close()
      srv:close()
    end)
  end)

  it("half-closes: shutdown('w'), then the reply", function()
    run(function()
      local srv = assert(net.listen("127.0.0.1", 0))
      local t = serve_one(srv, function(c)
        local all = c:read("a")
        c:write("got " .. #all)
      end)
      local c = assert(kinds[1].connect(srv))
      c:setvbuf("full")
      c:write(("x"):rep(1000))
      assert.is_true(c:shutdown("w"))  -- flushes first
      assert.equal("got 1000", c:read("a"))
      results(t)
      c:close()
      srv:close()
    end)
  end)

  it("lets many tasks share a connection, whole writes in order", function()
    run(function()
      local srv = assert(net.listen("127.0.0.1", 0))
      local t = serve_one(srv, function(c)
        local seen = {}
        for line in c:lines() do seen[#seen + 1] = line end
        return seen
      end)
      local c = assert(kinds[1].connect(srv))
      local writers = {}
      for w = 1, 10 do
        writers[w] = ums.spawn(function()
          for i = 1, 50 do
            assert(c:write(("w%d-%d-"):format(w, i), ("z"):rep(100), "\n"))
            if i % 7 == 0 then ums.yield() end
          end
        end)
      end
      for _, w in ipairs(writers) do results(w) end
      c:shutdown("w")
      local seen = results(t)
      assert.equal(500, #seen)
      local last = {}
      for _, line in ipairs(seen) do
        local w, i, z = line:match("^w(%d+)%-(%d+)%-(z*)$")
        assert.is_truthy(w, line)
        assert.equal(100, #z)
        w, i = tonumber(w), tonumber(i)
        assert.equal((last[w] or 0) + 1, i)
        last[w] = i
      end
      c:close()
      srv:close()
    end)
  end)

  it("a peer that stops reading blocks only its task; send times out",
     function()
    run(function()
      local c, finish = unread_peer()
      local ticks = 0
      local ticker = ums.spawn(function()
        for _ = 1, 5 do
          ums.sleep(0.01)
          ticks = ticks + 1
        end
      end)
      c:settimeout(0.3)
      local chunk = ("y"):rep(65536)
      local total, v, msg, code, sent = 0, nil, nil, nil, nil
      repeat
        v, msg, code, sent = c:send(chunk)
        total = total + (v or sent or 0)
      until not v
      assert.equal("timeout", msg)
      assert.equal(net.errno.ETIMEDOUT, code)
      assert.is_true(sent < #chunk)
      assert.is_true(total > 0)
      results(ticker)
      assert.equal(5, ticks)
      finish()
    end)
  end)

  it("never raises SIGPIPE: writes to a gone peer fail", function()
    run(function()
      local srv = assert(net.listen("127.0.0.1", 0))
      local t = serve_one(srv, function() end)
      local c = assert(kinds[1].connect(srv))
      results(t)
      local v, msg, code
      for _ = 1, 50 do
        v, msg, code = c:write(("p"):rep(1000))
        if not v then break end
        ums.sleep(0.005)
      end
      assert.is_nil(v)
      assert.is_truthy(code == net.errno.EPIPE or
                       code == net.errno.ECONNRESET, msg)
      c:close()
      srv:close()
    end)
  end)
end)

describe("ums.net timeouts and cancellation", function()
  it("accept times out and can be cancelled", function()
    run(function()
      local srv = assert(net.listen("127.0.0.1", 0))
      local v, msg, code = srv:accept(0.05)
      assert.is_nil(v)
      assert.equal("timeout", msg)
      assert.equal(net.errno.ETIMEDOUT, code)
      local t = ums.spawn(function() return srv:accept() end)
      ums.sleep(0.02)
      t:cancel()
      assert.is_false((t:join(5)))
      -- the listener still works
      local t2 = serve_one(srv, function(c) return c:read("l") end)
      local c = assert(kinds[1].connect(srv))
      c:write("still\n")
      assert.equal("still", results(t2))
      c:close()
      srv:close()
    end)
  end)

  it("recv and read time out and can be cancelled", function()
    run(function()
      local srv = assert(net.listen("127.0.0.1", 0))
      local stop = ums.channel()
      local t = serve_one(srv, function(c)
        stop:recv()
        c:write("late\n")
        stop:recv()
      end)
      local c = assert(kinds[1].connect(srv))
      c:settimeout(0.05)
      local v, msg = c:recv()
      assert.is_nil(v)
      assert.equal("timeout", msg)
      c:settimeout(nil)
      local r = ums.spawn(function() return c:read("l") end)
      ums.sleep(0.02)
      r:cancel()
      assert.is_false((r:join(5)))
      stop:send(true)
      assert.equal("late", c:read("l"))
      stop:send(true)
      results(t)
      c:close()
      srv:close()
    end)
  end)

  it("a send to a peer that never reads can be cancelled", function()
    run(function()
      local c, finish = unread_peer()
      local sent = 0
      local s = ums.spawn(function()
        local chunk = ("q"):rep(4096)
        while true do sent = sent + assert(c:send(chunk)) end
      end)
      until_net_wait(s)
      s:cancel()
      assert.is_false((s:join(5)))
      assert.is_true(sent > 0)
      finish()
    end)
  end)

  it("a method waiting for another's to end keeps the timeout", function()
    run(function()
      local srv = assert(net.listen("127.0.0.1", 0))
      local stop = ums.channel()
      local t = serve_one(srv, function(c)
        stop:recv()
        c:write("late\n")
        stop:recv()
      end)
      local c = assert(kinds[1].connect(srv))
      -- A reader without timeout holds the read side.
      local r = ums.spawn(function() return c:read("l") end)
      ums.sleep(0.02)
      c:settimeout(0.05)
      local v, msg, code = c:recv()
      assert.is_nil(v)
      assert.equal("timeout", msg)
      assert.equal(net.errno.ETIMEDOUT, code)
      v, msg = c:read(1)
      assert.is_nil(v)
      assert.equal("timeout", msg)
      -- The waiting readers touched nothing: the first gets its line.
      stop:send(true)
      assert.equal("late", results(r))
      stop:send(true)
      results(t)
      c:close()
      srv:close()
    end)
  end)

  it("a send waiting behind a blocked send times out", function()
    run(function()
      local c, finish = unread_peer()
      -- One send larger than the peer's buffers ever take: it holds the
      -- write side until it is cancelled. (A loop of smaller sends would
      -- give the side back between two of them, where a task past its
      -- quantum yields: the send below could then go first.)
      local chunk = ("q"):rep(16 << 20)
      local s = ums.spawn(function() assert(c:send(chunk)) end)
      until_net_wait(s)
      c:settimeout(0.05)
      local v, msg, code, sent = c:send("x")
      assert.is_nil(v)
      assert.equal("timeout", msg)
      assert.equal(net.errno.ETIMEDOUT, code)
      assert.equal(0, sent)
      v, msg, code, sent = c:write("x")
      assert.is_nil(v)
      assert.equal("timeout", msg)
      assert.equal(0, sent)
      s:cancel()
      assert.is_false((s:join(5)))
      finish()
    end)
  end)

  it("connect times out, and can be cancelled, on a full backlog", function()
    run(function()
      -- A listener that never accepts, with the smallest backlog: once
      -- it is full the kernel drops new SYNs and connects wait.
      local srv = assert(net.listen("127.0.0.1", 0, {backlog = 0}))
      local _, port = srv:getsockname()
      local held, timed_out = fill_backlog(port, 20, 0.2)
      assert.equal("timeout", timed_out)
      local t = ums.spawn(function()
        return net.connect("127.0.0.1", port)
      end)
      ums.sleep(0.05)
      t:cancel()
      assert.is_false((t:join(5)))
      for _, c in ipairs(held) do c:close() end
      srv:close()
    end)
  end)

  it("connect is refused, and tries every address", function()
    run(function()
      local v, msg, code = net.connect("127.0.0.1", closed_port())
      assert.is_nil(v)
      assert.equal("connection refused", msg)
      assert.equal(net.errno.ECONNREFUSED, code)
    end)
  end)
end)

describe("ums.net connect without waiting (wait = false)", function()
  it("hands the connection over; its reads and writes wait for it",
     function()
    run(function()
      local srv = assert(net.listen("127.0.0.1", 0))
      local _, port = srv:getsockname()
      local c, pending = net.connect("127.0.0.1", port, {wait = false})
      assert.is_true(c ~= nil)
      -- TCP's connect(2) never ends at once on a non-blocking socket.
      assert.is_true(pending)
      assert(c:write("hello\n"))
      local a = assert(srv:accept(5))
      assert.equal("hello", a:read("l"))
      assert(a:write("back\n"))
      assert.equal("back", c:read("l"))
      a:close()
      c:close()
      srv:close()
    end)
  end)

  it("a refused connection fails its first read with the refusal",
     function()
    run(function()
      local c = assert(net.connect("127.0.0.1", closed_port(),
                                   {wait = false}))
      local v, msg, code = c:read("l")
      assert.is_nil(v)
      assert.equal("connection refused", msg)
      assert.equal(net.errno.ECONNREFUSED, code)
      c:close()
    end)
  end)

  it("a Unix connection is made at once", function()
    run(function()
      local path = unix_path("w")
      os.remove(path)
      local srv = assert(net.listen_unix(path))
      local c, pending = net.connect_unix(path, {wait = false})
      assert.is_false(pending)
      assert(c:write("x"))
      local a = assert(srv:accept(5))
      assert.equal("x", a:read(1))
      a:close(); c:close(); srv:close()
      os.remove(path)
    end)
  end)

  it("server:setbacklog changes the queue of connections not accepted",
     function()
    run(function()
      local srv = assert(net.listen("127.0.0.1", 0))
      local _, port = srv:getsockname()
      assert.is_true(srv:setbacklog(0))
      -- One connection fits a backlog of 0; the next one waits.
      local held, timed_out = fill_backlog(port, 5, 0.1)
      assert.equal("timeout", timed_out)
      assert.is_true(#held <= 2)
      for _, c in ipairs(held) do c:close() end
      assert.has_error(function() srv:setbacklog(-1) end,
        "bad argument #1 to 'setbacklog' (backlog must be a non-negative " ..
        "integer)")
      srv:close()
      assert.has_error(function() srv:setbacklog(1) end,
        "attempt to use a closed server")
    end)
  end)
end)

-- Descriptors open in this process (the listing's own included, the
-- same each time).
local function fd_count()
  collectgarbage()
  collectgarbage()
  local n = 0
  for _ in ums.fs.dir("/proc/self/fd") do n = n + 1 end
  return n
end

-- A connected pair on 127.0.0.1: the client, the server's side, and the
-- listener. Call from a task.
local function pair()
  local srv = assert(net.listen("127.0.0.1", 0))
  local t = ums.spawn(function() return assert(srv:accept(10)) end)
  local c = assert(kinds[1].connect(srv))
  return c, results(t), srv
end

-- The failure a method ended by another task's close returns.
local function assert_closed(v, msg, code)
  assert.is_nil(v)
  assert.equal("closed", msg)
  assert.equal(net.errno.EBADF, code)
end

describe("ums.net full duplex", function()
  it("a writer does not wait for a reader blocked without timeout",
     function()
    run(function()
      local c, peer, srv = pair()
      -- The peer echoes every line.
      local echo = ums.spawn(function()
        for line in peer:lines("L") do assert(peer:write(line)) end
        peer:close()
      end)
      local reader = ums.spawn(function() return c:read("l") end)
      ums.sleep(0.02)
      local writer = ums.spawn(function()
        assert(c:write("ping\n"))
        assert(c:flush())
        assert.equal(5, c:send("sent\n"))
        return true
      end)
      assert.is_true((writer:join(5)))
      assert.equal("ping", results(reader))
      assert.equal("sent", c:read("l"))
      c:shutdown("w")
      results(echo)
      assert.is_nil(c:read("l"))
      c:close()
      srv:close()
    end)
  end)

  it("a read first sends what is buffered when no task writes", function()
    run(function()
      local c, peer, srv = pair()
      local echo = ums.spawn(function()
        assert(peer:write(peer:read("L")))
        peer:close()
      end)
      c:setvbuf("full")
      assert(c:write("buffered\n"))
      assert.equal("buffered", c:read("l"))
      results(echo)
      c:close()
      srv:close()
    end)
  end)

  it("two writers still take turns: no bytes interleaved in one call",
     function()
    run(function()
      local c, peer, srv = pair()
      c:setoption("sndbuf", 4096)
      local N = 300000
      local got = ums.spawn(function() return peer:read("a") end)
      local function writer(ch, how)
        return ums.spawn(function()
          if how == "send" then
            assert.equal(N, c:send(ch:rep(N)))
          else
            assert(c:write(ch:rep(N)))
            assert(c:flush())
          end
        end)
      end
      local a, b = writer("a", "send"), writer("b", "write")
      local r = ums.spawn(function() return c:read(1) end)
      results(a)
      results(b)
      c:shutdown("w")
      local all = results(got)
      assert.equal(2 * N, #all)
      assert.is_truthy(all == ("a"):rep(N) .. ("b"):rep(N) or
                       all == ("b"):rep(N) .. ("a"):rep(N))
      peer:close()
      assert.is_nil(results(r))
      c:close()
      srv:close()
    end)
  end)

  it("a send with a zero timeout sends what fits and makes no request",
     function()
    run(function()
      local c, peer, srv = pair()
      c:setoption("sndbuf", 4096)
      local big = ("z"):rep(4 * 1024 * 1024)
      c:settimeout(0)
      local function requests()
        local n = 0
        for _, row in ipairs(ums.stats()) do
          n = n + (row.io_requests or 0)
        end
        return n
      end
      -- The first calls fill the socket; the next ones find it full.
      local total, went = 0, 0
      local before = requests()
      for _ = 1, 20 do
        local v, msg, code, sent = c:send(big)
        assert.is_nil(v)
        assert.equal("timeout", msg)
        assert.equal(net.errno.ETIMEDOUT, code)
        total = total + sent
        if sent > 0 then went = went + 1 end
      end
      -- Only the sends that went out count as requests: none waited.
      assert.is_true(went > 0 and went < 20)
      assert.is_true(requests() - before <= went)
      c:settimeout(nil)
      c:shutdown("w")
      assert.equal(total, #peer:read("a"))
      peer:close()
      c:close()
      srv:close()
    end)
  end)

  it("recv returns at most max bytes and keeps the rest", function()
    run(function()
      local c, peer, srv = pair()
      assert.equal(8, peer:send("abcdefgh"))
      assert.equal("abc", c:recv(3))
      -- the rest, short, in a 4 KiB buffer (ums_net_recv_take)
      assert.equal(4096, (require "ums.core").stream_buffers(c))
      assert.equal("de", c:recv(2))
      assert.equal("fgh", c:recv())
      peer:close()
      assert.is_nil(c:recv())
      c:close()
      srv:close()
    end)
  end)

  it("small sends that wait deliver every byte they count, in order",
     function()
    run(function()
      local c, peer, srv = pair()
      c:setoption("sndbuf", 4096)
      -- Sends of a few bytes to a few KiB, more than the socket's buffers
      -- hold while the peer is not reading: many of them wait, some
      -- after a part went out.
      local parts = {}
      for i = 1, 1500 do
        parts[i] = string.format("<%d:", i) .. ("x"):rep(i * 7 % 3000) .. ">"
      end
      local want = table.concat(parts)
      local got = ums.spawn(function()
        ums.sleep(0.05)
        return peer:read("a")
      end)
      local total = 0
      for i = 1, #parts do
        -- every third one through a range, the rest whole
        if i % 3 == 0 then
          local p = "--" .. parts[i] .. "--"
          total = total + assert(c:send(p, 3, -3))
        else
          total = total + assert(c:send(parts[i]))
        end
      end
      c:shutdown("w")
      assert.equal(#want, total)
      assert.is_true(results(got) == want, "the peer got other bytes")
      peer:close()
      c:close()
      srv:close()
    end)
  end)

  it("small sends that time out count exactly the bytes the peer gets",
     function()
    run(function()
      local c, peer, srv = pair()
      c:setoption("sndbuf", 4096)
      c:settimeout(0.05)
      local sent, i, v, msg, part = {}, 0, nil, nil, nil
      repeat
        i = i + 1
        part = string.format("<%d:", i) .. ("y"):rep(i * 13 % 2000) .. ">"
        local n, m, _, k = c:send(part)
        v, msg = n, m
        sent[#sent + 1] = part:sub(1, n or k)
      until not v
      assert.equal("timeout", msg)
      c:shutdown("w")
      local all = assert(peer:read("a"))
      assert.is_true(all == table.concat(sent),
                     "the bytes counted are not the bytes the peer got")
      peer:close()
      c:close()
      srv:close()
    end)
  end)
end)

-- What a connection keeps while it waits: no read buffer (core.stream_buffers
-- says how many bytes of buffer a stream holds), whatever read it waits in,
-- and no byte lost for it.
describe("ums.net idle connections", function()
  local core = require "ums.core"
  local function rbuf(c) return (core.stream_buffers(c)) end

  it("a receive that waits holds no read buffer, after traffic too",
     function()
    run(function()
      local c, peer, srv = pair()
      for _ = 1, 3 do
        assert.equal(4, peer:send("ping"))
        assert.equal("ping", c:recv())
        assert.equal(0, rbuf(c))
        local t = ums.spawn(function() return c:recv() end)
        until_net_wait(t)
        assert.equal(0, rbuf(c))
        assert.equal(4, peer:send("pong"))
        assert.equal("pong", results(t))
        assert.equal(0, rbuf(c))
      end
      -- A line read waiting for the rest of its line, and recv(n) after
      -- a short read, hold none either.
      local t = ums.spawn(function() return c:read("l") end)
      peer:send("ab")
      until_net_wait(t)
      ums.sleep(0.01)
      assert.equal(0, rbuf(c))
      peer:send("c\nrest")
      assert.equal("abc", results(t))
      assert.is_true(rbuf(c) > 0)  -- "rest" waits in it, unread
      assert.equal("re", c:recv(2))
      assert.equal("st", c:recv(2))
      assert.equal(0, rbuf(c))
      t = ums.spawn(function() return c:recv(5) end)
      until_net_wait(t)
      assert.equal(0, rbuf(c))
      peer:send("123456789")
      assert.equal("12345", results(t))
      assert.equal("6789", c:recv())
      assert.equal(0, rbuf(c))
      peer:close()
      assert.is_nil(c:recv())
      assert.equal(0, rbuf(c))
      c:close()
      srv:close()
    end)
  end)

  it("a receive that times out keeps no buffer and loses nothing",
     function()
    run(function()
      local c, peer, srv = pair()
      c:settimeout(0.02)
      for _ = 1, 3 do
        local v, msg = c:recv()
        assert.is_nil(v)
        assert.equal("timeout", msg)
        assert.equal(0, rbuf(c))
      end
      peer:send("x1")
      c:settimeout(nil)
      assert.equal("x1", c:recv())
      -- A line cut by the timeout: its start comes back with the rest.
      c:settimeout(0.02)
      peer:send("par")
      local v, msg = c:read("l")
      assert.is_nil(v)
      assert.equal("timeout", msg)
      assert.is_true(rbuf(c) > 0)
      c:settimeout(nil)
      peer:send("tial\n")
      assert.equal("partial", c:read("l"))
      assert.equal(0, rbuf(c))
      c:close()
      peer:close()
      srv:close()
    end)
  end)

  it("200 connections waiting after an echo each hold no buffer",
     function()
    run(function()
      local srv = assert(net.listen("127.0.0.1", 0))
      local _, port = srv:getsockname()
      local conns, servers, clients = {}, {}, {}
      local acceptor = ums.spawn(function()
        for i = 1, 200 do
          local c = assert(srv:accept(10))
          conns[i] = c
          servers[i] = ums.spawn(function()
            while true do
              local data = c:recv()
              if not data or not c:send(data) then break end
            end
            c:close()
          end)
        end
      end)
      for i = 1, 200 do
        local c = assert(net.connect("127.0.0.1", port))
        assert(c:send("hello " .. i))
        assert.equal("hello " .. i, c:recv())
        clients[i] = c
      end
      results(acceptor)
      for _, t in ipairs(servers) do until_net_wait(t) end
      local held = 0
      for i = 1, 200 do
        held = held + rbuf(conns[i]) + rbuf(clients[i])
      end
      assert.equal(0, held)
      for i = 1, 200 do clients[i]:close() end
      for _, t in ipairs(servers) do results(t) end
      srv:close()
    end, 60)
  end)
end)

describe("ums.net receives around the smallest buffer (4 KiB)", function()
  local core = require "ums.core"
  local function rbuf(c) return (core.stream_buffers(c)) end
  -- n bytes that tell where each of them was
  local function data(n, seed)
    local t = {}
    for i = 1, n do t[i] = string.char((seed + i * 7) % 256) end
    return table.concat(t)
  end

  it("recv() returns what is there, up to 64 KiB, in order", function()
    run(function()
      local c, peer, srv = pair()
      for i, n in ipairs{1, 4095, 4096, 4097, 10000, 65536, 70000} do
        local want = data(n, i)
        assert.equal(n, peer:send(want))
        ums.sleep(0.01)
        -- Up to 10,000 bytes are all there: one recv() takes them all.
        -- More come in segments the kernel may not have queued yet, but
        -- one recv() takes more than 4 KiB of them.
        local first = assert(c:recv())
        if n <= 10000 then
          assert.equal(n, #first)
        else
          assert.is_true(#first > 4096 and #first <= 65536)
        end
        local got = {first}
        local have = #first
        while have < n do
          local more = assert(c:recv())
          got[#got + 1] = more
          have = have + #more
        end
        assert.is_true(table.concat(got) == want)
        assert.equal(0, rbuf(c))
      end
      c:close()
      peer:close()
      srv:close()
    end)
  end)

  it("lines, counts and 'a' across the boundary", function()
    run(function()
      local c, peer, srv = pair()
      local long = data(5000, 3):gsub("\n", "x")
      local t = ums.spawn(function()
        peer:send("ab\n" .. long .. "\n" .. data(4000, 5))
        ums.sleep(0.01)
        peer:send(data(3000, 6))
        ums.sleep(0.01)
        peer:send(data(200000, 7))
        peer:shutdown("w")
        return true
      end)
      assert.equal("ab", c:read("l"))
      assert.is_true(c:read("l") == long)
      assert.is_true(c:read(7000) == data(4000, 5) .. data(3000, 6))
      assert.is_true(c:read("a") == data(200000, 7))
      assert.is_true(results(t))
      c:close()
      peer:close()
      srv:close()
    end)
  end)
end)

describe("ums.net where Lua cannot yield", function()
  it("a read loses any number of races for its side in one call, and "
    .. "waits for its data many times, its C stack flat", function()
    -- A read inside table.sort's comparator (a C call Lua cannot yield
    -- across) blocks its worker instead of yielding. Each round, the
    -- side it is woken for is taken again by the task that gave it back,
    -- before it runs, so it looks again and waits again: N times within
    -- one call, on the smallest worker stack. Then its read waits for
    -- each of M bytes sent one at a time. Under TSan, where a round
    -- takes milliseconds, fewer rounds.
    local tsan = (os.getenv("LD_PRELOAD") or ""):find("libtsan", 1, true)
    local N = tsan and 100 or 10000
    local M = tsan and 20 or 500
    local prev = ums.config()
    ums.config{stack_size = ums.STACK_SIZE_MIN, quantum = 0}
    finally(function()
      ums.config{stack_size = prev.stack_size, quantum = prev.quantum}
    end)
    run(function()
      local c, peer, srv = pair()
      local reads = 0
      -- Holds the read side while each of its reads waits for its byte,
      -- and takes it again at once when one ends.
      local h = ums.spawn(function()
        for _ = 1, N do
          assert.equal("x", peer:read(1))
          reads = reads + 1
        end
      end)
      until_net_wait(h)
      local r = ums.spawn(function()
        local got
        table.sort({2, 1}, function(a, b)
          got = got or peer:read(M)
          return a < b
        end)
        return got
      end)
      for i = 1, N do
        assert.equal(1, c:send("x"))
        while reads < i do ums.yield() end
      end
      results(h)
      until_net_wait(r)
      for _ = 1, M do
        assert.equal(1, c:send("y"))
        ums.yield()
      end
      assert.equal(("y"):rep(M), results(r))
      c:close()
      peer:close()
      srv:close()
    end, 60)
  end)
end)

describe("ums.net close from another task", function()
  it("ends a blocked read, recv, send and accept with 'closed'", function()
    run(function()
      do  -- warm up: what the runtime makes once (its epoll set)
        local c, peer, srv = pair()
        local t = ums.spawn(function() return c:recv() end)
        ums.sleep(0.01)
        peer:write("x")
        peer:flush()
        results(t)
        c:close()
        peer:close()
        srv:close()
      end
      local before = fd_count()
      for _, how in ipairs({"read", "recv", "lines"}) do
        local c, peer, srv = pair()
        local t = ums.spawn(function()
          if how == "read" then return c:read("l") end
          if how == "recv" then return c:recv() end
          return pcall(function() for _ in c:lines() do end end)
        end)
        -- A second reader queued behind the first ends as well.
        local queued = ums.spawn(function() return c:read(1) end)
        ums.sleep(0.02)
        assert.is_true(c:close())
        if how == "lines" then
          local ok, err = results(t)
          assert.is_false(ok)
          assert.matches("closed", err)
        else
          assert_closed(results(t))
        end
        assert_closed(results(queued))
        assert.equal("ums.net.conn (closed)", tostring(c))
        peer:close()
        srv:close()
      end
      do
        -- A peer that never reads, and a small send buffer: sends block.
        local c, peer, srv = pair()
        c:setoption("sndbuf", 4096)
        local chunk = ("s"):rep(65536)
        local sender = ums.spawn(function()
          local total = 0
          while true do
            local n, msg, code, sent = c:send(chunk)
            if not n then return total + sent, msg, code end
            total = total + n
          end
        end)
        local writer = ums.spawn(function()
          return c:write(chunk)
        end)
        ums.sleep(0.05)
        local closer = ums.spawn(function() return c:close() end)
        assert.is_true(results(closer))
        local total, msg, code = results(sender)
        assert.is_true(total > 0)
        assert_closed(nil, msg, code)
        local v, wmsg, wcode = results(writer)
        assert_closed(v, wmsg, wcode)
        peer:close()
        srv:close()
      end
      do
        local srv = assert(net.listen("127.0.0.1", 0))
        local t = ums.spawn(function() return srv:accept() end)
        ums.sleep(0.02)
        srv:close()
        assert_closed(results(t))
      end
      assert.equal(before, fd_count())
    end)
  end)

  it("<close> of a connection a reader waits on ends the read", function()
    run(function()
      local c, peer, srv = pair()
      local t = ums.spawn(function() return c:read("a") end)
      ums.sleep(0.02)
      do
        local cc <close> = c  -- luacheck: ignore cc
      end
      assert_closed(results(t))
      peer:close()
      srv:close()
    end)
  end)

  it("a close whose task is cancelled while it waits still closes, once",
     function()
    run(function()
      do  -- warm up: what the runtime makes once (its epoll set)
        local c, peer, srv = pair()
        c:close()
        peer:close()
        srv:close()
      end
      local before = fd_count()
      -- The closer waits for the side a blocked reader holds (the close
      -- ends that read first); it is cancelled at once or after other
      -- tasks ran, before or after the reader has given the side back
      -- (or once its close is over: then the cancel changes nothing).
      local cancelled = 0
      for yields = 0, 3 do
        for _, tbc in ipairs({false, true}) do
          local c, peer, srv = pair()
          local reader = ums.spawn(function() return c:read("l") end)
          ums.sleep(0.01)
          local closer = ums.spawn(function()
            if not tbc then return c:close() end
            local cc <close> = c  -- luacheck: ignore cc
          end)
          for _ = 0, yields do ums.yield() end
          closer:cancel()
          if not closer:join(5) then cancelled = cancelled + 1 end
          assert_closed(results(reader))
          -- The descriptor is closed, by the close that was cancelled.
          assert.equal("ums.net.conn (closed)", tostring(c))
          assert.has_error(function() c:close() end,
                           "attempt to use a closed connection")
          peer:close()
          srv:close()
        end
      end
      assert.is_true(cancelled > 0)
      assert.equal(before, fd_count())
    end)
  end)

  it("a read and a write racing a close, 100 times", function()
    run(function()
      local before
      for i = 1, 100 do
        local c, peer, srv = pair()
        -- A method called once the close is over raises, as on any
        -- closed connection; one that was waiting ends with "closed".
        local function closed_or(f)
          return function()
            local r = table.pack(pcall(f))
            if r[1] then return table.unpack(r, 2, r.n) end
            assert.matches("attempt to use a closed connection", r[2])
            return nil, "closed", net.errno.EBADF
          end
        end
        local r = ums.spawn(closed_or(function() return c:read("l") end))
        local w = ums.spawn(closed_or(function()
          local v, msg, code = c:write(("w"):rep(1000), "\n")
          if v then v, msg, code = c:flush() end
          return v, msg, code
        end))
        local p = ums.spawn(function()
          -- The peer answers some of the time, before or after the close.
          if i % 3 == 0 then peer:send("line\n") end
          return true
        end)
        for _ = 1, i % 4 do ums.yield() end
        assert.is_true(c:close())
        local v, msg, code = results(r)
        if v ~= "line" then assert_closed(v, msg, code) end
        v, msg, code = results(w)
        if not v then assert_closed(v, msg, code) end
        results(p)
        peer:close()
        srv:close()
        if i == 1 then before = fd_count() end
      end
      assert.equal(before, fd_count())
    end)
  end)
end)

describe("ums.net.resolve", function()
  it("answers numeric hosts and /etc/hosts names", function()
    run(function()
      local r = assert(net.resolve("127.0.0.1", 80))
      assert.same({family = "inet", addr = "127.0.0.1", port = 80,
                   socktype = "stream"}, r[1])
      r = assert(net.resolve("::1", "8080", {socktype = "dgram"}))
      assert.same({family = "inet6", addr = "::1", port = 8080,
                   socktype = "dgram"}, r[1])
      r = assert(net.resolve("localhost", 1))
      assert.is_true(#r >= 1)
      for _, a in ipairs(r) do
        assert.is_truthy(a.addr == "127.0.0.1" or a.addr == "::1")
      end
      r = assert(net.resolve(nil, 99, {passive = true, family = "inet"}))
      assert.equal("0.0.0.0", r[1].addr)
      local v, msg = net.resolve("127.0.0.1", 80, {family = "inet6"})
      assert.is_nil(v)
      assert.is_string(msg)
    end)
  end)

  it("a name it must look up fails or times out, never hangs", function()
    run(function()
      local v, msg = net.resolve("no-such-host.invalid", 80,
                                 {timeout = 2})
      assert.is_nil(v)
      assert.is_string(msg)
    end)
  end)
end)

describe("ums.net datagrams", function()
  for _, fam in ipairs({{"inet", "127.0.0.1"}, {"inet6", "::1"}}) do
    it("sendto/recvfrom on " .. fam[2], function()
      run(function()
        local a = assert(net.udp({family = fam[1]}))
        local b = assert(net.udp({family = fam[1]}))
        assert.is_true(a:bind(fam[2], 0))
        local _, aport = a:getsockname()
        local t = ums.spawn(function()
          local data, host, port = a:recvfrom()
          assert.equal(fam[2], host)
          assert.equal(5, a:sendto(data:upper(), host, port))
          return data
        end)
        assert.equal(5, b:sendto("hello", fam[2], aport))
        local data, host, port = b:recvfrom(100)
        assert.equal("HELLO", data)
        assert.equal(fam[2], host)
        assert.equal(aport, port)
        assert.equal("hello", results(t))
        -- connected, with a timeout
        assert.is_true(b:connect(fam[2], aport))
        assert.equal(2, b:send("hi"))
        assert.equal("hi", a:recv())
        b:settimeout(0.05)
        local v, msg = b:recv()
        assert.is_nil(v)
        assert.equal("timeout", msg)
        -- disconnected: no peer, any address again
        assert.is_true(b:disconnect())
        assert.is_nil(b:getpeername())
        local c = assert(net.udp({family = fam[1]}))
        assert.is_true(c:bind(fam[2], 0))
        local _, cport = c:getsockname()
        assert.equal(3, b:sendto("new", fam[2], cport))
        assert.equal("new", c:recv())
        c:close()
        a:close()
        b:close()
      end)
    end)
  end

  it("Unix datagram sockets", function()
    run(function()
      local pa, pb = unix_path("da"), unix_path("db")
      os.remove(pa)
      os.remove(pb)
      local a = assert(net.udp_unix(pa))
      local b = assert(net.udp_unix(pb))
      assert.equal(4, b:sendto("ping", pa))
      local data, from = a:recvfrom()
      assert.equal("ping", data)
      assert.equal(pb, from)
      a:close()
      b:close()
      os.remove(pa)
      os.remove(pb)
    end)
  end)
end)

describe("ums.net arguments", function()
  it("raises for bad arguments with Lua's wording", function()
    run(function()
      assert.has_error(function() net.connect() end,
        "bad argument #1 to 'connect' (string expected, got no value)")
      assert.has_error(function() net.connect("127.0.0.1", 70000) end,
        "bad argument #2 to 'connect' (port out of range)")
      assert.has_error(function() net.listen("127.0.0.1", 0, 5) end,
        "bad argument #3 to 'listen' (table expected, got number)")
      assert.has_error(function()
        net.connect("127.0.0.1", 1, {timeout = "x"})
      end, "bad argument #3 to 'connect' (timeout must be a number of "
           .. "seconds)")
      -- A misspelt option raises, naming it and the options there are.
      assert.has_error(function()
        net.listen("127.0.0.1", 0, {reuse_port = true})
      end, "bad argument #3 to 'listen' (unknown option 'reuse_port' "
           .. "(options: backlog, reuseaddr, reuseport, family))")
      assert.has_error(function()
        net.connect("127.0.0.1", 1, {timout = 1})
      end, "bad argument #3 to 'connect' (unknown option 'timout' "
           .. "(options: timeout, family, nodelay, io_timeout, wait))")
      assert.has_error(function() net.udp({[1] = "inet"}) end,
        "bad argument #1 to 'udp' (option names must be strings "
        .. "(options: family, timeout))")
      assert.has_error(function() net.resolve("localhost", 80, {ttl = 1}) end,
        "bad argument #3 to 'resolve' (unknown option 'ttl' (options: "
        .. "family, socktype, passive, timeout))")
      assert.has_error(function()
        net.connect_unix("/nonexistent", {backlog = 1})
      end, "bad argument #2 to 'connect_unix' (unknown option 'backlog' "
           .. "(options: timeout, io_timeout, wait))")
      assert.has_error(function()
        net.listen_unix("/nonexistent", {timeout = 1})
      end, "bad argument #2 to 'listen_unix' (unknown option 'timeout' "
           .. "(options: backlog))")
      -- Called through pcall (no name at the call site), the error names
      -- the function by its module.
      local ok, err = pcall(net.connect, "127.0.0.1", 70000)
      assert.is_false(ok)
      assert.equal("bad argument #2 to 'ums.net.connect' (port out of range)",
                   err)
      ok, err = pcall(ums.fs.open, "x", "bogus")
      assert.is_false(ok)
      assert.matches("^bad argument #2 to 'ums.fs.open'", err)
      local srv = assert(net.listen("127.0.0.1", 0))
      local t = serve_one(srv, function(c) c:read("a") end)
      local c = assert(kinds[1].connect(srv))
      assert.has_error(function() c:read("x") end,
        "bad argument #1 to 'read' (invalid format)")
      assert.has_error(function() c:setoption("bogus", 1) end,
        "bad argument #1 to 'setoption' (invalid option 'bogus')")
      assert.has_error(function() c:shutdown("x") end,
        "bad argument #1 to 'shutdown' (invalid option 'x')")
      assert.has_error(function() c:recv(0) end,
        "bad argument #1 to 'recv' (size must be positive)")
      c:close()
      assert.has_error(function() c:read() end,
        "attempt to use a closed connection")
      results(t)
      srv:close()
      assert.has_error(function() srv:accept() end,
        "attempt to use a closed server")
    end)
  end)

  it("waits only inside a task", function()
    assert.has_error(function() net.connect("127.0.0.1", 1) end,
      "ums.net.connect: not inside a task (call it from a function run "
      .. "by ums.run or ums.spawn)")
    local srv = assert(net.listen("127.0.0.1", 0))
    assert.has_error(function() srv:accept() end,
      "ums.net.accept: not inside a task (call it from a function run "
      .. "by ums.run or ums.spawn)")
    srv:close()
  end)

  it("is require 'ums.net' too", function()
    assert.equal(net, require "ums.net")
  end)
end)
