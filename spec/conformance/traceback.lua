-- debug.traceback at several levels, and as xpcall's handler. The frames
-- below the main chunk belong to whoever runs it (lua.c's C frame, a
-- task's runner): each traceback is printed down to the main chunk.
local function upto_main(tb)
  local out = {}
  for line in (tb .. "\n"):gmatch("(.-)\n") do
    out[#out + 1] = line
    if line:find("in main chunk", 1, true) then break end
  end
  return table.concat(out, "\n")
end
local function a(level) return debug.traceback("at " .. level, level) end
local function b(level) return a(level) end
print(upto_main(b(1)))
print(upto_main(b(2)))
print(upto_main(debug.traceback()))
local ok, tb = xpcall(function() error("x") end, debug.traceback)
print(ok, upto_main(tb))
ok, tb = xpcall(function() local t = nil; return t.x end, debug.traceback)
print(ok, upto_main(tb))
local function rec(n) if n == 0 then return debug.traceback("deep") end
  return (rec(n - 1)) end
print(upto_main(rec(5)))
