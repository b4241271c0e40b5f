#!/usr/bin/env bash
# Messages between schedulers: two Lua VMs on two schedulers passing
# integers through ums.shared.channel (bench/many/chan.lua: ping-pong
# unbuffered and with a buffer of 64, a one-way stream of 1,000,000),
# beside the C spin-handoff floor (bench/many/spin_floor.c: two threads
# passing a token through one atomic word) and Go's channels with
# GOMAXPROCS=2 (bench/many/chan_go, built here when go is installed).
# Every shape runs in its own process, the peers interleaved, --reps
# times; prints medians of nanoseconds per one-way message and ratios,
# and the ums process's voluntary context switches (sleeps in the
# kernel) per 1,000 messages, which stay comparable on a busy machine.
#
#   bash bench/many/chan.sh [--quick] [--reps N] [--build-dir DIR]
#
# --quick: 10x fewer messages, 1 repetition (a smoke run). The build
# directory must hold a Release build (default build-release/, made if
# missing), as for bench/lua/run.sh; one outside this checkout is not
# rebuilt. The floor and Go's program go to this checkout's
# build-release/bench/many/.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=../release-tree.sh
source "$root/bench/release-tree.sh"
build="$root/build-release"
reps=5
n_pp=100000
n_stream=1000000
while (($#)); do
  case "$1" in
    --quick) n_pp=10000; n_stream=100000; reps=1 ;;
    --reps)
      [[ ${2:-} =~ ^[1-9][0-9]*$ ]] ||
        { echo "chan.sh: --reps needs a positive whole number" >&2; exit 2; }
      reps=$2; shift ;;
    --build-dir)
      [[ -n ${2:-} ]] || { echo "chan.sh: --build-dir needs a directory" >&2; exit 2; }
      build=$2; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "chan.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

release_tree chan.sh "$build"
build=$(cd "$build" && pwd)  # GOCACHE must be absolute
# A tree of another checkout (another branch's build, as "before") is
# used as it is: building it would build that checkout's sources.
[[ $build == "$root"/* ]] && cmake --build "$build" --target ums_lua >/dev/null

export LUA_PATH="$root/stdlib/?.lua;$root/stdlib/?/init.lua;;"
export LUA_CPATH="$build/lua-binding/?.so;;"

# The floor and the Go peer are built in this checkout's build-release/.
peers="$root/build-release/bench/many"
mkdir -p "$peers"
floor_bin="$peers/spin_floor"
${CC:-cc} -O2 -pthread -o "$floor_bin" "$root/bench/many/spin_floor.c"
go_bin=""
if command -v go >/dev/null; then
  export GOCACHE="$peers/go-cache" GOFLAGS= GO111MODULE=off
  go build -o "$peers/chan_go" "$root/bench/many/chan_go/main.go"
  go_bin="$peers/chan_go"
else
  echo "go not found: the Go columns stay empty (apt-get install golang-go)"
fi

echo "command: bash bench/many/chan.sh $* (ping-pong N = $n_pp round trips, stream N = $n_stream, $reps repetitions)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$root" rev-parse --short HEAD), build $build, load $(cut -d' ' -f1-3 /proc/loadavg)"

out=$(mktemp)
trap 'rm -f "$out" "$out.csw"' EXIT
for ((r = 1; r <= reps; r++)); do
  "$floor_bin" "$n_pp" >>"$out"
  for s in pingpong pingpong64 stream; do
    n=$n_pp
    [[ $s == stream ]] && n=$n_stream
    if [[ -x /usr/bin/time ]]; then
      # Voluntary context switches: the times a thread slept in the
      # kernel, which a hand-off between busy schedulers should not need.
      /usr/bin/time -f "vcsw_$s $n %w" -o "$out.csw" \
        lua5.4 "$root/bench/many/chan.lua" "$s" "$n" >>"$out"
      cat "$out.csw" >>"$out"
    else
      lua5.4 "$root/bench/many/chan.lua" "$s" "$n" >>"$out"
    fi
    if [[ -n $go_bin ]]; then
      GOMAXPROCS=2 "$go_bin" "$s" "$n" | sed 's/^/go_/' >>"$out"
    fi
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

lua5.4 - "$out" <<'LUA'
local t = {}
for line in io.lines(arg[1]) do
  local name, msgs, secs = line:match("^(%S+) (%d+) ([%d.]+)")
  if name and name:match("^vcsw_") then
    t[name] = t[name] or {}
    table.insert(t[name], tonumber(secs) / tonumber(msgs) * 1e3)
  elseif name then
    t[name] = t[name] or {}
    table.insert(t[name], tonumber(secs) / tonumber(msgs) * 1e9)
  end
end
local function median(v)
  if not v then return nil end
  table.sort(v)
  local k = #v
  return k % 2 == 1 and v[(k + 1) // 2] or (v[k // 2] + v[k // 2 + 1]) / 2
end
local m = {}
for k, v in pairs(t) do m[k] = median(v) end
local function s(x) return x and ("%.0f"):format(x) or "-" end
local function ratio(a, b) return (a and b) and ("%.2fx"):format(a / b) or "-" end
local function rate(x) return x and ("%.2f"):format(1e3 / x) or "-" end
print(("C spin handoff floor: %s ns a message"):format(s(m.spin_floor)))
print("| shape | ums ns/msg | ums M msg/s | Go 2 Ps ns/msg | ums/Go | ums/spin floor | ums sleeps/1000 | target |")
print("|---|---:|---:|---:|---:|---:|---:|---|")
for _, row in ipairs{
    {"ping-pong, unbuffered", "pingpong", "<= 1000 ns and <= 4x floor"},
    {"ping-pong, buffer 64 (bursts of 64)", "pingpong64", "<= 300 ns"},
    {"stream one way, buffer 64", "stream", ">= 2 M msg/s"}} do
  local u, g = m[row[2]], m["go_" .. row[2]]
  print(("| %s | %s | %s | %s | %s | %s | %s | %s |"):format(row[1], s(u),
    rate(u), s(g), ratio(u, g), ratio(u, m.spin_floor),
    s(m["vcsw_" .. row[2]]), row[3]))
end
LUA
