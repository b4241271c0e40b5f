#!/bin/sh
# install-test.sh BUILD_DIR SOURCE_DIR CC: installs the build into a
# temporary prefix, then, using only the installed files:
#   - checks that `pkg-config --cflags --libs ums` prints the prefix's
#     plain paths (docs/install.md);
#   - builds jobrun with that command and runs jobs.txt, also with the
#     static libraries;
#   - builds this directory as its own CMake project, with
#     find_package(ums CONFIG) and with pkg-config, and runs both jobruns;
#   - runs `require "ums"` in plain lua5.4 (module and stdlib installed).
set -eu
build=$1
src=$2
cc=$3
tmp=$(mktemp -d /tmp/ums-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
# GNUInstallDirs' libdir for a prefix other than /usr: lib, or lib64.
libdir=$(cd "$prefix" && ls -d lib64/pkgconfig lib/pkgconfig 2>/dev/null |
         head -n 1 | sed 's,/pkgconfig$,,')
export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
for f in "$libdir/libums.so" "$libdir/libums.a" "$libdir/libums-lua.so" \
         "$libdir/libums-lua.a" "$libdir/pkgconfig/ums.pc" \
         "$libdir/cmake/ums/ums-config.cmake" \
         "$libdir/cmake/ums/ums-config-version.cmake" \
         "$libdir/lua/5.4/ums/core.so" include/ums.h include/ums-lua.h \
         include/ums-version.h share/lua/5.4/ums/init.lua bin/ums; do
  test -e "$prefix/$f" || { echo "not installed: $f"; exit 1; }
done
echo "installed: libums, libums-lua (shared, static), headers, ums.pc,"\
     "the CMake package, ums/core.so, the stdlib, bin/ums"

# ums.pc names the prefix it was installed to, in plain paths.
flags=$(pkg-config --cflags --libs ums)
echo "pkg-config --cflags --libs ums: $flags"
want="-I$prefix/include $(pkg-config --cflags lua5.4 | sed 's/ *$//')"
want="$want -L$prefix/$libdir -lums-lua -lums $(pkg-config --libs lua5.4)"
want=$(echo "$want" | tr -s ' ' | sed 's/ *$//')
if [ "$(echo "$flags" | sed 's/ *$//')" != "$want" ]; then
  echo "want: $want"; exit 1
fi
"$cc" -o "$tmp/jobrun" "$src/jobrun.c" $flags
echo "built jobrun against $prefix"

lua_share="$prefix/share/lua/5.4"
lua_lib="$prefix/$libdir/lua/5.4"
export LUA_PATH="$src/?.lua;$lua_share/?.lua;$lua_share/?/init.lua;;"
export LUA_CPATH="$lua_lib/?.so;;"
want_jobs="summary: 8 jobs, 5 ok, 2 error, 1 timed out"
LD_LIBRARY_PATH="$prefix/$libdir" "$tmp/jobrun" "$src/jobs.txt" |
  grep -q "$want_jobs"
echo "ran jobrun (pkg-config): $want_jobs"

# The same, linked with the static libraries.
sflags=$(pkg-config --static --cflags --libs ums |
         sed 's/-lums-lua -lums/-Wl,-Bstatic -lums-lua -lums -Wl,-Bdynamic/')
"$cc" -o "$tmp/jobrun-static" "$src/jobrun.c" $sflags
if ldd "$tmp/jobrun-static" | grep -q libums; then
  echo "jobrun-static still needs a shared libums"; exit 1
fi
"$tmp/jobrun-static" "$src/jobs.txt" | grep -q "$want_jobs"
echo "built and ran jobrun with the static libraries"

# examples/embed as its own project: find_package(ums CONFIG), then
# pkg-config through CMake. The find_package build runs without
# LD_LIBRARY_PATH: CMake gives it the run path of the imported libraries.
for how in find_package pkg-config; do
  opt=-DEMBED_WITH_PKG_CONFIG=OFF
  [ "$how" = pkg-config ] && opt=-DEMBED_WITH_PKG_CONFIG=ON
  if ! { CC="$cc" cmake -S "$src" -B "$tmp/embed-$how" \
           -DCMAKE_PREFIX_PATH="$prefix" "$opt" &&
         cmake --build "$tmp/embed-$how"; } >"$tmp/embed-$how.log" 2>&1; then
    cat "$tmp/embed-$how.log"; echo "CMake build with $how failed"; exit 1
  fi
  if [ "$how" = find_package ]; then
    "$tmp/embed-$how/jobrun" "$src/jobs.txt" | grep -q "$want_jobs"
  else
    LD_LIBRARY_PATH="$prefix/$libdir" "$tmp/embed-$how/jobrun" \
      "$src/jobs.txt" | grep -q "$want_jobs"
  fi
  echo "built examples/embed with CMake and $how, ran jobrun: $want_jobs"
done

# Plain lua5.4 finds the installed module; it reaches libums-lua by its
# own run path (no LD_LIBRARY_PATH).
lua5.4 -e '
  local ums = require "ums"
  print("lua5.4: " .. ums.run(function()
    return ums.spawn(function() ums.sleep(0.001); return "require ums ok" end)
      :join() and "require ums ok"
  end))'
echo "install_embed: ok"
