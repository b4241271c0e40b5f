#!/usr/bin/env bash
# Runs the upstream Busted suite of a Debian package, unchanged, through
# the ums.busted helper:
#
#   scripts/debian-suite.sh <source package> <work dir> [busted args...]
#
# The suite is the package's upstream tarball (its .orig.tar.*), fetched
# once into <work dir> with apt-get from the deb-src twin of the machine's
# own Debian sources. The machine's apt configuration is left alone: the
# source list, package lists and cache used here all live in <work dir>.
# Then `lua5.4 busted --helper=ums.busted [busted args]` runs in the
# unpacked tree, with LUA_PATH and LUA_CPATH from the environment (ctest
# points them at the build), chained with spec/busted/count_runs.lua,
# which fails the run if no block ran as a task.
#
# Exit status: busted's; 77 (ctest's "skipped") when the sources cannot be
# fetched (no network, or the mirror does not have them).
set -euo pipefail

pkg=$1
work=$2
shift 2
busted=${UMS_BUSTED:-/usr/bin/busted}
# A sanitizer runtime is for lua5.4 only (ctest gives it to the children
# of a spec as UMS_CHILD_LD_PRELOAD under TSan), never for apt-get.
preload=${UMS_CHILD_LD_PRELOAD:-${LD_PRELOAD:-}}
unset LD_PRELOAD
mkdir -p "$work"
work=$(cd "$work" && pwd)

tree=$(find "$work" -mindepth 1 -maxdepth 1 -type d ! -name apt | head -n 1)
if [[ -z "$tree" ]]; then
  apt="$work/apt"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/parts"
  # deb-src entries for the mirrors the machine already uses.
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -e "$f" ]] || continue
    sed 's/^Types:.*/Types: deb-src/' "$f" >"$apt/parts/$(basename "$f")"
  done
  if [[ -e /etc/apt/sources.list ]]; then
    sed -n 's/^deb /deb-src /p' /etc/apt/sources.list >"$apt/parts/src.list"
  fi
  opts=(-o "Dir::Etc::SourceList=/dev/null"
        -o "Dir::Etc::SourceParts=$apt/parts"
        -o "Dir::State::Lists=$apt/lists"
        -o "Dir::Cache=$apt/cache"
        -o "APT::Sandbox::User=root" -qq)
  if ! apt-get "${opts[@]}" update >"$apt/log" 2>&1; then
    echo "debian-suite: cannot read the Debian source lists" \
         "(see $apt/log)" >&2
    exit 77
  fi
  # Only the upstream tarball is needed: the Debian part may be missing
  # from a mirror without harm.
  (cd "$work" && apt-get "${opts[@]}" source --download-only "$pkg" \
     >>"$apt/log" 2>&1) || true
  orig=$(find "$work" -maxdepth 1 -name "*.orig.tar.*" | head -n 1)
  if [[ -z "$orig" ]]; then
    echo "debian-suite: no upstream tarball for $pkg (see $apt/log)" >&2
    exit 77
  fi
  tar -xf "$orig" -C "$work"
  tree=$(find "$work" -mindepth 1 -maxdepth 1 -type d ! -name apt | head -n 1)
fi

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$tree"
if [[ -n "$preload" ]]; then export LD_PRELOAD="$preload"; fi
exec lua5.4 "$busted" --helper=ums.busted \
  -Xhelper "helper=$root/spec/busted/count_runs.lua" "$@"
