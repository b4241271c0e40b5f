-- examples/http_server.lua as a server in its own process: started on a
-- free port with two schedulers, asked for a few keep-alive requests by a
-- small client on ums.net in this process, checked, then stopped.
-- (examples_spec runs its self-test, where the clients are its own tasks.)
local sp = require "subprocess"
local ums = require "ums"
local it = sp.guard(it, pending)

local BODY = "Hello, World!\n"

-- Starts the server; returns its pid and the port it printed (10 s at
-- most), or raises with what it printed.
local function start_server()
  local out, err = sp.temp(), sp.temp()
  local env = sp.child_preload and ("LD_PRELOAD=" .. sp.q(sp.child_preload) ..
                                    " ") or ""
  local p = assert(io.popen(env .. "exec " .. sp.q(sp.lua) .. " " ..
    sp.q(sp.examples .. "/http_server.lua") .. " --port 0 --schedulers 2 >" ..
    sp.q(out) .. " 2>" .. sp.q(err) .. " & echo $!"))
  local pid = assert(math.tointeger(tonumber(p:read("l"))))
  p:close()
  for _ = 1, 100 do
    local line = sp.slurp(out)
    local port = line:match("serving http://127%.0%.0%.1:(%d+)/")
    if port then return pid, tonumber(port), line end
    os.execute("sleep 0.1")
  end
  os.execute("kill -KILL " .. pid)
  error("the server did not start:\n" .. sp.slurp(out) .. sp.slurp(err))
end

-- Reads one response; returns status line, headers (lower-case names),
-- body.
local function response(conn)
  local status = assert(conn:read("l"))
  local headers = {}
  while true do
    local line = assert(conn:read("l")):gsub("\r$", "")
    if line == "" then break end
    local name, value = line:match("^([^:]+):%s*(.*)$")
    headers[name:lower()] = value
  end
  local body = assert(conn:read(tonumber(headers["content-length"])))
  return status, headers, body
end

describe("examples/http_server.lua", function()
  local pid
  after_each(function()
    if pid then os.execute("kill -KILL " .. pid .. " 2>/dev/null") end
    pid = nil
    sp.cleanup()
  end)

  it("answers keep-alive requests on every scheduler, then stops",
     function()
    local port, banner
    pid, port, banner = start_server()
    assert.matches("on schedulers 0, 1\n", banner)
    ums.run(function()
      -- Three connections at once, five requests each on the same
      -- connection, the requests of a connection written in one piece
      -- (pipelined) for the last one.
      local tasks = {}
      for c = 1, 3 do
        tasks[c] = ums.spawn(function()
          local conn = assert(ums.net.connect("127.0.0.1", port,
                                              {timeout = 10, io_timeout = 10}))
          local req = "GET /" .. c .. " HTTP/1.1\r\nHost: x\r\n\r\n"
          if c == 3 then
            assert(conn:write(req:rep(5)))
            assert(conn:flush())
          end
          for _ = 1, 5 do
            if c ~= 3 then
              assert(conn:write(req))
              assert(conn:flush())
            end
            local status, headers, body = response(conn)
            assert.equal("HTTP/1.1 200 OK\r", status)
            assert.equal("text/plain", headers["content-type"])
            assert.is_nil(headers.connection)
            assert.equal(BODY, body)
          end
          conn:close()
          return true
        end)
      end
      for _, t in ipairs(tasks) do assert.same({true, true}, {t:join()}) end
      -- A request with a body and "Connection: close": answered, then the
      -- server closes (end of stream, not a reset).
      local conn = assert(ums.net.connect("127.0.0.1", port,
                                          {timeout = 10, io_timeout = 10}))
      assert(conn:write("POST /form HTTP/1.1\r\nHost: x\r\n",
                        "Content-Length: 5\r\nConnection: close\r\n\r\nhello"))
      assert(conn:flush())
      local status, headers, body = response(conn)
      assert.equal("HTTP/1.1 200 OK\r", status)
      assert.equal("close", headers.connection)
      assert.equal(BODY, body)
      assert.equal("", conn:read("a"))
      conn:close()
    end)
    -- Still serving: a process that died would leave kill -0 failing.
    assert.is_true(os.execute("kill -0 " .. pid))
    assert.is_true(os.execute("kill -TERM " .. pid))
    pid = nil
  end)
end)
