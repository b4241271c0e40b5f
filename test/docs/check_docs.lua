-- check_docs.lua: checks the documentation against the tree and the built
-- module. Run from the source root with the build's module on LUA_CPATH:
--
--   lua5.4 test/docs/check_docs.lua api     every public Lua function has
--                                           an entry in docs/lua-api.md or
--                                           docs/stdlib.md
--   lua5.4 test/docs/check_docs.lua links   every relative link of README.md,
--                                           CHANGELOG.md, bench/RESULTS.md
--                                           and docs/ names a file (and a
--                                           heading) that exists
--
-- Prints each problem and "N checked, N missing"; exits 1 on a problem.
-- Files are listed with ums.fs, which makes plain system calls outside a
-- task, so that no shell is started (a shell cannot start under the TSan
-- preload of sanitizer builds).

local ums = require "ums"

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function exists(path)
  return ums.fs.stat(path) ~= nil
end

-- Markdown files under dir, recursively, sorted.
local function markdown_under(dir, out)
  local names = {}
  for name in ums.fs.dir(dir) do
    if name ~= "." and name ~= ".." then names[#names + 1] = name end
  end
  table.sort(names)
  for _, name in ipairs(names) do
    local path = dir .. "/" .. name
    local st = assert(ums.fs.stat(path))
    if st.type == "directory" then
      markdown_under(path, out)
    elseif name:match("%.md$") then
      out[#out + 1] = path
    end
  end
  return out
end

-- Lines of a Markdown text outside fenced code blocks, with their numbers.
local function prose_lines(text)
  local out, fence = {}, false
  local n = 0
  for line in (text .. "\n"):gmatch("(.-)\n") do
    n = n + 1
    if line:match("^%s*```") then
      fence = not fence
    elseif not fence then
      out[#out + 1] = {n = n, line = line}
    end
  end
  return out
end

---------------------------------------------------------------------------
-- api: the reference names every function the modules export.
---------------------------------------------------------------------------

-- The names an entry gives: the code spans of a heading, or of the first
-- cell of a table row. A span's leading name is taken whole
-- (`ums.fs.open(path)` names ums.fs.open); a name without a module
-- (`writefile(path, s)`, `.mutex()`) belongs to the module of the name
-- before it in the same cell, or, for the first one, to the module the
-- section's heading names (the LuaSocket table under "`ums.socket`").
local function entries(path, names)
  local section = ""
  for _, l in ipairs(prose_lines(read(path))) do
    local line, cell = l.line, nil
    if line:match("^#+ ") then
      cell = line
      section = line:match("`(ums[%w_.]*)") or ""
      if section ~= "" then section = section .. "." end
    elseif line:match("^|") and not line:match("^|[%s%-:|]*$") then
      cell = line:match("^|([^|]*)|") or ""
      -- A first cell may hold `|` inside a code span (`"r" \| "w"`).
      cell = line:match("^|(.-[^\\])|") or cell
    end
    if cell then
      local prefix = nil
      for span in cell:gmatch("`([^`]+)`") do
        local name = span:match("^%.?[%a_][%w_.:]*")
        if name then
          if name:sub(1, 1) == "." then
            name = (prefix or section):gsub("%.$", "") .. name
          elseif name:match("^ums[.:]") or name == "ums" then
            prefix = name:match("^(.*%.)") or prefix
          elseif not name:find(":", 1, true) then
            name = (prefix or section) .. name
          end
          names[name] = names[name] or (path .. ":" .. l.n)
        end
      end
    end
  end
end

-- Fields that are not functions of the API, each with the reason.
local not_api = {
  ["ums.socket.sinkt"] = "LuaSocket's table of sink makers, by mode name",
  ["ums.socket.sourcet"] = "LuaSocket's table of source makers, by mode name",
}

-- Every function reachable from a module table, by its dotted name. A
-- function seen under one name is not asked for again under another
-- (ums.sync's are ums's, require "ums.net" is ums.net). Capitalised
-- fields are classes (their methods are documented with their objects),
-- and fields starting with "_" are not API.
local function functions_of(prefix, t, out, seen, depth)
  local keys = {}
  for k in pairs(t) do
    if type(k) == "string" then keys[#keys + 1] = k end
  end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local v, name = t[k], prefix .. "." .. k
    if k:match("^_") or k:match("^%u") or not_api[name] then
      -- not API
    elseif type(v) == "function" then
      if not seen[v] then
        seen[v] = name
        out[#out + 1] = name
      end
    elseif type(v) == "table" and depth > 0 and not seen[v] then
      seen[v] = name
      functions_of(name, v, out, seen, depth - 1)
    end
  end
  return out
end

local function check_api()
  local names = {}
  entries("docs/lua-api.md", names)
  entries("docs/stdlib.md", names)
  local seen, want = {}, {}
  -- The modules as a program loads them: ums (with the core's fields and
  -- ums.sync's), then the modules of stdlib/ums/ that have functions of
  -- their own. ums.waitq is the other modules' internals, ums.test a
  -- function (ums.test), ums.busted a Busted helper that loads only
  -- under Busted.
  functions_of("ums", ums, want, seen, 2)
  for _, m in ipairs{"ums.net", "ums.sync", "ums.applock", "ums.group",
                     "ums.workqueue", "ums.socket"} do
    local mod = require(m)
    if type(mod) == "table" and not seen[mod] then
      seen[mod] = m
      functions_of(m, mod, want, seen, 1)
    end
  end
  local missing = 0
  for _, name in ipairs(want) do
    if not names[name] then
      missing = missing + 1
      io.write("no entry for ", name, " in docs/lua-api.md or ",
               "docs/stdlib.md (a heading or a table row naming it)\n")
    end
  end
  io.write(#want, " functions checked, ", missing, " missing\n")
  return missing == 0
end

---------------------------------------------------------------------------
-- links: relative links name files and headings that exist.
---------------------------------------------------------------------------

-- GitHub's anchor for a heading: lower case, punctuation dropped, spaces
-- as hyphens; a repeated heading gets -1, -2, ...
local function anchors(path)
  local out, count = {}, {}
  for _, l in ipairs(prose_lines(read(path))) do
    local text = l.line:match("^#+%s+(.-)%s*$")
    if text then
      local a = text:lower():gsub("[^%w%- _]", ""):gsub(" ", "-")
      if count[a] then
        count[a] = count[a] + 1
        out[a .. "-" .. count[a]] = true
      else
        count[a] = 0
        out[a] = true
      end
    end
  end
  return out
end

local function dirname(path)
  return path:match("^(.*)/[^/]*$") or "."
end

-- a/b/../c -> a/c
local function normalize(path)
  local parts = {}
  for part in path:gmatch("[^/]+") do
    if part == ".." and #parts > 0 and parts[#parts] ~= ".." then
      parts[#parts] = nil
    elseif part ~= "." then
      parts[#parts + 1] = part
    end
  end
  return table.concat(parts, "/")
end

local function check_links()
  local files = {"README.md", "CHANGELOG.md", "bench/RESULTS.md"}
  markdown_under("docs", files)
  local cache, checked, bad = {}, 0, 0
  local function anchors_of(p)
    cache[p] = cache[p] or anchors(p)
    return cache[p]
  end
  for _, file in ipairs(files) do
    for _, l in ipairs(prose_lines(read(file))) do
      -- Code spans may hold text that looks like a link.
      local line = l.line:gsub("`[^`]*`", "")
      for target in line:gmatch("%]%(([^)%s]+)%)") do
        if not target:match("^%a[%w+.-]*:") then
          checked = checked + 1
          local path, anchor = target:match("^([^#]*)#?(.*)$")
          local full = path == "" and file
                       or normalize(dirname(file) .. "/" .. path)
          local problem
          if not exists(full) then
            problem = "no file " .. full
          elseif anchor ~= "" and full:match("%.md$")
                 and not anchors_of(full)[anchor] then
            problem = "no heading #" .. anchor .. " in " .. full
          end
          if problem then
            bad = bad + 1
            io.write(file, ":", l.n, ": link ", target, ": ", problem, "\n")
          end
        end
      end
    end
  end
  io.write(checked, " links checked, ", bad, " broken\n")
  return bad == 0
end

local mode = arg[1]
local ok
if mode == "api" then
  ok = check_api()
elseif mode == "links" then
  ok = check_links()
else
  io.stderr:write("usage: lua5.4 test/docs/check_docs.lua api|links\n")
  os.exit(2)
end
os.exit(ok and 0 or 1)
