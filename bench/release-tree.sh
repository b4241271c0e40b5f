# bench/release-tree.sh: sourced by the benchmark scripts.
#
#   release_tree NAME DIR [ALSO]
#
# Figures from a Debug or sanitizer build mean nothing, so a benchmark
# measures a Release tree: DIR is checked to be one (or of build type
# ALSO, e.g. RelWithDebInfo, which the ctest smoke runs use), or, when it
# holds no tree yet, configured as one. Otherwise exits 2 with a message
# that starts with NAME (the calling script).
release_tree() {
  local name=$1 dir=$2 also=${3:-Release}
  local src
  src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  if [[ -f "$dir/CMakeCache.txt" ]]; then
    local type sanitize
    type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$dir/CMakeCache.txt")
    sanitize=$(sed -n 's/^UMS_SANITIZE:[A-Z]*=//p' "$dir/CMakeCache.txt")
    if [[ -n "$sanitize" || ( "$type" != Release && "$type" != "$also" ) ]]
    then
      echo "$name: $dir is a '$type' build (sanitizer '$sanitize'):" \
           "figures from it mean nothing; use a Release tree (--build-dir)" >&2
      exit 2
    fi
  else
    cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
}
