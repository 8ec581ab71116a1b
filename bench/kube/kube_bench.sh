#!/usr/bin/env bash
# `make bench-kube`: the Kubernetes client library against a real kube-apiserver (the control
# plane of scripts/cluster.sh, started for the run in a temporary directory and stopped after,
# no nodes): informer cache memory per 10,000 pods, and list / informer sync / watch
# throughput, printed as a table. BENCH_SERVER=test runs it against the old kube-test-server
# instead, while it exists. Flags go to the program (spawnpoint-kube-bench --help), also
# through BENCH_ARGS:  make bench-kube BENCH_ARGS="--pods 2000"
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build}
bench=$build/bin/spawnpoint-kube-bench
[ -x "$bench" ] || { echo "bench-kube: $bench is missing; build first (make build)" >&2; exit 1; }

if [ "${BENCH_SERVER:-real}" = test ]; then
  server=$build/bin/kube-test-server
  [ -x "$server" ] || { echo "bench-kube: $server is missing; build first (make build)" >&2; exit 1; }
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags on purpose
  exec "$bench" --server "$server" ${BENCH_ARGS:-} "$@"
fi

dir=$(mktemp -d /tmp/spawnpoint-bench-kube-XXXXXX)
trap 'bash scripts/cluster.sh down --dir "$dir/cluster" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
kubeconfig=$(bash scripts/cluster.sh up --dir "$dir/cluster" --nodes 0 | tail -n 1 | sed 's/^kubeconfig: //')
# shellcheck disable=SC2086
"$bench" --kubeconfig "$kubeconfig" ${BENCH_ARGS:-} "$@"
