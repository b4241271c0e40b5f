-- As C stdio does for its streams, the exit writes what every open
-- ums.fs file still buffers, whichever VM opened it and whichever thread
-- calls exit(). Every case runs in a subprocess (under `timeout`).
local sp = require "subprocess"
local it = sp.guard(it, pending)

describe("os.exit flushes ums.fs files", function()
  after_each(sp.cleanup)

  local function slurp(name)
    local f = assert(io.open(name, "rb"))
    local s = f:read("a")
    f:close()
    return s
  end

  -- Runs body (with OUT set to a fresh file's name, and EXIT to the exit
  -- call) and checks the status and what the file holds.
  local function check(body, exit, opts)
    opts = opts or {}
    local out = sp.temp("")
    local s = sp.temp(("local OUT = %q\n"):format(out) ..
                      body:gsub("EXIT", exit), ".lua")
    local r = opts.ums and sp.ums({s}) or sp.lua_run({s})
    sp.assert_exit(r, 0)
    local got = slurp(out)
    if opts.unordered then
      -- The files are written in no particular order: compare the lines.
      local lines = {}
      for l in got:gmatch("[^\n]+") do lines[#lines + 1] = l end
      table.sort(lines)
      got = table.concat(lines, "\n") .. "\n"
    end
    assert.equal(opts.expect or "line\n", got, sp.describe(r))
  end

  for _, exit in ipairs{"os.exit(0)", "os.exit(0, true)"} do
    describe(exit, function()
      it("from a task", function()
        check([[
          local ums = require "ums"
          ums.run(function()
            ums.spawn(function() ums.sleep(30) end)
            local f = assert(ums.fs.open(OUT, "w"))
            f:write("line\n")
            EXIT
          end)
        ]], exit)
      end)

      it("from the main chunk outside ums.run", function()
        check([[
          local ums = require "ums"
          local f = assert(ums.fs.open(OUT, "w"))
          f:write("line\n")
          EXIT
        ]], exit)
      end)

      it("after a run, for a file a task opened", function()
        check([[
          local ums = require "ums"
          local f = ums.run(function()
            local f = assert(ums.fs.open(OUT, "w"))
            f:write("line\n")
            return f
          end)
          EXIT
        ]], exit)
      end)

      it("under the ums command", function()
        check([[
          local ums = require "ums"
          ums.spawn(function() ums.sleep(30) end)
          local f = assert(ums.fs.open(OUT, "w"))
          f:write("line\n")
          EXIT
        ]], exit, {ums = true})
      end)

      it("for a file another VM opened and keeps open", function()
        check([[
          local ums = require "ums"
          ums.config{schedulers = 2}
          ums.run(function()
            local w = ums.submit_on(1, function(out)
              local ums = require "ums"
              KEEP = assert(ums.fs.open(out, "w"))
              KEEP:write("line\n")
              return true
            end, OUT)
            assert(w:join())
            EXIT
          end)
        ]], exit)
      end)
    end)
  end

  -- A task that calls the C exit() itself (the real os.exit kept from
  -- before the run) runs the exit handlers on its scheduler's thread
  -- while the other scheduler's thread still runs: the files of both
  -- VMs are written all the same.
  it("when a scheduler thread calls exit() with others running", function()
    check([[
      local ums = require "ums"
      local c_exit = os.exit
      ums.config{schedulers = 2}
      ums.run(function()
        local w = ums.submit_on(1, function(out)
          local ums = require "ums"
          KEEP = assert(ums.fs.open(out, "a"))
          KEEP:write("other VM\n")
          return true
        end, OUT)
        assert(w:join())
        ums.submit_on(1, function() require("ums").sleep(30) end)
        local f = assert(ums.fs.open(OUT, "a"))
        f:write("main VM\n")
        c_exit(0)
      end)
    ]], "", {expect = "main VM\nother VM\n", unordered = true})
  end)

  -- The same from a thread of the preemptive pool, where a C function
  -- called through ums.ffi runs while its task's scheduler goes on.
  it("when a C function calls exit() on the preemptive pool", function()
    check([[
      local ums = require "ums"
      ums.config{schedulers = 2}
      ums.run(function()
        local w = ums.submit_on(1, function(out)
          local ums = require "ums"
          KEEP = assert(ums.fs.open(out, "a"))
          KEEP:write("other VM\n")
          return true
        end, OUT)
        assert(w:join())
        local f = assert(ums.fs.open(OUT, "a"))
        f:write("main VM\n")
        ums.ffi.cdef("void exit(int);")
        ums.ffi.C.exit(0)
      end)
    ]], "", {expect = "main VM\nother VM\n", unordered = true})
  end)
end)
