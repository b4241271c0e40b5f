#!/bin/sh
# install-test.sh BUILD_DIR SOURCE_DIR CC: installs the build into a
# temporary prefix, then, using only the installed files:
#   - builds jobrun with `pkg-config --cflags --libs ums` and runs jobs.txt;
#   - runs `require "ums"` in plain lua5.4 (module and stdlib installed);
#   - lints the rockspec with luarocks, when luarocks is there.
set -eu
build=$1
src=$2
cc=$3
prefix=$(mktemp -d /tmp/ums-install.XXXXXX)
trap 'rm -rf "$prefix"' EXIT

cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(sed -n "s/^libdir=\${prefix}\///p" "$build/ums.pc")
export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
for f in "$libdir/libums.so" "$libdir/libums.a" "$libdir/libums-lua.so" \
         "$libdir/libums-lua.a" "$libdir/pkgconfig/ums.pc" \
         "$libdir/lua/5.4/ums/core.so" include/ums.h include/ums-lua.h \
         share/lua/5.4/ums/init.lua bin/ums; do
  test -e "$prefix/$f" || { echo "not installed: $f"; exit 1; }
done
echo "installed: libums, libums-lua (shared, static), headers, ums.pc,"\
     "ums/core.so, the stdlib, bin/ums"

# ums.pc finds its prefix from where it is (${pcfiledir}).
flags=$(pkg-config --cflags --libs ums)
echo "pkg-config --cflags --libs ums: $flags"
"$cc" -o "$prefix/jobrun" "$src/jobrun.c" $flags
echo "built jobrun against $prefix"

lua_share="$prefix/share/lua/5.4"
lua_lib="$prefix/$libdir/lua/5.4"
export LD_LIBRARY_PATH="$prefix/$libdir"
export LUA_PATH="$src/?.lua;$lua_share/?.lua;$lua_share/?/init.lua;;"
export LUA_CPATH="$lua_lib/?.so;;"
out=$("$prefix/jobrun" "$src/jobs.txt")
echo "$out"
echo "$out" | grep -q "summary: 8 jobs, 5 ok, 2 error, 1 timed out"

# The same, linked with the static libraries.
sflags=$(pkg-config --static --cflags --libs ums |
         sed 's/-lums-lua -lums/-Wl,-Bstatic -lums-lua -lums -Wl,-Bdynamic/')
"$cc" -o "$prefix/jobrun-static" "$src/jobrun.c" $sflags
if ldd "$prefix/jobrun-static" | grep -q libums; then
  echo "jobrun-static still needs a shared libums"; exit 1
fi
"$prefix/jobrun-static" "$src/jobs.txt" |
  grep -q "summary: 8 jobs, 5 ok, 2 error, 1 timed out"
echo "built and ran jobrun with the static libraries"

# Plain lua5.4 finds the installed module; it reaches libums-lua by its
# own run path (no LD_LIBRARY_PATH).
env -u LD_LIBRARY_PATH lua5.4 -e '
  local ums = require "ums"
  print("lua5.4: " .. ums.run(function()
    return ums.spawn(function() ums.sleep(0.001); return "require ums ok" end)
      :join() and "require ums ok"
  end))'

if command -v luarocks >/dev/null 2>&1; then
  for r in "$src"/../../rockspecs/*.rockspec; do
    luarocks --lua-version=5.4 lint "$r"
    echo "luarocks lint $(basename "$r"): ok"
  done
else
  echo "luarocks not installed: rockspec lint skipped"
fi
echo "install_embed: ok"
