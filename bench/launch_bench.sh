#!/usr/bin/env bash
# `make bench-launch`: the example DDP trainer (2 CPU ranks, gloo) under spawnpoint-agent and
# under torchrun, in one invocation: start-up, restart after a rank's death, launcher memory.
# Flags go to the harness (bench/launch_bench.py --help), also through BENCH_ARGS:
#   make bench-launch BENCH_ARGS=--quick
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
python=/usr/bin/python3

for bin in "$build/bin/spawnpoint-agent" "$build/bin/spawnpoint-example-trainer"; do
  if [ ! -x "$bin" ]; then
    echo "bench-launch: $bin is missing; build first (make build)" >&2
    exit 1
  fi
done
if [ ! -x "$python" ] || ! "$python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)'; then
  echo "bench-launch: $python with torch is needed for torchrun (apt-get install python3-torch)" >&2
  exit 1
fi

# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags on purpose
exec "$python" bench/launch_bench.py --build-dir "$build" ${BENCH_ARGS:-} "$@"
