# Shared by bench/net/run.sh, http.sh and idle.sh (sourced, not run):
# building the servers and the Go programs, starting a server on a free
# port, waiting for it, and stopping every server on exit.
#
# Expects: root (the source tree) and build (a Release tree) set, and
# `set -euo pipefail` in the caller.

# shellcheck source=../release-tree.sh
source "$root/bench/release-tree.sh"

net_tmp=$(mktemp -d)
net_pids=()

# Stops every server still running (by the pids started here, nothing
# else), then removes the scratch folder. Installed as the EXIT trap.
net_cleanup() {
  local pid
  for pid in "${net_pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${net_pids[@]}"; do
    net_reap "$pid"
  done
  rm -rf "$net_tmp"
}
trap net_cleanup EXIT
trap 'exit 130' INT TERM

# net_reap PID: waits up to 5 s for PID to end, then kills it.
net_reap() {
  local pid=$1 i
  for ((i = 0; i < 50; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# Builds what the benchmarks run: the Release tree's servers and module,
# and the Go programs into $build/bench/net (GOCACHE there too: the
# standard library only, nothing fetched).
net_build() {
  release_tree "$0" "$build"
  if ! cmake --build "$build" --target ums_lua echo_epoll echo_ums \
       >"$net_tmp/build.log" 2>&1; then
    cat "$net_tmp/build.log" >&2
    exit 1
  fi
  mkdir -p "$build/bench/net"
  (
    cd "$root/bench/net"
    export GOCACHE="$build/bench/net/go-cache" GOFLAGS= GO111MODULE=off
    go build -o "$build/bench/net/loadgen" ./loadgen/main.go
    go build -o "$build/bench/net/goserver" ./goserver/main.go
  )
  export LUA_PATH="$root/stdlib/?.lua;$root/stdlib/?/init.lua;;"
  export LUA_CPATH="$build/lua-binding/?.so;;"
  loadgen="$build/bench/net/loadgen"
}

# net_port: prints a TCP port nobody listens on at the moment, below the
# ephemeral range (32768 and up) that clients' own ports come from.
net_port() {
  local p
  while :; do
    p=$((10000 + RANDOM % 20000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
}

# net_start PORT CMD...: starts CMD in the background (output to a log in
# the scratch folder), waits until 127.0.0.1:PORT accepts a connection
# (net_start_wait tenths of a second, 10 s unless set) and sets
# server_pid. Fails, printing the log, if the server
# dies or never listens.
net_start() {
  local port=$1 i
  shift
  "$@" >"$net_tmp/server.log" 2>&1 &
  server_pid=$!
  net_pids+=("$server_pid")
  for ((i = 0; i < ${net_start_wait:-100}; i++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      return 0
    fi
    if ! kill -0 "$server_pid" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "$0: server did not start: $*" >&2
  cat "$net_tmp/server.log" >&2
  return 1
}

# net_forget PID: PID has been reaped; the exit trap must not signal it
# (the number may belong to another process by then).
net_forget() {
  local kept=() pid
  for pid in "${net_pids[@]}"; do
    [[ "$pid" == "$1" ]] || kept+=("$pid")
  done
  net_pids=("${kept[@]}")
}

# net_stop: stops the server net_start started last.
net_stop() {
  kill -TERM "$server_pid" 2>/dev/null || true
  net_reap "$server_pid"
  net_forget "$server_pid"
}

# median: the median of the numbers on stdin, one per line.
median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
