-- Specs for many VMs: ums.submit / ums.submit_on (work submitted by value
-- to the VM of another scheduler), copying values between VMs, shared
-- objects (ums.shared.*, {shared = true}), placement and stealing, the
-- init module, cancellation, errors from other VMs and the end of a run
-- (lua-binding/lvm.c, lcopy.c, lshared.c).
--
-- Every run here has two schedulers, so work really runs on two OS
-- threads in two VMs. Nothing asserts on timing: where a spec needs one
-- scheduler busy, it keeps it busy by computing without yielding
-- (quantum 0), which no amount of machine noise can undo, and waits only
-- with generous deadlines that fail the spec instead of hanging it.

local ums = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
  .. "helper.lua")
local core = require "ums.core"

local CANCELLED = core.CANCELLED
local pack, unpack = table.pack, table.unpack

-- Runs body as the first task of a fresh run with `n` schedulers (2 by
-- default) and the settings in extra; fails on error, on a timeout (30 s:
-- TSan is slow) and on an error nobody joined.
local function run(body, opts)
  opts = opts or {}
  local prev = ums.config()
  local cfg = {schedulers = opts.schedulers or 2,
               quantum = opts.quantum or prev.quantum,
               preempt = opts.preempt or false,
               init = opts.init or false}
  ums.config(cfg)
  local ok, err = pcall(ums.test, body, opts.limit or 30)
  ums.config{schedulers = prev.schedulers, quantum = prev.quantum,
             preempt = prev.preempt, init = prev.init}
  if not ok then error(err, 0) end
end

-- Joins w, asserts it ended normally, returns its results (packed).
local function results(w, timeout)
  local r = pack(w:join(timeout or 20))
  assert(r[1] == true, "work did not end normally: " .. tostring(r[2])
    .. "\n" .. tostring(r[3]))
  return pack(unpack(r, 2, r.n))
end

-- Asserts that f raises an error containing each of the strings given.
local function assert_raises(f, ...)
  local ok, err = pcall(f)
  assert(not ok, "did not raise")
  err = tostring(err)
  for _, want in ipairs {...} do
    assert(err:find(want, 1, true),
      ("error %q does not contain %q"):format(err, want))
  end
  return err
end

-- Waits (sleeping) until pred() is true; fails after `limit` seconds.
local function wait_until(pred, what, limit)
  local deadline = ums.now() + (limit or 20)
  while not pred() do
    assert(ums.now() < deadline, "gave up waiting for " .. what)
    ums.sleep(0.001)
  end
end

-- An identity function for submit: what it gets, it gives back.
local function echo(...) return ... end

-- Submits fn(...) to scheduler 1 and makes sure it starts there: the
-- main task keeps scheduler 0 busy until the work has started, never
-- yielding (the run must have quantum = 0), so scheduler 0 cannot steal
-- it. Returns the handle.
local function on1(fn, ...)
  local started = ums.shared.event(true)
  local w = ums.submit_on(1, function(started, fn, ...)
    started:set()
    return fn(...)
  end, started, fn, ...)
  local t0 = os.time()
  while not started:is_set() and os.time() - t0 < 20 do end
  assert(started:is_set(), "the work never started on scheduler 1")
  return w
end

-- ---------------------------------------------------------------------
describe("ums.submit copies", function()
  it("nil, booleans, integers and floats (kept apart), strings", function()
    run(function()
      local big = ("x\0y"):rep(100000)
      local inf, nan = math.huge, 0 / 0
      local r = results(ums.submit(echo, nil, true, false, 0, 1, -1,
        math.maxinteger, math.mininteger, 1.0, -0.0, 0.5, inf, -inf, nan,
        "", "a\0b", big, nil))
      assert.equal(18, r.n)
      assert.is_nil(r[1])
      assert.is_true(r[2])
      assert.is_false(r[3])
      for i, v in ipairs {0, 1, -1, math.maxinteger, math.mininteger} do
        assert.equal("integer", math.type(r[3 + i]))
        assert.equal(v, r[3 + i])
      end
      for i, v in ipairs {1.0, -0.0, 0.5, inf, -inf} do
        assert.equal("float", math.type(r[8 + i]))
        assert.equal(v, r[8 + i])
      end
      assert.equal(-math.huge, 1 / r[10])  -- the sign of -0.0 survives
      assert.is_true(r[14] ~= r[14])       -- NaN
      assert.equal("", r[15])
      assert.equal("a\0b", r[16])
      assert.equal(big, r[17])
      assert.is_nil(r[18])
    end)
  end)

  it("the integer/float distinction inside the other VM too", function()
    run(function()
      local r = results(ums.submit(function(a, b, t)
        return math.type(a), math.type(b), math.type(t[1]), math.type(t.f)
      end, 3, 3.0, {7, f = 7.0}))
      assert.same({"integer", "float", "integer", "float"},
        {unpack(r, 1, 4)})
    end)
  end)

  it("nested tables, shared references, cycles and table keys", function()
    run(function()
      local shared = {name = "shared"}
      local t = {1, 2, 3, nested = {deep = {deeper = {"bottom"}}},
                 a = shared, b = shared, [10] = "ten", [2.5] = "float key",
                 [true] = "bool key"}
      t.self = t
      local key = {"key"}
      t[key] = "table key"
      local r = results(ums.submit(function(x)
        -- In the other VM: the same shape, built there.
        assert(x.self == x, "cycle")
        assert(x.a == x.b, "shared reference")
        local nkeys = 0
        for k, v in pairs(x) do
          if type(k) == "table" then
            assert(k[1] == "key" and v == "table key")
            nkeys = nkeys + 1
          end
        end
        assert(nkeys == 1)
        x.added = "in the other VM"
        return x, x.a
      end, t))
      local c, a = r[1], r[2]
      assert.are_not.equal(t, c)            -- a copy ...
      assert.is_nil(t.added)                -- ... the original is untouched
      assert.equal("in the other VM", c.added)
      assert.equal(c, c.self)
      assert.equal(c.a, c.b)
      assert.equal(a, c.a)                  -- identity across the results
      assert.same({1, 2, 3}, {c[1], c[2], c[3]})
      assert.equal("bottom", c.nested.deep.deeper[1])
      assert.equal("ten", c[10])
      assert.equal("float key", c[2.5])
      assert.equal("bool key", c[true])
      local keys = 0
      for k in pairs(c) do if type(k) == "table" then keys = keys + 1 end end
      assert.equal(1, keys)
    end)
  end)

  it("functions without upvalues but _ENV, which see the new VM's globals",
    function()
      run(function()
        local r = results(ums.submit(function(f, t)
          return f(20), t.g(1), type(rawget(_G, "ums")), type(string.format)
        end, function(x) return x + 1 end,
           {g = function(x) return tostring(x) .. math.type(x) end}))
        -- `ums` is a local of this file, not a global of the other VM.
        assert.same({21, "1integer", "nil", "function"}, {unpack(r, 1, 4)})
        -- A function comes back as a function.
        local back = results(ums.submit(function()
          return function(a, b) return a * b end
        end))
        assert.equal(42, back[1](6, 7))
      end)
    end)

  it("shared objects by reference, one proxy per VM", function()
    run(function()
      local ch = ums.shared.channel(4)
      local r = results(ums.submit(function(a, b, t)
        a:send("from the other VM")
        return rawequal(a, b), rawequal(a, t.ch), a
      end, ch, ch, {ch = ch}))
      assert.is_true(r[1])
      assert.is_true(r[2])
      assert.equal(ch, r[3])  -- back home: the same proxy
      assert.equal("from the other VM", ch:recv())
    end)
  end)

  it("the work's results and its handle across VMs", function()
    run(function()
      -- Work that submits work, and joins work another VM submitted.
      local inner = ums.submit_on(0, function() return "inner" end)
      local r = results(on1(function(w)
        local ums = require "ums"
        local ok, v = w:join(10)
        local nested = ums.submit_on(0, function(x) return x * 2 end, 21)
        return ok, v, select(2, nested:join(10)), ums.scheduler()
      end, inner))
      assert.same({true, "inner", 42, 1}, {unpack(r, 1, 4)})
    end, {quantum = 0})
  end)
end)

describe("scheduler numbers", function()
  it("count from 0 in ums.scheduler, submit_on, work:scheduler, "
     .. "ums.tasks and ums.stats alike", function()
    run(function()
      local here = ums.scheduler()
      assert.equal(0, here)
      local mine
      for _, t in ipairs(ums.tasks()) do
        if t.id == ums.self():id() then mine = t end
      end
      assert.equal(here, mine.scheduler)
      assert.equal(here, ums.stats()[here + 1].id)
      local w = on1(function()
        local u = require "ums"
        for _, t in ipairs(u.tasks()) do
          if t.id == u.self():id() then return u.scheduler(), t.scheduler end
        end
      end)
      local r = results(w)
      assert.same({1, 1}, {r[1], r[2]})
      assert.equal(1, w:scheduler())
    end, {quantum = 0})
  end)
end)

describe("work handles", function()
  it("join with a timeout, then again; several joiners in several VMs",
    function()
      run(function()
        local go = ums.shared.event(true)
        local w = ums.submit(function(go)
          go:wait()
          return "result", {n = 1}
        end, go)
        assert.same({nil, "timeout"}, {w:join(0.01)})
        assert.same({nil, "timeout"}, {w:join(0)})
        -- Another joiner, in a VM of its own (or this one, if stolen).
        local other = ums.submit(function(w)
          local ok, v, t = w:join(20)
          return ok, v, t.n
        end, w)
        wait_until(function() return other:status() == "running" end,
          "the other joiner")
        go:set()
        local r = results(w)
        assert.equal("result", r[1])
        assert.same({n = 1}, r[2])
        assert.same({true, "result", 1}, {unpack(results(other), 1, 3)})
        -- Done: joins keep giving the same outcome, fresh copies each.
        local again = results(w)
        assert.same({n = 1}, again[2])
        assert.are_not.equal(r[2], again[2])
        assert.equal("done", w:status())
      end)
    end)

  it("work cannot join itself", function()
    run(function()
      local ch = ums.shared.channel(1)
      local w = ums.submit(function(ch)
        local me = ch:recv(20)
        return pcall(me.join, me)
      end, ch)
      ch:send(w)
      local r = results(w)
      assert.is_false(r[1])
      assert.matches("work cannot join itself", r[2])
    end)
  end)
end)

-- ---------------------------------------------------------------------
describe("ums.submit refuses values it cannot copy", function()
  local function refused(msg, ...)
    local args = pack(...)
    run(function()
      assert_raises(function() ums.submit(echo, unpack(args, 1, args.n)) end,
        "bad argument #", "to 'submit'", msg)
    end)
  end

  it("naming each value and its path", function()
    local up = 1
    local function with_up() return up end
    refused("args[2].config.callback: function with upvalues (up)",
      1, {config = {callback = with_up}})
    refused("args[1]: userdata (FILE*)", io.stdout)
    refused("args[1].list[3]: thread (a coroutine)",
      {list = {1, 2, coroutine.create(print)}})
    refused("args[1]: C function", print)
    refused("args[1].id: light userdata", {id = debug.upvalueid(with_up, 1)})
    refused("args[1][\"a key\"]: table with a metatable",
      {["a key"] = setmetatable({}, {})})
    refused("args[1][<key>]: userdata (FILE*)", {[io.stderr] = true})
    refused("args[2]: table with a metatable", 1, setmetatable({}, {}))
  end)

  it("with hints for ums objects that are not shared", function()
    refused("args[1]: ums.channel is not shared (create it with "
            .. "{shared = true} or ums.shared.channel)", ums.channel())
    refused("args[1]: ums.mutex is not shared", ums.mutex())
    refused("args[1]: ums.waitgroup is not shared", ums.waitgroup())
    run(function()
      assert_raises(function() ums.submit(echo, ums.self()) end,
        "args[1]: ums.task (a task stays in its VM")
    end)
  end)

  it("tables nested too deeply", function()
    local deep = {}
    local t = deep
    for _ = 1, 300 do t.next = {}; t = t.next end
    refused("tables nested too deeply", deep)
  end)

  it("a function with upvalues as the work itself", function()
    local up = 0
    run(function()
      assert_raises(function() ums.submit(function() return up end) end,
        "bad argument #1 to 'submit' (fn: function with upvalues (up))")
    end)
  end)

  it("results it cannot copy fail the work, naming them", function()
    run(function()
      local ok, err = ums.submit(function()
        return 1, coroutine.create(print)
      end):join(20)
      assert.is_false(ok)
      assert.matches("cannot copy the results: results%[2%]: thread", err)
    end)
  end)
end)

-- ---------------------------------------------------------------------
describe("ums.submit by module name", function()
  it("runs module.function in the other VM", function()
    run(function()
      assert.equal(5, results(ums.submit("vm_work.add", 2, 3))[1])
      -- Placed on 1, but an idle scheduler 0 may take it first.
      local s = results(ums.submit_on(1, "vm_work.where"))[1]
      assert.is_true(s == 0 or s == 1)
    end)
  end)

  it("fails the work for a missing module or a field that is no function",
    function()
      run(function()
        local ok, err = ums.submit("vm_no_such_module.f"):join(20)
        assert.is_false(ok)
        assert.matches("module 'vm_no_such_module' not found", err)
        ok, err = ums.submit("vm_work.answer"):join(20)
        assert.is_false(ok)
        assert.matches("'vm_work.answer' is not a function %(number%)", err)
      end)
    end)
end)

-- ---------------------------------------------------------------------
describe("the init module", function()
  -- The main VM's real globals (Busted runs specs in an environment of
  -- its own).
  local G = debug.getregistry()[2]

  it("runs once in every VM, before its first work", function()
    G.INIT_COUNT = nil
    package.loaded.vm_init = nil
    local ran_on_0
    run(function()
      local ws = {on1(function() return require("vm_work").where() end)}
      for i = 1, 40 do
        ws[#ws + 1] = ums.submit_on(i % 2, "vm_work.where")
      end
      local seen = {}
      for i = 1, #ws do
        local r = results(ws[i])
        assert.equal(1, r[2], "init ran " .. tostring(r[2]) .. " times")
        seen[r[1]] = true
      end
      assert.is_true(seen[1])
      ran_on_0 = seen[0]
    end, {init = "vm_init", quantum = 0})
    -- The main VM is scheduler 0's: the init module ran there too if any
    -- work did (scheduler 1 may have stolen all of it).
    assert.equal(ran_on_0 and 1 or nil, G.INIT_COUNT)
    G.INIT_COUNT = nil
    package.loaded.vm_init = nil
  end)

  it("that fails in one VM leaves that scheduler's work to the others",
     function()
    package.loaded.vm_init_fail1 = nil
    G.VM_MAIN = true
    run(function()
      -- Named for scheduler 1, or placed: scheduler 1 refuses each once its
      -- VM failed, and scheduler 0 runs them all; none fails.
      local ws = {}
      for i = 1, 30 do
        ws[#ws + 1] = i % 3 == 0 and ums.submit("vm_work.where")
                      or ums.submit_on(1, "vm_work.where")
      end
      for i = 1, #ws do
        local r = results(ws[i])
        assert.equal(0, r[1])
      end
      -- Later work named for scheduler 1 goes to scheduler 0 at once.
      assert.equal(0, results(ums.submit_on(1, "vm_work.where"))[1])
    end, {init = "vm_init_fail1", quantum = 0})
    package.loaded.vm_init_fail1 = nil
    G.VM_MAIN = nil
  end)

  it("that fails fails the work with its error", function()
    run(function()
      local ok, err = ums.submit_on(1, echo, 1):join(20)
      assert.is_false(ok)
      assert.matches("the init module 'vm_no_such_init' failed in the VM of "
        .. "scheduler %d: .*module 'vm_no_such_init' not found", err)
    end, {init = "vm_no_such_init"})
  end)
end)

-- ---------------------------------------------------------------------
describe("shared objects", function()
  it("a channel carries 100,000 messages between schedulers, none lost "
     .. "or duplicated", function()
    run(function()
      local N, P = 100000, 2
      local ch = ums.channel(64, {shared = true})
      local producers = {}
      for p = 1, P do
        -- Each producer sends its own range of numbers from scheduler 1.
        producers[p] = on1(function(ch, from, to)
          for i = from, to do ch:send(i) end
          return require("ums").scheduler()
        end, ch, (p - 1) * N // P + 1, p * N // P)
      end
      local seen, count = {}, 0
      for _ = 1, N do
        local v = ch:recv(20)
        assert(math.type(v) == "integer", "got " .. tostring(v))
        assert(not seen[v], "duplicate " .. v)
        seen[v] = true
        count = count + 1
      end
      for p = 1, P do assert.equal(1, results(producers[p])[1]) end
      assert.equal(N, count)
      for i = 1, N do assert(seen[i], "lost " .. i) end
      assert.same({false, nil, "empty"}, {ch:try_recv()})
    end, {limit = 120, quantum = 0})
  end)

  it("an unbuffered channel hands over values in both directions", function()
    run(function()
      local ping = ums.shared.channel()
      local pong = ums.shared.channel()
      local w = on1(function(ping, pong)
        while true do
          local v, err = ping:recv()
          if v == nil then return err end
          pong:send({v = v, where = require("ums").scheduler()})
        end
      end, ping, pong)
      for i = 1, 2000 do
        assert.is_true(ping:send(i))
        local r = pong:recv()
        assert.equal(i, r.v)
        assert.equal(1, r.where)
      end
      ping:close()
      assert.equal("closed", results(w)[1])
      assert.same({nil, "closed"}, {ping:send(1)})
      assert.same({nil, "closed"}, {ping:recv()})
      assert.same({nil, "timeout"}, {pong:recv(0.001)})
    end, {quantum = 0})
  end)

  it("a buffered channel streams across VMs in order, both ways at once",
    function()
      -- A sender on each scheduler and a receiver on each, through one
      -- small buffer, so that both sides keep finding it empty and full
      -- (and spin or park for it): every value arrives once, each
      -- sender's in its order, and a close ends both receivers.
      run(function()
        local N = 5000
        local ch = ums.shared.channel(4)
        local function recv_all(ch)
          local seen, last = 0, {}
          while true do
            local v, err = ch:recv()
            if v == nil then return seen, last, err end
            local who, i = v:match("^(%a+):(%d+)$")
            i = tonumber(i)
            assert(i > (last[who] or 0), "out of order")
            last[who] = i
            seen = seen + 1
          end
        end
        local sent = ums.shared.event(true)
        local far = on1(function(ch, n, recv_all, sent)
          local ums = require "ums"
          local r = ums.spawn(recv_all, ch)
          for i = 1, n do assert(ch:send("far:" .. i)) end
          sent:set()
          local ok, seen, last, err = r:join()
          assert(ok, seen)
          return seen, last.near or 0, last.far or 0, err
        end, ch, N, recv_all, sent)
        local r = ums.spawn(recv_all, ch)
        for i = 1, N do assert.is_true(ch:send("near:" .. i)) end
        assert.is_true(sent:wait(20))
        -- The receivers drain what is buffered, then see the close.
        ch:close()
        local ok, seen, last, err = r:join(20)
        assert.is_true(ok)
        assert.equal("closed", err)
        local fr = results(far)
        assert.equal("closed", fr[4])
        assert.equal(2 * N, seen + fr[1])
        assert.is_true(math.max(last.near or 0, fr[2]) == N)
        assert.is_true(math.max(last.far or 0, fr[3]) == N)
      end, {quantum = 0})
    end)

  it("senders and receivers on two schedulers get every value once, "
    .. "through cancellations, timeouts and a close in the middle",
    function()
      -- Each scheduler runs two senders, three receivers (one with short
      -- timeouts), and a sender and a receiver that are cancelled while
      -- the channel is busy. A value counts as sent when send returned
      -- true, as received when recv returned it; nothing yields in
      -- between, so every value sent is received exactly once, also by
      -- the cancelled receiver before it was cancelled. Unbuffered, rings
      -- of one and three slots, and a capacity beyond the ring (the spill).
      local function side(ch, who, go)
        local ums = require "ums"
        local CANCELLED = require("ums.core").CANCELLED
        local sent, got = {}, {}
        local function sender(id)
          local i = 0
          while true do
            i = i + 1
            local v = who .. id .. ":" .. i
            local ok, err = ch:send(v, i % 5 == 0 and 0.0002 or nil)
            if ok then
              sent[#sent + 1] = v
            elseif err == "closed" then
              return
            end
          end
        end
        local function receiver(timeouts)
          while true do
            local v, err = ch:recv(timeouts and 0.0002 or nil)
            if v ~= nil then
              got[#got + 1] = v
            elseif err == "closed" then
              return
            end
          end
        end
        local ts = {}
        for id = 1, 2 do ts[#ts + 1] = ums.spawn(sender, id) end
        for k = 1, 3 do ts[#ts + 1] = ums.spawn(receiver, k == 3) end
        local vs, vr = ums.spawn(sender, 9), ums.spawn(receiver, false)
        assert(go:wait(30))
        ums.sleep(0.001)
        vs:cancel()
        vr:cancel()
        for _, t in ipairs(ts) do
          local ok, err = t:join(30)
          assert(ok, tostring(err))
        end
        -- A victim that was not waiting when cancelled may see the close
        -- before it waits again.
        for _, t in ipairs {vs, vr} do
          local ok, err = t:join(30)
          assert(ok or err == CANCELLED, tostring(err))
        end
        return sent, got
      end
      for _, cap in ipairs {0, 1, 3, 300} do
        run(function()
          local ch = ums.shared.channel(cap)
          local go = ums.shared.event(true)
          local far = on1(side, ch, "far", go)
          local near = ums.spawn(side, ch, "near", go)
          -- Let values flow both ways for a while, cancel the victims,
          -- then close while the senders are still sending.
          ums.sleep(0.02)
          go:set()
          ums.sleep(0.02)
          assert.is_true(ch:close())
          local ok, nsent, ngot = near:join(30)
          assert.is_true(ok, nsent)
          local fr = results(far)
          local count = {}
          for _, list in ipairs {nsent, fr[1]} do
            for _, v in ipairs(list) do
              assert(count[v] == nil, "sent twice: " .. v)
              count[v] = 0
            end
          end
          local total = 0
          for _, list in ipairs {ngot, fr[2]} do
            for _, v in ipairs(list) do
              assert(count[v], "received but not sent: " .. v)
              assert(count[v] == 0, "received twice: " .. v)
              count[v] = 1
              total = total + 1
            end
          end
          assert.equal(#nsent + #fr[1], total, "values lost")
          assert.is_true(total > 0)
          assert.same({false, nil, "closed"}, {ch:try_recv()})
        end, {quantum = 0})
      end
    end)

  it("a channel wakes a receiver parked on another scheduler "
    .. "for every value, with no timeout or close to rescue it", function()
    -- Ping-pong, unbuffered and buffered: each side waits in recv (parks,
    -- or spins first) for the other's value, so one lost wake-up stops
    -- the exchange.
    for _, cap in ipairs {0, 1, 300} do
      run(function()
        local a, b = ums.shared.channel(cap), ums.shared.channel(cap)
        local far = on1(function(a, b, n)
          for _ = 1, n do assert(b:send(a:recv() + 1)) end
          return true
        end, a, b, 3000)
        local x = 0
        for _ = 1, 3000 do
          assert.is_true(a:send(x))
          x = b:recv(20)
          assert.is_not_nil(x, "a wake-up was lost")
        end
        assert.equal(3000, x)
        assert.is_true(results(far)[1])
      end, {quantum = 0})
    end
  end)

  it("a send or receive where Lua cannot yield loses any number of races "
    .. "for a buffered channel in one call, its C stack flat", function()
    -- A task that waits inside table.sort's comparator (a C call Lua
    -- cannot yield across) blocks its worker instead of yielding. Each
    -- round, the room or value it is woken for is taken by another task
    -- before it runs, so it looks again and waits again: N times within
    -- one call, about three times what the smallest worker stack held
    -- when each look again was a level deeper (then the run crashed).
    -- Under TSan, where a round takes milliseconds, far fewer: there it
    -- checks the loop for races, the normal and ASan builds its depth.
    local tsan = (os.getenv("LD_PRELOAD") or ""):find("libtsan", 1, true)
    local N = tonumber(os.getenv("UMS_SPEC_LOST_RACES"))
      or (tsan and 100 or 10000)
    local stack_size = ums.config().stack_size
    ums.config{stack_size = core.STACK_SIZE_MIN}
    finally(function() ums.config{stack_size = stack_size} end)
    -- Yields until t waits in the channel (not merely runnable): one
    -- yield lets it run to its wait, which the spec checks now and then
    -- (task:info() makes a traceback).
    local function until_waiting(t, i)
      ums.yield()
      if i % 50 == 0 then
        local info = t:info()
        while info.state ~= "suspended" or info.wait_type == nil do
          ums.yield()
          info = t:info()
        end
      end
    end
    run(function()
      local ch = ums.shared.channel(1)
      local r = ums.spawn(function()
        local got
        table.sort({2, 1}, function(a, b)
          got = got or ch:recv(20)
          return a < b
        end)
        return got
      end)
      for i = 1, N do
        until_waiting(r, i)
        assert.is_true(ch:send(i))
        assert.equal(i, ch:recv())  -- taken before r looks again
      end
      until_waiting(r, 0)
      assert.is_true(ch:send("last"))
      assert.same({true, "last"}, {r:join(20)})

      assert.is_true(ch:send(0))  -- full
      local s = ums.spawn(function()
        local sent
        table.sort({2, 1}, function(a, b)
          sent = sent or ch:send("s", 20)
          return a < b
        end)
        return sent
      end)
      for i = 1, N do
        until_waiting(s, i)
        assert.equal(i - 1, ch:recv())
        assert.is_true(ch:send(i))  -- fills the room before s looks again
      end
      until_waiting(s, 0)
      assert.equal(N, ch:recv())
      assert.same({true, true}, {s:join(20)})
      assert.equal("s", ch:recv())
    end, {schedulers = 1, quantum = 0, limit = 200})
  end)

  it("a channel keeps buffered values after close, and try_* and len",
    function()
      run(function()
        local ch = ums.shared.channel(2)
        assert.equal(2, ch:cap())
        assert.is_true(ch:try_send("a"))
        assert.is_true(ch:try_send({b = true}))
        assert.same({false, "full"}, {ch:try_send("c")})
        assert.equal(2, ch:len())
        assert.is_true(ch:close())
        assert.same({nil, "closed"}, {ch:close()})
        assert.is_true(ch:closed())
        assert.same({false, "closed"}, {ch:try_send("c")})
        assert.equal("a", ch:recv())
        assert.same({true, {b = true}}, {ch:try_recv()})
        assert.same({false, nil, "closed"}, {ch:try_recv()})
      end)
    end)

  it("a channel's capacity is a bound, not memory reserved up front",
    function()
      -- 2^40 slots would be 8 TiB if they were allocated at creation.
      local ch = ums.shared.channel(1 << 40)
      assert.equal(1 << 40, ch:cap())
      -- The ring grows while its oldest value is not in its first slot,
      -- and keeps the order of sends across the growth.
      local sent, got = 0, 0
      for round = 1, 6 do
        for _ = 1, round * 7 do
          sent = sent + 1
          assert.is_true(ch:try_send(sent))
        end
        for _ = 1, round * 3 do
          got = got + 1
          assert.same({true, got}, {ch:try_recv()})
        end
      end
      assert.equal(sent - got, ch:len())
      while got < sent do
        got = got + 1
        assert.same({true, got}, {ch:try_recv()})
      end
      assert.same({false, nil, "empty"}, {ch:try_recv()})
    end)

  it("a mutex, semaphore, event and wait group work across VMs", function()
    run(function()
      local m = ums.mutex{shared = true}
      local sem = ums.semaphore(0, {shared = true})
      local ev = ums.event(true, {shared = true})
      local wg = ums.waitgroup{shared = true}
      local log = ums.shared.channel(100)
      assert.is_true(m:lock())
      wg:add(3)
      local ws = {}
      for i = 1, 3 do
        ws[i] = ums.submit_on(1, function(m, sem, ev, wg, log, i)
          ev:wait()                 -- manual reset: wakes all three
          assert(m:lock(10))        -- held by the main task until it
          log:send(i)               -- unlocks; one at a time from there
          m:unlock()
          sem:release()
          wg:done()
          return true
        end, m, sem, ev, wg, log, i)
      end
      ums.sleep(0.01)
      assert.same({nil, "timeout"}, {wg:wait(0)})
      ev:set()
      assert.is_true(ev:is_set())
      ums.sleep(0.01)
      assert.equal(0, log:len())  -- the mutex is still ours
      m:unlock()
      for _ = 1, 3 do assert.is_true(sem:acquire(20)) end
      assert.is_true(wg:wait(20))
      for i = 1, 3 do assert.is_true(results(ws[i])[1]) end
      assert.equal(3, log:len())
      assert.equal(0, sem:value())
    end)
  end)

  it("an auto-reset event wakes one waiter per set", function()
    run(function()
      local ev = ums.shared.event()
      local got = ums.shared.channel(10)
      local ws = {}
      for i = 1, 2 do
        ws[i] = ums.submit_on(1, function(ev, got, i)
          assert(ev:wait(20))
          got:send(i)
        end, ev, got, i)
      end
      wait_until(function()
        return ws[1]:status() == "running" and ws[2]:status() == "running"
      end, "both waiting")
      ums.sleep(0.01)
      ev:set()
      local first = got:recv(20)
      assert.same({nil, "timeout"}, {got:recv(0.05)})
      ev:set()
      assert.equal(3 - first, got:recv(20))
      assert.is_false(ev:is_set())
      for i = 1, 2 do results(ws[i]) end
    end)
  end)

  it("can be made outside a run and used after it", function()
    local ev = ums.shared.event(true)
    local ch = ums.shared.channel(1)
    run(function()
      -- Work nobody joins: the run still waits for it to end.
      ums.submit_on(1, function(ev, ch)
        require("ums").sleep(0.05)
        ch:send("done")
        ev:set()
      end, ev, ch)
    end)
    assert.is_true(ev:is_set())
    assert.equal("done", ch:recv())
  end)

  it("mutex misuse and waits outside tasks give clear errors", function()
    local m = ums.shared.mutex()
    assert_raises(function() m:lock() end, "ums.mutex:lock: not inside a task")
    local ch = ums.shared.channel()
    assert_raises(function() ch:recv() end,
      "ums.channel:recv: not inside a task")
    run(function()
      assert_raises(function() m:unlock() end, "the mutex is not locked")
      assert.is_true(m:lock())
      assert.same({nil, "would deadlock: the mutex is already locked by this "
                   .. "task"}, {m:lock()})
      local ok, err = ums.submit_on(1, function(m) return m:unlock() end, m)
        :join(20)
      assert.is_false(ok)
      assert.matches("locked by another task", err)
      assert.is_true(m:unlock())
    end)
  end)
end)

-- ---------------------------------------------------------------------
describe("cancelling submitted work", function()
  it("before it starts: it never runs", function()
    -- One scheduler, and the main task does not yield between submit and
    -- cancel: nothing can start the work meanwhile.
    run(function()
      local ran = ums.shared.event(true)
      local w = ums.submit(function(ran) ran:set() end, ran)
      assert.equal("pending", w:status())
      assert.is_true(w:cancel())
      local ok, err, tb = w:join(20)
      assert.is_false(ok)
      assert.equal(CANCELLED, err)
      assert.matches("cancelled before it started", tb)
      assert.equal("cancelled", w:status())
      ums.sleep(0.02)
      assert.is_false(ran:is_set())
      assert.is_false(w:cancel())  -- done: nothing to cancel
    end, {schedulers = 1})
  end)

  it("while it waits in another VM", function()
    run(function()
      local never = ums.shared.event()
      local w = ums.submit_on(1, function(never)
        never:wait()
        return "woke"
      end, never)
      wait_until(function() return w:status() == "running" end, "running")
      assert.is_number(w:scheduler())
      assert.is_true(w:cancel())
      local ok, err, tb = w:join(20)
      assert.is_false(ok)
      assert.equal(CANCELLED, err)  -- this VM's own CANCELLED
      assert.matches("stack traceback", tb)
      assert.equal("cancelled", w:status())
    end)
  end)

  it("while it computes in another VM (at its quantum)", function()
    run(function()
      local w = ums.submit_on(1, function()
        local x = 0
        while true do x = x + 1 end
      end)
      wait_until(function() return w:status() == "running" end, "running")
      assert.is_true(w:cancel())
      local ok, err = w:join(20)
      assert.is_false(ok)
      assert.equal(CANCELLED, err)
    end, {quantum = 0.004, preempt = true})
  end)
end)

-- ---------------------------------------------------------------------
describe("errors in submitted work", function()
  it("come back through join with the traceback from the other VM",
    function()
      run(function()
        local ok, err, tb = ums.submit_on(1, function(x)
          local function inner() error("boom " .. x) end
          inner()
        end, 7):join(20)
        assert.is_false(ok)
        assert.matches("vm_spec%.lua:%d+: boom 7", err)
        assert.matches("stack traceback:", tb)
        assert.matches("in %a+ 'inner'", tb)
        assert.matches("vm_spec%.lua:%d+:", tb)
      end)
    end)

  it("leave load's errors as they are inside the work", function()
    -- Lua runs the parser under the work's message handler: a reader that
    -- raises and a chunk nested too deeply give load's usual results.
    run(function()
      local ok, r = ums.submit_on(1, function()
        local out = {}
        local function add(...) out[#out + 1] = table.pack(...) end
        add(load(function() error("reader failed") end))
        add(load(function() error({code = 7}) end))
        add(load(string.rep("(", 300) .. "1" .. string.rep(")", 300)))
        add(pcall(load, function() error("in pcall") end))
        -- The work's own error afterwards keeps its traceback.
        local ok, e = pcall(error, "caught")
        out.caught = {ok, e}
        return out
      end):join(20)
      assert.is_true(ok)
      assert.equal(2, r[1].n)
      assert.is_nil(r[1][1])
      assert.equal("string", type(r[1][2]))
      assert.matches("vm_spec%.lua:%d+: reader failed$", r[1][2])
      assert.same({n = 2, nil, {code = 7}}, r[2])
      assert.same({n = 2, nil, "C stack overflow"}, r[3])
      assert.is_true(r[4][1])
      assert.matches("in pcall$", r[4][3])
      assert.same({false, "caught"}, r.caught)
      local tb
      ok, r, tb = ums.submit_on(1, function()
        assert(not load(function() error("first") end))
        error("second")
      end):join(20)
      assert.is_false(ok)
      assert.matches("vm_spec%.lua:%d+: second$", r)
      assert.matches("^[^\n]*second\nstack traceback:", tb)
      assert.not_matches("first", tb)
    end)
  end)

  it("keep error values that can be copied, and the name's module in the "
     .. "traceback", function()
    run(function()
      local ok, err = ums.submit(function() error({code = 42}) end):join(20)
      assert.is_false(ok)
      assert.same({code = 42}, err)
      local tb
      ok, err, tb = ums.submit("vm_work.fail", "by name"):join(20)
      assert.is_false(ok)
      assert.matches("vm_work%.lua:%d+: by name", err)
      assert.matches("vm_work%.lua", tb)
      -- A value that cannot cross becomes its string form.
      ok, err = ums.submit(function() error(coroutine.create(print)) end)
        :join(20)
      assert.is_false(ok)
      assert.matches("^thread: ", err)
    end)
  end)

  it("reach on_error at the end of the run when nobody joined", function()
    local got = {}
    local prev = debug.getregistry()["ums.on_error"]
    ums.on_error(function(err, tb, w)
      got[#got + 1] = {err = err, tb = tb, name = w:name()}
    end)
    ums.config{schedulers = 2}
    local ok, e = pcall(ums.run, function()
      ums.submit_on(1, "vm_work.fail", "nobody joins")
      local w = ums.submit_on(1, "vm_work.fail", "joined")
      w:join(20)
    end)
    ums.config{schedulers = 1}
    ums.on_error(prev)
    assert(ok, e)
    assert.equal(1, #got)
    assert.matches("nobody joins", got[1].err)
    assert.matches("stack traceback", got[1].tb)
    assert.equal("vm_work.fail", got[1].name)
  end)
end)

-- ---------------------------------------------------------------------
describe("placement and stealing", function()
  it("runs work on both schedulers at once", function()
    -- Two works that each compute (never yielding: quantum 0) until both
    -- have started: one scheduler cannot run both, so they finish only if
    -- placement or stealing put them on different schedulers.
    run(function()
      local started = ums.shared.semaphore(0)
      local ws = {}
      for i = 1, 2 do
        ws[i] = ums.submit(function(started)
          started:release()
          local t0 = os.time()
          while started:value() < 2 and os.time() - t0 < 20 do end
          return started:value() >= 2, require("ums").scheduler()
        end, started)
      end
      local a, b = results(ws[1]), results(ws[2])
      assert.is_true(a[1], "the second work never started")
      assert.is_true(b[1])
      assert.are_not.equal(a[2], b[2])
    end, {quantum = 0})
  end)

  it("an idle scheduler steals queued work from a busy one", function()
    -- The main task keeps scheduler 0 busy without ever yielding (quantum
    -- off): work queued for scheduler 0 can only start if scheduler 1
    -- steals it.
    run(function()
      local started = ums.shared.event(true)
      local w = ums.submit_on(0, function(started)
        started:set()
        return require("ums").scheduler()
      end, started)
      local t0 = os.time()
      while not started:is_set() and os.time() - t0 < 20 do end
      assert.is_true(started:is_set(), "the queued work never started")
      assert.equal(1, results(w)[1])
      assert.equal(1, w:scheduler())
    end, {quantum = 0})
  end)

  it("work queued for a running scheduler starts there", function()
    -- Scheduler 0's task queues one work for itself and one for
    -- scheduler 1, then joins both. Scheduler 1 is free to steal the first
    -- (its own work parks at once), but scheduler 0 reaches its join, and
    -- starts its work, within the steal grace (runtime/src/work.c), so each work runs
    -- where it was queued, whether scheduler 1 is running or still waking
    -- up. A round goes wrong only when a scheduler is held up for longer
    -- than the grace (a millisecond) between a submit and its next idle
    -- moment and runs another task first, or for 10 ms (work.c, "The steal
    -- grace"); the assertion allows that in half the rounds. Without the
    -- grace nearly every round goes wrong.
    local ROUNDS = 20
    run(function()
      local function where()
        local ums = require "ums"
        ums.sleep(0.001)
        return ums.scheduler()
      end
      local in_place = 0
      for _ = 1, ROUNDS do
        local a = ums.submit_on(0, where)
        local b = ums.submit_on(1, where)
        local ra, rb = results(a)[1], results(b)[1]
        if ra == 0 and rb == 1 then in_place = in_place + 1 end
      end
      assert(in_place >= ROUNDS / 2, ("%d rounds of %d ran in place")
        :format(in_place, ROUNDS))
    end)
  end)

  it("a busy scheduler's queue is emptied by the other one", function()
    run(function()
      -- Scheduler 1 computes until told to stop; everything queued for
      -- it meanwhile runs on scheduler 0, where the main task only waits.
      local stop = ums.shared.event(true)
      local hog = on1(function(stop)
        while not stop:is_set() do end
        return "stopped"
      end, stop)
      wait_until(function() return hog:status() == "running" end, "the hog")
      local ws = {}
      for i = 1, 8 do
        ws[i] = ums.submit_on(1, function()
          return require("ums").scheduler()
        end)
      end
      for i = 1, 8 do assert.equal(0, results(ws[i])[1]) end
      stop:set()
      assert.equal("stopped", results(hog)[1])
    end, {quantum = 0})
  end)
end)

-- ---------------------------------------------------------------------
describe("the end of a run", function()
  it("closes the other VMs, running their finalizers", function()
    local ch = ums.shared.channel(1)
    run(function()
      results(on1(function(ch)
        -- A global of the other VM, finalized when that VM is closed.
        KEEP = setmetatable({}, {__gc = function() ch:try_send("closed") end})
      end, ch))
      assert.same({false, nil, "empty"}, {ch:try_recv()})
    end, {quantum = 0})
    assert.same({true, "closed"}, {ch:try_recv()})
  end)

  it("waits for work submitted by work", function()
    local ev = ums.shared.event(true)
    run(function()
      ums.submit_on(1, function(ev)
        local ums = require "ums"
        ums.submit_on(0, function(ev)
          require("ums").sleep(0.02)
          ev:set()
        end, ev)
      end, ev)
    end)
    assert.is_true(ev:is_set())
  end)

  it("cancels work that never started when the run fails", function()
    local w
    ums.config{schedulers = 1}
    local ok, err = pcall(ums.run, function()
      w = ums.submit(function() return 1 end)
      error("the run fails")
    end)
    assert.is_false(ok)
    assert.matches("the run fails", err)
    local jok, jerr, tb = w:join()  -- done: joinable outside a run
    assert.is_false(jok)
    assert.equal(CANCELLED, jerr)
    assert.matches("before it started", tb)
  end)
end)

-- ---------------------------------------------------------------------
describe("bad input", function()
  it("gives clear errors naming the function and the argument", function()
    assert_raises(function() ums.submit(echo) end,
      "ums.submit: not inside a task")
    run(function()
      assert_raises(function() ums.submit() end,
        "bad argument #1 to 'submit' (function or \"module.function\" "
        .. "expected, got no value)")
      assert_raises(function() ums.submit(42) end,
        "bad argument #1 to 'submit' (function or \"module.function\" "
        .. "expected, got number)")
      assert_raises(function() ums.submit("nodot") end,
        "bad argument #1 to 'submit' (\"module.function\" expected)")
      assert_raises(function() ums.submit(".f") end,
        "bad argument #1 to 'submit' (\"module.function\" expected)")
      assert_raises(function() ums.submit_on(-1, echo) end,
        "bad argument #1 to 'submit_on' (scheduler -1 out of range (0 to 1))")
      assert_raises(function() ums.submit_on(2, echo) end,
        "bad argument #1 to 'submit_on' (scheduler 2 out of range (0 to 1))")
      assert_raises(function() ums.submit_on({}, echo) end,
        "bad argument #1 to 'submit_on' (number expected, got table)")
      assert_raises(function() ums.submit_on(1.5, echo) end,
        "bad argument #1 to 'submit_on' (number has no integer "
        .. "representation)")
      assert_raises(function() ums.submit_on(0, echo, io.stdout) end,
        "bad argument #3 to 'submit_on' (args[1]: userdata (FILE*))")
      local w = ums.submit(echo)
      assert_raises(function() w:join("soon") end,
        "bad argument #1 to 'join' (number expected, got string)")
      assert_raises(function() w:join(-1) end,
        "bad argument #1 to 'join' (timeout must be a non-negative number)")
      assert_raises(function() w.join({}) end,
        "bad argument #1 to 'join' (ums.work expected, got table)")
      results(w)
      local ch = ums.shared.channel()
      assert_raises(function() ch:send(io.stdout) end,
        "bad argument #1 to 'send' (value: userdata (FILE*))")
      assert_raises(function() ch:try_send({f = print}) end,
        "bad argument #1 to 'try_send' (value.f: C function)")
      assert_raises(function() ch.recv(ums.channel()) end,
        "bad argument #1 to 'recv' (ums.shared.channel expected, got "
        .. "ums.channel)")
      assert_raises(function() ums.shared.channel(-1) end,
        "bad argument #1 to 'channel' (size must not be negative)")
      assert_raises(function() ums.shared.semaphore(-1) end,
        "bad argument #1 to 'semaphore' (initial value must not be negative)")
      assert_raises(function() ums.shared.semaphore() end,
        "bad argument #1 to 'semaphore' (number expected, got no value)")
      assert_raises(function() ums.shared.event(1) end,
        "bad argument #1 to 'event' (boolean expected, got number)")
      assert_raises(function() ums.channel(0, {bogus = true}) end,
        "bad argument #2 to 'channel' (unknown option 'bogus')")
      assert_raises(function() ums.channel(0, 5) end,
        "bad argument #2 to 'channel' (table expected, got number)")
      assert_raises(function() ums.mutex{shared = 1} end,
        "bad argument #1 to 'mutex' (option 'shared' must be a boolean, "
        .. "got number)")
      assert_raises(function() ums.semaphore(1, {sharde = true}) end,
        "bad argument #2 to 'semaphore' (unknown option 'sharde')")
      local wg = ums.shared.waitgroup()
      assert_raises(function() wg:done() end,
        "ums.waitgroup:done: the counter would become negative")
      assert_raises(function() wg:add(1.5) end,
        "bad argument #1 to 'add' (number has no integer representation)")
    end)
    assert_raises(function() ums.config{init = 5} end,
      "ums.config: 'init' must be a module name, or false for none")
  end)
end)

-- ---------------------------------------------------------------------
describe("os.exit in another VM", function()
  local sp = require "subprocess"
  local it = sp.guard(it, pending)
  after_each(sp.cleanup)

  it("ends the whole run with its status, also after the first task ended",
    function()
      for _, case in ipairs {
        -- The first task still waits: the exit cancels it.
        {7, [[ums.run(function()
            ums.submit(function() require("ums").sleep(1000) end)
            ums.submit_on(1, function() os.exit(7, true) end)
            ums.sleep(1000)
          end)]]},
        -- The first task has returned; the run waits for the work.
        {3, [[ums.run(function()
            ums.submit(function() require("ums").sleep(1000) end)
            ums.submit(function()
              require("ums").sleep(0.05)
              os.exit(3)
            end)
          end)]]},
      } do
        local script = sp.temp("local ums = require 'ums'\n"
          .. "ums.config{schedulers = 2}\n" .. case[2] .. "\n"
          .. "print('not reached')\n")
        local r = sp.lua_run({script})
        sp.assert_exit(r, case[1])
        assert.equal("", r.stdout, sp.describe(r))
      end
    end)
end)
