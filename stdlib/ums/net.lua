--- ums.net: sockets for tasks (lua-binding/lnet.c; docs/lua-api.md,
-- "Sockets"). The same table as require("ums").net.
return require("ums.core").net
