#!/usr/bin/env bash
# `make bench-metrics`: the Prometheus exposition library: time and heap allocations per
# scrape of 10,000 series (counters, GPU-labelled gauges, histograms, a scrape-time
# collector) and the cost of updates, printed as tables.
# Flags go to the program (spawnpoint-metrics-bench --help), also through BENCH_ARGS:
#   make bench-metrics BENCH_ARGS="--series 50000 --iterations 20"
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build}

bin="$build/bin/spawnpoint-metrics-bench"
if [ ! -x "$bin" ]; then
  echo "bench-metrics: $bin is missing; build first (make build)" >&2
  exit 1
fi

# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags on purpose
exec "$bin" ${BENCH_ARGS:-} "$@"
