-- conformance: main
-- An uncaught error whose value is not a string (tostring): reported as lua.c
-- reports it, exit status 1.
print("before")
error(setmetatable({}, {__tostring = function() return "custom" end}))
