#!/usr/bin/env bash
# `make bench-operator`: 1,000 TrainingJobs of 2 nodes created at once against a real control
# plane (scripts/cluster.sh, simulated pods); prints the time until every pod exists,
# reconciles per second, p99 reconcile latency and the operator's peak memory. Flags go to operator_bench.py (--help),
# also through BENCH_ARGS:  make bench-operator BENCH_ARGS="--jobs 200 --workers 8"
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags on purpose
exec python3 bench/operator/operator_bench.py --build "${BUILD:-build}" ${BENCH_ARGS:-} "$@"
