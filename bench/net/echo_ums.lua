-- The echo server in Lua on ums.net: a task per connection, raw recv and
-- send, on one or more schedulers.
--   lua5.4 bench/net/echo_ums.lua PORT [SCHEDULERS]
-- Each scheduler runs its own listener on the port with SO_REUSEPORT and
-- keeps the connections it accepts, as examples/http_server.lua does (its
-- header says why). Serves until killed.
local ums = require "ums"

local port = assert(math.tointeger(tonumber(arg[1])),
                    "usage: echo_ums.lua PORT [SCHEDULERS]")
local nsched = math.tointeger(tonumber(arg[2] or 1))

-- One scheduler's listener; its only upvalue is _ENV (ums.submit).
local function listen_on(p)
  local ums = require "ums"  -- this VM's own: the only upvalue is _ENV
  local function serve(conn)
    while true do
      local data = conn:recv()
      if not data or not conn:send(data) then break end
    end
    conn:close()
  end
  local server = assert(ums.net.listen("127.0.0.1", p, {reuseport = true}))
  while true do
    local conn = server:accept()
    if conn then
      ums.spawn(serve, conn)
    else
      ums.sleep(0.05)  -- out of descriptors: the connection stays queued
    end
  end
end

ums.config{schedulers = nsched}
ums.run(function()
  local listeners = {ums.spawn(listen_on, port)}
  for i = 1, nsched - 1 do
    local work = ums.submit_on(i, listen_on, port)
    -- Keep scheduler 0 busy until scheduler i has taken its listener: an
    -- idle scheduler may steal work that has not started.
    while work:status() == "pending" do ums.yield() end
    assert(work:scheduler() == i, "listener stolen by another scheduler")
    listeners[#listeners + 1] = work
  end
  for _, l in ipairs(listeners) do assert(l:join()) end
end)
