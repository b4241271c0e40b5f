#!/usr/bin/env bash
# Installs what is missing, then builds and runs every test in three
# configurations, one build tree each:
#   normal  build/       the release-like build (RelWithDebInfo)
#   asan    build-asan/  AddressSanitizer + UndefinedBehaviorSanitizer
#   tsan    build-tsan/  ThreadSanitizer
# and ends with one line "N passed, N failed" summed over the three (plus
# ", N skipped" when tests were skipped). Exits non-zero if a build or a
# test failed. This is what CI runs (.ci/run).
#
# Environment (all optional):
#   UMS_TEST_CONFIGS       configurations to run, default "normal asan tsan"
#   UMS_TEST_SLOW_SANITIZE 1 (default): run the "slow" stress tests in the
#                          sanitizer builds too; 0: only in the normal build
#   ASAN_OPTIONS, UBSAN_OPTIONS, TSAN_OPTIONS override the defaults below.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

bash scripts/setup.sh || exit 1

read -r -a configs <<<"${UMS_TEST_CONFIGS:-normal asan tsan}"
slow_sanitize=${UMS_TEST_SLOW_SANITIZE:-1}

total_passed=0
total_failed=0
total_skipped=0
last=$((${#configs[@]} - 1))

# Reads "tests failures skipped disabled" from a ctest JUnit file.
junit_counts() {
  local head
  head=$(sed -n '/<testsuite/,/>/p' "$1" | tr '\n' ' ')
  local attr v out=""
  for attr in tests failures skipped disabled; do
    v=$(sed -n "s/.*[[:space:]]${attr}=\"\([0-9]*\)\".*/\1/p" <<<"$head")
    out+="${v:-0} "
  done
  echo "$out"
}

for i in "${!configs[@]}"; do
  cfg=${configs[$i]}
  case "$cfg" in
    normal) dir=build ;;
    asan)   dir=build-asan ;;
    tsan)   dir=build-tsan ;;
    *) echo "test.sh: unknown configuration '$cfg'" >&2; exit 2 ;;
  esac
  start=$SECONDS

  echo
  echo "==== $cfg: build ($dir/) ===="
  if ! bash scripts/build.sh "$cfg"; then
    echo "test.sh: $cfg: build failed"
    total_failed=$((total_failed + 1))
    continue
  fi

  ctest_args=(--test-dir "$dir" --output-on-failure -j2)
  env_args=()
  case "$cfg" in
    asan)
      env_args=(
        "ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
        "UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}")
      ;;
    tsan)
      env_args=(
        "TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}")
      ;;
  esac
  if [[ "$cfg" != normal && "$slow_sanitize" == 0 ]]; then
    ctest_args+=(--label-exclude slow)
  fi

  junit="$PWD/$dir/ctest-junit.xml"
  rm -f "$junit"
  echo
  echo "==== $cfg: ctest ===="
  env "${env_args[@]}" ctest "${ctest_args[@]}" --output-junit "$junit" \
    </dev/null
  rc=$?

  if [[ -s "$junit" ]]; then
    read -r tests failures skipped disabled <<<"$(junit_counts "$junit")"
    # A disabled test (a case waiting for a fix) did not pass.
    skipped=$((skipped + disabled))
  else
    tests=0 failures=0 skipped=0
  fi
  passed=$((tests - failures - skipped))
  if ((tests == 0)); then
    echo "test.sh: $cfg: no test ran"
    failures=$((failures + 1))
  elif ((rc != 0 && failures == 0)); then
    echo "test.sh: $cfg: ctest exited with $rc"
    failures=1
  fi
  total_passed=$((total_passed + passed))
  total_failed=$((total_failed + failures))
  total_skipped=$((total_skipped + skipped))

  # A recap between configurations; after the last one, the ctest summary
  # stays the last thing printed before the combined line.
  if ((i != last)); then
    echo "test.sh: $cfg: $passed ok, $failures failing, $skipped skipped" \
         "($((SECONDS - start)) s)"
  fi
done

line="$total_passed passed, $total_failed failed"
if ((total_skipped > 0)); then
  line+=", $total_skipped skipped"
fi
echo
echo "$line"
((total_failed == 0))
