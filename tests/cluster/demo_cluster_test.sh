#!/usr/bin/env bash
# `make demo-cluster` as CI sees it (stdout not a terminal): operator/demo/demo-cluster.sh
# must bring examples/local-cluster.yaml (or JOB, e.g. the README's Python quick start's
# examples/python/ddp.yaml) to Succeeded with equal parameters (exit 0), and print no
# terminal escape codes into a log. With a JOB, PATH is a fresh Debian machine's, so that
# the manifest's python3 is Debian's (with python3-torch), as the README says.
#
#   demo_cluster_test.sh SOURCE_DIR BUILD_DIR [JOB]
set -uo pipefail
source_dir=$1 build_dir=$2 job=${3:-}
if [ -n "$job" ]; then
  export JOB=$job PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
fi
out=$(mktemp /tmp/spawnpoint-demo-cluster-test.XXXXXX)
trap 'rm -f "$out"' EXIT
BUILD=$build_dir bash "$source_dir/operator/demo/demo-cluster.sh" >"$out" 2>&1
code=$?
cat "$out"
if [ $code -ne 0 ]; then
  echo "FAIL: demo-cluster.sh exited $code"
  exit 1
fi
if grep -q $'\033' "$out"; then
  echo "FAIL: escape codes in the output of a run that is not on a terminal"
  exit 1
fi
echo "ok: demo-cluster succeeded, plain text"
