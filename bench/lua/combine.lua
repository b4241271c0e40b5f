--[[
combine.lua: one table from the JSON of bench_ums.lua and, when given,
bench_tarantool.lua (used by bench/lua/run.sh).

Usage: lua5.4 combine.lua UMS.json [TARANTOOL.json]

Columns: the Lua 5.4 floor, ums, ums/floor (median of per-repetition time
ratios, measured back to back in one process), Tarantool, ums/tarantool
(ratio of the medians: time, or bytes for memory; < 1 means ums is
faster or smaller), and the issue's target with PASS / MISS.
]]

local fmt = string.format

-- The JSON decoder bench/report.lua shares, next to this file.
local decode = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/json.lua")

local function load_json(path)
  local f = assert(io.open(path, "r"))
  local s = f:read("a")
  f:close()
  -- The first line that looks like an object: interpreters may print
  -- other things before it.
  local obj = s:match("(%b{})")
  if not obj then error(path .. ": no JSON object found") end
  return decode(obj)
end

local ums = load_json(assert(arg[1], "usage: combine.lua UMS.json [TT.json]"))
local tt = arg[2] and load_json(arg[2]) or nil

local function index(doc)
  local t = {}
  if doc then for _, r in ipairs(doc.results or {}) do t[r.id] = r end end
  return t
end
local U, T = index(ums), index(tt)

local function v(r) return r and r.median end

local function num(x, unit)
  if x == nil then return "-" end
  if unit == "x" then return fmt("%.3f", x) end
  if unit == "tasks" then return fmt("%d", math.floor(x + 0.5)) end
  if math.abs(x) >= 100 then return fmt("%.0f", x) end
  return fmt("%.1f", x)
end

local function ratio(x) return x and fmt("%.2f", x) or "-" end

local function verdict(ok, text)
  if ok == nil then return "? (" .. text .. ")" end
  return (ok and "PASS" or "MISS") .. " (" .. text .. ")"
end

local function rate(ns)
  if not ns or ns <= 0 then return "" end
  local r = 1e9 / ns
  if r >= 1e6 then return fmt("%.2f M/s", r / 1e6) end
  return fmt("%.0f k/s", r / 1e3)
end

-- Rows: label, unit, floor id, ums id, tarantool id, target function.
local rows = {}
local function row(t) rows[#rows + 1] = t end

local spawn_n = U["ums.spawn_join"] and U["ums.spawn_join"].n
row { "spawn+join, batches of 1000", "ns/task", "floor.spawn",
      "ums.spawn_join", "tarantool.spawn_join",
      function(u, _, t)
        if not u then return nil end
        local ok = 1e9 / u >= 5e6
        local txt = fmt(">= 5M/s: %.2f M/s", 1e9 / u / 1e6)
        if t then
          ok = ok and t / u >= 3.5
          txt = txt .. fmt("; >= 3.5x fiber.new: %.2fx", t / u)
        end
        return verdict(ok, txt)
      end }
row { "spawn, not joined, batches", "ns/task", "floor.spawn",
      "ums.spawn_detached", "tarantool.spawn_detached" }
row { "spawn all first, then join", "ns/task", "floor.spawn_all",
      "ums.spawn_all", nil }
row { "switch: yield, 2 tasks", "ns/switch", "floor.switch_lua",
      "ums.switch", "tarantool.switch",
      function(u, f, _, ur)
        return verdict(ur.ratio and ur.ratio <= 1.0, "<= 1.0x Lua-loop floor")
      end }
row { "  same, quantum = 0", "ns/switch", "floor.switch_lua",
      "ums.switch_q0", "tarantool.switch" }
row { "  floor: resume+yield from C", "ns/switch", "floor.switch_c",
      nil, nil }
row { "  floor: from C, Lua body", "ns/switch", "floor.switch_c_luabody",
      nil, nil }
row { "channel msg, unbuffered", "ns/msg", "floor.message", "ums.channel",
      "tarantool.channel",
      function(u, f, _, ur)
        return verdict(ur.ratio and ur.ratio <= 2.0, "<= 2.0x floor")
      end }
row { "  same, quantum = 0", "ns/msg", "floor.message", "ums.channel_q0",
      "tarantool.channel" }
row { "parked task: RSS", "B/task", "floor.mem_rss", "ums.mem_rss",
      "tarantool.mem_rss" }
row { "parked task: RSS beyond a co", "B/task", nil,
      "ums.mem_extra_rss", "tarantool.mem_extra_rss",
      function(u)
        return verdict(u and u <= 2048, "<= 2048 B beyond a coroutine")
      end }
row { "parked task: Lua heap", "B/task", "floor.mem_lua", "ums.mem_lua",
      "tarantool.mem_lua" }
row { "parked task: heap beyond a co", "B/task", nil,
      "ums.mem_extra_lua", "tarantool.mem_extra_lua" }
row { "quantum: loop speed on/off", "x", nil, "quantum.loop_speed", nil,
      function(u) return verdict(u and u >= 0.97, ">= 0.97") end }
row { "quantum: fib speed on/off", "x", nil, "quantum.fib_speed", nil,
      function(u) return verdict(u and u >= 0.97, ">= 0.97") end }

print(fmt("ums Lua benchmarks: %s%s; medians of %d repetitions",
  ums.lua or "?", ums.quick and " (--quick: counts / 100)" or "",
  ums.reps or 0))
print("  ums:       " .. tostring(ums.command))
if tt then
  print(fmt("  tarantool: %s  (Tarantool %s, its Lua is %s)",
    tostring(tt.command), tostring(tt.tarantool), tostring(tt.lua)))
else
  print("  tarantool: not run")
end
print()
local ROW = "%-32s %-9s %8s %8s %9s %9s %7s %9s %9s  %s"
local h = fmt(ROW, "figure", "unit", "floor", "ums", "ums/floor",
  "tarantool", "ums/tt", "ums wall", "tt wall", "target")
print(h)
print(string.rep("-", #h + 40))
for _, r in ipairs(rows) do
  local label, unit, fid, uid, tid, target = r[1], r[2], r[3], r[4], r[5],
    r[6]
  local fr, ur, tr = fid and U[fid], uid and U[uid], tid and T[tid]
  local unit_k = ur and ur.unit or fr and fr.unit
  local f, u, t = v(fr), v(ur), v(tr)
  local uf = ur and ur.ratio
  if fid == nil then uf = nil end
  local ut = (u and t and t ~= 0) and u / t or nil
  local tgt = target and target(u, f, t, ur or {}) or ""
  print(fmt(ROW, label, unit, num(f, unit_k), num(u, unit_k), ratio(uf),
    num(t, unit_k), ratio(ut), num(ur and ur.wall_median, unit_k),
    num(tr and tr.wall_median, unit_k), tgt))
end

-- How many parked tasks each could keep alive.
local mem = U["ums.mem_rss"]
local tmax = T["tarantool.mem_max"]
print(fmt(ROW, "parked tasks kept alive",
  "tasks", "-", mem and mem.n and num(mem.n, "tasks") or "-", "-",
  tmax and num(tmax.median, "tasks") or "-", "-", "-", "-",
  verdict(mem and mem.median ~= nil, (mem and num(mem.n, "tasks") or "?")
    .. " parked tasks fit")))
if tmax and tmax.note then
  print("  tarantool stopped at: " .. tmax.note)
end
print()
print("Times are process CPU time (os.clock), medians; the wall columns "
  .. "are wall-clock medians.")
print("ums/floor: median of per-repetition CPU-time ratios (floor measured "
  .. "back to back, same process).")
print("ums/tt: ums median / Tarantool median (separate processes, same "
  .. "run); < 1: ums is faster or smaller.")
print("Floors are Lua 5.4's; Tarantool runs LuaJIT 2.1, whose own floors "
  .. "bench_tarantool.lua prints:")
for _, id in ipairs { "luajit.spawn", "luajit.switch", "luajit.message",
                      "luajit.mem_rss" } do
  local r = T[id]
  if r then
    print(fmt("  %-16s %-46s %8s %s", id, r.what, num(r.median, r.unit),
      r.unit))
  end
end
if ums.failed or (tt and tt.failed) then
  print("SOME BENCHMARKS FAILED: see the messages above")
end
