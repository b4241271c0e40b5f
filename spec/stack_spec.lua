-- Specs for task stacks: at the smallest stack_size accepted, code that
-- nests as deep as Lua allows (LUAI_MAXCCALLS nested C calls) gets Lua's
-- own errors, never a crash; copies of deeply nested tables work; calls
-- that need a large stack or may block (ums.ffi.load's dlopen) run off the
-- scheduler. Every case runs in a child process (under `timeout`), so
-- that a crash or a hang fails the spec instead of Busted, and so that
-- under TSan only the children need the sanitizer preloaded (Busted's own
-- process never loads ums).

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local root = here .. "../"
-- As spec/helper.lua finds the modules, without loading them.
if not package.searchpath("ums.sync", package.path) then
  package.path = root .. "stdlib/?.lua;" .. root .. "stdlib/?/init.lua;"
    .. package.path
end
if not package.searchpath("ums.core", package.cpath) then
  package.cpath = (os.getenv("UMS_BUILD_DIR") or (root .. "build"))
    .. "/lua-binding/?.so;" .. package.cpath
end
package.path = here .. "?.lua;" .. package.path
local sp = require "subprocess"

local sit = sp.guard(it, pending)

-- Runs body (Lua source) in a child: ums is loaded and configured with the
-- smallest stack; what the body prints is the child's stdout. Asserts that
-- the child exited with status 0, without a crash report. The quantum is
-- off: a task made to yield half-way down its nested pcalls leaves the C
-- stack, and Lua then counts the nesting afresh, so where the overflow
-- comes would depend on the machine's speed.
local function child(body, opts)
  local script = sp.temp(([==[
    package.path = %q
    package.cpath = %q
    local ums = require "ums"
    ums.config{stack_size = ums.STACK_SIZE_MIN, schedulers = 1,
                quantum = 0}
    %s
  ]==]):format(package.path, package.cpath, body), ".lua")
  local r = sp.lua_run({script}, {timeout = (opts or {}).timeout or 60})
  sp.assert_exit(r, 0)
  return r.stdout, r
end

describe("stack_size", function()
  after_each(sp.cleanup)

  sit("is refused below the minimum, with a message naming it", function()
    local out = child[[
      print(ums.STACK_SIZE_MIN, ums.config().stack_size)
      for _, v in ipairs{16384, 65536, ums.STACK_SIZE_MIN - 1} do
        print(pcall(ums.config, {stack_size = v}))
      end
      print(ums.config().stack_size)
    ]]
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal("524288\t524288", lines[1], out)
    for i, v in ipairs{16384, 65536, 524287} do
      local l = lines[i + 1]
      assert.matches("^false\t", l)
      assert.matches("'stack_size' must be an integer number of bytes " ..
                     "from 524288 to 1073741824 (ums.STACK_SIZE_MIN and " ..
                     "up), got " .. v, l, 1, true)
    end
    assert.equal("524288", lines[5], out)
  end)
end)

describe("at the smallest stack", function()
  after_each(sp.cleanup)

  sit("nested pcalls, callbacks and metamethods raise Lua's errors",
      function()
    local out = child[[
      local function depth(f)
        local ok, err = pcall(f, 250)
        print(ok, (tostring(err):gsub("^.*:%d+: ", "")))
      end
      print(ums.run(function()
        local t = ums.spawn(function()
          depth(function(n)
            local function f(k)
              if k == 0 then return end
              local ok, e = pcall(f, k - 1)
              if not ok then error(e, 0) end
            end
            f(n)
          end)
          -- The costliest level: gsub's match state and buffer.
          depth(function(n)
            local function g(k)
              if k == 0 then return "" end
              return (string.gsub("a", "a", function() return g(k - 1) end))
            end
            g(n)
          end)
          depth(function(n)
            local function s(k)
              if k == 0 then return end
              local once = false
              table.sort({3, 1, 2}, function(a, b)
                if not once then once = true; s(k - 1) end
                return a < b
              end)
            end
            s(n)
          end)
          depth(function(n)
            local mt = {}
            mt.__index = function(_, k)
              if k == 0 then return 0 end
              return setmetatable({}, mt)[k - 1]
            end
            return setmetatable({}, mt)[n]
          end)
          depth(function(n)
            local function c(k)
              if k == 0 then return end
              return coroutine.wrap(function() return c(k - 1) end)()
            end
            c(n)
          end)
          depth(function(n)
            assert(load("return " .. ("("):rep(n) .. "1" .. (")"):rep(n)))
          end)
          -- A message handler that raises again, at every level.
          local function h(m) error(m, 0) end
          local function x(k)
            if k == 0 then error("bottom", 0) end
            local ok, e = xpcall(x, h, k - 1)
            if not ok then error(e, 0) end
          end
          print(pcall(x, 250))
          return "alive"
        end)
        return t:join()
      end))
    ]]
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    for i = 1, 6 do
      assert.equal("false\tC stack overflow", lines[i], out)
    end
    assert.equal("false\terror in error handling", lines[7], out)
    assert.equal("true\talive", lines[8], out)
  end)

  sit("a table nested 40 deep, or to the copy's limit, is copied; deeper " ..
      "raises", function()
    local out = child[[
      local function nest(n)
        local t = {}
        local c = t
        for _ = 1, n do c[1] = {}; c = c[1] end
        return t
      end
      local function count(x)
        local d = 0
        while x[1] do x = x[1]; d = d + 1 end
        return d
      end
      local function get(w)
        local ok, v = w:join()
        assert(ok, v)
        return v
      end
      print(ums.run(function()
        local a = get(ums.submit(count, nest(40)))
        local b = get(ums.submit(count, nest(199)))
        -- Results are copies too, and the copy may start deep in a
        -- task's stack: under 190 nested gsub callbacks here.
        local c
        local function g(k)
          if k == 0 then
            c = get(ums.submit(function(n)
              local t = {}
              local x = t
              for _ = 1, n do x[1] = {}; x = x[1] end
              return t
            end, 199))
            return ""
          end
          return (string.gsub("a", "a", function() return g(k - 1) end))
        end
        g(190)
        local ok, err = pcall(ums.submit, count, nest(300))
        return a, b, count(c), ok, err:match("tables nested too deeply")
      end))
    ]]
    assert.equal("40\t199\t199\tfalse\ttables nested too deeply\n", out)
  end)

  -- glibc's dlopen copies the name onto the stack it runs on.
  sit("ums.ffi.load with a 4,000-character name, or one larger than the " ..
      "stack, raises a clear error", function()
    local out = child[[
      print(ums.run(function()
        local r = {}
        for _, n in ipairs{4000, ums.STACK_SIZE_MIN + 4096} do
          local ok, err = pcall(ums.ffi.load, ("x"):rep(n))
          r[#r + 1] = ok
          r[#r + 1] = err:match("^ums%.ffi%.load: cannot load library 'x+'")
                      ~= nil
        end
        return table.unpack(r)
      end))
    ]]
    assert.equal("false\ttrue\tfalse\ttrue\n", out)
  end)
end)

describe("ums.ffi.load", function()
  after_each(sp.cleanup)

  -- dlopen of a FIFO blocks in open() until a writer comes: on the
  -- scheduler thread it would stop every task of the scheduler, the one
  -- that is to write included.
  sit("does not stall the other tasks of its scheduler", function()
    local fifo = os.tmpname()
    os.remove(fifo)
    assert(os.execute("mkfifo " .. sp.q(fifo)))
    local ok, out = pcall(child, ([[
      local fifo = %q
      print(ums.run(function()
        local ticks, loaded = 0, false
        local loader = ums.spawn(function()
          local ok, err = pcall(ums.ffi.load, fifo)
          loaded = true
          return ok, err:match("cannot load library") ~= nil, ticks
        end)
        local ticker = ums.spawn(function()
          while ticks < 3 do
            ums.sleep(0.01)
            ticks = ticks + 1
          end
          local before = loaded
          -- dlopen is reading, or about to: this open does not wait long.
          local f = assert(io.open(fifo, "w"))
          f:write("x")
          f:close()
          return before
        end)
        local _, still_loading = ticker:join()
        local _, ok, clear, ticked = loader:join()
        return still_loading, ok, clear, ticked
      end))
    ]]):format(fifo), {timeout = 30})
    os.remove(fifo)
    assert(ok, out)
    assert.equal("false\tfalse\ttrue\t3\n", out)
  end)
end)
