#!/usr/bin/env bash
# Runs the Lua benchmarks: bench_ums.lua (ums next to raw Lua 5.4
# coroutines and lua_resume from C) and bench_tarantool.lua (the same
# shapes with Tarantool fibers), then prints one table with the ratios
# ums/floor and ums/tarantool side by side.
#
#   bench/lua/run.sh [--quick] [--reps N] [--build-dir DIR]
#
# Builds a Release tree first if needed (default: build-release/; an
# existing tree of another build type is refused: figures from a Debug or
# sanitizer build mean nothing). Without tarantool on PATH the peer
# columns stay empty (install it with apt-get install tarantool).
# The JSON of both runs is kept in DIR/bench-lua/.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=../release-tree.sh
source "$root/bench/release-tree.sh"
build="$root/build-release"
args=()
while (($#)); do
  case "$1" in
    --quick) args+=(--quick) ;;
    --reps) args+=(--reps "$2"); shift ;;
    --build-dir) build=$2; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

echo "command: $0 ${args[*]:-} (build: $build)"

release_tree run.sh "$build"
cmake --build "$build" --target ums_lua bench_floor >/dev/null

lua=$(command -v lua5.4) || { echo "run.sh: lua5.4 not found" >&2; exit 2; }
export LUA_PATH="$root/stdlib/?.lua;$root/stdlib/?/init.lua;;"
export LUA_CPATH="$build/lua-binding/?.so;$build/bench/lua/?.so;;"
out="$build/bench-lua"
mkdir -p "$out"
status=0

echo "== bench_ums.lua (progress on stderr)" >&2
"$lua" "$root/bench/lua/bench_ums.lua" --json "${args[@]}" \
  >"$out/ums.json" || status=1

tt_json=()
if command -v tarantool >/dev/null; then
  echo "== bench_tarantool.lua (progress on stderr)" >&2
  # Tarantool logs a SystemError when a fiber cannot be created; that is
  # the figure being measured, not a failure of the run.
  tarantool "$root/bench/lua/bench_tarantool.lua" --json "${args[@]}" \
    >"$out/tarantool.json" || status=1
  tt_json=("$out/tarantool.json")
else
  echo "run.sh: tarantool not found: peer columns left empty" >&2
fi

echo
"$lua" "$root/bench/lua/combine.lua" "$out/ums.json" "${tt_json[@]}"
echo
echo "raw figures: $out/ums.json ${tt_json[*]:-}"
exit $status
