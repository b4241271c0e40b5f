-- conformance: main
-- A script that removes or replaces the globals a runner might use: its
-- error is still reported as lua5.4 reports it.
tostring = function() return "replaced" end
debug = nil
string = nil
io = nil
table = nil
getmetatable = nil
setmetatable = nil
xpcall = nil
print("globals gone")
error("still reported")
