#!/usr/bin/env bash
# make test-asan / make test-tsan: the whole suite built with GCC's sanitizers in a build
# directory of its own, then run by ctest.
#
#   scripts/sanitizer-tests.sh asan|tsan [--build-dir DIR] [--jobs N] [--no-build]
#                              [--check-skips] [-- ctest args...]
#
# asan: AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer), any finding aborts
# (-fno-sanitize-recover=all). tsan: ThreadSanitizer. Every process of the run (tests,
# agents, operators, ranks, loader workers: whatever of ours a test starts) writes its
# reports into <build-dir>/sanitizer-reports/, and the run fails when a report is there even
# if the test that started the process passed (a test may expect a worker to die; it does
# not expect it to die of a heap overflow). Suppressions (system libraries only, one reason
# per line) are in tests/sanitizers/. What is excluded, and why, is EXCLUDED below. Like make
# test, it ends with the tests that did not run (scripts/test-skips.py); --check-skips
# (.ci/run) fails the run when one outside tests/skip-allowlist.txt did not run.
set -euo pipefail
cd "$(dirname "$0")/.."
source_dir=$PWD

mode=${1:-}
shift || true
case "$mode" in
  asan) sanitize="address,undefined" ;;
  tsan) sanitize="thread" ;;
  *)
    echo "usage: $0 asan|tsan [--build-dir DIR] [--jobs N] [-- ctest args...]" >&2
    exit 2
    ;;
esac
build_dir="build-$mode"
jobs=2
build=1
check_skips=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --no-build) build=0; shift ;;  # run the tests of the tree as it is
    --check-skips) check_skips=1; shift ;;
    --) shift; break ;;
    *) echo "$0: unknown argument $1" \
            "(allowed: --build-dir DIR, --jobs N, --no-build, -- ctest args)" >&2
       exit 2 ;;
  esac
done

# ---- What does not run instrumented, and why (ctest -E / -LE) ----
# Labels:
#   images: the images carry the release build's binaries (scripts/images.sh packs a
#     build tree into the agent and operator images); an instrumented agent in an image
#     tests nothing the bundle and foreign-root tests do not, and images are release
#     artefacts, not sanitizer targets.
#   fuzz: the corpora are replayed under ASan+UBSan by `make fuzz`'s own build (clang,
#     libFuzzer); here they would only repeat that.
#   ci: tests of the CI scripts (Python and shell; the fuzz one builds its own clang targets,
#     which crash on purpose): nothing of ours runs instrumented in them.
exclude_labels="images|fuzz|ci"
# Tests (regular expressions on ctest names), by sanitizer:
declare -a exclude_common=(
)
declare -a exclude_asan=(
)
declare -a exclude_tsan=(
)

start=$(date +%s)
if [ "$build" = 1 ]; then
  bash scripts/install-deps.sh
  bash scripts/install-tools.sh --control-plane
fi
if [ ! -f "$build_dir/build.ninja" ]; then
  cmake -S . -B "$build_dir" -G Ninja -DSPAWNPOINT_SANITIZE="$sanitize"
fi
if ! grep -q "^SPAWNPOINT_SANITIZE:STRING=$sanitize\$" "$build_dir/CMakeCache.txt"; then
  echo "$0: $build_dir is not a $mode build (SPAWNPOINT_SANITIZE=$sanitize); remove it" >&2
  exit 2
fi
if [ "$build" = 1 ]; then
  echo "== $mode: building $build_dir (ninja -j$jobs)"
  ninja -C "$build_dir" -j "$jobs"
fi
built=$(date +%s)

reports="$PWD/$build_dir/sanitizer-reports"
rm -rf "$reports"
mkdir -p "$reports"
supp="$source_dir/tests/sanitizers"
# Reports go to files (log_path) so that a child's report is found after its test, whatever
# the test made of the child's exit. The fatal signals stay the kernel's (handle_*=0): tests
# make workers and ranks die of SIGSEGV, SIGBUS (a full /dev/shm) and SIGABRT on purpose and
# check the signal; an instrumented access is checked before it could fault anyway.
# Deadlines (never expected times) of the Python harnesses are 3 (ASan) or 6 (TSan) times
# longer, as the C++ ones are in these builds (tests/support/test_process.h:
# SanitizerSlowdown).
if [ "$mode" = tsan ]; then
  export SPAWNPOINT_TEST_SLOWDOWN=6
else
  export SPAWNPOINT_TEST_SLOWDOWN=3
fi
signals="handle_segv=0:handle_sigbus=0:handle_abort=0:handle_sigfpe=0:handle_sigill=0"
asan="halt_on_error=1:detect_leaks=1:check_initialization_order=1:strict_init_order=1"
asan="$asan:detect_stack_use_after_return=1:allocator_may_return_null=0"
export ASAN_OPTIONS="log_path=$reports/asan:$asan:$signals"
export UBSAN_OPTIONS="log_path=$reports/ubsan:print_stacktrace=1:halt_on_error=1"
UBSAN_OPTIONS="$UBSAN_OPTIONS:suppressions=$supp/ubsan.supp:$signals"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export TSAN_OPTIONS="log_path=$reports/tsan:halt_on_error=0:second_deadlock_stack=1"
TSAN_OPTIONS="$TSAN_OPTIONS:suppressions=$supp/tsan.supp:print_suppressions=0:$signals"

exclude=("${exclude_common[@]}")
if [ "$mode" = asan ]; then exclude+=("${exclude_asan[@]}"); fi
if [ "$mode" = tsan ]; then exclude+=("${exclude_tsan[@]}"); fi
regex=""
for e in "${exclude[@]}"; do regex="${regex:+$regex|}$e"; done
junit="$PWD/$build_dir/Testing/ctest-junit.xml"
rm -f "$junit"
args=(--output-on-failure -j "$jobs" --timeout 900 -LE "$exclude_labels" --output-junit "$junit"
      --test-output-truncation middle)
[ -n "$regex" ] && args+=(-E "$regex")

echo "== $mode: ctest ${args[*]} $*"
status=0
(cd "$build_dir" && ctest "${args[@]}" "$@") || status=$?
end=$(date +%s)

# A report is an error (ASan, LSan, UBSan, TSan's warnings are its reports); a file with only
# a runtime's notice (e.g. ASan ignoring a no-return on another stack) is shown, not counted.
pattern='ERROR: (Address|Leak|Thread)Sanitizer|runtime error:|WARNING: ThreadSanitizer'
found=$(grep -lE "$pattern" -r "$reports" | sort || true)
for f in $(find "$reports" -type f | sort); do
  case " $(echo $found) " in *" $f "*) continue ;; esac
  echo "== $mode: notice, not a report: $f: $(head -c 300 "$f")"
done
if [ -n "$found" ]; then
  echo "== $mode: sanitizer reports (each file one process):"
  for f in $found; do
    echo "---- $f"
    head -c 20000 "$f"
  done
  [ "$status" -eq 0 ] && status=1
fi
n=$(printf '%s\n' "$found" | grep -c . || true)
echo "== $mode: build $((built - start)) s, tests $((end - built)) s," \
  "reports $n, ctest exit $status"
skips=(--title "make test-$mode" --junit "$junit" --allowlist tests/skip-allowlist.txt)
[ "$check_skips" = 1 ] && skips+=(--check)
/usr/bin/python3 scripts/test-skips.py "${skips[@]}" || { [ "$status" -eq 0 ] && status=1; }
exit "$status"
