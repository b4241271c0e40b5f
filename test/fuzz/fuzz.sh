#!/usr/bin/env bash
# The API fuzzer's driver: runs test/fuzz/api_fuzz.lua once per seed, each
# in a child process of its own with a time limit, and reports every seed
# whose run did not end cleanly: a crash (death by a signal), a hang (the
# limit passed), a sanitizer report, or any other exit. See
# test/fuzz/README.md.
#
# usage: test/fuzz/fuzz.sh [options]
#   --seeds A-B      seeds A to B (default 1-1000000, cut by --budget)
#   --budget S       start no seed after S seconds (default: none)
#   --calls N        calls per seed (default 2000)
#   --timeout S      a seed that runs longer than S seconds hangs (default 60);
#                    its threads' stacks are printed (gdb) before the kill
#   --keep DIR       keep each failing seed's output in DIR
#
# The Lua paths, the interpreter (UMS_LUA, default lua5.4) and, for the
# sanitizer builds, LD_PRELOAD come from the environment, as ctest sets it.
# Exit status: 0 when every seed ended cleanly, 1 otherwise.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
lua=${UMS_LUA:-lua5.4}
first=1 last=1000000 budget=0 calls=2000 limit=60 keep=""
while (($#)); do
  case "$1" in
    --seeds) first=${2%-*}; last=${2#*-}; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --calls) calls=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    *) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

# Under TSan, /bin/sh and timeout cannot start with libtsan preloaded: the
# build hands the preload over for the interpreter alone.
run=("$lua")
if [[ -n ${UMS_CHILD_LD_PRELOAD:-} ]]; then
  run=(env "LD_PRELOAD=$UMS_CHILD_LD_PRELOAD" "$lua")
fi

scratch=$(mktemp -d /tmp/ums-fuzz.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
[[ -n $keep ]] && mkdir -p "$keep"

# What a sanitizer prints when it finds something, whatever the exit
# status it was told to use.
reports='ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:'
reports+='|WARNING: ThreadSanitizer|ERROR: ThreadSanitizer'

start=$SECONDS seeds=0 bad=0 deadlocks=0
for ((seed = first; seed <= last; seed++)); do
  if ((budget > 0 && SECONDS - start >= budget)); then break; fi
  work="$scratch/$seed"
  mkdir -p "$work/files"
  # The child runs in a directory of its own: misused paths (a number, a
  # mode string) name files in the working directory. run_seed sets rc
  # and hung, and leaves every thread's stack of a hung child in
  # $work/backtrace (a rare hang may not come back).
  run_seed() {
    (cd "$work" &&
     exec "${run[@]}" "$here/api_fuzz.lua" "$seed" "$calls" "$work/files") \
      >"$work/out" 2>"$work/err" &
    pid=$!
    sleep "$limit" &
    timer=$!
    wait -n -p ended "$pid" "$timer"
    rc=$?
    hung=0
    if [[ $ended == "$pid" ]]; then
      kill "$timer" 2>/dev/null
      wait "$timer" 2>/dev/null
    else
      hung=1
      # Bounded: gdb is slow to attach to a sanitizer build's process.
      if command -v gdb >/dev/null; then
        timeout 60 gdb -p "$pid" -batch -ex 'thread apply all bt 25' \
          -x "$here/hang-state.py" >"$work/backtrace" 2>&1 </dev/null
      fi
      kill -KILL "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
    fi
  }
  run_seed
  seeds=$((seeds + 1))
  why=""
  if ((hung)); then
    why="hang (still running after ${limit} s)"
  elif ((rc > 128)); then
    why="crash (signal $((rc - 128)))"
  elif grep -Eq "$reports" "$work/err"; then
    why="sanitizer report"
  elif ((rc != 0)); then
    why="exit status $rc"
  elif ! grep -q "^DONE seed=$seed " "$work/out"; then
    why="no DONE line"
  elif grep -q "^DONE seed=$seed .* deadlock=1" "$work/out"; then
    deadlocks=$((deadlocks + 1))
  fi
  if [[ -n $why ]]; then
    bad=$((bad + 1))
    echo "FAIL seed=$seed: $why"
    echo "  reproduce: (cd /tmp && $lua $here/api_fuzz.lua $seed $calls)"
    if [[ $why == "sanitizer report" ]]; then
      # The first report, each stack cut to its top frames (a task's
      # stack runs through every worker it resumed): CI logs may be all
      # there is of a rare one.
      awk -v re="$reports" '
        !on && $0 ~ re { on = 1 }
        on && /^==================$/ { exit }
        on && (!/^ +#[0-9]+ / || $1 ~ /^#[0-5]$/) { print "  | " $0 }
      ' "$work/err" | head -n 120
    else
      grep -Em 3 "fatal|api_fuzz:" "$work/err" | sed 's/^/  /'
      tail -n 5 "$work/err" | sed 's/^/  | /'
    fi
    if ((hung)) && [[ -s $work/backtrace ]]; then
      grep -E '^Thread |^#[0-9]+ ' "$work/backtrace" | head -n 80 |
        sed 's/^/  bt| /'
      grep -E '^(scheduler|runtime|task|no scheduler|hang-state)' \
        "$work/backtrace" | head -n 40 | sed 's/^/  state| /'
    fi
    if [[ -n $keep ]]; then
      cp "$work/out" "$keep/seed-$seed.out"
      cp "$work/err" "$keep/seed-$seed.err"
      [[ -f $work/backtrace ]] && cp "$work/backtrace" "$keep/seed-$seed.bt"
    fi
  fi
  rm -rf "$work"
done

echo "fuzz: $seeds seeds ($first-$((first + seeds - 1))), $calls calls each," \
     "$((SECONDS - start)) s: $bad failed, $deadlocks ended in a deadlock report"
((bad == 0))
