#!/usr/bin/env bash
# The HTTP "hello" benchmark: keep-alive GETs from wrk (Debian's), pinned
# to one CPU with taskset, against servers answering a fixed 14-byte body,
# each its own process on 127.0.0.1, with 1 and 2 workers each:
#
#   ums     examples/http_server.lua (ums.net, a listener per scheduler
#           with SO_REUSEPORT), 1 and 2 schedulers
#   Go      bench/net/goserver -mode http (net/http), GOMAXPROCS 1 and 2
#   nginx   nginx-light, unprivileged, its own configuration in a scratch
#           folder (`return 200`), worker_processes 1 and 2
#
# Each repetition runs every server in turn (wrk -t1 -c CONNS -d SECS);
# the table gives the medians over repetitions of requests per second, of
# wrk's latency percentiles, and of the ratio to nginx with as many
# workers in the same repetition.
#
#   bench/net/http.sh [--quick] [--reps N] [--conns N] [--secs N]
#                     [--build-dir DIR]
#
# Uses a Release tree (default: build-release/). Peers: apt-get install
# wrk nginx-light golang-go (scripts/setup.sh --bench).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$root/build-release"
reps=5
conns=100
secs=5
while (($#)); do
  case "$1" in
    --quick) reps=1; secs=1 ;;
    --reps) reps=$2; shift ;;
    --conns) conns=$2; shift ;;
    --secs) secs=$2; shift ;;
    --build-dir) build=$2; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "http.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# shellcheck source=common.sh
source "$root/bench/net/common.sh"
net_build
net="$build/bench/net"
lcpu=$(($(nproc) - 1))
nginx=$(command -v nginx || echo /usr/sbin/nginx)

# nginx_conf WORKERS PORT: writes a configuration that keeps everything
# (pid, temp files, logs) in the scratch folder; prints its path.
nginx_conf() {
  local dir="$net_tmp/nginx-$1"
  mkdir -p "$dir"
  cat >"$dir/nginx.conf" <<EOF
daemon off;
worker_processes $1;
pid $dir/nginx.pid;
error_log $dir/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fastcgi;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$2;
    location / {
      default_type text/plain;
      return 200 "Hello, World!\n";
    }
  }
}
EOF
  echo "$dir/nginx.conf"
}

servers=(
  "ums, 1 scheduler|lua5.4 $root/examples/http_server.lua --port PORT --schedulers 1"
  "ums, 2 schedulers|lua5.4 $root/examples/http_server.lua --port PORT --schedulers 2"
  "Go net/http, GOMAXPROCS 1|env GOMAXPROCS=1 $net/goserver -mode http -addr 127.0.0.1:PORT"
  "Go net/http, GOMAXPROCS 2|env GOMAXPROCS=2 $net/goserver -mode http -addr 127.0.0.1:PORT")
if [[ -x "$nginx" ]]; then
  servers+=("nginx, 1 worker|NGINX 1" "nginx, 2 workers|NGINX 2")
fi

echo "command: $0 --reps $reps --conns $conns --secs $secs (build: $build)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg), wrk on CPU $lcpu"

results="$net_tmp/results"
: >"$results"
for ((rep = 1; rep <= reps; rep++)); do
  for s in "${servers[@]}"; do
    name=${s%%|*}
    cmd=${s#*|}
    port=$(net_port)
    if [[ "$cmd" == NGINX* ]]; then
      conf=$(nginx_conf "${cmd#NGINX }" "$port")
      net_start "$port" "$nginx" -p "$(dirname "$conf")" -c "$conf" \
        -e "$(dirname "$conf")/error.log"
    else
      # shellcheck disable=SC2086  # the command is split on purpose
      net_start "$port" ${cmd//PORT/$port}
    fi
    out=$(taskset -c "$lcpu" timeout $((secs + 30)) wrk -t1 -c "$conns" \
            -d "${secs}s" --latency "http://127.0.0.1:$port/")
    if grep -q "Non-2xx\|Socket errors" <<<"$out"; then
      echo "http.sh: $name: errors:" >&2
      grep "Non-2xx\|Socket errors" <<<"$out" >&2
    fi
    rps=$(sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p' <<<"$out")
    p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
    p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
    echo "$name|$rep|$rps|$p50|$p99" >>"$results"
    net_stop
    echo "rep $rep: $name: $rps requests/s" >&2
  done
done

# us VALUE: wrk's latency (850.00us, 1.20ms, 2.00s) in microseconds.
us() {
  awk -v v="$1" 'BEGIN {
    n = v + 0
    if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000;
    else if (v ~ /s$/) print n * 1e6 }'
}
m() { if (($#)); then printf '%s\n' "$@" | median; fi; }

echo
echo "HTTP keep-alive, wrk -t1 -c $conns -d ${secs}s (medians of $reps):"
echo
echo "| server | requests/s | / nginx, same workers | p50 µs | p99 µs |"
echo "|---|---:|---:|---:|---:|"
for s in "${servers[@]}"; do
  name=${s%%|*}
  workers=$(grep -o '[0-9]\+' <<<"$name" | tail -1)
  rs=() ratio=() p50=() p99=()
  while IFS='|' read -r n rep rps l50 l99; do
    [[ "$n" == "$name" && -n "$rps" ]] || continue
    rs+=("$rps")
    p50+=("$(us "$l50")")
    p99+=("$(us "$l99")")
    ng=$(awk -F'|' -v r="$rep" -v w="nginx, $workers worker" \
           'index($1, w) == 1 && $2 == r {print $3}' "$results")
    if [[ -n "$ng" ]]; then
      ratio+=("$(awk -v a="$rps" -v b="$ng" 'BEGIN {print a / b}')")
    fi
  done <"$results"
  ((${#rs[@]})) || continue
  awk -v n="$name" -v r="$(m "${rs[@]}")" -v q="$(m "${ratio[@]}")" \
      -v a="$(m "${p50[@]}")" -v b="$(m "${p99[@]}")" 'BEGIN {
    printf "| %s | %.0f | %s | %.0f | %.0f |\n", n, r,
      q == "" ? "" : sprintf("%.2f", q), a, b }'
done
echo
echo "Target: ums on 1 scheduler >= 0.5x nginx with 1 worker."
