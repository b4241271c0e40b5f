#!/usr/bin/env bash
# Installs what is missing, builds the normal configuration (build/) and
# runs the tours: examples/tour.lua (the Lua API, through the `ums`
# command) and examples/tour.c (the C API).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
bash scripts/build.sh normal
export LUA_PATH="$PWD/stdlib/?.lua;$PWD/stdlib/?/init.lua;;"
export LUA_CPATH="$PWD/build/lua-binding/?.so;;"
echo
echo "== examples/tour.lua (lua5.4 bin/ums examples/tour.lua)"
lua5.4 bin/ums examples/tour.lua
echo
echo "== examples/tour.c (build/examples/example_tour)"
exec build/examples/example_tour
