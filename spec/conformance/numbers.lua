-- Integers, floats, string formats and goto: nothing here depends on
-- where the program runs.
print(1, 1.0, -0.0, 1e100, 2^53, 2^63, math.maxinteger, math.mininteger)
print(7 // 2, 7.0 // 2, 7 % -3, -7 % 3, 7 / 2, 3 | 5, 3 ~ 5, 1 << 63)
print(math.type(1), math.type(1.0), math.type("1"), math.tointeger(3.0))
print(math.maxinteger + 1 == math.mininteger, 1 // 0.0, -1 // 0.0)
print(pcall(function() return 1 // 0 end))
print(0/0 ~= 0/0, math.huge, -math.huge, math.pi)
print(string.format("%5.2f|%-5d|%x|%X|%o|%e|%g|%a", 3.14159, 42, 255, 255, 8,
                    12345.678, 0.0001, 1.0))
print(string.format("%q", "a\nb\0c\"d\\"), string.format("%q", 1 / 3))
print(string.format("%q", math.mininteger), string.format("%10.3s|", "abcdef"))
print(string.format("%s %s %s", nil, true, {} ~= nil))
print(tostring(10 // 3), tostring(10 / 2), 3 == 3.0, "10" + 5, "3.0" + 1)
print(tonumber("0x10"), tonumber("1e2"), tonumber("z", 36), tonumber(" 12 "))
print(("%d"):rep(3, ","), ("abc"):byte(1, -1))
print(utf8.char(72, 228, 8364, 128512), utf8.len("häß"))
for w, n in string.gmatch("a=1, bb=22, ccc=333", "(%a+)=(%d+)") do
  io.write(w, ":", n, " ")
end
print()
print(string.pack("<i4", 100):byte(1, -1))
print(table.concat({1, 2.5, "x"}, "-"), select("#", nil, nil), select(-1, 1, 2))
local t = {5, 2, 8, 1}
table.sort(t, function(a, b) return a > b end)
print(table.concat(t, " "), table.unpack({1, 2, 3}, 2))

-- goto: continue and nested loops.
for i = 1, 3 do
  for j = 1, 3 do
    if j == 2 then goto continue end
    io.write(i, j, " ")
    ::continue::
  end
end
print()
do
  local k = 0
  ::top::
  k = k + 1
  if k < 5 then goto top end
  print("k", k)
end

-- Integer for-loop edges and coroutine generators inside the program.
for i = math.maxinteger - 2, math.maxinteger do io.write(i, " ") end
print()
for x = 1, 2, 0.5 do io.write(x, " ") end
print()
local gen = coroutine.wrap(function()
  for i = 1, 3 do coroutine.yield(i) end
  return "done"
end)
print(gen(), gen(), gen(), gen())
print(coroutine.status(coroutine.create(print)))
io.stdout:write("written ", 1, " ", 2.5, "\n")
io.stderr:write("to stderr\n")
