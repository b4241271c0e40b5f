-- The `ums` command (bin/ums), run as a subprocess: `lua5.4 $UMS_BIN ...`.
local sp = require "subprocess"
local it = sp.guard(it, pending)

local function script(src) return sp.temp(src, ".lua") end

-- A script that prints its arg table and its varargs, one per line.
local SHOW_ARGS = [[
local lo = 0
while arg[lo - 1] ~= nil do lo = lo - 1 end
for i = lo, #arg do print("arg[" .. i .. "]=" .. tostring(arg[i])) end
print("n=" .. select("#", ...))
for i = 1, select("#", ...) do print("...[" .. i .. "]=" .. select(i, ...)) end
]]

local function lines(s)
  local t = {}
  for l in s:gmatch("[^\n]*") do if l ~= "" then t[#t + 1] = l end end
  return t
end

describe("ums command", function()
  after_each(sp.cleanup)

  describe("script and arguments", function()
    it("gives the script arg and ... like lua5.4", function()
      local s = script(SHOW_ARGS)
      local r = sp.ums({s, "a", "b c", ""})
      sp.assert_exit(r, 0)
      assert.same({
        "arg[-1]=" .. sp.bin, "arg[0]=" .. s, "arg[1]=a", "arg[2]=b c",
        "arg[3]=", "n=3", "...[1]=a", "...[2]=b c", "...[3]=",
      }, lines(r.stdout))
    end)

    it("puts options before the script at negative indices", function()
      local s = script(SHOW_ARGS)
      local r = sp.ums({"-e", "x = 1", s, "z"})
      sp.assert_exit(r, 0)
      assert.same({
        "arg[-3]=" .. sp.bin, "arg[-2]=-e", "arg[-1]=x = 1", "arg[0]=" .. s,
        "arg[1]=z", "n=1", "...[1]=z",
      }, lines(r.stdout))
    end)

    it("stops handling options at --", function()
      local s = script(SHOW_ARGS)
      local r = sp.ums({"--", s, "-v", "--help"})
      sp.assert_exit(r, 0)
      local out = lines(r.stdout)
      assert.equal("arg[0]=" .. s, out[3])
      assert.equal("arg[1]=-v", out[4])
      assert.equal("arg[2]=--help", out[5])
    end)

    it("runs the main chunk as a task and waits for every task", function()
      local r = sp.ums({script [[
        local ums = require "ums"
        assert(ums.self(), "the main chunk is not a task")
        local t = ums.spawn(function(a) ums.sleep(0.01); return a * 2 end, 21)
        print(t:join())
        ums.spawn(function() ums.sleep(0.05); print("late task ran") end)
        table.sort({3, 1, 2}, function(a, b) ums.yield(); return a < b end)
        print("main chunk ends")
      ]]})
      sp.assert_exit(r, 0)
      assert.same({"true\t42", "main chunk ends", "late task ran"},
                  lines(r.stdout))
    end)

    it("runs a script written for lua5.4 that calls ums.run", function()
      local r = sp.ums({script [[
        local ums = require "ums"
        print(ums.run(function(a)
          local t = ums.spawn(function() ums.sleep(0.01); return a + 1 end)
          return select(2, t:join())
        end, 41))
        -- As from lua5.4: the error, with the task's traceback appended.
        local ok, err = pcall(ums.run, function() error("inner", 0) end)
        print(ok, (err:match("^[^\n]*")), err:find("stack traceback:") ~= nil)
      ]]})
      sp.assert_exit(r, 0)
      assert.same({"42", "false\tinner\ttrue"}, lines(r.stdout))
    end)

    it("returns the main chunk's values to nobody and exits 0", function()
      sp.assert_exit(sp.ums({script "return 1, 2, 3"}), 0)
    end)
  end)

  describe("exit status", function()
    it("is 0 at a normal end", function()
      local r = sp.ums({script "print('ok')"})
      sp.assert_exit(r, 0)
      assert.equal("ok\n", r.stdout)
      assert.equal("", r.stderr)
    end)

    it("is 1 on an error", function()
      sp.assert_exit(sp.ums({script "error('boom')"}), 1)
    end)

    for _, case in ipairs{
      {"os.exit(3)", 3}, {"os.exit(4, true)", 4}, {"os.exit(true)", 0},
      {"os.exit(false)", 1}, {"os.exit()", 0}, {"os.exit(0, true)", 0},
    } do
      it("keeps " .. case[1], function()
        local r = sp.ums({script([[
          local ums = require "ums"
          ums.spawn(function() ums.sleep(3600) end)
          io.stdout:write("before\n")
          ]] .. case[1] .. [[

          print("not reached")
        ]])})
        sp.assert_exit(r, case[2])
        assert.equal("before\n", r.stdout)
      end)
    end

    it("is 1 when the script cannot be loaded", function()
      local r = sp.ums({"/nonexistent/dir/nofile.lua"})
      sp.assert_exit(r, 1)
      assert.matches("^ums: cannot open /nonexistent/dir/nofile.lua", r.stderr)
      r = sp.ums({script "local x = = 1"})
      sp.assert_exit(r, 1)
      assert.matches("^ums: .-%.lua:1: unexpected symbol", r.stderr)
    end)

    it("cancels the other tasks when the main chunk fails", function()
      local r = sp.ums({script [[
        local ums = require "ums"
        ums.spawn(function()
          local _ <close> = setmetatable({}, {__close = function()
            print("cleanup")
          end})
          ums.sleep(3600)
        end)
        ums.sleep(0.01)
        error("main failed")
      ]]}, {timeout = 20})
      sp.assert_exit(r, 1)
      assert.equal("cleanup\n", r.stdout)
    end)
  end)

  describe("error report", function()
    it("prints 'ums: <msg>' and the traceback on stderr", function()
      local s = script [[
        local function inner() error("boom") end
        local function outer() inner() end
        outer()
      ]]
      local r = sp.ums({s})
      sp.assert_exit(r, 1)
      assert.equal("", r.stdout)
      local name = s:match("[^/]*$")
      assert.matches("^ums: [^\n]*" .. name:gsub("%p", "%%%0") ..
                     ":1: boom\nstack traceback:\n", r.stderr)
      assert.matches("in %w* ?'inner'", r.stderr)
      assert.matches("in %w* ?'outer'", r.stderr)
      assert.matches("in main chunk", r.stderr)
    end)

    it("reports a traceback from inside a non-yieldable context", function()
      local r = sp.ums({script [[
        local ums = require "ums"
        table.sort({2, 1}, function() ums.sleep(0); error("in sort") end)
      ]]})
      sp.assert_exit(r, 1)
      assert.matches("^ums: [^\n]*:2: in sort\nstack traceback:", r.stderr)
      assert.matches("sort", r.stderr:match("stack traceback:.*"))
    end)

    it("describes error values that are not strings", function()
      local r = sp.ums({script "error({})"})
      sp.assert_exit(r, 1)
      assert.matches("^ums: %(error object is a table value%)\n" ..
                     "stack traceback:", r.stderr)
      r = sp.ums({script [[
        error(setmetatable({}, {__tostring = function() return "custom" end}))
      ]]})
      sp.assert_exit(r, 1)
      -- As lua.c's handler: the object's string is the whole message.
      assert.equal("ums: custom\n", r.stderr)
      r = sp.ums({script "error(42)"})
      sp.assert_exit(r, 1)
      assert.matches("^ums: 42\nstack traceback:\n", r.stderr)
      r = sp.ums({script "error()"})
      sp.assert_exit(r, 1)
      assert.matches("^ums: %(error object is a nil value%)\n", r.stderr)
    end)

    it("gives load's reader error and a too-deep chunk's as lua5.4 does",
       function()
      -- Lua runs the parser under the caller's message handler: the
      -- command's handler must give what lua.c's gives, a string.
      local s = script [[
        local f, e = load(function() error("reader failed") end)
        print(f, type(e), e)
        f, e = load(function() error({}) end)
        print(f, type(e), e)
        f, e = load(string.rep("(", 300) .. "1" .. string.rep(")", 300))
        print(f, type(e), e)
      ]]
      local r = sp.ums({s})
      sp.assert_exit(r, 0)
      assert.matches("^nil\tstring\t[^\n]*:1: reader failed\n" ..
                     "stack traceback:\n", r.stdout)
      assert.matches("\nnil\tstring\t%(error object is a table value%)\n",
                     r.stdout)
      assert.matches("\nnil\tstring\tC stack overflow\n", r.stdout)
      local plain = sp.lua_run({s})
      sp.assert_exit(plain, 0)
      assert.equal(plain.stdout, r.stdout)
    end)

    it("reports the error of a script that removed the globals it uses",
       function()
      local s = script [[
        local raise = error
        debug, string, io, table = nil, nil, nil, nil
        tostring = function() return "replaced" end
        getmetatable, xpcall, pcall, error = nil, nil, nil, nil
        raise("still reported")
      ]]
      local r = sp.ums({s})
      sp.assert_exit(r, 1)
      assert.matches("^ums: [^\n]*:5: still reported\nstack traceback:\n",
                     r.stderr)
      local plain = sp.lua_run({s})
      assert.equal(plain.stderr:gsub("^lua5%.4: ", "ums: "), r.stderr)
    end)

    it("reports an error of a task nobody joined, and exits 1", function()
      local r = sp.ums({script [[
        local ums = require "ums"
        ums.spawn(function() error("lost task") end)
      ]]})
      assert.is_false(r.timed_out)
      sp.assert_exit(r, 1)
      assert.matches("lost task", r.stderr)
    end)

    it("reports such an error that is not a string as lua5.4 would: by "
       .. "__tostring, or naming its type, then the traceback", function()
      local r = sp.lua_run({script [[
        local ums = require "ums"
        ums.run(function()
          ums.spawn(function() error({code = 1}) end)
          ums.spawn(function()
            error(setmetatable({}, {__tostring = function()
              return "custom error" end}))
          end)
          ums.spawn(function() error(42) end)
          ums.yield()
        end)
      ]]})
      assert.is_false(r.timed_out)
      local pre = "ums: error in a task nobody joined: "
      assert.truthy(r.stderr:find(pre .. "(error object is a table value)\n"
                                  .. "stack traceback:", 1, true), r.stderr)
      assert.truthy(r.stderr:find(pre .. "custom error\nstack traceback:", 1,
                                  true), r.stderr)
      assert.truthy(r.stderr:find(pre .. "42\nstack traceback:", 1, true),
                    r.stderr)
    end)

    it("leaves the status to a script that handles such errors itself",
       function()
      local r = sp.ums({script [[
        local ums = require "ums"
        ums.on_error(function(e) print("handled: " .. tostring(e)) end)
        ums.spawn(function() error("lost task") end)
      ]]})
      sp.assert_exit(r, 0)
      assert.matches("handled: .*lost task", r.stdout)
    end)
  end)

  describe("-e", function()
    it("runs code as a task", function()
      local r = sp.ums({"-e", [[
        local ums = require "ums"
        print(ums.self() ~= nil, select(2, ums.spawn(function()
          ums.sleep(0.001); return "joined" end):join()))
      ]]})
      sp.assert_exit(r, 0)
      assert.equal("true\tjoined\n", r.stdout)
    end)

    it("runs several in order, then the script, in one run", function()
      local s = script "print('script', x, ...)"
      local r = sp.ums({"-e", "print('one'); x = 1", "-eprint('two'); x = x + 1",
                        s, "a"})
      sp.assert_exit(r, 0)
      assert.same({"one", "two", "script\t2\ta"}, lines(r.stdout))
    end)

    it("reports an error in the code with exit 1", function()
      local r = sp.ums({"-e", "error('bad code')"})
      sp.assert_exit(r, 1)
      assert.matches("^ums: %(command line%):1: bad code\nstack traceback:",
                     r.stderr)
      r = sp.ums({"-e", "x = = 1"})
      sp.assert_exit(r, 1)
      assert.matches("^ums: %(command line%):1:", r.stderr)
    end)

    it("without its argument is a usage error", function()
      local r = sp.ums({"-e"})
      sp.assert_exit(r, 2)
      assert.matches("usage: ums", r.stderr)
    end)

    it("-l requires a module into a global", function()
      local r = sp.ums({"-l", "ums", "-e", "print(type(ums.spawn))"})
      sp.assert_exit(r, 0)
      assert.equal("function\n", r.stdout)
    end)
  end)

  describe("information", function()
    it("-v prints the ums and Lua versions", function()
      local r = sp.ums({"-v"})
      sp.assert_exit(r, 0)
      assert.matches("^ums %d+%.%d+%.%d+ %(Lua 5%.4%)\n$", r.stdout)
      -- The module's version, the one the project's CMake writes (asked
      -- of a child: in TSan builds only children can load the module).
      local m = sp.ums({"-e", "io.write(require('ums')._VERSION)"})
      sp.assert_exit(m, 0)
      assert.matches("^ums %d+%.%d+%.%d+$", m.stdout)
      assert.equal(m.stdout .. " (Lua 5.4)\n", r.stdout)
    end)

    it("-v then a script runs the script", function()
      local r = sp.ums({"-v", "-e", "print('ran')"})
      sp.assert_exit(r, 0)
      assert.matches("^ums [^\n]*\nran\n$", r.stdout)
    end)

    for _, opt in ipairs{"--help", "-h"} do
      it(opt .. " prints the usage on stdout", function()
        local r = sp.ums({opt})
        sp.assert_exit(r, 0)
        assert.matches("^usage: ums %[options%] %[script %[args%]%]", r.stdout)
        for _, word in ipairs{"-e", "-v", "UMS_SCHEDULERS", "UMS_QUANTUM",
                              "UMS_MAX_WORKERS", "UMS_STACK_SIZE",
                              "UMS_WORKER_IDLE_TIMEOUT",
                              "UMS_IDLE_WORKERS_KEPT"} do
          assert.truthy(r.stdout:find(word, 1, true), word)
        end
        assert.equal("", r.stderr)
      end)
    end
  end)

  describe("stdin", function()
    it("'-' reads the script from stdin, with arguments", function()
      local r = sp.ums({"-", "x", "y"}, {stdin = [[
        local ums = require "ums"
        ums.sleep(0.001)
        print(arg[0], ...)
      ]]})
      sp.assert_exit(r, 0)
      assert.equal("-\tx\ty\n", r.stdout)
    end)

    it("reports an error from stdin", function()
      local r = sp.ums({"-"}, {stdin = "error('from stdin')"})
      sp.assert_exit(r, 1)
      assert.matches("^ums: stdin:1: from stdin", r.stderr)
    end)
  end)

  describe("environment settings", function()
    local SHOW_CONFIG = [[
      local c = require("ums").config()
      for _, k in ipairs{"schedulers", "max_workers", "quantum", "stack_size",
                         "worker_idle_timeout", "idle_workers_kept"} do
        print(k, c[k])
      end
    ]]

    it("are applied before the run", function()
      local r = sp.ums({script(SHOW_CONFIG)}, {env = {
        UMS_SCHEDULERS = "2", UMS_MAX_WORKERS = "7", UMS_QUANTUM = "0.25",
        UMS_STACK_SIZE = "524288", UMS_WORKER_IDLE_TIMEOUT = "1.5",
        UMS_IDLE_WORKERS_KEPT = "3"}})
      sp.assert_exit(r, 0)
      assert.same({"schedulers\t2", "max_workers\t7", "quantum\t0.25",
                   "stack_size\t524288", "worker_idle_timeout\t1.5",
                   "idle_workers_kept\t3"}, lines(r.stdout))
    end)

    it("leave the defaults when unset or empty", function()
      local plain = sp.lua_run({"-e", SHOW_CONFIG})
      sp.assert_exit(plain, 0)
      local r = sp.ums({script(SHOW_CONFIG)}, {env = {UMS_QUANTUM = ""}})
      sp.assert_exit(r, 0)
      assert.equal(plain.stdout, r.stdout)
    end)

    it("accept 0 for quantum (off) and k/m suffixes for the stack size",
       function()
      local r = sp.ums({script(SHOW_CONFIG)},
                       {env = {UMS_QUANTUM = "0", UMS_STACK_SIZE = "512k"}})
      sp.assert_exit(r, 0)
      assert.truthy(r.stdout:find("quantum\t0", 1, true))
      assert.truthy(r.stdout:find("stack_size\t524288", 1, true))
    end)

    it("are in force in the run: a CPU hog does not starve others "
       .. "(UMS_PREEMPT=1)", function()
      local r = sp.ums({script [[
        local ums = require "ums"
        local stop = false
        ums.spawn(function() while not stop do end end)
        ums.sleep(0.05)
        stop = true
        print("not starved")
      ]]}, {env = {UMS_QUANTUM = "0.002", UMS_PREEMPT = "1"}})
      sp.assert_exit(r, 0)
      assert.equal("not starved\n", r.stdout)
    end)

    for _, bad in ipairs{
      {"UMS_SCHEDULERS", "abc"}, {"UMS_SCHEDULERS", "0"},
      {"UMS_SCHEDULERS", "1.5"}, {"UMS_MAX_WORKERS", "-1"},
      {"UMS_MAX_WORKERS", "many"}, {"UMS_QUANTUM", "fast"},
      {"UMS_QUANTUM", "-1"}, {"UMS_QUANTUM", "nan"},
      {"UMS_STACK_SIZE", "10"}, {"UMS_STACK_SIZE", "big"},
      {"UMS_WORKER_IDLE_TIMEOUT", "soon"}, {"UMS_IDLE_WORKERS_KEPT", "1.5"},
      {"UMS_IDLE_WORKERS_KEPT", "-2"},
    } do
      it(("%s=%s exits 2 naming the variable"):format(bad[1], bad[2]),
         function()
        local r = sp.ums({"-e", "print('ran')"}, {env = {[bad[1]] = bad[2]}})
        sp.assert_exit(r, 2)
        assert.equal("", r.stdout)
        assert.matches("^ums: [^\n]*" .. bad[1], r.stderr)
      end)
    end
  end)

  describe("usage errors", function()
    for _, args in ipairs{{"-x"}, {"--frobnicate"}, {"-vx"}, {"-i"}, {}} do
      it("'" .. table.concat(args, " ") .. "' prints the usage and exits 2",
         function()
        local r = sp.ums(args)
        sp.assert_exit(r, 2)
        assert.equal("", r.stdout)
        assert.matches("usage: ums", r.stderr)
      end)
    end
  end)
end)
