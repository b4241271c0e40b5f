-- A fault-job program (test/fault/CMakeLists.txt), run under a small
-- `ulimit -n`: opens files until the process runs out of descriptors.
-- Each failed open must answer `nil, "path: Too many open files", 24`;
-- after closing, opening must work again, and tasks, timers, channels
-- and work on other schedulers must go on working.
--
-- usage: lua5.4 test/fault/manyfiles.lua DIR
local ums = require "ums"
local dir = assert(arg[1])
local EMFILE = 24

local function exhaust(where)
  local files, msg, code = {}
  for i = 1, 100000 do
    local f
    f, msg, code = ums.fs.open(("%s/%s-%d"):format(dir, where, i % 50), "w")
    if not f then break end
    files[#files + 1] = f
  end
  assert(code == EMFILE and msg:find("Too many open files", 1, true),
         ("%s: expected EMFILE, got %s, %s"):format(where, tostring(msg),
                                                   tostring(code)))
  -- While none is left, reading a whole file fails the same way.
  local ok, rmsg = ums.fs.readfile(dir .. "/" .. where .. "-1")
  assert(not ok and rmsg:find("Too many open files", 1, true),
         where .. ": readfile: " .. tostring(rmsg))
  for _, f in ipairs(files) do assert(f:close()) end
  local f = assert(ums.fs.open(("%s/%s-again"):format(dir, where), "w"))
  assert(f:write("fine"))
  assert(f:close())
  print(("%s: %d files opened, then %s"):format(where, #files, msg))
end

exhaust("outside")
ums.config{schedulers = 2}
local backend
ums.run(function()
  backend = ums.io_backend()
  exhaust("task")
  -- Everything else still works after running out once.
  local ch = ums.channel(1)
  local t = ums.spawn(function() ums.sleep(0.01) ch:send("late") end)
  assert(ch:recv(30) == "late")
  assert(t:join(30))
  local w = ums.submit(function(n) return n * 2 end, 21)
  assert(select(2, w:join(30)) == 42)
  -- Another scheduler's VM runs out too, and recovers.
  local dw = ums.submit(function(d)
    local u = require "ums"
    local fs, n = {}, 0
    while true do
      local f, msg = u.fs.open(d .. "/vm2-" .. (n % 50), "w")
      if not f then
        for _, g in ipairs(fs) do g:close() end
        return msg
      end
      n = n + 1
      fs[n] = f
    end
  end, dir)
  local ok, msg = dw:join(30)
  assert(ok and msg:find("Too many open files", 1, true), tostring(msg))
end)
print("OK (backend " .. backend .. ")")
