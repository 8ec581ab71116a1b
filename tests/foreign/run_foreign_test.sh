#!/usr/bin/env bash
# Runs one foreign test (a script of tests/foreign/) inside a foreign trainer root, for ctest.
#
#   run_foreign_test.sh --suite SUITE --bundle DIR SCRIPT [ARGS...]
#   run_foreign_test.sh --suite SUITE --root-only     only build (or find) the root
#
# Builds the root on demand (scripts/foreign-root.sh SUITE: cached in .cache/roots/SUITE)
# and runs SCRIPT there with scripts/in-root.sh: SCRIPT.py by the root's python3, anything
# else as an executable; the bundle at /opt/spawnpoint, this folder at
# /opt/spawnpoint-tests, the source's agent/python and tests/python under
# /opt/spawnpoint-src, SPAWNPOINT_FOREIGN_SUITE=SUITE (foreign_common.py says the rest).
# Exit status: SCRIPT's; 1 when the root cannot be built or the bundle is missing (a
# failure, not a skip); 77 (skip) only when not run as root, which chroot needs.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
suite="" bundle="" root_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) suite=$2; shift 2 ;;
    --bundle) bundle=$2; shift 2 ;;
    --root-only) root_only=1; shift ;;
    --) shift; break ;;
    -*) echo "run_foreign_test: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ -n "$suite" ] || { echo "run_foreign_test: --suite is required" >&2; exit 2; }

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: the foreign root tests need root: scripts/foreign-root.sh builds the $suite root" \
    "with mmdebstrap's root mode and scripts/in-root.sh runs it with chroot and mounts"
  exit 77
fi

started=$(date +%s)
if ! root=$(bash "$repo/scripts/foreign-root.sh" "$suite"); then
  echo "FAIL: scripts/foreign-root.sh $suite could not build the $suite root (its output is" \
    "above); run it by hand to see why (mmdebstrap from scripts/install-deps.sh, root, the" \
    "Debian mirror)"
  exit 1
fi
root=$(tail -n 1 <<<"$root")
echo "root: $root ($(sed -n 's/^built=//p' "$root/.spawnpoint-root")), ready in $(($(date +%s) - started))s"
if [ "$root_only" -eq 1 ]; then
  exit 0
fi

[ $# -gt 0 ] || { echo "run_foreign_test: no SCRIPT to run" >&2; exit 2; }
script=$1
shift
if [ -z "$bundle" ] || [ ! -x "$bundle/bin/spawnpoint-agent" ]; then
  echo "FAIL: no agent bundle at '${bundle}' (bin/spawnpoint-agent); build the agent-bundle target"
  exit 1
fi
[ -f "$here/$script" ] || { echo "FAIL: no $script in $here"; exit 1; }
case "$script" in
  *.py) command=(python3 "/opt/spawnpoint-tests/$script") ;;
  *) command=("/opt/spawnpoint-tests/$script") ;;
esac
echo "in the $suite root: ${command[*]} $*"
bash "$repo/scripts/in-root.sh" --bundle "$bundle" --ro-bind "$here:/opt/spawnpoint-tests" \
  --ro-bind "$repo/agent/python:/opt/spawnpoint-src/agent/python" \
  --ro-bind "$repo/tests/python:/opt/spawnpoint-src/tests/python" \
  --ro-bind "$repo/tests/support:/opt/spawnpoint-src/tests/support" \
  --env SPAWNPOINT_FOREIGN_SUITE="$suite" --env PYTHONDONTWRITEBYTECODE=1 \
  --env PYTHONUNBUFFERED=1 "$root" -- "${command[@]}" "$@"
rc=$?
echo "in the $suite root: exit $rc after $(($(date +%s) - started))s"
exit $rc
