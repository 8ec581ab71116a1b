#!/usr/bin/env bash
# make fuzz: builds the libFuzzer targets (SPAWNPOINT_FUZZ=ON, clang, ASan+UBSan) in their
# own build directory and runs each for FUZZ_SECONDS on a copy of its seed corpus
# (tests/fuzz/corpus/<target>/ plus regressions/<target>/); new corpus entries go to that
# temporary copy only, never to the tree. Prints per target the executions per second and
# the inputs tried (libFuzzer's final stats), and last `fuzz targets=N execs=N crashes=N`.
# A crashing input (or a leak, UB, a timeout or an out-of-memory: libFuzzer stops at the
# first and exits non-zero) is kept in <build>/fuzz-artifacts/<target>/ with the target's log;
# the script then exits 1. A built fuzz-<target> without a seed corpus is an error too (it
# would never run). .ci/run runs it when time allows; tests/ci/fuzz_crash_test.sh checks that
# a crash fails it.
#   FUZZ_SECONDS (30)   FUZZ_BUILD (build-fuzz)   JOBS (2)   FUZZ_CXX/FUZZ_CC (clang-14)
#   FUZZ_TARGETS        space-separated subset (default: every corpus/<target>)
#   FUZZ_CORPORA        the folder of corpus/ and regressions/ (default: tests/fuzz)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=${FUZZ_CORPORA:-$ROOT/tests/fuzz}
SECS=${FUZZ_SECONDS:-30}
BUILD=${FUZZ_BUILD:-$ROOT/build-fuzz}
JOBS=${JOBS:-2}
CXX_BIN=${FUZZ_CXX:-$(command -v clang++-14 || command -v clang++ || echo clang++)}
CC_BIN=${FUZZ_CC:-$(command -v clang-14 || command -v clang || echo clang)}

if [[ ! -f $BUILD/build.ninja ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DSPAWNPOINT_FUZZ=ON \
    -DCMAKE_CXX_COMPILER="$CXX_BIN" -DCMAKE_C_COMPILER="$CC_BIN" >/dev/null
fi
ninja -C "$BUILD" -j "$JOBS" fuzz-targets

targets=${FUZZ_TARGETS:-$(cd "$HERE/corpus" && ls)}
if [[ -z ${FUZZ_TARGETS:-} ]]; then
  for bin in "$BUILD"/bin/fuzz-*; do
    [[ -e $bin ]] || continue
    t=${bin##*/fuzz-}
    if [[ ! -d $HERE/corpus/$t ]]; then
      echo "run_fuzz.sh: $bin has no seed corpus $HERE/corpus/$t/, so it would never run;" \
        "add one (tests/fuzz/README.md)" >&2
      exit 1
    fi
  done
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/spawnpoint-fuzz-XXXXXX")
trap 'rm -rf "$work"' EXIT
artifacts=$BUILD/fuzz-artifacts

total_targets=0 total_execs=0 total_crashes=0
printf '%-16s %10s %12s %8s\n' target execs/s execs crashes
for t in $targets; do
  corpus=$work/$t/corpus
  mkdir -p "$corpus" "$work/$t/tmp" "$work/$t/artifacts"
  cp "$HERE/corpus/$t"/* "$corpus"/
  if [[ -d $HERE/regressions/$t ]]; then cp "$HERE/regressions/$t"/* "$corpus"/; fi
  log=$work/$t/log
  rc=0
  TMPDIR=$work/$t/tmp "$BUILD/bin/fuzz-$t" -max_total_time="$SECS" -print_final_stats=1 \
    -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$work/$t/artifacts/" \
    "$corpus" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  crashes=0
  if [[ $rc -ne 0 ]] || ls "$work/$t/artifacts" | grep -q .; then
    crashes=1  # libFuzzer stops at the first crash, leak, UB or timeout
    mkdir -p "$artifacts/$t"
    cp "$work/$t/artifacts"/* "$artifacts/$t"/ 2>/dev/null || true
    cp "$log" "$artifacts/$t/log"
    echo "fuzz-$t: exit $rc; input and log in $artifacts/$t/" >&2
    grep -m 3 -E 'ERROR: |runtime error|SUMMARY' "$log" >&2 || true
  fi
  printf '%-16s %10s %12s %8s\n' "$t" "${rate:-?}" "${execs:-?}" "$crashes"
  total_targets=$((total_targets + 1))
  total_execs=$((total_execs + ${execs:-0}))
  total_crashes=$((total_crashes + crashes))
done
echo "fuzz targets=$total_targets execs=$total_execs crashes=$total_crashes"
[[ $total_crashes -eq 0 ]]
