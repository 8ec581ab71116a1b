#!/usr/bin/env bash
# tests/fuzz/run_fuzz.sh (make fuzz, .ci/run's fuzz step) fails when a target crashes: three
# real libFuzzer targets (tests/ci/fuzz_target.c with clang-14, ASan + UBSan as
# tests/fuzz/fuzz_build.cmake compiles them) in a build folder whose build.ninja has nothing
# left to build, each with a one-file seed corpus in a FUZZ_CORPORA of this test's own:
#   crashy_asan, crashy_ubsan: the seed is "CRASH..." -> a heap overflow, a signed overflow;
#   calm: never fails.
# Checks: all three -> exit 1, crashes=2, each crashing input and its log kept; calm alone ->
# exit 0, crashes=0; a built target with no seed corpus -> exit 1 naming it.
#   fuzz_crash_test.sh REPO
set -euo pipefail
repo=$1
# The test's own targets must report to their log, not to a sanitizer run's report folder.
unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
cc=$(command -v clang-14 || command -v clang || true)
if [[ -z $cc ]]; then
  echo "FAIL: no clang-14; scripts/install-deps.sh (make deps) installs it for make fuzz" >&2
  exit 1
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/spawnpoint-fuzz-test-XXXXXX")
trap 'rm -rf "$work"' EXIT
build=$work/build
mkdir -p "$build/bin"
printf 'ninja_required_version = 1.5\nbuild fuzz-targets: phony\n' >"$build/build.ninja"
flags=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all)
"$cc" "${flags[@]}" -DCRASH_ASAN "$repo/tests/ci/fuzz_target.c" -o "$build/bin/fuzz-crashy_asan"
"$cc" "${flags[@]}" -DCRASH_UBSAN "$repo/tests/ci/fuzz_target.c" -o "$build/bin/fuzz-crashy_ubsan"
"$cc" "${flags[@]}" "$repo/tests/ci/fuzz_target.c" -o "$build/bin/fuzz-calm"
for t in crashy_asan crashy_ubsan calm; do mkdir -p "$work/corpora/corpus/$t"; done
printf 'CRASH!!' >"$work/corpora/corpus/crashy_asan/seed"
printf 'CRASH!!' >"$work/corpora/corpus/crashy_ubsan/seed"
printf 'CRASH!!' >"$work/corpora/corpus/calm/seed"

failed=0
fail() { echo "FAIL: $*" >&2; failed=1; }
fuzz() {  # fuzz TARGETS...: run_fuzz.sh's exit status in $rc, its output in $work/out
  rc=0
  FUZZ_BUILD=$build FUZZ_CORPORA=$work/corpora FUZZ_SECONDS=2 FUZZ_TARGETS="$*" \
    bash "$repo/tests/fuzz/run_fuzz.sh" >"$work/out" 2>&1 || rc=$?
  cat "$work/out"
}

echo "== a crash fails the run"
fuzz calm crashy_asan crashy_ubsan
[[ $rc -eq 1 ]] || fail "run_fuzz.sh exited $rc with two crashing targets (want 1)"
grep -q '^fuzz targets=3 execs=[0-9]* crashes=2$' "$work/out" ||
  fail "the last line does not say targets=3 crashes=2"
for t in crashy_asan crashy_ubsan; do
  ls "$build/fuzz-artifacts/$t"/crash-* >/dev/null 2>&1 || fail "$t: no crashing input kept"
done
grep -q 'heap-buffer-overflow' "$build/fuzz-artifacts/crashy_asan/log" ||
  fail "crashy_asan: its log does not name the heap overflow"
grep -q 'runtime error: signed integer overflow' "$build/fuzz-artifacts/crashy_ubsan/log" ||
  fail "crashy_ubsan: its log does not name the signed overflow"
[[ ! -e $build/fuzz-artifacts/calm ]] || fail "calm: artifacts kept for a target that never failed"

echo "== no crash passes"
fuzz calm
[[ $rc -eq 0 ]] || fail "run_fuzz.sh exited $rc with a target that never crashes (want 0)"
grep -q '^fuzz targets=1 execs=[1-9][0-9]* crashes=0$' "$work/out" ||
  fail "the last line does not say targets=1 crashes=0 with inputs tried"

echo "== a built target without a seed corpus is an error"
cp "$build/bin/fuzz-calm" "$build/bin/fuzz-orphan"
rm -rf "$work/corpora/corpus/crashy_asan" "$work/corpora/corpus/crashy_ubsan"
rm "$build/bin/fuzz-crashy_asan" "$build/bin/fuzz-crashy_ubsan"
fuzz
[[ $rc -ne 0 ]] || fail "run_fuzz.sh passed with fuzz-orphan built and no corpus for it"
grep -q 'fuzz-orphan has no seed corpus' "$work/out" || fail "the error does not name fuzz-orphan"

[[ $failed -eq 0 ]] && echo "PASS: run_fuzz.sh fails on a crash and on a target it cannot run"
exit $failed
