#!/usr/bin/env bash
# Installs the Debian 12 packages ums needs, only those that are missing.
# Safe to run again: when everything is installed it touches nothing and
# needs no network. Runs as root; as another user it prints the apt-get
# command to run and fails.
#
#   scripts/setup.sh            what builds and tests need
#   scripts/setup.sh --bench    that, plus the benchmarks' peers (bench/)
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config   # toolchain
  libffi-dev liburing-dev                        # runtime dependencies
  lua5.4 liblua5.4-dev lua-busted                # Lua binding and specs
  strace                                         # fault-injection tests
  zlib1g-dev                                     # examples/cmod (zutil)
  luarocks                                       # the rock test (install_rock)
  lua-socket                                     # ums.socket specs, example
  gnuplot-nox                                    # bench/report's charts (bench_report_smoke)
)
# The peers the benchmarks compare with: not needed by any test.
if [[ "${1:-}" == --bench ]]; then
  PACKAGES+=(
    tarantool lua-luv lua-cqueues                # Lua peers (bench/lua, bench/net)
    luajit                                       # LuaJIT's ffi.new (bench_ffi.lua)
    golang-go wrk nginx-light                    # network peers and load (bench/net)
  )
fi

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  if [[ "$status" != "installed" ]]; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all packages present"
  exit 0
fi

echo "setup: missing packages: ${missing[*]}"
if [[ "$(id -u)" != 0 ]]; then
  echo "setup: not root; install them with:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y" \
       "--no-install-recommends ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends "${missing[@]}" </dev/null
echo "setup: installed ${missing[*]}"
