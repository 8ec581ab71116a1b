#!/usr/bin/env bash
# `make bench-kube`: the Kubernetes client library against a real kube-apiserver (the control
# plane of scripts/cluster.sh, started for the run in a temporary directory and stopped after,
# no nodes): informer cache memory per 10,000 pods, and list / informer sync / watch
# throughput, printed as a table. Flags go to the program (spawnpoint-kube-bench --help), also
# through BENCH_ARGS:  make bench-kube BENCH_ARGS="--pods 2000"
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build}
bench=$build/bin/spawnpoint-kube-bench
[ -x "$bench" ] || { echo "bench-kube: $bench is missing; build first (make build)" >&2; exit 1; }

dir=$(mktemp -d /tmp/spawnpoint-bench-kube-XXXXXX)
trap 'bash scripts/cluster.sh down --dir "$dir/cluster" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
kubeconfig=$(bash scripts/cluster.sh up --dir "$dir/cluster" --nodes 0 | tail -n 1 | sed 's/^kubeconfig: //')
# shellcheck disable=SC2086
"$bench" --kubeconfig "$kubeconfig" ${BENCH_ARGS:-} "$@"
