#!/usr/bin/env bash
# make test-repeat N=20: the suite's process and timing tests run N times each while a
# second process keeps a core busy; any failure fails the run.
#
#   scripts/test-repeat.sh [--n N] [--build-dir DIR] [--jobs J] [-- ctest args...]
#
# Which tests: every test of the C++ suites (agent, loader, progress, kube client, metrics,
# devices, api, examples: the ones that start processes, time out workers, poll deadlines
# and race threads) except the end-to-end labels, whose single runs take minutes each and
# run once per CI: cluster and operator (a control plane per run), python (interpreters
# importing torch), frameworks, foreign, images, helm, bundle, and fuzz (corpus replays,
# deterministic). ctest's --repeat until-fail:N runs each test up to N times and stops that
# test at its first failure. The last line is
#   test-repeat n=N tests=T runs=R failed=F busy_cores=1
# (R counts the passing tests' runs; a failed test ran until its first failure).
set -euo pipefail
cd "$(dirname "$0")/.."

n=20
build_dir=build
jobs=2
while [ $# -gt 0 ]; do
  case "$1" in
    --n) n=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "$0: unknown argument $1 (allowed: --n N, --build-dir DIR, --jobs J, -- ctest args)" >&2
       exit 2 ;;
  esac
done
case "$n" in
  '' | *[!0-9]* | 0) echo "$0: --n must be a positive number, got '$n'" >&2; exit 2 ;;
esac
exclude_labels="cluster|operator|python|frameworks|foreign|images|helm|bundle|fuzz"

# The load: one core kept busy for the whole run (a shell loop: no I/O, no memory).
sh -c 'while :; do :; done' &
busy=$!
trap 'kill "$busy" 2>/dev/null || true' EXIT

tests=$(cd "$build_dir" && ctest -N -LE "$exclude_labels" "$@" | sed -n 's/^Total Tests: //p')
echo "== test-repeat: $tests tests x $n, one core kept busy (pid $busy), ctest -j$jobs"
log=$(mktemp)
start=$(date +%s)
status=0
(cd "$build_dir" && ctest --output-on-failure -j "$jobs" --timeout 600 \
  --repeat "until-fail:$n" -LE "$exclude_labels" "$@") > "$log" 2>&1 || status=$?
end=$(date +%s)
# The failures (ctest lists them at the end), or nothing.
sed -n '/The following tests FAILED/,$p' "$log"
failed=$(sed -n '/The following tests FAILED/,$p' "$log" | grep -c ' - ' || true)
tail -n 3 "$log" | grep -E "tests passed|Total Test time" || true
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  tail -n 40 "$log"
  failed=1
fi
rm -f "$log"
# A test that failed ran until its failure; every other one ran n times.
echo "== test-repeat: $((end - start)) s"
echo "test-repeat n=$n tests=$tests runs=$(((tests - failed) * n)) failed=$failed busy_cores=1"
[ "$failed" -eq 0 ]
