#!/usr/bin/env bash
# The test nvml_header_abi: the NVML declarations spawnpoint builds with
# (agent/devices/nvml_abi.h, used by the NVML backend and the fake NVML library) against
# NVIDIA's own nvml.h, from the go-nvml module pinned in tools/nvml and fetched by
# scripts/install-tools.sh into .tools/include. It compiles at test time, so a header fetched
# after the build is still checked, and a missing one fails (never skips). Three steps:
#   1. nvml_header_test.cc: every type, field offset, constant and entry point of nvml_abi.h
#      against nvml.h (static_asserts; the compiler names what differs);
#   2. the fake library's source compiled against nvml.h instead of nvml_abi.h (its entry
#      point definitions must match NVIDIA's prototypes, its field names NVIDIA's structs);
#   3. the backend's tests (devices_test, *Nvml* and SelectGpuBackend*) on that fake: the
#      backend built with nvml_abi.h talks to a library built with nvml.h.
# Usage: nvml_header_check.sh --cxx CXX --cc CC --source-dir DIR --header-dir DIR
#          --work-dir DIR --devices-test BIN
set -euo pipefail

while [ $# -gt 0 ]; do
  case "$1" in
    --cxx) cxx=$2 ;;
    --cc) cc=$2 ;;
    --source-dir) src=$2 ;;
    --header-dir) headers=$2 ;;
    --work-dir) work=$2 ;;
    --devices-test) devices_test=$2 ;;
    *) echo "nvml_header_check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
: "${cxx:?--cxx}" "${cc:?--cc}" "${src:?--source-dir}" "${headers:?--header-dir}"
: "${work:?--work-dir}" "${devices_test:?--devices-test}"

fail() {
  echo "nvml_header_abi: FAILED: $*" >&2
  exit 1
}

version=$(awk '$1 == "require" && $2 == "github.com/NVIDIA/go-nvml" { print $3; exit }' \
  "$src/tools/nvml/go.mod")
if [ ! -f "$headers/nvml.h" ]; then
  fail "NVIDIA's nvml.h is not at $headers/nvml.h. It is fetched, never committed: \
scripts/install-tools.sh (run by make deps, make build and make test) takes it from the Go \
module github.com/NVIDIA/go-nvml $version (tools/nvml/go.mod; go.sum pins it) through the Go \
module proxy. Run: bash $src/scripts/install-tools.sh"
fi
echo "nvml_header_abi: $headers/nvml.h (go-nvml $version): $(head -n1 "$headers/nvml.h")"
mkdir -p "$work"

echo "nvml_header_abi: 1. agent/devices/nvml_abi.h against nvml.h"
"$cxx" -std=c++20 -Wall -Wextra -Werror -I"$src" -isystem "$headers" \
  "$src/tests/devices/nvml_header_test.cc" -o "$work/nvml_header_test" ||
  fail "agent/devices/nvml_abi.h differs from nvml.h (the static assertions above say where)"
"$work/nvml_header_test" || fail "$work/nvml_header_test exited $?"

echo "nvml_header_abi: 2. tests/fakes/fake_nvml.c compiled against nvml.h"
"$cc" -std=c11 -Wall -Wextra -Werror -shared -fPIC -DFAKE_NVML_WITH_NVIDIA_HEADER \
  -I"$src" -isystem "$headers" "$src/tests/fakes/fake_nvml.c" \
  -o "$work/libnvidia-ml-nvidia-header.so" ||
  fail "tests/fakes/fake_nvml.c does not compile against nvml.h (above)"

echo "nvml_header_abi: 3. the backend's tests on the fake built from nvml.h"
library="$work/libnvidia-ml-nvidia-header.so"
SPAWNPOINT_TEST_FAKE_NVML="$library" "$devices_test" --gtest_filter='*Nvml*:SelectGpuBackend*' \
  --gtest_brief=1 2>&1 | tee "$work/devices_test.log" ||
  fail "the backend's tests failed on the fake NVML built from nvml.h (above)"
grep -qxF "fake NVML library: $library" "$work/devices_test.log" ||
  fail "devices_test did not load $library (it says which library it loads: see above)"
echo "nvml_header_abi: passed"
