-- conformance: main
-- An uncaught error: the report on stderr, its traceback and exit
-- status 1 (under the ums command: "ums:" for "lua5.4:").
local function inner(x) error("boom " .. x) end
local function outer() inner("deep") end
print("before")
outer()
print("not reached")
