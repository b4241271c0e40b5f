--[[
report.lua: the two halves of bench/report that are not shell.

  lua5.4 bench/report.lua rows GROUP KIND COMMAND FILE...
      reads the output of one benchmark command (FILE..., of the shape
      KIND names) and prints its figures as rows on stdout, one a line,
      tab-separated:

        group workload runtime role value unit better ratio command note

      role is "floor" (the 1.0 of its workload), "ums", "peer", or "ref"
      (another reference point, such as a second floor); better is
      "lower" or "higher"; ratio is value / the workload's floor, as the
      benchmark itself computed it when it does (medians of per-repetition
      ratios are steadier than a ratio of medians), empty when the
      workload has no floor. It raises when the output has none of the
      figures it should have: a benchmark whose format changed must fail
      the report, not leave a hole in it.

  lua5.4 bench/report.lua render DIR
      reads DIR/rows.tsv, DIR/meta.tsv and DIR/notes.tsv (written by
      bench/report) and writes DIR/report.md, one gnuplot script per group
      (DIR/<group>.gp) and runs gnuplot on it to make DIR/<group>.png.

  lua5.4 bench/report.lua check DIR [GROUP...]
      what the ctest smoke test asserts: every row's value and ratio are
      numbers, each GROUP has rows with a floor, its chart is a PNG and
      report.md has its section.
]]

local fmt = string.format
local here = arg[0]:match("^(.*)/[^/]*$") or "."
local decode = dofile(here .. "/lua/json.lua")

local function readfile(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function num(s)
  local v = tonumber(s)
  if v == nil or v ~= v or v == math.huge or v == -math.huge then
    return nil
  end
  return v
end

---------------------------------------------------------------- rows

local out_rows = {}

-- One figure. A ratio given by the benchmark is kept; otherwise the
-- renderer divides by the workload's floor.
local function row(group, workload, runtime, role, value, unit, better,
                   ratio, command, note)
  assert(role == "floor" or role == "ums" or role == "peer" or role == "ref")
  assert(better == "lower" or better == "higher")
  local v = num(value)
  if v == nil then
    error(fmt("%s: %s / %s: not a number: %s", group, workload, runtime,
      tostring(value)), 0)
  end
  out_rows[#out_rows + 1] = table.concat({ group, workload, runtime, role,
    fmt("%.6g", v), unit, better, ratio and fmt("%.6g", ratio) or "",
    command, ((note or ""):gsub("[\t\n]", " ")) }, "\t")
end

local function role_of(name)
  if name:match("^ums") then return "ums" end
  return "peer"
end

local parsers = {}

-- bench_core --json: every result with a ratio_to is charted against it.
-- Its floors are these; the rest is the runtime.
local CORE_FLOORS = { ctx_switch = true, condvar_handoff = true,
                      spin_handoff = true, timer_floor = true }

function parsers.core(group, command, file)
  local floors = CORE_FLOORS
  local doc = decode(readfile(file):match("(%b{})") or "")
  local by = {}
  for _, r in ipairs(doc.results or {}) do by[r.name] = r end
  for _, r in ipairs(doc.results or {}) do
    local better = r.lower_is_better and "lower" or "higher"
    local f = r.ratio_to and by[r.ratio_to]
    if floors[r.name] then
      -- A floor measured against another floor says nothing of ums: each
      -- appears as the floor of the figures measured against it.
    elseif f then
      row(group, r.name, f.name, "floor", f.median, f.unit, better, 1,
        command, f.notes)
      row(group, r.name, "ums", "ums", r.median, r.unit, better, r.ratio,
        command, r.notes)
    elseif not floors[r.name] then
      row(group, r.name, "ums", "ums", r.median, r.unit, better, nil,
        command, r.notes)
    end
  end
end

-- bench/lua/run.sh: the JSON it keeps of bench_ums.lua and, when it ran,
-- bench_tarantool.lua. The pairs are combine.lua's rows.
function parsers.lua(group, command, ums_file, tt_file)
  local function index(path)
    local t = {}
    if path then
      local doc = decode(readfile(path):match("(%b{})") or "")
      for _, r in ipairs(doc.results or {}) do t[r.id] = r end
    end
    return t
  end
  local U = index(ums_file)
  local T = index(tt_file ~= "" and tt_file or nil)
  local figures = {
    { "spawn + join, batches of 1,000", "floor.spawn", "ums.spawn_join",
      "tarantool.spawn_join" },
    { "spawn, not joined", "floor.spawn", "ums.spawn_detached",
      "tarantool.spawn_detached" },
    { "spawn all first, then join", "floor.spawn_all", "ums.spawn_all" },
    { "switch: yield between 2 tasks", "floor.switch_lua", "ums.switch",
      "tarantool.switch" },
    { "channel message, unbuffered", "floor.message", "ums.channel",
      "tarantool.channel" },
    { "memory per parked task (RSS)", "floor.mem_rss", "ums.mem_rss",
      "tarantool.mem_rss" },
  }
  for _, f in ipairs(figures) do
    local fr, ur, tr = U[f[2]], U[f[3]], f[4] and T[f[4]]
    if fr and ur then
      row(group, f[1], "Lua 5.4 floor", "floor", fr.median, fr.unit,
        "lower", 1, command, fr.what)
      row(group, f[1], "ums", "ums", ur.median, ur.unit, "lower",
        ur.ratio or ur.median / fr.median, command, ur.what)
      if tr then
        row(group, f[1], "Tarantool", "peer", tr.median, tr.unit, "lower",
          tr.median / fr.median, command,
          (tr.what or "") .. " (its own process: LuaJIT)")
      end
    end
  end
end

-- bench_fs.lua --json: an array of {id, what, unit, value, ratio, floor}.
function parsers.fs(group, command, file)
  local list = decode(readfile(file):match("(%b[])") or "")
  local by = {}
  for _, r in ipairs(list) do by[r.id] = r end
  local floors = {}
  for _, r in ipairs(list) do
    if r.floor and by[r.floor] then floors[r.floor] = true end
  end
  for _, r in ipairs(list) do
    if floors[r.id] then
      row(group, r.id, r.id, "floor", r.value, r.unit, "higher", 1, command,
        r.what)
    end
  end
  for _, r in ipairs(list) do
    if r.floor and by[r.floor] then
      -- Lua's own io is a reference point, not a peer runtime.
      local who = r.id:match("^(%w+)%.")
      local role = who == "ums" and "ums" or who == "io" and "ref" or "peer"
      row(group, r.floor, r.id, role, r.value,
        r.unit, "higher", r.ratio, command, r.what)
    end
  end
end

-- bench_io: its table, "figure median best unit [ratio floor] notes".
function parsers.io(group, command, file)
  local rows, floors = {}, {}
  for line in readfile(file):gmatch("[^\n]+") do
    local name, med, unit, rest =
      line:match("^(%S+)%s+([%d.]+)%s+[%d.]+%s+(%S+)%s*(.*)$")
    if name then
      local ratio, to, note = rest:match("^([%d.]+)x (%S+)%s*(.*)$")
      rows[#rows + 1] = { name = name, value = med, unit = unit,
        ratio = num(ratio), to = to, note = ratio and note or rest }
      if to then floors[to] = true end
    end
  end
  for _, r in ipairs(rows) do
    if floors[r.name] then
      row(group, "C: " .. r.name, r.name, "floor", r.value, r.unit,
        "higher", 1, command, r.note)
    end
  end
  for _, r in ipairs(rows) do
    if r.to then
      row(group, "C: " .. r.to, "ums C " .. r.name, "ums", r.value, r.unit,
        "higher", r.ratio, command, r.note)
    end
  end
end

-- bench_ffi.lua: its table, "id what us/call calls/s".
function parsers.ffi(group, command, file)
  local by = {}
  for line in readfile(file):gmatch("[^\n]+") do
    local id, what, us, per_s =
      line:match("^(%S+)%s+(.-)%s+([%d.]+)%s+([%d.]+)%s*$")
    if id and id ~= "figure" then by[id] = { what = what, us = us } end
  end
  local names = { ums = "ums", luv = "luv", tt = "Tarantool" }
  for _, shape in ipairs { "1", "64" } do
    local w = shape == "1" and "round trip, 1 call in flight"
      or "64 calls in flight, per call"
    -- The raw handoffs are one call at a time: a floor for the first
    -- shape only.
    if shape == "1" and by.handoff then
      row(group, w, "condvar handoff", "floor", by.handoff.us, "us/call",
        "lower", 1, command, by.handoff.what)
      if by.handoff_spin then
        row(group, w, "spinning handoff", "ref", by.handoff_spin.us,
          "us/call", "lower", nil, command, by.handoff_spin.what)
      end
    end
    for _, who in ipairs { "ums", "luv", "tt" } do
      local r = by[who .. "_" .. shape]
      if r then
        row(group, w, names[who], who == "ums" and "ums" or "peer", r.us,
          "us/call", "lower", nil, command, r.what)
      end
    end
  end
end

-- bench_preempt: "name value unit ...".
function parsers.preempt(group, command, file)
  local by = {}
  for line in readfile(file):gmatch("[^\n]+") do
    local name, v, unit = line:match("^(%S+)%s+([%d.]+) (%S+)")
    if name then by[name] = { v = v, unit = unit } end
  end
  local w = "C: round trip, 1 call in flight"
  if by.condvar_rt then
    row(group, w, "condvar handoff (C)", "floor", by.condvar_rt.v, "us/call",
      "lower", 1, command, "a pthread condvar round trip")
  end
  for _, k in ipairs { "preempt_1", "preempt_1_nospin" } do
    if by[k] then
      row(group, w, "ums C " .. k, "ums", by[k].v, "us/call", "lower", nil,
        command, nil)
    end
  end
  if by.preempt_64 then
    row(group, "C: 64 calls in flight", "ums C preempt_64", "ums",
      by.preempt_64.v, "calls/s", "higher", nil, command, nil)
  end
end

-- bench_cores.lua --json: {name: {median, min, max}}, wall seconds.
function parsers.cores(group, command, file)
  local doc = decode(readfile(file):match("(%b{})") or "")
  local w = "64 prime counts, wall time"
  local function med(k) return doc[k] and doc[k].median end
  if med("floor") then
    row(group, w, "plain Lua, 1 core", "floor", med("floor"), "s", "lower",
      1, command, "the same count in a plain Lua loop")
  end
  for _, k in ipairs { { "cpu_1sched", "ums, 1 scheduler" },
                       { "cpu_2sched", "ums, 2 schedulers" },
                       { "cpu_2sched_on1", "ums, 2 schedulers, all on 1" } } do
    if med(k[1]) then
      row(group, w, k[2], "ums", med(k[1]), "s", "lower", nil, command,
        k[1])
    end
  end
  if med("floor_2proc") then
    row(group, w, "2 plain lua5.4 processes", "ref", med("floor_2proc"), "s",
      "lower", nil, command, "what two cores give plain Lua")
  end
  for _, k in ipairs { "chan_same_vm", "chan_shared_cross",
                       "chan_same_vm_buf64", "chan_shared_cross_buf64" } do
    if med(k) then
      row(group, "channel messages", "ums " .. k, "ums", med(k), "msg/s",
        "higher", nil, command, nil)
    end
  end
end

-- The Markdown tables of bench/net/*.sh and bench_busted.sh, each a list
-- of rows of cells ("| name | value | ... |", header and rule left out)
-- under the last line of text before it, its title.
local function md_tables(file)
  local tables, cur = {}, nil
  for line in readfile(file):gmatch("[^\n]+") do
    if line:match("^|") then
      local cells = {}
      for c in line:gmatch("|%s*([^|]-)%s*%f[|]") do cells[#cells + 1] = c end
      if cur and cells[1] ~= "server" and not cells[1]:match("^%-")
         and not (cells[2] or ""):match("^%-") and cells[1] ~= "" then
        cur.rows[#cur.rows + 1] = cells
      end
    elseif line:match("%S") then
      cur = { title = line, rows = {} }
      tables[#tables + 1] = cur
    end
  end
  return tables
end

function parsers.echo(group, command, file)
  for _, t in ipairs(md_tables(file)) do
    local clients = t.title:match("^Echo, (%d+) clients")
    if clients then
      local w = fmt("echo, %s clients", clients)
      for _, c in ipairs(t.rows) do
        local name = c[1]
        local role = name == "C epoll floor" and "floor" or role_of(name)
        row(group, w, name, role, c[2], "round trips/s", "higher",
          role == "floor" and 1 or num(c[3]), command,
          fmt("p50 %s us, p99 %s us", c[5], c[6]))
      end
    end
  end
end

function parsers.http(group, command, file)
  for _, t in ipairs(md_tables(file)) do
    if t.title:match("^HTTP keep%-alive") then
      for _, c in ipairs(t.rows) do
        local name = c[1]
        local workers = name:match("(%d+)[^%d]*$") or "?"
        local w = fmt("HTTP hello, %s worker%s", workers,
          workers == "1" and "" or "s")
        local role = name:match("^nginx") and "floor" or role_of(name)
        row(group, w, name, role, c[2], "requests/s", "higher",
          role == "floor" and 1 or num(c[3]), command,
          fmt("p50 %s us, p99 %s us", c[4], c[5]))
      end
    end
  end
end

function parsers.idle(group, command, file)
  for _, t in ipairs(md_tables(file)) do
    for _, c in ipairs(t.rows) do
      local per = c[4] and c[4]:match("^(%-?%d+)")
      if per then
        local name = c[1]
        local role = name == "C epoll floor" and "floor" or role_of(name)
        row(group, "memory per idle connection", name, role, per,
          "B/connection", "lower", role == "floor" and 1 or nil, command,
          "range " .. (c[4]:match("%((.-)%)") or "?"))
      end
    end
  end
end

function parsers.busted(group, command, file)
  for _, t in ipairs(md_tables(file)) do
    for _, c in ipairs(t.rows) do
      if num(c[2]) and num(c[3]) then
        row(group, c[1], "plain busted", "floor", c[2], "ms/test", "lower",
          1, command, nil)
        row(group, c[1], "ums.busted helper", "ums", c[3], "ms/test",
          "lower", nil, command, "adds " .. c[4] .. " ms a test")
      end
    end
  end
end

local function cmd_rows(group, kind, command, ...)
  local p = parsers[kind] or error("unknown kind " .. tostring(kind), 0)
  p(group, command, ...)
  if #out_rows == 0 then
    error(fmt("%s: no figure found in the output of %s", group, command), 0)
  end
  for _, r in ipairs(out_rows) do print(r) end
end

---------------------------------------------------------------- render

local COLS = { "group", "workload", "runtime", "role", "value", "unit",
               "better", "ratio", "command", "note" }

local function read_tsv(path, cols)
  local t = {}
  local f = io.open(path, "r")
  if not f then return t end
  for line in f:lines() do
    if line ~= "" then
      local r, i = {}, 1
      for cell in (line .. "\t"):gmatch("([^\t]*)\t") do
        r[cols and cols[i] or i] = cell
        i = i + 1
      end
      t[#t + 1] = r
    end
  end
  f:close()
  return t
end

-- Groups, each with its workloads in the order they first appear.
local function grouped(rows)
  local groups, by = {}, {}
  for _, r in ipairs(rows) do
    local g = by[r.group]
    if not g then
      g = { name = r.group, workloads = {}, wby = {}, commands = {},
            cby = {} }
      by[r.group] = g
      groups[#groups + 1] = g
    end
    local w = g.wby[r.workload]
    if not w then
      w = { name = r.workload, rows = {} }
      g.wby[r.workload] = w
      g.workloads[#g.workloads + 1] = w
    end
    w.rows[#w.rows + 1] = r
    if not g.cby[r.command] then
      g.commands[#g.commands + 1] = r.command
      g.cby[r.command] = #g.commands
    end
  end
  -- The ratio of every row of a workload with a floor: the benchmark's own
  -- when it gave one, else value / floor.
  for _, g in ipairs(groups) do
    for _, w in ipairs(g.workloads) do
      for _, r in ipairs(w.rows) do
        if r.role == "floor" then w.floor = r end
      end
      for _, r in ipairs(w.rows) do
        r.v = num(r.value)
        r.q = num(r.ratio)
        if not r.q and w.floor and num(w.floor.value) ~= 0 then
          r.q = r.v / num(w.floor.value)
        end
        if not w.floor then r.q = nil end
      end
    end
  end
  return groups
end

local function human(v)
  local a = math.abs(v)
  if a >= 1e6 then return fmt("%.2f M", v / 1e6) end
  if a >= 1e4 then return fmt("%.1f k", v / 1e3) end
  if a >= 100 then return fmt("%.0f", v) end
  if a >= 10 then return fmt("%.1f", v) end
  return fmt("%.3g", v)
end

-- A chart of one group: a bar per runtime beside the others of its
-- workload, from the floor's 1.0 up or down to the ratio, on a log scale
-- so that 2x slower and 2x faster are as far from the floor.
local function chart(dir, g, titles)
  local bars, labels, x = {}, {}, 0
  local better
  local lo, hi = 1, 1
  for _, w in ipairs(g.workloads) do
    if w.floor then
      local first = x + 1
      local n = 0
      for _, r in ipairs(w.rows) do
        if r.role ~= "floor" and r.q and r.q > 0 then n = n + 1 end
      end
      for _, r in ipairs(w.rows) do
        if r.role ~= "floor" and r.q and r.q > 0 then
          if better and better ~= r.better then
            error(fmt("%s: the chart mixes lower- and higher-is-better "
              .. "figures (%s)", g.name, w.name), 0)
          end
          better = r.better
          x = x + 1
          local color = r.role == "ums" and "0x1f5fa8"
            or r.role == "ref" and "0x999999" or "0xe08a1e"
          -- A workload with one bar is named under it; with several,
          -- each bar is its runtime and the workload's name goes above.
          local label = n == 1 and w.name or r.runtime
          bars[#bars + 1] = fmt("%d\t%.6g\t%s\t\"%s\"", x, r.q, color,
            (label:gsub('"', "'")))
          lo, hi = math.min(lo, r.q), math.max(hi, r.q)
        end
      end
      if n > 1 then
        labels[#labels + 1] = { (first + x) / 2, w.name, n + 1 }
      end
      if x >= first then
        x = x + 1
      end
    end
  end
  if #bars == 0 then return nil end
  local data = dir .. "/" .. g.name .. ".dat"
  local f = assert(io.open(data, "w"))
  f:write(table.concat(bars, "\n"), "\n")
  f:close()
  -- Wide enough for each workload's name over its bars (names alternate
  -- between two heights, so a name may take half its neighbours' room).
  local unit = 48
  for _, l in ipairs(labels) do
    unit = math.max(unit, #l[2] * 3.6 / l[3])
  end
  local width = math.floor(math.max(640, math.min(1800, unit * x + 160)))
  local gp = {
    fmt("set terminal pngcairo size %d,440 font 'sans,9' noenhanced",
      width),
    fmt("set output '%s/%s.png'", dir, g.name),
    fmt("set label '%s: ratio to the floor (floor = 1.0; %s is better)' "
      .. "at screen 0.5, screen 0.96 center font ',10'",
      titles[g.name] or g.name, better),
    "set logscale y 2",
    fmt("set yrange [%.4g:%.4g]", math.min(lo, 1) / 1.6,
      math.max(hi, 1) * 1.6),
    fmt("set xrange [-0.3:%d]", x),
    "set tmargin 6",
    "set ylabel 'value / floor (log scale)'",
    "set grid ytics lc rgb '#dddddd'",
    "set xtics rotate by 30 right nomirror font ',8'",
    "set ytics nomirror format '%.3g'",
    "set border 3",
    "set key off",
    "set datafile separator '\\t'",
    "set bmargin 8",
    "set arrow from graph 0, first 1 to graph 1, first 1 nohead "
      .. "dt 2 lw 1.5 lc rgb '#444444' front",
  }
  for i, l in ipairs(labels) do
    gp[#gp + 1] = fmt("set label \"%s\" at %.2f, graph %.2f center "
      .. "font ',9'", l[2]:gsub('"', "'"), l[1], i % 2 == 1 and 1.03 or 1.09)
  end
  gp[#gp + 1] = fmt("plot '%s' using 1:2:($1-0.4):($1+0.4):(1):2:3:xtic(4) "
    .. "with boxxyerror fs solid 0.85 noborder lc rgb variable, "
    .. "'' using 1:($2 >= 1 ? $2 * 1.12 : $2 / 1.12):"
    .. "(sprintf('%%.2f', $2)) with labels font ',8'", data)
  local script = dir .. "/" .. g.name .. ".gp"
  f = assert(io.open(script, "w"))
  f:write(table.concat(gp, "\n"), "\n")
  f:close()
  local ok = os.execute(fmt("gnuplot '%s'", script))
  if not ok then error("gnuplot failed on " .. script, 0) end
  return g.name .. ".png"
end

local TITLES = {
  core = "C runtime: scheduler, channels, timers (bench_core)",
  lua = "Lua tasks and channels (bench/lua/run.sh)",
  fs = "File I/O (bench_fs.lua, bench_io)",
  ffi = "Going preemptive (bench_ffi.lua, bench_preempt)",
  cores = "Many cores (bench_cores.lua)",
  echo = "Network echo (bench/net/run.sh)",
  http = "HTTP keep-alive (bench/net/http.sh)",
  idle = "Idle connections (bench/net/idle.sh)",
  busted = "Busted helper (bench_busted.sh)",
}

local function render(dir)
  local rows = read_tsv(dir .. "/rows.tsv", COLS)
  local meta = {}
  for _, r in ipairs(read_tsv(dir .. "/meta.tsv")) do meta[r[1]] = r[2] end
  local notes = read_tsv(dir .. "/notes.tsv")
  local groups = grouped(rows)
  local md = {}
  local function p(...) md[#md + 1] = fmt(...) end

  p("# ums benchmark report, %s", meta.date or "?")
  p("")
  p("Each figure is ums (or a peer) against the **floor** of its workload: "
    .. "the same work done the plainest way on this machine (a C loop, a "
    .. "raw coroutine, one thread), measured in the same run. The headline "
    .. "is the ratio (value / floor, so 1.0 is the floor; whether lower or "
    .. "higher is better is said per group); the absolute figures stand "
    .. "beside it. Peers are other runtimes doing the same work in the "
    .. "same run. Where a benchmark measures the floor and ums back to back "
    .. "in each repetition, the ratio is its median of per-repetition "
    .. "ratios, which can differ from the ratio of the two medians shown; "
    .. "otherwise it is value / floor. A workload without a floor is in "
    .. "the table with its absolute figures only. The raw output of every "
    .. "command is in raw/ beside this file.")
  p("")
  p("**Noise.** This machine is a %s-vCPU VM shared with other jobs: "
    .. "figures move ±20%% from run to run (more for anything that puts "
    .. "a thread to sleep), so compare ratios within this run, not "
    .. "absolute figures across runs. Load average before: %s; after: %s.",
    meta.nproc or "?", meta.load_before or "?", meta.load_after or "?")
  p("")
  p("| | |")
  p("|---|---|")
  for _, k in ipairs { { "date", "date (UTC)" },
                       { "duration", "duration" },
                       { "machine", "machine" },
                       { "cpu", "CPU" },
                       { "kernel", "kernel" },
                       { "load_before", "load average before" },
                       { "load_after", "load average after" },
                       { "commit", "commit" },
                       { "build", "build tree" },
                       { "command", "command" },
                       { "peers", "peers" } } do
    if meta[k[1]] then
      local v = meta[k[1]]
      if k[1] == "command" or k[1] == "commit" then v = "`" .. v .. "`" end
      p("| %s | %s |", k[2], v)
    end
  end
  p("")
  if #notes > 0 then
    p("Not measured in this run:")
    p("")
    for _, n in ipairs(notes) do p("- **%s**: %s", n[1], n[2] or "") end
    p("")
  end
  p("Groups: %s.", (function()
    local t = {}
    for _, g in ipairs(groups) do
      t[#t + 1] = fmt("[%s](#%s)", g.name, g.name)
    end
    return #t > 0 and table.concat(t, ", ") or "none"
  end)())
  p("")

  for _, g in ipairs(groups) do
    p('<a id="%s"></a>', g.name)
    p("")
    p("## %s: %s", g.name, TITLES[g.name] or g.name)
    p("")
    local png = chart(dir, g, TITLES)
    if png then
      p("![%s](%s)", g.name, png)
      p("")
    end
    if meta["time_" .. g.name] then
      p("Run time of the group: %s s.", meta["time_" .. g.name])
      p("")
    end
    p("Commands (the bracketed number beside each figure):")
    p("")
    for i, c in ipairs(g.commands) do p("%d. `%s`", i, c) end
    p("")
    p("| workload | runtime | ratio to floor | figure | floor | better | "
      .. "from | note |")
    p("|---|---|---:|---:|---:|---|---|---|")
    for _, w in ipairs(g.workloads) do
      for _, r in ipairs(w.rows) do
        local ratio = r.role == "floor" and "1.00 (floor)"
          or r.q and fmt("**%.2f**", r.q) or "-"
        local fl = w.floor and fmt("%s %s", human(num(w.floor.value)),
          w.floor.unit) or "no floor"
        local who = r.role == "ums" and "**" .. r.runtime .. "**"
          or r.runtime
        p("| %s | %s | %s | %s %s | %s | %s | [%d] | %s |", w.name, who,
          ratio, human(r.v), r.unit, r.role == "floor" and "" or fl,
          r.better, g.cby[r.command], r.note)
      end
    end
    p("")
  end
  local f = assert(io.open(dir .. "/report.md", "w"))
  f:write(table.concat(md, "\n"), "\n")
  f:close()
end

---------------------------------------------------------------- check

local function check(dir, want)
  local rows = read_tsv(dir .. "/rows.tsv", COLS)
  assert(#rows > 0, dir .. "/rows.tsv: no rows")
  for i, r in ipairs(rows) do
    assert(num(r.value), fmt("row %d: value %q is not a number", i,
      tostring(r.value)))
    assert(r.ratio == "" or num(r.ratio), fmt("row %d: ratio %q is not a "
      .. "number", i, tostring(r.ratio)))
    assert(r.command ~= "", fmt("row %d: no command", i))
  end
  local md = readfile(dir .. "/report.md")
  for _, key in ipairs { "load average before", "commit", "command" } do
    assert(md:find(key, 1, true), "report.md: no " .. key)
  end
  for _, name in ipairs(want) do
    local found
    for _, g in ipairs(grouped(rows)) do
      if g.name == name then found = g end
    end
    assert(found, "no rows for group " .. name)
    local charted = 0
    for _, w in ipairs(found.workloads) do
      for _, r in ipairs(w.rows) do
        if r.role ~= "floor" and r.q then charted = charted + 1 end
      end
    end
    assert(charted > 0, name .. ": no figure with a ratio to a floor")
    local png = readfile(dir .. "/" .. name .. ".png")
    assert(png:sub(1, 8) == "\137PNG\r\n\26\n", name .. ".png: not a PNG")
    assert(md:find("## " .. name .. ":", 1, true),
      "report.md: no section " .. name)
  end
  print(fmt("report check: %d rows, groups %s: ok", #rows,
    table.concat(want, " ")))
end

---------------------------------------------------------------- main

local cmd = arg[1]
local ok, err = pcall(function()
  if cmd == "rows" then
    cmd_rows(arg[2], arg[3], arg[4], table.unpack(arg, 5))
  elseif cmd == "render" then
    render(assert(arg[2], "render DIR"))
  elseif cmd == "check" then
    check(assert(arg[2], "check DIR"), { table.unpack(arg, 3) })
  else
    error("usage: report.lua rows|render|check ...", 0)
  end
end)
if not ok then
  io.stderr:write("report.lua: ", tostring(err), "\n")
  os.exit(1)
end
