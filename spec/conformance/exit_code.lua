-- os.exit with a code: output so far is flushed, the status is the code.
io.write("before exit")
print(" (line)")
io.stdout:write("unflushed tail")
os.exit(3)
