-- A fault-job program (test/fault/CMakeLists.txt): writes 2 MiB through
-- every ums.fs write path into DIR, where the file system or the process
-- limit stops a file at 1 MiB (`ulimit -f 1024`, or a 1 MiB tmpfs). Each
-- write must either succeed with every byte on disk or return
-- `nil, "message", errno` naming the failure; it must never report
-- success for a file that holds less than was written.
--
-- usage: lua5.4 test/fault/bigwrite.lua DIR "File too large"|"No space"
local ums = require "ums"
local dir, expect = assert(arg[1]), assert(arg[2])
local SIZE = 2 * 1024 * 1024
local data = {}
for i = 1, SIZE // 64 do data[i] = ("%063d\n"):format(i) end
data = table.concat(data)

local checked = 0

-- `ok, msg` is what the write path reported; the file must agree with it.
local function check(what, path, ok, msg)
  local st = ums.fs.stat(path)
  local size = st and st.size or 0
  if ok then
    assert(size == SIZE, ("%s reported success with %d of %d bytes on disk")
                         :format(what, size, SIZE))
    -- A short write retried at the wrong position leaves the right size
    -- with the wrong bytes.
    assert(ums.fs.readfile(path) == data, what .. ": the bytes differ")
  else
    assert(type(msg) == "string" and msg:find(expect, 1, true),
           ("%s: expected an error naming %q, got %s"):format(
             what, expect, tostring(msg)))
  end
  ums.fs.remove(path)
  checked = checked + 1
  print(("%s: %s"):format(what, ok and "complete" or msg))
end

local function paths(where)
  local n = 0
  return function(tag)
    n = n + 1
    return ("%s/%s-%s-%d"):format(dir, where, tag, n)
  end
end

local function all(where)
  local name = paths(where)
  local p = name("writefile")
  check(where .. " writefile", p, ums.fs.writefile(p, data))

  -- One write, then flush and close: any of them may report the failure.
  p = name("write")
  local f = assert(ums.fs.open(p, "w"))
  local ok, msg = f:write(data)
  if ok then ok, msg = f:flush() end
  local cok, cmsg = f:close()
  if ok and not cok then ok, msg = cok, cmsg end
  check(where .. " write+flush+close", p, ok, msg)

  -- Many small writes through the buffer.
  p = name("chunks")
  f = assert(ums.fs.open(p, "w"))
  ok, msg = true, nil
  for i = 1, SIZE, 4096 do
    ok, msg = f:write(data:sub(i, i + 4095))
    if not ok then break end
  end
  if ok then ok, msg = f:close() else f:close() end
  check(where .. " chunked writes", p, ok, msg)

  -- Appends.
  p = name("append")
  f = assert(ums.fs.open(p, "a"))
  ok, msg = f:write(data)
  if ok then ok, msg = f:close() else f:close() end
  check(where .. " append", p, ok, msg)

  -- Positioned writes, which never rely on the file position.
  p = name("pwrite")
  f = assert(ums.fs.open(p, "w"))
  ok, msg = f:pwrite(data, 0)
  f:close()
  check(where .. " pwrite", p, ok, msg)
end

all("outside")
local backend
ums.run(function()
  backend = ums.io_backend()
  all("task")
  -- Many tasks at once, each with its own file.
  local tasks = {}
  for i = 1, 4 do
    tasks[i] = ums.spawn(function()
      local p = ("%s/many-%d"):format(dir, i)
      check("task " .. i .. " writefile", p, ums.fs.writefile(p, data))
    end)
  end
  for i = 1, 4 do assert(tasks[i]:join(60)) end
end)
print(("OK %d write paths checked (backend %s)"):format(checked, backend))
