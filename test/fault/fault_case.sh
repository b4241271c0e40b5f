#!/usr/bin/env bash
# Runs one case of the fault job (test/fault/CMakeLists.txt): a command
# under an injected fault, judged by what a user may rely on. The command
# must end (within --timeout), must not die of a signal, and must not make
# a sanitizer report; then either it exits 0, or (with --expect) it fails
# with output naming the failure.
#
# usage: fault_case.sh [options] -- command [args...]
#   --timeout S     the command hangs if it runs longer (default 120)
#   --expect RE     a non-zero exit is accepted when the output matches the
#                   extended regular expression RE (a clear error)
#   --busted        the command is a Busted run that may report failed
#                   specs (the fault makes them fail), but must get to its
#                   summary line: it ended without a crash or a hang; with
#                   --expect, failed specs must name the failure
#   --fsize KB      `ulimit -f KB` with SIGXFSZ ignored: writes past KB
#                   fail with EFBIG
#   --nofile N      `ulimit -n N`: opens past N fail with EMFILE
#   --vmem KB       `ulimit -v KB`: mappings past KB fail with ENOMEM
#   --env VAR=VAL   sets VAR for the command only (not for this script
#                   and the tools it starts), e.g. an LD_PRELOAD
#   --tmpfs DIR:SZ  runs in a private mount namespace with a tmpfs of SZ
#                   mounted on DIR: writes past SZ fail with ENOSPC. Skipped
#                   (exit 77) where mounting is not allowed
# Exit status: 0 pass, 1 fail, 77 skipped.
set -u

limit=120 expect="" busted=0 fsize="" nofile="" vmem="" tmpfs="" envs=()
while (($#)); do
  case "$1" in
    --timeout) limit=$2; shift 2 ;;
    --expect) expect=$2; shift 2 ;;
    --busted) busted=1; shift ;;
    --fsize) fsize=$2; shift 2 ;;
    --nofile) nofile=$2; shift 2 ;;
    --vmem) vmem=$2; shift 2 ;;
    --tmpfs) tmpfs=$2; shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "fault_case.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
(($#)) || { echo "fault_case.sh: no command" >&2; exit 2; }

out=$(mktemp /tmp/ums-fault.XXXXXX)
trap 'rm -f "$out"' EXIT

if [[ -n $tmpfs ]]; then
  dir=${tmpfs%%:*} size=${tmpfs#*:}
  mkdir -p "$dir"
  if ! unshare -m --propagation private \
       sh -c 'mount -t tmpfs -o size=1k tmpfs "$1"' sh "$dir" 2>/dev/null
  then
    echo "SKIP: cannot mount a tmpfs in a private mount namespace here"
    exit 77
  fi
fi

# Under TSan, /bin/sh and the tools cannot start with libtsan preloaded:
# the build hands the preload over for the command alone.
if [[ -n ${UMS_CHILD_LD_PRELOAD:-} ]]; then
  envs=("LD_PRELOAD=$UMS_CHILD_LD_PRELOAD" "${envs[@]}")
fi
if ((${#envs[@]})); then
  set -- env "${envs[@]}" "$@"
fi

# The limits apply to the command only: set in a subshell that then
# becomes it (through unshare and the mount, for a tmpfs).
(
  [[ -n $fsize ]] && { ulimit -f "$fsize" || exit 2; trap '' XFSZ; }
  [[ -n $nofile ]] && { ulimit -n "$nofile" || exit 2; }
  [[ -n $vmem ]] && { ulimit -v "$vmem" || exit 2; }
  if [[ -n $tmpfs ]]; then
    exec timeout -k 10 "$limit" unshare -m --propagation private \
      sh -c 'mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"' \
      sh "$size" "$dir" "$@"
  fi
  exec timeout -k 10 "$limit" "$@"
) >"$out" 2>&1
rc=$?

cat "$out"
echo "fault_case: exit status $rc"
reports='ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:'
reports+='|WARNING: ThreadSanitizer|ERROR: ThreadSanitizer'
if ((rc == 124 || rc == 137)); then
  echo "FAIL: hang: still running after $limit s"; exit 1
elif ((rc > 128)); then
  echo "FAIL: crash: killed by signal $((rc - 128))"; exit 1
elif grep -Eq "$reports" "$out"; then
  echo "FAIL: sanitizer report"; exit 1
elif ((busted)); then
  summary='^[0-9]+ successes? / [0-9]+ failures? / [0-9]+ errors? / [0-9]+'
  if ! grep -Eq "$summary" "$out"; then
    echo "FAIL: Busted did not reach its summary"; exit 1
  fi
  if ((rc != 0)) && [[ -n $expect ]] && ! grep -Eq "$expect" "$out"; then
    echo "FAIL: specs failed, none with an error matching /$expect/"; exit 1
  fi
  echo "PASS: the specs ran to their end"; exit 0
elif ((rc == 0)); then
  echo "PASS"; exit 0
elif [[ -n $expect ]] && grep -Eq "$expect" "$out"; then
  echo "PASS: failed with a clear error (/$expect/)"; exit 0
fi
echo "FAIL: exit status $rc${expect:+ without an error matching /$expect/}"
exit 1
