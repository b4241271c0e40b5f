-- Limits of ums.net (docs/lua-api.md, "Sockets"): 10,000 connections at once on
-- one scheduler, the descriptor count back to its start after many
-- connections, EMFILE on accept, and the open-files limit raised at load.
-- The clients of the 10,000 and the EMFILE runs are other processes
-- (spec/net_client.lua, spec/net_emfile_child.lua): the limit here is
-- 20,000 descriptors per process. Run on both socket backends.

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local ums = dofile(here .. "helper.lua")
local sp = require "subprocess"
local net = ums.net
local it = sp.guard(it, pending)

-- Descriptors open in this process (the listing's own included, the
-- same each time).
local function fd_count()
  collectgarbage()
  collectgarbage()
  local n = 0
  for _ in ums.fs.dir("/proc/self/fd") do n = n + 1 end
  return n
end

-- The descriptor count of this process with a runtime of config cfg
-- made once already: what a run keeps between runs (its ring) is not a
-- leak of the runs measured after it.
local function fd_baseline(cfg)
  ums.config(cfg)
  ums.test(function() ums.sleep(0) end, {timeout = 10})
  return fd_count()
end

local function backends(body)
  for _, io_ in ipairs({"auto", "pool"}) do
    body(io_, {io = io_})
  end
end

local function env_prefix()
  if sp.child_preload then
    return "env LD_PRELOAD=" .. sp.q(sp.child_preload) .. " "
  end
  return ""
end

describe("ums.net limits", function()
  backends(function(io_, cfg)
    it("holds 10,000 connections at once on one scheduler (" .. io_ .. ")",
       function()
      local N = 10000
      local before = fd_baseline(cfg)
      local srv = assert(net.listen("127.0.0.1", 0, {backlog = 4096}))
      local _, port = srv:getsockname()
      local child = assert(io.popen(env_prefix() .. "UMS_IO=" .. io_ ..
        " timeout -k 5 120 " .. sp.q(sp.lua) .. " " ..
        sp.q(here .. "net_client.lua") .. " hold " .. port .. " " .. N ..
        " 2>&1", "r"))
      local open, peak, done = 0, 0, 0
      ums.test(function()
        for _ = 1, N do
          local c = assert(srv:accept(60))
          open = open + 1
          if open > peak then peak = open end
          ums.spawn(function()
            local line = c:read("l")
            c:write(line, "\n")
            assert(c:read("a") == "")  -- until the client closes
            c:close()
            open = open - 1
            done = done + 1
          end)
        end
        while done < N do ums.sleep(0.01) end
      end, {timeout = 150, gc = true})
      local out = child:read("a")
      local ok = child:close()
      assert.is_true(ok, out)
      assert.equal("echoed " .. N, out:match("echoed %d+"), out)
      assert.equal(N, peak)
      srv:close()
      assert.equal(before, fd_count())
      ums.config({io = "auto"})
    end)

    it("leaves the descriptor count where it started after many "
       .. "connect/accept/close cycles (" .. io_ .. ")", function()
      -- 100,000 cycles, or as many as 10 s allow (about a quarter of
      -- them here; fewer in sanitizer builds). The clients close with
      -- linger 0 (a reset): a normal close would leave each client port
      -- in TIME_WAIT, and the loopback's ephemeral ports would run out
      -- before 100,000.
      local TOTAL, PAIRS, BUDGET = 100000, 8, 10
      local before = fd_baseline(cfg)
      local cycles = 0
      ums.test(function()
        local srv = assert(net.listen("127.0.0.1", 0, {backlog = 1024}))
        local _, port = srv:getsockname()
        local stop_at = ums.now() + BUDGET
        local acceptor = ums.spawn(function()
          while true do
            local c = srv:accept()
            if not c then return end
            c:close()
          end
        end)
        local clients = {}
        for p = 1, PAIRS do
          clients[p] = ums.spawn(function()
            while cycles < TOTAL and ums.now() < stop_at do
              local c = assert(net.connect("127.0.0.1", port))
              c:setoption("linger", 0)
              c:close()
              cycles = cycles + 1
            end
          end)
        end
        for _, t in ipairs(clients) do assert(t:join(60)) end
        acceptor:cancel()
        acceptor:join(10)
        srv:close()
      end, {timeout = 90, gc = true})
      print(("\n  %s: %d connect/accept/close cycles"):format(io_, cycles))
      assert.is_true(cycles > 0)
      assert.equal(before, fd_count())
      ums.config({io = "auto"})
    end)

    it("waits on EMFILE at accept without spinning, keeping the listener ("
       .. io_ .. ")", function()
      local r = sp.sh("sh -c " .. sp.q("ulimit -n 64; " .. env_prefix() ..
        "UMS_IO=" .. io_ .. " " .. sp.q(sp.lua) .. " " ..
        sp.q(here .. "net_emfile_child.lua")), {timeout = 60})
      assert.equal(0, r.code, sp.describe(r))
      local cpu, wall = r.stdout:match("^ok ([%d.]+) ([%d.]+)")
      assert.is_truthy(cpu, sp.describe(r))
      cpu, wall = tonumber(cpu), tonumber(wall)
      -- It waited for its whole timeout, and a spinning accept would have
      -- spent about that much CPU; backing off spends a small part.
      assert.is_true(wall >= 1.0, r.stdout)
      assert.is_true(cpu < wall / 4, r.stdout)
    end)
  end)

  it("raises the soft open-files limit to the hard one at load, unless "
     .. "UMS_NOFILE=keep", function()
    local probe = "dofile('" .. here .. "helper.lua'); "
      .. "for l in io.lines('/proc/self/limits') do "
      .. "if l:find('open files') then print(l) end end"
    local r = sp.sh("sh -c " .. sp.q("ulimit -S -n 256; " .. env_prefix() ..
      sp.q(sp.lua) .. " -e " .. sp.q(probe)))
    local soft, hard = r.stdout:match("open files%s+(%d+)%s+(%d+)")
    assert.is_truthy(soft, sp.describe(r))
    assert.equal(hard, soft)
    r = sp.sh("sh -c " .. sp.q("ulimit -S -n 256; " .. env_prefix() ..
      "UMS_NOFILE=keep " .. sp.q(sp.lua) .. " -e " .. sp.q(probe)))
    soft = r.stdout:match("open files%s+(%d+)")
    assert.equal("256", soft, sp.describe(r))
  end)
end)
