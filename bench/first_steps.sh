#!/usr/bin/env bash
# bench/first_steps.py in the frameworks environment's torch 2.6 (scripts/frameworks-env.sh),
# the agent bundle against that torch's torchrun: launch -> each of the first 20 steps.
#
#   bench/first_steps.sh [--reps N]     (BUILD: the build directory, default build)
#
# Needs root (the frameworks environment is a chroot root) and $BUILD/agent-bundle.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD:-$repo/build}
reps=3
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    *) echo "first_steps.sh: unknown argument $1 (allowed: --reps N)" >&2; exit 2 ;;
  esac
done
[ -x "$build/agent-bundle/bin/spawnpoint-agent" ] ||
  { echo "first_steps.sh: no agent bundle in $build/agent-bundle (ninja agent-bundle)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] ||
  { echo "first_steps.sh: needs root (the frameworks environment is a chroot root)" >&2; exit 1; }
line=$(bash "$repo/scripts/frameworks-env.sh" | tail -n 1)
python=$(sed -n 's/^python: \([^ ]*\) (in \([^;]*\);.*/\1/p' <<<"$line")
root=$(sed -n 's/^python: \([^ ]*\) (in \([^;]*\);.*/\2/p' <<<"$line")
[ -n "$python" ] && [ -d "$root" ] ||
  { echo "first_steps.sh: cannot read frameworks-env.sh's last line: $line" >&2; exit 1; }
exec bash "$repo/scripts/in-root.sh" --bundle "$build/agent-bundle" \
  --ro-bind "$repo/bench:/opt/spawnpoint-bench" --env PYTHONDONTWRITEBYTECODE=1 "$root" -- \
  "$python" /opt/spawnpoint-bench/first_steps.py \
  --agent /opt/spawnpoint/bin/spawnpoint-agent --reps "$reps"
