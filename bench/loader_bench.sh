#!/usr/bin/env bash
# `make bench-loader`: spawnpoint's loader (build/bin/spawnpoint-loader-bench) against
# PyTorch's DataLoader with spawned persistent workers (bench/loader_reference.py), in one
# invocation: first batch, steady throughput (transfer- and compute-heavy), epoch boundary,
# peak memory. Flags go to the harness (bench/loader_bench.py --help), also through BENCH_ARGS:
#   make bench-loader BENCH_ARGS=--quick
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
python=/usr/bin/python3

for bin in "$build/bin/spawnpoint-loader-bench" "$build/bin/spawnpoint-loader-bench-worker"; do
  if [ ! -x "$bin" ]; then
    echo "bench-loader: $bin is missing; build first (make build)" >&2
    exit 1
  fi
done
if [ ! -x "$python" ] || ! "$python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)'; then
  echo "bench-loader: $python with torch is needed for the reference (apt-get install python3-torch)" >&2
  exit 1
fi

# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags on purpose
exec "$python" bench/loader_bench.py --build-dir "$build" ${BENCH_ARGS:-} "$@"
