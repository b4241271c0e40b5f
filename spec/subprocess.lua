-- Helpers for specs that run lua5.4 or the ums command as a subprocess
-- (cli_spec, exit_spec, examples_spec). Not a spec itself.
--
-- The environment comes from spec/CMakeLists.txt: LUA_PATH and LUA_CPATH
-- point at the build, UMS_BIN at bin/ums, UMS_EXAMPLES at examples/, and
-- sanitizer builds set LD_PRELOAD, which the children inherit.
local M = {}

M.lua = os.getenv("UMS_LUA") or "lua5.4"
M.bin = os.getenv("UMS_BIN") or "bin/ums"
M.examples = os.getenv("UMS_EXAMPLES") or "examples"

-- /bin/sh (dash, and bash too) crashes at start with libtsan preloaded,
-- and io.popen / os.execute always go through it: under the TSan build
-- (LD_PRELOAD holding libtsan) no subprocess can be started, so these
-- specs are reported pending there. If UMS_CHILD_LD_PRELOAD is set, the
-- children get it as their LD_PRELOAD (a build can then run the specs
-- without preloading the shell).
local preload = os.getenv("LD_PRELOAD") or ""
if preload:find("libtsan", 1, true) then
  M.unavailable = "no subprocess under a TSan preload: /bin/sh crashes " ..
                  "with libtsan preloaded"
end
M.child_preload = os.getenv("UMS_CHILD_LD_PRELOAD")

--- Wraps busted's `it` so that the test is pending where subprocesses
-- cannot run: `local it = sp.guard(it, pending)`.
function M.guard(it_, pending_)
  return function(name, fn)
    return it_(name, function(...)
      if M.unavailable then return pending_(M.unavailable) end
      return fn(...)
    end)
  end
end

--- Quotes s for /bin/sh.
function M.q(s)
  return "'" .. tostring(s):gsub("'", [['\'']]) .. "'"
end

local temps = {}

--- Writes content to a fresh temporary file; returns its name.
function M.temp(content, suffix)
  local name = os.tmpname()
  if suffix then
    os.remove(name)
    name = name .. suffix
  end
  local f = assert(io.open(name, "wb"))
  f:write(content or "")
  f:close()
  temps[#temps + 1] = name
  return name
end

--- Removes every file made by M.temp.
function M.cleanup()
  for _, name in ipairs(temps) do os.remove(name) end
  temps = {}
end

--- The contents of file `name`, or "" if it cannot be opened.
local function slurp(name)
  local f = io.open(name, "rb")
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end
M.slurp = slurp

--- Runs a shell command line under `timeout`. opts: env (table of
-- NAME = value), stdin (a string), timeout (seconds, default 20).
-- Returns {code = exit status, how = "exit" | "signal", stdout, stderr,
-- timed_out = boolean, cmd = the command line}.
function M.sh(cmdline, opts)
  opts = opts or {}
  local env = {}
  for k, v in pairs(opts.env or {}) do env[k] = v end
  if M.child_preload then env.LD_PRELOAD = M.child_preload end
  local names = {}
  for k in pairs(env) do names[#names + 1] = k end
  table.sort(names)
  local parts = {}
  if #names > 0 then
    parts[1] = "env"
    for _, k in ipairs(names) do parts[#parts + 1] = M.q(k .. "=" .. env[k]) end
  end
  for _, p in ipairs{"timeout", "-k", "5", tostring(opts.timeout or 20)} do
    parts[#parts + 1] = p
  end
  local errf = M.temp()
  local inf = M.temp(opts.stdin or "")
  local cmd = table.concat(parts, " ") .. " " .. cmdline ..
              " <" .. M.q(inf) .. " 2>" .. M.q(errf)
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("a")
  local _, how, code = p:close()
  local r = {code = code, how = how, stdout = out, stderr = slurp(errf),
             cmd = cmd}
  -- timeout(1): 124 when it had to stop the command, 137 when it killed it.
  r.timed_out = how == "exit" and (code == 124 or code == 137)
  return r
end

--- Runs `lua5.4 <args...>` (each argument quoted).
function M.lua_run(args, opts)
  local q = {}
  for i, a in ipairs(args) do q[i] = M.q(a) end
  return M.sh(M.q(M.lua) .. " " .. table.concat(q, " "), opts)
end

--- Runs `lua5.4 $UMS_BIN <args...>`.
function M.ums(args, opts)
  local all = {M.bin}
  for _, a in ipairs(args) do all[#all + 1] = a end
  return M.lua_run(all, opts)
end

--- A one-line description of a result, for assertion messages.
function M.describe(r)
  return ("command: %s\nexit: %s %s\nstdout:\n%s\nstderr:\n%s"):format(
    r.cmd, tostring(r.how), tostring(r.code), r.stdout, r.stderr)
end

-- What a crash leaves on stderr: shells, glibc, the sanitizers.
local CRASH = {"Segmentation fault", "Aborted", "core dumped",
               "AddressSanitizer", "ThreadSanitizer",
               "UndefinedBehaviorSanitizer", "runtime error:",
               "double free", "corrupted", "stack smashing"}

--- The first crash marker found in s, or nil.
function M.crash_marker(s)
  for _, m in ipairs(CRASH) do
    if s:find(m, 1, true) then return m end
  end
  return nil
end

--- Asserts that r ended by exiting (no signal, no timeout, no crash
-- report) with the status `code`.
function M.assert_exit(r, code)
  assert(not r.timed_out, "the command hung (timeout)\n" .. M.describe(r))
  assert(r.how == "exit", "the command died of a signal\n" .. M.describe(r))
  local m = M.crash_marker(r.stderr)
  assert(not m, "crash report (" .. tostring(m) .. ") on stderr\n" ..
         M.describe(r))
  assert(r.code == code, ("exit status %s, expected %s\n"):format(
         tostring(r.code), tostring(code)) .. M.describe(r))
end

return M
