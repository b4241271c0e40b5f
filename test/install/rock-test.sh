#!/bin/sh
# rock-test.sh SOURCE_DIR VERSION: the rock as a Lua user installs it.
# Copies the sources (not the checkout's build directories) to a temporary
# directory, runs the README's `luarocks --lua-version=5.4 make` there into
# a temporary tree, and checks, with only that tree on Lua's paths, that
#   - the tree holds ums/core.so, the stdlib and the ums command, and no
#     dangling symlink (LuaRocks copies symlinks as files);
#   - plain lua5.4 runs require "ums" and a small ums.run from it;
#   - the ums command from the tree's bin, found through `luarocks path`,
#     prints the version and runs a script.
set -eu
src=$1
version=$2
tmp=$(mktemp -d /tmp/ums-rock.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
tree=$tmp/tree

mkdir "$tmp/src" "$tmp/home"
tar -C "$src" --exclude='./build*' --exclude='./_build*' --exclude='./.git' \
    -cf - . | tar -C "$tmp/src" -xf -
# HOME keeps LuaRocks' cache and configuration out of the user's own.
# The build is bounded in time: a hang fails the test, not ctest's timeout.
if ! (cd "$tmp/src" &&
      HOME=$tmp/home CMAKE_BUILD_PARALLEL_LEVEL=2 \
      timeout 900 luarocks --lua-version=5.4 make --tree "$tree" \
      >"$tmp/make.log" 2>&1); then
  cat "$tmp/make.log"
  echo "luarocks make failed"
  exit 1
fi
tail -n 1 "$tmp/make.log"

for f in lib/lua/5.4/ums/core.so share/lua/5.4/ums/init.lua bin/ums; do
  test -f "$tree/$f" || { echo "not in the rock tree: $f"; exit 1; }
done
dangling=$(find "$tree" -xtype l)
if [ -n "$dangling" ]; then
  echo "dangling symlinks in the rock tree: $dangling"; exit 1
fi
# The module carries the runtime: it needs no libums of its own.
if ldd "$tree/lib/lua/5.4/ums/core.so" | grep -q 'libums'; then
  echo "the rock's core.so needs a shared libums"; exit 1
fi
echo "rock tree: ums/core.so (standalone), the stdlib, bin/ums"

# Only the rock tree on Lua's paths: no ';;', so no default entry that
# could find a system-wide ums or the build tree.
out=$(env -i PATH=/usr/bin:/bin \
      LUA_PATH="$tree/share/lua/5.4/?.lua;$tree/share/lua/5.4/?/init.lua" \
      LUA_CPATH="$tree/lib/lua/5.4/?.so" \
      timeout 60 lua5.4 -e '
  local ums = require "ums"
  assert(package.searchpath("ums.core", package.cpath):find("/tree/", 1, true))
  local r = ums.run(function()
    local t = ums.spawn(function(a) ums.sleep(0.01); return a * 2 end, 21)
    local ch = ums.channel()
    ums.spawn(function() ch:send("from a task") end)
    return select(2, t:join()), ch:recv()
  end)
  print(ums._VERSION, r)')
echo "lua5.4: $out"
[ "$out" = "ums $version	42" ] || { echo "want: ums $version	42"; exit 1; }

# docs/install.md's way: `luarocks path` sets LUA_PATH, LUA_CPATH and PATH.
cat >"$tmp/script.lua" <<'LUA'
local ums = require "ums"
print(ums.spawn(function() return "script ran" end):join())
LUA
out=$(env -i PATH=/usr/bin:/bin HOME="$tmp/home" sh -c '
  eval "$(luarocks --lua-version=5.4 --tree "$1" path)"
  command -v ums; timeout 60 ums -v; timeout 60 ums "$2"' sh "$tree" \
  "$tmp/script.lua")
echo "$out"
want="$tree/bin/ums
ums $version (Lua 5.4)
true	script ran"
[ "$out" = "$want" ] || { echo "want: $want"; exit 1; }
echo "install_rock: ok"
