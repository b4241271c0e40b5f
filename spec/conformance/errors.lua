-- Error values of every kind through pcall, xpcall and error, and load
-- failing inside a protected call: the same under lua5.4, in a task,
-- under the ums command and as submitted work.
local function show(...)
  local t = table.pack(...)
  for i = 1, t.n do
    local v = t[i]
    if type(v) == "table" then t[i] = "table:" .. tostring(v.tag)
    else t[i] = tostring(v) end
  end
  print(table.concat(t, " | ", 1, t.n))
end

show(pcall(error, "plain"))
show(pcall(error, "level 1", 1))
show(pcall(function() error("level 2", 2) end))
show(pcall(error, {tag = "a table"}))
show(pcall(error, nil))
show(pcall(error))
show(pcall(error, 42))
show(pcall(error, 4.5))
show(pcall(error, true))
local obj = setmetatable({}, {__tostring = function() return "an object" end})
show(pcall(error, obj))
print(select(2, pcall(error, obj)) == obj)

-- xpcall with handlers that return other values, or several.
show(xpcall(error, function(e) return "handled: " .. tostring(e) end, "x"))
show(xpcall(error, function(e) return e, "dropped" end, {tag = "kept"}))
show(xpcall(function(a, b) return a + b end, print, 1, 2))
show(xpcall(error, function() error("in handler") end, "first"))

-- Errors from Lua itself.
show(pcall(function() local t = nil; return t.x end))
show(pcall(function() return 1 + {} end))
show(pcall(function() return #5 end))
show(pcall(string.rep))
show(pcall(string.format, "%d", 1.5))

-- load: failing reader, too-deep chunk, syntax error, binary chunk, env.
local function load_cases()
  show(load(function() error("reader failed") end))
  show(load(function() error({tag = "reader table"}) end))
  show(load(function() error(obj) end))
  show(load(string.rep("(", 300) .. "1" .. string.rep(")", 300)))
  show(load("x = = 1", "=syntax"))
  show(load("return 1", "=text", "b"))
  show(load(string.dump(function() return 7 end), "=bin", "t"))
  local f = load(string.dump(function() return 7 end), "=bin", "b")
  show(f())
  local env = {}
  load("y = 8", "=env", "t", env)()
  show(env.y, y)
  local parts, i = {"return ", "1 ", "+ 2"}, 0
  show(load(function() i = i + 1; return parts[i] end)())
end
show(pcall(load_cases))

-- Nested pcall inside xpcall: the inner handler does not leak out.
show(xpcall(function()
  local ok, e = pcall(error, "inner")
  return ok, e, select(2, pcall(load, function() error("deep") end))
end, function(e) return "outer saw " .. tostring(e) end))

-- error in __close and __gc-free finalisation order.
show(pcall(function()
  local _ <close> = setmetatable({}, {__close = function(_, e)
    print("closing with", e)
  end})
  error("with close", 0)
end))
show(pcall(function()
  local _ <close> = setmetatable({}, {__close = function()
    error("close replaced", 0)
  end})
  error("original", 0)
end))

-- Tracebacks as strings: their first line only (the frames below the
-- program's own depend on who called it).
local function head(tb) return (tb:match("^[^\n]*\n[^\n]*\n[^\n]*")) end
print(head(debug.traceback("msg", 1)))
print(head(debug.traceback(42)))
print(head(debug.traceback("level 0", 0)))
print(debug.traceback(nil) == nil, debug.traceback({}) ~= nil)
local co = coroutine.create(function() coroutine.yield() end)
coroutine.resume(co)
print(debug.traceback(co, "co"))
print(debug.traceback(co, "co", 1))
