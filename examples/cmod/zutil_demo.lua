-- zutil_demo.lua: a C module (examples/cmod/zutil.c, built on ums-lua.h)
-- doing blocking work on ums's preemptive pool while other tasks run.
--
--   LUA_CPATH="build/examples/cmod/?.so;build/lua-binding/?.so;;" \
--   LUA_PATH="stdlib/?.lua;stdlib/?/init.lua;;" lua5.4 examples/cmod/zutil_demo.lua
--
-- It checks its own results (a CRC-32 computed in Lua, a round trip
-- through zlib) and fails loudly if one is wrong: ctest runs it.
local ums = require "ums"     -- first: zutil needs ums loaded
local zutil = require "zutil"

-- CRC-32 (the one zlib computes), in Lua, to check the C module against.
local crc_table = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do
    c = (c & 1) ~= 0 and (0xEDB88320 ~ (c >> 1)) or (c >> 1)
  end
  crc_table[i] = c
end
local function lua_crc32(s)
  local c = 0xFFFFFFFF
  for i = 1, #s do
    c = crc_table[(c ~ s:byte(i)) & 0xFF] ~ (c >> 8)
  end
  return c ~ 0xFFFFFFFF
end

-- A file of 256 KiB to checksum.
local parts = {}
for i = 1, 4096 do parts[i] = ("line %05d of the zutil demo ....\n"):format(i)
                                 :rep(2):sub(1, 64) end
local content = table.concat(parts)
local path = os.tmpname()
local f = assert(io.open(path, "wb"))
f:write(content)
f:close()

local ok, err = pcall(ums.run, function()
  -- Four checksums at once, each on the C-call pool, while a ticker task
  -- keeps running on the scheduler.
  local ticks, done = 0, false
  local ticker = ums.spawn(function()
    while not done do ticks = ticks + 1; ums.sleep(0.001) end
  end)
  local tasks = {}
  for i = 1, 4 do
    tasks[i] = ums.spawn(function() return zutil.crc32_file(path) end)
  end
  local want = lua_crc32(content)
  for i = 1, 4 do
    local joined, crc, bytes = tasks[i]:join()
    assert(joined, crc)
    assert(crc == want, ("crc %08x, want %08x"):format(crc, want))
    assert(bytes == #content)
  end
  print(("crc32_file: %08x over %d bytes (x4), ticker ran %d times")
        :format(want, #content, ticks))

  -- A failure is a result, with errno.
  local none, msg, errno = zutil.crc32_file(path .. ".missing")
  assert(none == nil and msg:find("No such file", 1, true) and errno == 2)
  print("missing file: " .. msg)

  -- zlib both ways, each on the pool.
  local z = zutil.compress(content, 9)
  local back = zutil.uncompress(z, #content)
  assert(back == content, "round trip changed the data")
  print(("compress: %d -> %d bytes, uncompress gives them back")
        :format(#content, #z))
  done = true
  ticker:join()
end)
os.remove(path)
assert(ok, err)
assert(zutil.pending() == 0, "requests not released")
print("zutil demo done")
