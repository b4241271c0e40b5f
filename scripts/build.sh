#!/usr/bin/env bash
# Configures (Ninja) and builds one configuration:
#   scripts/build.sh [normal|asan|tsan]   (default: normal)
#     normal -> build/        asan -> build-asan/ (ASan+UBSan)
#     tsan   -> build-tsan/ (TSan)
# Extra arguments after the configuration go to cmake at configure time,
# e.g. scripts/build.sh normal -DUMS_CONTEXT=ucontext
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

config=${1:-normal}
shift || true
case "$config" in
  normal) dir=build;      sanitize="" ;;
  asan)   dir=build-asan; sanitize=address ;;
  tsan)   dir=build-tsan; sanitize=thread ;;
  *) echo "usage: $0 [normal|asan|tsan] [cmake args...]" >&2; exit 2 ;;
esac

# A tree configured earlier with another generator cannot be reused.
if [[ -f "$dir/CMakeCache.txt" ]] &&
   ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$dir/CMakeCache.txt"; then
  echo "build.sh: $dir/ was not configured with Ninja; starting it afresh"
  rm -rf "$dir"
fi

cmake -S . -B "$dir" -G Ninja -DUMS_SANITIZE="$sanitize" "$@"
cmake --build "$dir" -j "$(nproc)"
