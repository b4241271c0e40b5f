-- The writer of spec/shortwrite_spec.lua (not a spec itself): runs under a
-- file size limit (`ulimit -f`, SIGXFSZ ignored) and makes every kind of
-- ums.fs write cross it, printing each call's results for the spec to
-- check against the file on disk.
--
-- lua5.4 shortwrite_child.lua <where> <dir> <limit>
--   where  "host" (outside a task), "task" (the first task of ums.run),
--          or "backend" (only print the backend in force)
--   dir    an empty directory for the files
--   limit  the file size limit in bytes
--
-- Output, one line per call: label, then each result, tab-separated;
-- "backend\t<uring|pool>" in a task; and after each case, for the file it
-- wrote, "file\t<name>\t<size>\t<true if it holds the first size bytes
-- of the data, in order>", read with io (the file is then removed, so that
-- on a full file system every case starts with the same room).

local ums = dofile((arg[0]:match("^(.*/)") or "./") .. "helper.lua")
local fs = ums.fs

local where, dir, limit = arg[1], arg[2], math.tointeger(arg[3])

-- The data written: 4-byte counters, so that any part of it differs from
-- any other (a file holding the last part instead of the first shows).
local function data(n)
  local t = {}
  for i = 1, n // 4 do t[i] = string.pack(">I4", i) end
  return table.concat(t)
end

local function out(label, ...)
  local r = table.pack(...)
  local t = {label}
  for i = 1, r.n do t[#t + 1] = tostring(r[i]) end
  io.write(table.concat(t, "\t"), "\n")
end

local big = data(2 * limit)

local function check(name)
  local path = dir .. "/" .. name
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  out("file", name, #s, s == big:sub(1, #s))
  assert(os.remove(path))
end

local function body()
  if where == "task" then out("backend", require("ums.core").io_backend()) end

  -- ums.fs.writefile of twice the limit.
  out("writefile", fs.writefile(dir .. "/writefile", big))
  check("writefile")

  -- f:write of twice the limit (straight to the kernel), then flush and
  -- close, which have nothing left to write.
  local f = assert(fs.open(dir .. "/write", "w"))
  out("write.write", f:write(big))
  out("write.pos", f:seek())
  out("write.flush", f:flush())
  out("write.close", f:close())
  check("write")

  -- f:write in pieces of 3/10 of the limit: three whole, one short, the
  -- rest refused.
  f = assert(fs.open(dir .. "/pieces", "w"))
  local piece = limit // 10 * 3
  for i = 1, 5 do
    local r = table.pack(f:write(big:sub((i - 1) * piece + 1, i * piece)))
    out("pieces." .. i, r[1] == f or r[1], table.unpack(r, 2, r.n))
  end
  out("pieces.close", f:close())
  check("pieces")

  -- Small writes buffered in the file, flushed by flush: the flush
  -- writes what fits and reports the rest.
  f = assert(fs.open(dir .. "/flush", "w"))
  out("flush.first", f:write(big:sub(1, limit - 1000)) == f)
  for i = 0, 2 do
    local s = limit - 1000 + i * 1000
    out("flush.small", f:write(big:sub(s + 1, s + 1000)) == f)
  end
  out("flush.flush", f:flush())
  out("flush.pos", f:seek())
  out("flush.close", f:close())
  check("flush")

  -- The same flushed by close.
  f = assert(fs.open(dir .. "/close", "w"))
  out("close.first", f:write(big:sub(1, limit - 1000)) == f)
  out("close.small", f:write(big:sub(limit - 999, limit + 2000)) == f)
  out("close.close", f:close())
  check("close")

  -- Many small writes: flushed whenever the file's buffer fills.
  f = assert(fs.open(dir .. "/small", "w"))
  local failed
  for i = 0, (limit + 200000) // 1000 - 1 do
    local r = table.pack(f:write(big:sub(i * 1000 + 1, i * 1000 + 1000)))
    if r[1] ~= f and not failed then
      failed = true
      out("small.fail", table.unpack(r, 1, r.n))
      out("small.pos", f:seek())
    end
  end
  out("small.close", f:close())
  check("small")

  -- pwrite of twice the limit at offset 0.
  f = assert(fs.open(dir .. "/pwrite", "w"))
  out("pwrite", f:pwrite(big, 0))
  out("pwrite.again", f:pwrite(big:sub(limit + 1), limit))
  out("pwrite.close", f:close())
  check("pwrite")
end

if where == "backend" then
  -- Only the backend in force (the spec's reference for its default
  -- runs).
  ums.run(function() out("backend", require("ums.core").io_backend()) end)
  os.exit(0)
elseif where == "task" then
  ums.run(body)
else
  body()
end
out("done")
