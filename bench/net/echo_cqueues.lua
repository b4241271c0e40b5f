-- The cqueues peer of the echo benchmark (Debian's lua-cqueues): a
-- coroutine per connection on one controller.
--   lua5.4 bench/net/echo_cqueues.lua PORT
local cqueues = require "cqueues"
local socket = require "cqueues.socket"
local signal = require "cqueues.signal"

local port = assert(tonumber(arg[1]), "usage: echo_cqueues.lua PORT")
local cq = cqueues.new()
local server = assert(socket.listen{host = "127.0.0.1", port = port,
                                    reuseaddr = true})
cq:wrap(function()
  for c in server:clients() do
    cq:wrap(function()
      -- Raw bytes, no buffering of writes: each read returns what is
      -- there (a negative count: "up to"), written back at once.
      c:setmode("bn", "bn")
      while true do
        local data = c:read(-4096)
        if not data then break end
        c:write(data)
        c:flush()
      end
      c:close()
    end)
  end
end)
signal.block(signal.SIGTERM, signal.SIGINT)
local sig = signal.listen(signal.SIGTERM, signal.SIGINT)
cq:wrap(function()
  sig:wait()
  os.exit(0)
end)
assert(cq:loop())
