-- os.exit(false, true): status 1, the state closed first (a pending
-- to-be-closed variable does not run: os.exit does not unwind).
print("exiting")
local _ <close> = setmetatable({}, {__close = function() print("closed") end})
os.exit(false, true)
