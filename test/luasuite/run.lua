-- Runs Lua 5.4's own test files (the "testes" folder of the Lua source
-- distribution, which does not ship with ums) in ums tasks, several ways,
-- and prints a table of what passed.
--
--   lua5.4 test/luasuite/run.lua <testes-dir> [--ways w,w,...] [file...]
--
-- Run it from the root of a built tree: it loads ums from stdlib/ and
-- build/lua-binding/ (UMS_BUILD_DIR for another build folder). Without
-- <testes-dir>, or when that folder has no all.lua, it says so and exits 0.
-- Files default to every file all.lua runs that needs neither Lua's
-- internal test library (T) nor a standalone interpreter (main.lua);
-- the C libraries attrib.lua loads must be built in <testes-dir>/libs
-- (`make -C libs LUA_DIR=/usr/include/lua5.4`), else attrib.lua fails
-- every way, plainly too.
--
-- The ways (each file runs in its own process, from <testes-dir>):
--   plain      lua5.4 file.lua, the reference
--   task       inside ums.run, as its first task
--   command    under the ums command (bin/ums)
--   submitted  as work submitted to another scheduler and joined
--   plain3     lua5.4 running the file three times in one VM, one after
--              the other: the reference for the two ways below, whose
--              copies share a VM too (its type metatables, io's default
--              files, the collector)
--   concurrent three copies as tasks of one scheduler (one VM, its globals
--              shared as the files expect; cooperative, they interleave
--              only where a file yields to the scheduler)
--   preempt    preempt = true with a 1 ms quantum, beside a task that
--              keeps yielding, so the file is cut between instructions
--   plain3own  plain3 with a globals table of its own for each run, as
--              cpreempt gives: the reference for cpreempt
--   cpreempt   three copies cut by preemption, each with its own globals
--              table (load's chunks still see the VM's _G, and io's
--              default files are the VM's: see docs/testing.md)
-- A way passes when its process exits 0 (the files assert what they test).
-- Every file runs with _port = true (as all.lua's portable run does),
-- big.lua inside a coroutine.wrap as all.lua runs it.

local here = arg[0]:match("^(.*)/[^/]*$") or "."
local root = here .. "/../.."

-- ------------------------------------------------------------------------
-- Child mode: run one file one way, in this process.
-- ------------------------------------------------------------------------

-- Lines blanked in every way, the plain one too (their numbers stay):
-- checks that hold only in the main thread, which a task is not, listed
-- in docs/lua-api.md ("Errors as in plain Lua"). The rest of the file
-- then runs; without this it stops there.
local by_design = {
  ["coroutine.lua"] = {
    [11] = "coroutine.running() in a task is not the main thread",
    [13] = "coroutine.isyieldable() is true in a task",
    [14] = "a bare coroutine.yield() in a task yields to the scheduler",
  },
  ["errors.lua"] = {
    [344] = "a bare coroutine.yield() in a task yields to the scheduler",
  },
}

-- Runs a test file in env (this VM's _G when nil) the way all.lua runs
-- it, with the lines of skip (a set of line numbers) blanked. No upvalue
-- but _ENV: submitted work runs it in another VM.
local function run_file(file, env, skip)
  env = env or _G
  env._port, env._soft, env._nomsg = true, false, true
  local f
  if skip and next(skip) then
    local lines, n = {}, 0
    for line in io.lines(file) do
      n = n + 1
      lines[n] = skip[n] and "" or line
    end
    f = assert(load(table.concat(lines, "\n"), "@" .. file, "t", env))
  else
    f = assert(loadfile(file, "bt", env))
  end
  if file == "big.lua" then
    local co = coroutine.wrap(f)
    assert(co() == "b")
    assert(co() == "a")
  else
    f()
  end
end

-- A globals table of its own for one copy, a copy of _G without a
-- metatable (errors.lua, for one, changes _G's); the chunks the copy
-- loads get it too.
local function own_globals()
  local env = {}
  for k, v in pairs(_G) do env[k] = v end
  env._G = env
  env.load = function(chunk, name, mode, ...)
    if select("#", ...) == 0 then return load(chunk, name, mode, env) end
    return load(chunk, name, mode, ...)
  end
  env.loadfile = function(name, mode, ...)
    if select("#", ...) == 0 then return loadfile(name, mode, env) end
    return loadfile(name, mode, ...)
  end
  env.dofile = function(name)
    return assert(env.loadfile(name))()
  end
  return env
end

local function copies(ums, file, skip, n, separate)
  local tasks = {}
  for i = 1, n do
    tasks[i] = ums.spawn(run_file, file, separate and own_globals(), skip)
  end
  for i = 1, n do
    local ok, err, tb = tasks[i]:join()
    if not ok then error(tostring(err) .. "\n" .. tostring(tb), 0) end
  end
end

-- A task that keeps the scheduler busy with others, so the quantum has
-- somebody to yield to; returns a function that stops it.
local function ticker(ums)
  local done = false
  local t = ums.spawn(function()
    while not done do ums.sleep(0.0005) end
  end)
  return function() done = true; assert(t:join()) end
end

local function preempted(ums)
  local n = 0
  for _, row in ipairs(ums.stats()) do
    if not row.hidden then n = n + (row.quantum_expiries or 0) end
  end
  return n
end

local function skipped(file)
  local set = {}
  for line in pairs(by_design[file] or {}) do set[line] = true end
  return set
end

if arg[1] == "--child" then
  local way, file = arg[2], arg[3]
  local skip = skipped(file)
  if way == "plain" or way == "plain3" then
    for _ = 1, way == "plain" and 1 or 3 do run_file(file, nil, skip) end
    return
  elseif way == "plain3own" then
    for _ = 1, 3 do run_file(file, own_globals(), skip) end
    return
  end
  local ums = require "ums"
  if way == "task" then
    ums.run(run_file, file, nil, skip)
  elseif way == "submitted" then
    ums.config{schedulers = 2}
    ums.run(function()
      local ok, err = ums.submit_on(1, run_file, file, nil, skip):join()
      if not ok then error(err, 0) end
    end)
  elseif way == "concurrent" then
    ums.config{schedulers = 1}
    ums.run(copies, ums, file, skip, 3, false)
  elseif way == "preempt" or way == "cpreempt" then
    ums.config{schedulers = 1, preempt = true, quantum = 0.001}
    ums.run(function()
      local stop = ticker(ums)
      if way == "preempt" then
        run_file(file, nil, skip)
      else
        copies(ums, file, skip, 3, true)
      end
      stop()
      io.stderr:write(("luasuite: %d quantum expiries\n"):format(
        preempted(ums)))
    end)
  else
    error("unknown way " .. way)
  end
  return
end

-- ------------------------------------------------------------------------
-- Parent mode: every file, every way, a table.
-- ------------------------------------------------------------------------

local dir = arg[1]
local probe = dir and io.open(dir .. "/all.lua")
if not probe then
  print("luasuite: no Lua test suite given (need the folder holding "
        .. "all.lua): skipped")
  os.exit(0)
end
probe:close()

local ways = {"plain", "task", "command", "submitted", "plain3",
              "concurrent", "preempt", "plain3own", "cpreempt"}
local files = {}
do
  local i = 2
  while arg[i] do
    if arg[i] == "--ways" then
      ways = {}
      for w in arg[i + 1]:gmatch("[^,]+") do ways[#ways + 1] = w end
      i = i + 1
    else
      files[#files + 1] = arg[i]
    end
    i = i + 1
  end
end
if #files == 0 then
  files = {"gc.lua", "db.lua", "calls.lua", "strings.lua", "literals.lua",
           "tpack.lua", "attrib.lua", "gengc.lua", "locals.lua",
           "constructs.lua", "big.lua", "cstack.lua", "nextvar.lua",
           "pm.lua", "utf8.lua", "events.lua", "vararg.lua",
           "closure.lua", "coroutine.lua", "goto.lua", "errors.lua",
           "math.lua", "sort.lua", "bitwise.lua", "verybig.lua",
           "files.lua"}
end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local function abs(p)
  if p:sub(1, 1) == "/" then return p end
  local pwd = os.getenv("PWD") or assert(io.popen("pwd")):read("l")
  return pwd .. "/" .. p
end

root = abs(root)
local self = abs(arg[0])
local lua = os.getenv("LUA54") or "lua5.4"
local build = os.getenv("UMS_BUILD_DIR") or (root .. "/build")
local env = ("LUA_PATH=%s LUA_CPATH=%s"):format(
  q(root .. "/stdlib/?.lua;" .. root .. "/stdlib/?/init.lua;;"),
  q(build .. "/lua-binding/?.so;;"))
local logs = os.getenv("LUASUITE_LOGS") or os.tmpname() .. ".d"
os.execute("mkdir -p " .. q(logs))

-- plain and command: the interpreter's own command line, as all.lua's
-- files are run by hand.
local function command_line(interp, file)
  local set = "_port = true _soft = false _nomsg = true"
  if file == "big.lua" then
    return ("%s -e %s"):format(interp, q(set
      .. " local f = coroutine.wrap(assert(loadfile('big.lua')))"
      .. " assert(f() == 'b') assert(f() == 'a')"))
  end
  return ("%s -e %s %s"):format(interp, q(set), q(file))
end

local function run(way, file)
  local cmd
  local ums_bin = q(lua) .. " " .. q(root .. "/bin/ums")
  if by_design[file] and (way == "plain" or way == "command") then
    -- The same blanked lines for the reference and under the command.
    cmd = ("%s %s --child plain %s"):format(
      way == "plain" and q(lua) or ums_bin, q(self), q(file))
  elseif way == "plain" then
    cmd = command_line(q(lua), file)
  elseif way == "command" then
    cmd = command_line(ums_bin, file)
  else
    cmd = ("%s %s --child %s %s"):format(q(lua), q(self), way, q(file))
  end
  local log = ("%s/%s-%s.log"):format(logs, file:gsub("%.lua$", ""), way)
  local full = ("cd %s && %s timeout 600 %s </dev/null >%s 2>&1"):format(
    q(dir), env, cmd, q(log))
  local ok, how, code = os.execute(full)
  if how == "signal" then code = 128 + code end
  return ok and "pass" or ("FAIL(" .. code .. ")"), log
end

io.write(("%-15s"):format("file"))
for _, w in ipairs(ways) do io.write(("%-11s"):format(w)) end
io.write("\n")
local failed = 0
for _, file in ipairs(files) do
  io.write(("%-15s"):format(file))
  io.flush()
  for _, w in ipairs(ways) do
    local r = run(w, file)
    if r ~= "pass" then failed = failed + 1 end
    io.write(("%-11s"):format(r))
    io.flush()
  end
  io.write("\n")
end
print(("logs in %s; %d failed"):format(logs, failed))
os.exit(failed == 0 and 0 or 1)
