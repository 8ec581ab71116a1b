#!/usr/bin/env bash
# Runs a command against a fresh real control plane (scripts/cluster.sh, no nodes) with
# SPAWNPOINT_TEST_KUBECONFIG pointing at it, the way a test binary's real-cluster mode is
# meant to be run; the control plane is stopped afterwards whatever the command did.
#
#   with_cluster.sh SOURCE_DIR -- COMMAND [ARGS...]
#
# Exit status: the command's; 1 when the control plane cannot start (its reason above).
set -uo pipefail
source_dir=$1
shift
[ "${1:-}" = -- ] && shift
dir=$(mktemp -d /tmp/spawnpoint-with-cluster.XXXXXX)
trap 'bash "$source_dir/scripts/cluster.sh" down --dir "$dir/cp" >/dev/null 2>&1; rm -rf "$dir"' EXIT
line=$(bash "$source_dir/scripts/cluster.sh" up --dir "$dir/cp" --nodes 0 | tail -n 1) || exit 1
export SPAWNPOINT_TEST_KUBECONFIG=${line#kubeconfig: }
"$@"
