-- conformance: main
-- load in a main chunk: lua.c runs the chunk under a message handler
-- that adds a traceback, and Lua runs load's parser under the caller's
-- handler, so a failing reader or a too-deep chunk gives the message
-- with a traceback. A task has no such handler (it is a coroutine):
-- there load gives the bare message, as in any coroutine.
print(load(function() error("reader failed") end))
print(load(function() error({}) end))
print(load(function()
  error(setmetatable({}, {__tostring = function() return "obj" end}))
end))
print(load(string.rep("(", 300) .. "1" .. string.rep(")", 300)))
local f, e = load(function() error("again") end)
print(type(f), type(e))
