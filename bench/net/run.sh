#!/usr/bin/env bash
# The echo benchmark: every server below, each its own process on
# 127.0.0.1, driven by the same Go load generator (bench/net/loadgen)
# pinned to one CPU with taskset: 100 and 500 clients at once, each making
# 100 round trips of a 64-byte message. Servers are not pinned (the
# two-scheduler ones may use what CPU the load generator leaves).
#
#   C epoll floor    bench/net/echo_epoll.c, one thread, level triggered
#   luv, cqueues     bench/net/echo_luv.lua, echo_cqueues.lua (Debian)
#   Go 1, Go 2       bench/net/goserver (net package), GOMAXPROCS 1 and 2
#   ums C 1, 2       bench/net/echo_ums.c: a C task per connection on the
#                    runtime's ums_net_* calls, 1 and 2 schedulers
#   ums Lua 1, 2     bench/net/echo_ums.lua: ums.net, 1 and 2 schedulers;
#                    1 scheduler again without io_uring (UMS_IO=pool: the
#                    sockets' epoll backend)
#   Tarantool        bench/net/echo_tarantool.lua (when installed)
#
# Each repetition runs every server in turn; the table gives medians over
# the repetitions of round trips per second, of p50/p99 latency, and of
# the ratios to the C floor and to luv measured in the same repetition.
#
#   bench/net/run.sh [--quick] [--reps N] [--build-dir DIR] [--only REGEX]
#
# Uses a Release tree (default: build-release/, configured and built if
# missing). Peers: apt-get install lua-luv lua-cqueues golang-go tarantool
# (scripts/setup.sh --bench installs them); a missing Lua peer is skipped.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$root/build-release"
reps=5
rounds=100
clients_list=(100 500)
only=.
while (($#)); do
  case "$1" in
    --quick) reps=1; rounds=20; clients_list=(20 50) ;;
    --reps) reps=$2; shift ;;
    --build-dir) build=$2; shift ;;
    --only) only=$2; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# shellcheck source=common.sh
source "$root/bench/net/common.sh"
net_build
net="$build/bench/net"
lcpu=$(($(nproc) - 1))

# name|command, PORT replaced by the port.
servers=("C epoll floor|$net/echo_epoll PORT")
has_lua() { lua5.4 -e "require '$1'" 2>/dev/null; }
has_lua luv && servers+=("luv|lua5.4 $root/bench/net/echo_luv.lua PORT")
has_lua cqueues &&
  servers+=("cqueues|lua5.4 $root/bench/net/echo_cqueues.lua PORT")
servers+=(
  "Go, GOMAXPROCS 1|env GOMAXPROCS=1 $net/goserver -mode echo -addr 127.0.0.1:PORT"
  "Go, GOMAXPROCS 2|env GOMAXPROCS=2 $net/goserver -mode echo -addr 127.0.0.1:PORT"
  "ums C, 1 scheduler|$net/echo_ums PORT 1"
  "ums C, 2 schedulers|$net/echo_ums PORT 2"
  "ums Lua, 1 scheduler|lua5.4 $root/bench/net/echo_ums.lua PORT 1"
  "ums Lua, 2 schedulers|lua5.4 $root/bench/net/echo_ums.lua PORT 2"
  "ums Lua, 1 scheduler, epoll backend|env UMS_IO=pool lua5.4 $root/bench/net/echo_ums.lua PORT 1")
command -v tarantool >/dev/null &&
  servers+=("Tarantool|tarantool $root/bench/net/echo_tarantool.lua PORT")

echo "command: $0 --reps $reps (build: $build)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)," \
     "load generator on CPU $lcpu"

results="$net_tmp/results"
: >"$results"
for ((rep = 1; rep <= reps; rep++)); do
  for s in "${servers[@]}"; do
    name=${s%%|*}
    [[ "$name" =~ $only ]] || continue
    port=$(net_port)
    cmd=${s#*|}
    # shellcheck disable=SC2086  # the command is split on purpose
    net_start "$port" ${cmd//PORT/$port}
    # A short warm-up: first connections, first pages touched.
    taskset -c "$lcpu" "$loadgen" -addr "127.0.0.1:$port" -c 10 -n 100 \
      >/dev/null
    for c in "${clients_list[@]}"; do
      line=$(taskset -c "$lcpu" "$loadgen" -addr "127.0.0.1:$port" -c "$c" \
               -n "$rounds" -timeout 120)
      echo "$name|$c|$rep|$line" >>"$results"
    done
    net_stop
    echo "rep $rep: $name done" >&2
  done
done

# field LINE KEY: the value of KEY=value in a load generator line.
field() { sed -n "s/.*$2=\([0-9.]*\).*/\1/p" <<<"$1"; }
# value NAME CLIENTS REP KEY
value() {
  local l
  l=$(grep -F "$1|$2|$3|" "$results" | head -1 | cut -d'|' -f4)
  if [[ -n "$l" ]]; then field "$l" "$4"; fi
}
# m VALUES...: their median, or nothing.
m() { if (($#)); then printf '%s\n' "$@" | median; fi; }

for c in "${clients_list[@]}"; do
  echo
  echo "Echo, $c clients x $rounds round trips of 64 bytes (medians of $reps):"
  echo
  echo "| server | round trips/s | / C floor | / luv | p50 µs | p99 µs |"
  echo "|---|---:|---:|---:|---:|---:|"
  for s in "${servers[@]}"; do
    name=${s%%|*}
    [[ "$name" =~ $only ]] || continue
    rt=() rf=() rl=() p50=() p99=()
    for ((rep = 1; rep <= reps; rep++)); do
      v=$(value "$name" "$c" "$rep" rtps)
      [[ -n "$v" ]] || continue
      rt+=("$v")
      p50+=("$(value "$name" "$c" "$rep" p50_us)")
      p99+=("$(value "$name" "$c" "$rep" p99_us)")
      f=$(value "C epoll floor" "$c" "$rep" rtps)
      l=$(value luv "$c" "$rep" rtps)
      if [[ -n "$f" ]]; then rf+=("$(awk -v a="$v" -v b="$f" 'BEGIN{print a/b}')"); fi
      if [[ -n "$l" ]]; then rl+=("$(awk -v a="$v" -v b="$l" 'BEGIN{print a/b}')"); fi
    done
    ((${#rt[@]})) || continue
    awk -v n="$name" -v rt="$(m "${rt[@]}")" -v rf="$(m "${rf[@]}")" \
        -v rl="$(m "${rl[@]}")" -v p50="$(m "${p50[@]}")" \
        -v p99="$(m "${p99[@]}")" 'BEGIN {
      printf "| %s | %.0f | %s | %s | %.0f | %.0f |\n", n, rt,
        rf == "" ? "" : sprintf("%.2f", rf),
        rl == "" ? "" : sprintf("%.2f", rl), p50, p99 }'
  done
done
echo
echo "Targets: ums Lua on 1 scheduler >= luv and >= 0.9x the C floor;" \
     "2 schedulers: reported (the load generator takes one of $(nproc) CPUs)."
