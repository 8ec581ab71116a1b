#!/usr/bin/env bash
# Runs one frameworks test (a script of tests/frameworks/) in the frameworks environment, for ctest.
#
#   run_frameworks_test.sh --bundle DIR SCRIPT [ARGS...]
#   run_frameworks_test.sh --env-only          only make (or find) the environment
#
# Makes the environment on demand (scripts/frameworks-env.sh: the trixie-frameworks root with
# Lightning in a venv, cached) and runs SCRIPT there with scripts/in-root.sh by the venv's
# python: the bundle at /opt/spawnpoint, this folder at /opt/spawnpoint-tests,
# tests/foreign at /opt/spawnpoint-foreign (its foreign_common.py: run_agent, Checks),
# tests/python/pool_trainers at /opt/spawnpoint-pool-trainers, examples/ at
# /opt/spawnpoint-repo/examples (the examples run from /opt/spawnpoint-repo as from the root),
# tests/notebook and tests/support at /opt/spawnpoint-repo/tests/ (the notebook tests),
# SPAWNPOINT_FOREIGN_SUITE=trixie. Exit status: SCRIPT's; 1 when the environment cannot be
# made or the bundle is missing (a failure, not a skip); 77 (skip) only when not run as root.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
bundle="" env_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle=$2; shift 2 ;;
    --env-only) env_only=1; shift ;;
    --) shift; break ;;
    -*) echo "run_frameworks_test: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: the frameworks tests need root: the environment is a chroot root (mmdebstrap)" \
    "and scripts/in-root.sh runs it with chroot and mounts"
  exit 77
fi

started=$(date +%s)
if ! line=$(bash "$repo/scripts/frameworks-env.sh" | tail -n 1); then
  echo "FAIL: scripts/frameworks-env.sh could not make the frameworks environment (its output" \
    "is above); run it (or make frameworks-env) by hand to see why"
  exit 1
fi
python=$(sed -n 's/^python: \([^ ]*\) (in \([^;]*\);.*/\1/p' <<<"$line")
root=$(sed -n 's/^python: \([^ ]*\) (in \([^;]*\);.*/\2/p' <<<"$line")
if [ -z "$python" ] || [ ! -d "$root" ]; then
  echo "FAIL: cannot read the interpreter and root from frameworks-env.sh's last line: $line"
  exit 1
fi
echo "environment: $python in $root, ready in $(($(date +%s) - started))s"
[ "$env_only" -eq 1 ] && exit 0

[ $# -gt 0 ] || { echo "run_frameworks_test: no SCRIPT to run" >&2; exit 2; }
script=$1
shift
if [ -z "$bundle" ] || [ ! -x "$bundle/bin/spawnpoint-agent" ]; then
  echo "FAIL: no agent bundle at '${bundle}' (bin/spawnpoint-agent); build the agent-bundle target"
  exit 1
fi
[ -f "$here/$script" ] || { echo "FAIL: no $script in $here"; exit 1; }
echo "in the frameworks environment: $python /opt/spawnpoint-tests/$script $*"
bash "$repo/scripts/in-root.sh" --bundle "$bundle" --ro-bind "$here:/opt/spawnpoint-tests" \
  --ro-bind "$repo/tests/foreign:/opt/spawnpoint-foreign" \
  --ro-bind "$repo/tests/python/pool_trainers:/opt/spawnpoint-pool-trainers" \
  --ro-bind "$repo/examples:/opt/spawnpoint-repo/examples" \
  --ro-bind "$repo/tests/notebook:/opt/spawnpoint-repo/tests/notebook" \
  --ro-bind "$repo/tests/support:/opt/spawnpoint-repo/tests/support" \
  --env SPAWNPOINT_FOREIGN_SUITE=trixie --env PYTHONDONTWRITEBYTECODE=1 \
  --env PYTHONUNBUFFERED=1 "$root" -- "$python" "/opt/spawnpoint-tests/$script" "$@"
rc=$?
echo "in the frameworks environment: exit $rc after $(($(date +%s) - started))s"
exit $rc
