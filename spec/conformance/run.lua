-- The conformance run: one ordinary Lua program, run four ways, compared.
--
--   lua5.4 spec/conformance/run.lua <program>
--
-- The ways: plain `lua5.4 <program>`; inside a task (in_task.lua); under
-- the ums command (`lua5.4 $UMS_BIN <program>`); as submitted work,
-- joined (submitted.lua). Every way must give the plain run's exit status
-- and, on stderr, its first line (the error message, lua5.4's name read
-- as "ums" under the command), and all of it when the program succeeds.
-- The command must give the plain run's
-- stdout and stderr byte for byte. The task and submitted ways must give
-- its stdout too, unless the program's first line is
-- "-- conformance: main": its output depends on running as a main chunk
-- (lua.c's message handler, the frames below it in a traceback), which a
-- task is not; docs/lua-api.md ("Errors as in plain Lua") lists these
-- differences.
--
-- Exits 0 when everything matches; otherwise prints each difference.
local prog = assert(arg[1], "usage: run.lua <program> [--mask pattern]..."
                   .. " [--no-stdout] [-- args...]")
-- Options: --mask replaces every match of a Lua pattern in stdout with
-- "#" before comparing (timings, counts that vary run to run);
-- --no-stdout compares only the exit status and stderr (a report made of
-- timings); the words after -- are the program's arguments.
local masks, compare_stdout, prog_args = {}, true, {}
do
  local i = 2
  while arg[i] do
    if arg[i] == "--mask" then
      masks[#masks + 1] = assert(arg[i + 1], "--mask needs a pattern")
      i = i + 1
    elseif arg[i] == "--no-stdout" then
      compare_stdout = false
    elseif arg[i] == "--" then
      table.move(arg, i + 1, #arg, 1, prog_args)
      break
    else
      error("unknown option " .. arg[i])
    end
    i = i + 1
  end
end
local here = arg[0]:match("^(.*)/[^/]*$") or "."
local lua = os.getenv("LUA54") or "lua5.4"
local bin = os.getenv("UMS_BIN") or (here .. "/../../bin/ums")
-- Under TSan only the interpreter that loads ums gets the runtime (the
-- shell cannot start with it).
local preload = os.getenv("UMS_CHILD_LD_PRELOAD")

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function slurp(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  os.remove(path)
  return s
end

local function run(args)
  local out, err = os.tmpname(), os.tmpname()
  local cmd = {}
  if preload then cmd[#cmd + 1] = "LD_PRELOAD=" .. q(preload) end
  cmd[#cmd + 1] = q(lua)
  for _, a in ipairs(args) do cmd[#cmd + 1] = q(a) end
  for _, a in ipairs(prog_args) do cmd[#cmd + 1] = q(a) end
  cmd = table.concat(cmd, " ") .. " </dev/null >" .. out .. " 2>" .. err
  local _, how, code = os.execute(cmd)
  if how == "signal" then code = 128 + code end
  local stdout = slurp(out)
  for _, m in ipairs(masks) do stdout = stdout:gsub(m, "#") end
  return {status = code, stdout = stdout, stderr = slurp(err), cmd = cmd}
end

local f = assert(io.open(prog))
local mode = f:read("l"):match("^%-%- conformance: (%w+)") or "all"
f:close()

local ways = {
  {"plain", {prog}},
  {"task", {here .. "/in_task.lua", prog}},
  {"command", {bin, prog}},
  {"submitted", {here .. "/submitted.lua", prog}},
}
local r = {}
for _, w in ipairs(ways) do r[w[1]] = run(w[2]) end
local plain = r.plain

local failures = 0
local function differ(way, what, want, got)
  failures = failures + 1
  print(("%s: %s differs from plain lua5.4 (%s)"):format(prog, what, way))
  print("  command: " .. r[way].cmd)
  print("  plain:   " .. ("%q"):format(want))
  print("  " .. way .. ": " .. ("%q"):format(got))
end

local function first_line(s, prefix)
  s = s:match("^[^\n]*")
  return (s:gsub("^" .. prefix:gsub("%p", "%%%0") .. ": ", "PROG: "))
end

-- lua.c names itself as it was started (argv[0]); the command "ums".
local prefixes = {plain = lua, task = lua, command = "ums", submitted = lua}
for _, w in ipairs(ways) do
  local name, got = w[1], r[w[1]]
  if name ~= "plain" then
    if got.status ~= plain.status then
      differ(name, "exit status", plain.status, got.status)
    end
    local want1 = first_line(plain.stderr, lua)
    local got1 = first_line(got.stderr, prefixes[name])
    if got1 ~= want1 then differ(name, "stderr's first line", want1, got1) end
    if compare_stdout and (name == "command" or mode ~= "main") then
      if got.stdout ~= plain.stdout then
        differ(name, "stdout", plain.stdout, got.stdout)
      end
    end
    if name ~= "command" and mode ~= "main" and plain.status == 0 and
       got.stderr ~= plain.stderr then
      differ(name, "stderr", plain.stderr, got.stderr)
    end
    if name == "command" then
      local want = plain.stderr:gsub("^" .. lua:gsub("%p", "%%%0") .. ": ",
                                     "ums: ")
      if got.stderr ~= want then differ(name, "stderr", want, got.stderr) end
    end
  end
end
if failures > 0 then os.exit(1) end
print(("%s: the four ways agree (%s)"):format(prog, mode))
