#!/usr/bin/env bash
# What an echo round trip costs the server, in figures the machine's load
# does not change: user-space instructions (valgrind's callgrind) and
# system calls (strace -c), each per round trip, for the C epoll floor,
# luv and the ums Lua echo server on one scheduler (io_uring, and the
# epoll backend with UMS_IO=pool). Each server serves a warm-up (10
# clients x 100 round trips), then its counts are zeroed (callgrind_control
# -z; strace attaches) and the load generator makes C clients x N round
# trips of 64 bytes; what the server did meanwhile, divided by C x N, is
# the figure. How many connections one pass of a loop serves changes the
# per-round-trip share of the loop's own calls: compare servers measured
# with the same C and N.
#
#   bench/net/cost.sh [--clients C] [--rounds N] [--build-dir DIR]
#                     [--only REGEX] [--keep DIR]
#
# --keep DIR keeps each server's callgrind dump and strace table there
# (for callgrind_annotate).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$root/build-release"
clients=100
rounds=200
only=.
keep=
while (($#)); do
  case "$1" in
    --clients) clients=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --build-dir) build=$2; shift ;;
    --only) only=$2; shift ;;
    --keep) keep=$2; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "cost.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# shellcheck source=common.sh
source "$root/bench/net/common.sh"
net_build
net="$build/bench/net"
trips=$((clients * rounds))
# A server under valgrind starts slowly on a loaded machine.
net_start_wait=600

# name|environment|command, PORT replaced by the port. env and valgrind
# exec what they run, so the pid net_start records is the server's.
servers=("C epoll floor||$net/echo_epoll PORT")
lua5.4 -e "require 'luv'" 2>/dev/null &&
  servers+=("luv||lua5.4 $root/bench/net/echo_luv.lua PORT")
servers+=(
  "ums Lua, 1 scheduler||lua5.4 $root/bench/net/echo_ums.lua PORT 1"
  "ums Lua, 1 scheduler, epoll backend|UMS_IO=pool|lua5.4 $root/bench/net/echo_ums.lua PORT 1")

warm() {
  "$loadgen" -addr "127.0.0.1:$1" -c 10 -n 100 -timeout 300 >/dev/null
}
load() {
  "$loadgen" -addr "127.0.0.1:$1" -c "$clients" -n "$rounds" -timeout 600 \
    >/dev/null
}

echo "command: $0 --clients $clients --rounds $rounds (build: $build)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), load average" \
     "$(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| server | instructions / round trip | system calls / round trip | of which |"
echo "|---|---:|---:|---|"
for s in "${servers[@]}"; do
  name=${s%%|*}
  [[ "$name" =~ $only ]] || continue
  envs=${s#*|}
  envs=${envs%%|*}
  cmd=${s##*|}

  # Instructions: callgrind, counting zeroed after the warm-up.
  port=$(net_port)
  out="$net_tmp/cg"
  rm -f "$out"*
  # shellcheck disable=SC2086  # the command is split on purpose
  net_start "$port" env $envs valgrind --tool=callgrind -q \
    --callgrind-out-file="$out" ${cmd//PORT/$port}
  warm "$port"
  callgrind_control -z "$server_pid" >/dev/null 2>&1
  load "$port"
  callgrind_control -d "$server_pid" >/dev/null 2>&1
  net_stop
  dump=$(find "$net_tmp" -maxdepth 1 -name "cg.*" | head -1)
  ir=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$dump" | head -1)
  [[ -n "$ir" ]] || ir=$(sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$dump" | head -1)

  # System calls: strace -c attached after the warm-up, for the run.
  port=$(net_port)
  # shellcheck disable=SC2086
  net_start "$port" env $envs ${cmd//PORT/$port}
  warm "$port"
  st="$net_tmp/strace"
  strace -c -f -q -o "$st" -p "$server_pid" &
  strace_pid=$!
  sleep 1  # attached
  load "$port"
  kill -INT "$strace_pid"
  wait "$strace_pid" || true
  net_stop
  # strace -c's columns: % time, seconds, usecs/call, calls, [errors,]
  # syscall.
  calls=$(awk '$NF == "total" {print $4}' "$st")
  top=$(awk 'NR > 2 && $1 !~ /^-/ && $NF != "total" && $4 + 0 > 0 {
           print $4, $NF }' "$st" |
        sort -rn | head -4 |
        awk -v t="$trips" '{printf "%s%s %.2f", sep, $2, $1 / t; sep = ", "}')
  if [[ -n "$keep" ]]; then
    mkdir -p "$keep"
    tag=${name//[^A-Za-z0-9]/_}
    cp "$dump" "$keep/callgrind.$tag"
    cp "$st" "$keep/strace.$tag"
  fi
  awk -v n="$name" -v ir="$ir" -v c="$calls" -v t="$trips" -v top="$top" \
    'BEGIN { printf "| %s | %.0f | %.2f | %s |\n", n, ir / t, c / t, top }'
done
