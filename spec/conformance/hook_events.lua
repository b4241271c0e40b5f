-- The events a hook set with debug.sethook sees, and the names the hook
-- reads for them, are Lua's: ums keeps sethook and gethook working beside
-- its own hook, without an extra call or return of its own around them.
local events = {}
local depth, lowest = 0, 0

local function hook(event)
  local name = debug.getinfo(2, "n").name
  events[#events + 1] = event .. " " .. tostring(name)
  if event == "call" or event == "tail call" then
    depth = depth + 1
  elseif event == "return" then
    depth = depth - 1
    if depth < lowest then lowest = depth end
  end
end

local function leaf(x) return x + 1 end
local function middle(x) local y = leaf(x) return y end

debug.sethook(hook, "cr")
middle(1)
debug.sethook()
print(table.concat(events, "\n"))
-- Only the first event (the return from sethook) has no call before it.
print("lowest depth", lowest)

-- A hook set inside a __close handler: its first event is still the
-- return from sethook, named so.
local names = {}
do
  local x <close> = setmetatable({}, {__close = function()
    debug.sethook(function(event)
      names[#names + 1] = event .. " " .. tostring(debug.getinfo(2, "n").name)
    end, "r")
  end})
end
debug.sethook()
print(table.concat(names, "\n"))

-- What gethook returns, and an argument error naming the function.
local function h() end
debug.sethook(h, "l", 7)
local f, mask, count = debug.gethook()
debug.sethook()
print(f == h, mask, count)
print(pcall(debug.sethook, h, {}))
print(select(2, pcall(function() debug.sethook(h, "c", "x") end)))
