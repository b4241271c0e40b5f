#!/usr/bin/env bash
# The cost of wait statistics and CPU sampling (issue 7) on the switch and
# channel benchmarks, in instructions per operation (callgrind), stats on
# against stats off in the same tree, and optionally against another tree
# (a build of an earlier commit: --base); UMS_STATS=precise as well, and
# the same channel between two C tasks (c_channel, bench/stats_pingpong.c).
#
#   bench/lua/stats_cost.sh [--build-dir DIR] [--base ROOT:BUILD] [--n N]
#
# Instructions repeat where time does not on this noisy VM. Each figure is
# (count(N + n0) - count(n0)) / N, which cancels start-up and teardown.
# Three things make the counts repeat: valgrind serialises the threads;
# UMS_IO=pool, because valgrind 3.19 does not know io_uring_enter and the
# ring's idle wait never returns under it; and fixed_time.so (see
# fixed_time.c) with equally long paths and environments in every run,
# which pins Lua's string hash seed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$root/build-release"
base=""
n=200000
n0=20000
while (($#)); do
  case "$1" in
    --build-dir) build=$2; shift ;;
    --base) base=$2; shift ;;
    --n) n=$2; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "stats_cost.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
command -v valgrind >/dev/null || { echo "stats_cost.sh: no valgrind" >&2; exit 2; }
[[ -f "$build/CMakeCache.txt" ]] ||
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target ums_lua fixed_time stats_pingpong >/dev/null

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Every tree seen through paths of the same length.
mktree() { # name root build
  mkdir -p "$tmp/$1"
  ln -s "$2/stdlib" "$tmp/$1/stdlib"
  ln -s "$3/lua-binding" "$tmp/$1/lb"
  ln -s "$root/bench/lua/stats_cost.lua" "$tmp/$1/w.lua"
  ln -s "$3/bench/stats_pingpong" "$tmp/$1/pingpong"
}
mktree new "$root" "$build"
if [[ -n "$base" ]]; then mktree old "${base%%:*}" "${base#*:}"; fi

count() { # tree stats(on|off|precise) workload n
  local d="$tmp/$1"
  if [[ $3 == c_channel ]]; then
    # The same channel between two C tasks (bench/stats_pingpong.c).
    env UMS_STATS="$2" UMS_IO=pool \
      valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$d/pingpong" "$4" 2>&1 |
      sed -n 's/.*Collected : //p'
    return
  fi
  env UMS_STATS="$2" UMS_IO=pool LD_PRELOAD="$build/bench/lua/fixed_time.so" \
    LUA_PATH="$d/stdlib/?.lua;$d/stdlib/?/init.lua;;" \
    LUA_CPATH="$d/lb/?.so;;" \
    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
      lua5.4 "$d/w.lua" "$3" "$4" 2>&1 |
    sed -n 's/.*Collected : //p'
}
per_op() { # tree stats workload
  local a b
  a=$(count "$1" "$2" "$3" "$n0")
  b=$(count "$1" "$2" "$3" $((n0 + n)))
  awk -v a="$a" -v b="$b" -v n="$n" 'BEGIN { printf "%.1f", (b - a) / n }'
}

echo "command: $0 --n $n${base:+ --base $base} (build: $build)"
printf "%-9s %11s %11s %8s %11s %8s" workload "stats on" "stats off" \
  "on/off" "precise" "prec/off"
[[ -n "$base" ]] && printf " %11s %8s" "base off" "off/base"
printf "   (instructions per op)\n"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
for w in switch channel c_channel; do
  on=$(per_op new on "$w")
  off=$(per_op new off "$w")
  precise=$(per_op new precise "$w")
  printf "%-9s %11s %11s %8s %11s %8s" "$w" "$on" "$off" "$(ratio "$on" "$off")" \
    "$precise" "$(ratio "$precise" "$off")"
  if [[ -n "$base" ]]; then
    if [[ $w != c_channel || -x "${base#*:}/bench/stats_pingpong" ]]; then
      old=$(per_op old off "$w")
      printf " %11s %8s" "$old" "$(ratio "$off" "$old")"
    else
      printf " %11s %8s" "-" "-"
    fi
  fi
  printf "\n"
done
