#!/usr/bin/env bash
# `make bench-kube`: the Kubernetes client library against kube-test-server: informer cache
# memory per 10,000 pods, and list / informer sync / watch throughput, printed as a table.
# Flags go to the program (spawnpoint-kube-bench --help), also through BENCH_ARGS:
#   make bench-kube BENCH_ARGS="--pods 2000"
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build}

for bin in "$build/bin/spawnpoint-kube-bench" "$build/bin/kube-test-server"; do
  if [ ! -x "$bin" ]; then
    echo "bench-kube: $bin is missing; build first (make build)" >&2
    exit 1
  fi
done

# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags on purpose
exec "$build/bin/spawnpoint-kube-bench" --server "$build/bin/kube-test-server" ${BENCH_ARGS:-} "$@"
