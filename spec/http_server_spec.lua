-- examples/http_server.lua as a server in its own process: started on a
-- free port with two schedulers, asked for keep-alive requests by a small
-- client on ums.net in another process, checked, then stopped. (The
-- client is a child too, so that under TSan both get the preload the
-- interpreter cannot have here; examples_spec runs the example's own
-- self-test, where the clients are tasks of the server's run.)
local sp = require "subprocess"
local it = sp.guard(it, pending)

-- Three connections at once, five requests each on one connection (the
-- third connection writes its five in one piece: pipelined); then a POST
-- with a body and "Connection: close", answered, then end of stream.
-- Prints "ok <responses>" or raises.
local CLIENT = [[
local ums = require "ums"
local port = assert(tonumber(arg[1]))
local BODY = "Hello, World!\n"

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
  assert(status == "HTTP/1.1 200 OK\r", status)
  assert(body == BODY, body)
  assert(headers["content-type"] == "text/plain")
  return headers
end

local function connect()
  return assert(ums.net.connect("127.0.0.1", port,
                                {timeout = 10, io_timeout = 10}))
end

ums.config{schedulers = 2}
local n = ums.run(function()
  local tasks = {}
  for c = 1, 3 do
    tasks[c] = ums.spawn(function()
      local conn = connect()
      local req = "GET /" .. c .. " HTTP/1.1\r\nHost: x\r\n\r\n"
      if c == 3 then assert(conn:write(req:rep(5))) end
      for _ = 1, 5 do
        if c ~= 3 then assert(conn:write(req)) end
        assert(conn:flush())
        assert(response(conn).connection == nil, "keep-alive expected")
      end
      conn:close()
      return 5
    end)
  end
  local answered = 0
  for _, t in ipairs(tasks) do
    local ok, k = t:join()
    assert(ok, k)
    answered = answered + k
  end
  local conn = connect()
  assert(conn:write("POST /form HTTP/1.1\r\nHost: x\r\n",
                    "Content-Length: 5\r\nConnection: close\r\n\r\nhello"))
  assert(conn:flush())
  assert(response(conn).connection == "close")
  assert(conn:read("a") == "", "data after Connection: close")
  conn:close()
  return answered + 1
end)
print("ok " .. n)
]]

-- Starts the server; returns its pid and what it printed first, once it
-- names its port (10 s at most), or raises with what it printed.
local function start_server()
  local out, err = sp.temp(), sp.temp()
  local env = sp.child_preload and
              ("LD_PRELOAD=" .. sp.q(sp.child_preload) .. " ") or ""
  local p = assert(io.popen(env .. "exec " .. sp.q(sp.lua) .. " " ..
    sp.q(sp.examples .. "/http_server.lua") .. " --port 0 --schedulers 2 >" ..
    sp.q(out) .. " 2>" .. sp.q(err) .. " & echo $!"))
  local pid = assert(math.tointeger(tonumber(p:read("l"))))
  p:close()
  for _ = 1, 100 do
    local line = sp.slurp(out)
    if line:match("serving http://127%.0%.0%.1:%d+/") then return pid, line end
    os.execute("sleep 0.1")
  end
  os.execute("kill -KILL " .. pid)
  error("the server did not start:\n" .. sp.slurp(out) .. sp.slurp(err))
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
    local banner
    pid, banner = start_server()
    assert.matches("on schedulers 0, 1\n", banner)
    local port = banner:match(":(%d+)/")
    local r = sp.lua_run({sp.temp(CLIENT, ".lua"), port}, {timeout = 60})
    sp.assert_exit(r, 0)
    assert.equal("ok 16\n", r.stdout)
    -- Still serving after all that; then stopped by a signal.
    assert.is_true(os.execute("kill -0 " .. pid))
    assert.is_true(os.execute("kill -TERM " .. pid))
    pid = nil
  end)
end)
