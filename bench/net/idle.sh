#!/usr/bin/env bash
# Memory per idle connection: the load generator (bench/net/loadgen -mode
# idle, its own process) opens N connections to a server and holds them;
# the server's resident memory (VmRSS in /proc/PID/status) is read before
# and once it holds all N (its descriptor count says so), and the
# difference divided by N is the figure. The kernel's socket buffers are
# not in a process's RSS, so this is the memory beyond them.
#
#   ums Lua echo   bench/net/echo_ums.lua, 1 scheduler: a task per
#                  connection waiting in conn:recv()
#   ums Lua http   examples/http_server.lua, 1 scheduler: a task per
#                  connection waiting in conn:read("l")
#   ums C          bench/net/echo_ums.c, 1 scheduler: a C task (fiber and
#                  stack) per connection
#   C epoll floor, luv, Go (GOMAXPROCS 1): the same shapes in the peers
#
#   bench/net/idle.sh [--conns N] [--reps N] [--build-dir DIR]
#                     [--echo-first]
#
# --echo-first: each connection first makes one 64-byte round trip, then
# waits (the echo servers only: the HTTP server is left out): what an
# idle connection costs after it has carried traffic.
#
# N defaults to 10,000: the server and the load generator each need N
# descriptors (the limit here is 20,000 per process).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$root/build-release"
conns=10000
reps=3
echo_first=0
while (($#)); do
  case "$1" in
    --quick) conns=500; reps=1 ;;
    --conns) conns=$2; shift ;;
    --reps) reps=$2; shift ;;
    --build-dir) build=$2; shift ;;
    --echo-first) echo_first=1 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "idle.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# shellcheck source=common.sh
source "$root/bench/net/common.sh"
net_build
net="$build/bench/net"
ulimit -n "$(ulimit -Hn)"
if (($(ulimit -n) < conns + 100)); then
  echo "idle.sh: the open-files limit ($(ulimit -n)) is below" \
       "$conns connections" >&2
  exit 2
fi

servers=("ums Lua echo, recv|lua5.4 $root/bench/net/echo_ums.lua PORT 1")
((echo_first)) ||
  servers+=("ums Lua http, read(\"l\")|lua5.4 $root/examples/http_server.lua --port PORT --schedulers 1")
servers+=(
  "ums C|$net/echo_ums PORT 1"
  "C epoll floor|$net/echo_epoll PORT")
lua5.4 -e "require 'luv'" 2>/dev/null &&
  servers+=("luv|lua5.4 $root/bench/net/echo_luv.lua PORT")
servers+=("Go, GOMAXPROCS 1|env GOMAXPROCS=1 $net/goserver -mode echo -addr 127.0.0.1:PORT")

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
fd_count() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 | wc -l; }

echo "command: $0 --conns $conns --reps $reps$( ((echo_first)) && echo " --echo-first") (build: $build)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), load average" \
     "$(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| server | RSS before, KiB | RSS with $conns idle, KiB | bytes per connection, median of $reps (range) |"
echo "|---|---:|---:|---:|"
for s in "${servers[@]}"; do
  name=${s%%|*}
  cmd=${s#*|}
  per=() before=() after=()
  for ((rep = 1; rep <= reps; rep++)); do
    port=$(net_port)
    # shellcheck disable=SC2086  # the command is split on purpose
    net_start "$port" ${cmd//PORT/$port}
    # The server's own process: env execs it, lua5.4 is the process.
    pid=$server_pid
    sleep 0.5
    b=$(rss_kib "$pid")
    fd0=$(fd_count "$pid")
    "$loadgen" -mode idle -addr "127.0.0.1:$port" -c "$conns" -hold 120 \
      -timeout 150 -echo-first="$((echo_first))" >"$net_tmp/idle.out" &
    lg=$!
    net_pids+=("$lg")
    # Wait (60 s at most) until the server holds every connection.
    for ((i = 0; i < 600; i++)); do
      (($(fd_count "$pid") >= fd0 + conns)) && break
      sleep 0.1
    done
    held=$(($(fd_count "$pid") - fd0))
    sleep 1
    a=$(rss_kib "$pid")
    kill -TERM "$lg" 2>/dev/null || true
    net_reap "$lg"
    net_forget "$lg"
    net_stop
    if ((held < conns)); then
      echo "idle.sh: $name held $held of $conns connections" >&2
      continue
    fi
    before+=("$b")
    after+=("$a")
    per+=("$(((a - b) * 1024 / conns))")
  done
  ((${#per[@]})) || continue
  printf '| %s | %s | %s | %s (%s-%s) |\n' "$name" \
    "$(printf '%s\n' "${before[@]}" | median)" \
    "$(printf '%s\n' "${after[@]}" | median)" \
    "$(printf '%s\n' "${per[@]}" | median)" \
    "$(printf '%s\n' "${per[@]}" | sort -g | head -1)" \
    "$(printf '%s\n' "${per[@]}" | sort -g | tail -1)"
done
echo
echo "Target: ums Lua <= 8 KiB (8192 bytes) per idle connection."
