-- conformance: main
-- An uncaught error whose value is not a string (number): reported as lua.c
-- reports it, exit status 1.
print("before")
error(42)
