-- A tour of ums for Lua: run it with `lua5.4 examples/tour.lua`
-- (or `bin/ums examples/tour.lua`). Each section prints what happens.
local ums = require "ums"

ums.run(function()            -- the main thread waits here until all ends
  -- 1. Tasks: spawn runs a function as a task; join waits for its results.
  local t = ums.spawn(function(a, b) return a + b, "sum" end, 20, 22)
  print("1. join:", t:join())                   --> true  42  sum

  -- 2. Sleep parks only the sleeping task: these three overlap, so the
  --    whole section takes about 30 ms, and they finish shortest first.
  local start, order = ums.now(), {}
  local sleepers = {}
  for _, ms in ipairs{30, 10, 20} do
    sleepers[#sleepers + 1] = ums.spawn(function()
      ums.sleep(ms / 1000)
      order[#order + 1] = ms
    end)
  end
  for _, s in ipairs(sleepers) do s:join() end
  print(("2. sleep: woke in order %s after %.0f ms")
        :format(table.concat(order, ", "), (ums.now() - start) * 1000))

  -- 3. An error in a task comes back through join, with its traceback.
  local bad = ums.spawn(function() error("something broke") end)
  local ok, err, traceback = bad:join()
  print("3. error:", ok, err, "(traceback: " .. #traceback .. " bytes)")

  -- 4. Cancel: the task's waits raise, and its <close> variables run.
  local worker = ums.spawn(function()
    local _ <close> = setmetatable({}, {__close = function()
      print("4. cancel: worker's <close> cleanup ran")
    end})
    ums.sleep(3600)                     -- parked here when cancelled
  end)
  ums.sleep(0.01)
  worker:cancel()
  local _, why = worker:join()
  print("4. cancel: status " .. worker:status() .. ", join says " ..
        tostring(why))

  -- 5. Yield from anywhere: a wait inside table.sort's comparator (a C
  --    function Lua itself cannot yield across) parks just this task.
  local ticks, sorted = 0, false
  local ticker = ums.spawn(function()
    while not sorted do ums.sleep(0.001); ticks = ticks + 1 end
  end)
  local words = {"pear", "fig", "apple", "kiwi"}
  table.sort(words, function(a, b) ums.sleep(0.002); return a < b end)
  sorted = true
  print("5. sort with waits: " .. table.concat(words, " ") ..
        " (another task ticked " .. ticks .. " times meanwhile)")
  ticker:join()

  -- 6. Channels and mutexes.
  local ch = ums.channel(2)             -- a buffer of 2 values
  local producer = ums.spawn(function()
    for i = 1, 5 do ch:send(i * i) end
    ch:close()                          -- receivers see nil, "closed"
  end)
  local got = {}
  for v in function() return ch:recv() end do got[#got + 1] = v end
  producer:join()
  print("6. channel: received " .. table.concat(got, " "))

  local m, counter, done = ums.mutex(), 0, {}
  for i = 1, 4 do
    done[i] = ums.spawn(function()
      for _ = 1, 10 do
        m:lock()                        -- the read-sleep-write needs it
        local v = counter
        ums.sleep(0)
        counter = v + 1
        m:unlock()
      end
    end)
  end
  for _, d in ipairs(done) do d:join() end
  print("6. mutex: 4 tasks x 10 increments = " .. counter)

  -- 7. Files: io's methods, but a read or write parks only its task
  --    (io_uring underneath). Three tasks append to one shared file.
  local path = os.tmpname()
  local log <close> = assert(ums.fs.open(path, "w"))
  local writers = {}
  for i = 1, 3 do
    writers[i] = ums.spawn(function()
      for j = 1, 2 do log:write(("task %d line %d\n"):format(i, j)) end
    end)
  end
  for _, w in ipairs(writers) do w:join() end
  log:flush()
  local lines = 0
  for _ in ums.fs.lines(path) do lines = lines + 1 end
  print(("7. files: %d lines, %d bytes, backend %s"):format(lines,
    ums.fs.stat(path).size, ums.io_backend()))
  ums.fs.remove(path)
end)
print("tour done")
