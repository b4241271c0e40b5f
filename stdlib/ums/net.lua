--- ums.net: sockets for tasks (lua-binding/lnet.c; README.md, "The Lua
-- API"). The same table as require("ums").net.
return require("ums.core").net
