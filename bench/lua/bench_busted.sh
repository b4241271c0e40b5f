#!/usr/bin/env bash
# What the ums.busted helper adds per test, against plain Busted: a spec
# of N empty tests (optionally with an empty before_each and after_each,
# each then a block of the test's run) is run by `lua5.4 busted` with and
# without --helper=ums.busted, on a small heap and with a 70 MB heap kept
# live for the whole run (a helper that fills it before the tests).
# Busted's own suite time (its summary line, startup excluded) is the
# figure; the overhead per test is (helper - plain) / N, medians of
# --reps runs. A last row runs the helper with gc (a full collection per
# test, on request) on the large heap.
#
#   bench/lua/bench_busted.sh [--quick] [--reps N] [--tests N]
#                             [--build-dir DIR]
#
# Uses a Release tree (default: build-release/, built if missing; any
# other tree with --build-dir).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$root/build-release"
reps=5
n=400
while (($#)); do
  case "$1" in
    --quick) n=40; reps=1 ;;
    --reps) reps=$2; shift ;;
    --tests) n=$2; shift ;;
    --build-dir) build=$2; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "bench_busted.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" --target ums_lua >/dev/null
busted=$(command -v busted)
export LUA_PATH="$root/stdlib/?.lua;$root/stdlib/?/init.lua;;"
export LUA_CPATH="$build/lua-binding/?.so;;"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The specs: N empty tests; the same with empty hooks.
{
  echo 'describe("empty", function()'
  for ((i = 1; i <= n; i++)); do echo "  it('t$i', function() end)"; done
  echo 'end)'
} >"$tmp/bare_spec.lua"
{
  echo 'describe("hooks", function()'
  echo '  before_each(function() end)'
  echo '  after_each(function() end)'
  for ((i = 1; i <= n; i++)); do echo "  it('t$i', function() end)"; done
  echo 'end)'
} >"$tmp/hooks_spec.lua"
# 70 MB of small tables, live until the process ends.
cat >"$tmp/heap.lua" <<'EOF'
BENCH_HEAP = {}
for i = 1, 780000 do BENCH_HEAP[i] = {i} end
EOF
: >"$tmp/none.lua"

# suite_time <spec> <busted args...>: Busted's suite time in seconds.
suite_time() {
  local spec=$1
  shift
  lua5.4 "$busted" --output=plainTerminal "$@" "$spec" |
    sed -n 's/.* : \([0-9.e-]*\) seconds$/\1/p'
}

median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

# row <label> <spec> <heap file> <ums args...>
row() {
  local label=$1 spec=$2 heap=$3
  shift 3
  local plain=() ums=() i
  for ((i = 0; i < reps; i++)); do
    plain+=("$(suite_time "$spec" --helper="$heap")")
    ums+=("$(suite_time "$spec" --helper=ums.busted \
              -Xhelper "helper=$heap" "$@")")
  done
  local p u
  p=$(printf '%s\n' "${plain[@]}" | median)
  u=$(printf '%s\n' "${ums[@]}" | median)
  awk -v l="$label" -v p="$p" -v u="$u" -v n="$n" 'BEGIN {
    printf "| %-34s | %9.2f | %9.2f | %10.3f |\n", l, p * 1000 / n,
           u * 1000 / n, (u - p) * 1000 / n }'
}

heap_mb=$(lua5.4 -e "dofile('$tmp/heap.lua')
  print(math.floor(collectgarbage('count') / 1024))")
echo "command: $0 (n = $n tests, reps = $reps, medians; heap: $heap_mb MB)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs"
echo
echo "| spec, heap                         | plain ms/test | helper ms/test | added ms/test |"
echo "|---|---:|---:|---:|"
row "$n empty tests, small heap" "$tmp/bare_spec.lua" "$tmp/none.lua"
row "$n empty tests, ${heap_mb} MB heap" "$tmp/bare_spec.lua" "$tmp/heap.lua"
row "$n tests + 2 hooks, small heap" "$tmp/hooks_spec.lua" "$tmp/none.lua"
row "$n tests + 2 hooks, ${heap_mb} MB heap" "$tmp/hooks_spec.lua" \
  "$tmp/heap.lua"
n_gc=$((n / 20 > 2 ? n / 20 : 2))
{
  echo 'describe("empty", function()'
  for ((i = 1; i <= n_gc; i++)); do echo "  it('t$i', function() end)"; done
  echo 'end)'
} >"$tmp/gc_spec.lua"
n_saved=$n
n=$n_gc
row "$n_gc empty tests, ${heap_mb} MB, gc" "$tmp/gc_spec.lua" "$tmp/heap.lua" \
  -Xhelper gc
n=$n_saved
