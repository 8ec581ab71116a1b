#!/usr/bin/env bash
# `make chart-local` as CI sees it (stdout not a terminal): operator/demo/chart-local.sh must
# install the chart on the local control plane, leave the Deployment's pod Pending with the
# reason (never a ReplicaSet replacing failed pods), run the operator with the Deployment's
# arguments as the installed ServiceAccount, run the status watchdog (`spawnpoint-operator
# status-watchdog`, its own Deployment's pod also Pending) with its Deployment's arguments as
# its own ServiceAccount, and bring the example job to Succeeded (exit 0) with the watchdog
# still running and the job not marked StatusStale, printing no terminal escape codes.
#
#   chart_local_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
source_dir=$1 build_dir=$2
out=$(mktemp /tmp/spawnpoint-chart-local-test.XXXXXX)
trap 'rm -f "$out"' EXIT
BUILD=$build_dir bash "$source_dir/operator/demo/chart-local.sh" >"$out" 2>&1
code=$?
cat "$out"
fail=0
check() {  # WHAT PATTERN
  if grep -qE -- "$2" "$out"; then echo "ok: $1"; else echo "FAIL: $1 (no line matching '$2')"; fail=1; fi
}
[ $code -eq 0 ] || { echo "FAIL: chart-local.sh exited $code"; fail=1; }
check "the operator's pod waits, Pending, with the reason" "^spawnpoint-[a-z0-9]+-[a-z0-9]+ Pending ImageNotRunnable$"
check "the operator ran as the chart's ServiceAccount" "^as system:serviceaccount:spawnpoint-system:spawnpoint$"
check "the example job succeeded under the chart's RBAC" "ran ml/local-cluster to Succeeded under the chart's RBAC"
check "the watchdog's pod waits, Pending, with the reason" "^spawnpoint-status-watchdog-[a-z0-9]+-[a-z0-9]+ Pending ImageNotRunnable$"
check "the watchdog ran as its own ServiceAccount" "^as system:serviceaccount:spawnpoint-system:spawnpoint-status-watchdog$"
check "the watchdog's arguments are its Deployment's" "^  status-watchdog$"
check "the watchdog kept running and marked nothing stale" "^the chart's status watchdog ran beside it, and marked nothing stale$"
if [ "$(grep -cE '^spawnpoint-[a-z0-9]+-[a-z0-9]+ (Pending|Failed|Running)' "$out")" -ne 1 ]; then
  echo "FAIL: not exactly one operator pod (a ReplicaSet replacing failed pods makes many)"
  fail=1
fi
if grep -q $'\033' "$out"; then
  echo "FAIL: escape codes in the output of a run that is not on a terminal"
  fail=1
fi
exit $fail
