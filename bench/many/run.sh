#!/usr/bin/env bash
# Many live tasks: the skynet tree (1,111,111 tasks) with joins and with
# channels, and 1,000,000 tasks spawned before any is joined, each beside
# its plain-Lua floor (bench/many/many.lua) and skynet beside Go's
# goroutines with GOMAXPROCS=1 and 2 (built here when go is installed).
# Then the memory of a parked task beside a bare coroutine
# (bench/many/parked.lua, N/10 of each). Every shape runs in its own
# process, the shapes interleaved, --reps times; prints medians and the
# ratios.
#
#   bash bench/many/run.sh [--quick] [--reps N] [--build-dir DIR]
#
# --quick: 100,000 leaves and tasks, 1 repetition (a smoke run). The
# build directory must hold a Release build (default build-release/,
# made if missing), as for bench/lua/run.sh.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=../release-tree.sh
source "$root/bench/release-tree.sh"
build="$root/build-release"
reps=3
n=1000000
while (($#)); do
  case "$1" in
    --quick) n=100000; reps=1 ;;
    --reps)
      [[ ${2:-} =~ ^[1-9][0-9]*$ ]] ||
        { echo "run.sh: --reps needs a positive whole number" >&2; exit 2; }
      reps=$2; shift ;;
    --build-dir)
      [[ -n ${2:-} ]] || { echo "run.sh: --build-dir needs a directory" >&2; exit 2; }
      build=$2; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

release_tree run.sh "$build"
cmake --build "$build" --target ums_lua >/dev/null

export LUA_PATH="$root/stdlib/?.lua;$root/stdlib/?/init.lua;;"
export LUA_CPATH="$build/lua-binding/?.so;;"

go_bin=""
if command -v go >/dev/null; then
  mkdir -p "$build/bench/many"
  export GOCACHE="$build/bench/many/go-cache" GOFLAGS= GO111MODULE=off
  go build -o "$build/bench/many/skynet_go" "$root/bench/many/skynet_go/main.go"
  go_bin="$build/bench/many/skynet_go"
else
  echo "go not found: the Go columns stay empty (apt-get install golang-go)"
fi

echo "command: bash bench/many/run.sh $* (N = $n, $reps repetitions)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$root" rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)"

out=$(mktemp)
trap 'rm -f "$out"' EXIT
shapes=(skynet_join skynet_chan skynet_floor spawn_join spawn_floor)
for ((r = 1; r <= reps; r++)); do
  for s in "${shapes[@]}"; do
    lua5.4 "$root/bench/many/many.lua" "$s" "$n" >>"$out"
  done
  if [[ -n $go_bin ]]; then
    GOMAXPROCS=1 "$go_bin" "$n" | sed 's/^skynet_go/skynet_go1/' >>"$out"
    GOMAXPROCS=2 "$go_bin" "$n" | sed 's/^skynet_go/skynet_go2/' >>"$out"
  fi
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
parked=$(lua5.4 "$root/bench/many/parked.lua" $((n / 10)))

lua5.4 - "$out" <<'LUA'
local t = {}
for line in io.lines(arg[1]) do
  local name, _, secs = line:match("^(%S+) (%d+) ([%d.]+)")
  if name then
    t[name] = t[name] or {}
    table.insert(t[name], tonumber(secs))
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
local function s(x) return x and ("%.3f"):format(x) or "-" end
local function ratio(a, b) return (a and b) and ("%.2fx"):format(a / b) or "-" end
print(("| shape | ums s | floor s | ums/floor | Go 1 P s | Go 2 Ps s | ums/Go 2 Ps |"))
print("|---|---:|---:|---:|---:|---:|---:|")
for _, row in ipairs{{"skynet, joins", "skynet_join", "skynet_floor", true},
                     {"skynet, channels", "skynet_chan", "skynet_floor", true},
                     {"spawn all, then join", "spawn_join", "spawn_floor", false}} do
  local u, f = m[row[2]], m[row[3]]
  local g1, g2 = row[4] and m.skynet_go1, row[4] and m.skynet_go2
  print(("| %s | %s | %s | %s | %s | %s | %s |"):format(row[1], s(u), s(f),
        ratio(u, f), s(g1 or nil), s(g2 or nil), ratio(u, g2 or nil)))
end
LUA
echo
echo "Memory of a parked task (bench/many/parked.lua $((n / 10))):"
echo
echo '```'
echo "$parked"
echo '```'
