#!/usr/bin/env bash
# LuaSocket's select() loop, unchanged, on Debian's LuaSocket and on
# ums.socket: a line echo server whose select list holds IDLE silent
# connections and one busy one (bench/net/select_server.lua), the client
# in its own process (bench/net/select_client.lua). Prints microseconds
# per round trip for each server and idle count, and ums / LuaSocket.
#
#   bench/net/select.sh [--idle "0 100 900"] [--rounds N] [--reps N]
#                       [--build-dir DIR]
#
# LuaSocket's select(2) takes at most 1,024 descriptors, so the idle
# counts stay below that.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$root/build-release"
idles="0 100 900"
rounds=2000
reps=3
while (($#)); do
  case "$1" in
    --quick) idles="0 100"; rounds=200; reps=1 ;;
    --idle) idles=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --reps) reps=$2; shift ;;
    --build-dir) build=$2; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "select.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# shellcheck source=common.sh
source "$root/bench/net/common.sh"
net_build
if ! lua5.4 -e 'require "socket"' 2>/dev/null; then
  echo "select.sh: Debian's lua-socket is not installed" >&2
  exit 2
fi
ulimit -n "$(ulimit -Hn)"

one() {  # one MODE IDLE: microseconds a round trip
  local port
  port=$(net_port)
  net_start "$port" lua5.4 "$root/bench/net/select_server.lua" "$1" "$port"
  lua5.4 "$root/bench/net/select_client.lua" "$port" "$2" "$rounds"
  net_stop
}

printf '%-22s %12s %12s %16s\n' "idle connections" "LuaSocket" "ums.socket" "ums / LuaSocket"
for n in $idles; do
  ls_runs=() ums_runs=()
  for ((r = 0; r < reps; r++)); do  # alternated
    ls_runs+=("$(one luasocket "$n")")
    ums_runs+=("$(one ums "$n")")
  done
  a=$(printf '%s\n' "${ls_runs[@]}" | median)
  b=$(printf '%s\n' "${ums_runs[@]}" | median)
  printf '%-22s %9s us %9s us %9.2fx\n' "$n" "$a" "$b" \
    "$(awk -v a="$a" -v b="$b" 'BEGIN {print b / a}')"
done
