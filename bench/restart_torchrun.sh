#!/usr/bin/env bash
# A rank's death to its restarted first step, and the first start, under spawnpoint-agent at
# its defaults against torchrun of the same torch at its defaults (bench/restart_vs_torchrun.py):
# in the frameworks environment's torch 2.6 (scripts/frameworks-env.sh: a torch + torchvision
# DDP script and a Lightning script), then in Debian's torch 1.13 (the torchvision script;
# Debian 12 has no Lightning). Prints both tables and, last,
#
#   ratios restart_torchvision=X restart_lightning=Y start_overhead_pct=Z
#          restart_torchvision_113=X1 start_overhead_pct_113=Z1
#
#   bench/restart_torchrun.sh [--reps N] [--first-steps]   (BUILD: the build directory,
#                                                           default build)
#
# --first-steps runs bench/first_steps.py instead (the first 20 steps, torch 2.6 only).
#
# Needs root (the frameworks environment is a chroot root) and the agent bundle
# ($BUILD/agent-bundle, which make bench-restart builds).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD:-$repo/build}
reps=3
first_steps=0
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --first-steps) first_steps=1; shift ;;
    *) echo "restart_torchrun.sh: unknown argument $1 (allowed: --reps N, --first-steps)" >&2
       exit 2 ;;
  esac
done
[ -x "$build/agent-bundle/bin/spawnpoint-agent" ] ||
  { echo "restart_torchrun.sh: no agent bundle in $build/agent-bundle (ninja agent-bundle)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] ||
  { echo "restart_torchrun.sh: needs root (the frameworks environment is a chroot root)" >&2; exit 1; }

line=$(bash "$repo/scripts/frameworks-env.sh" | tail -n 1)
python=$(sed -n 's/^python: \([^ ]*\) (in \([^;]*\);.*/\1/p' <<<"$line")
root=$(sed -n 's/^python: \([^ ]*\) (in \([^;]*\);.*/\2/p' <<<"$line")
[ -n "$python" ] && [ -d "$root" ] ||
  { echo "restart_torchrun.sh: cannot read frameworks-env.sh's last line: $line" >&2; exit 1; }

if [ "$first_steps" = 1 ]; then
  exec bash "$repo/scripts/in-root.sh" --bundle "$build/agent-bundle" \
    --ro-bind "$repo/bench:/opt/spawnpoint-bench" --env PYTHONDONTWRITEBYTECODE=1 "$root" -- \
    "$python" /opt/spawnpoint-bench/first_steps.py \
    --agent /opt/spawnpoint/bin/spawnpoint-agent --reps "$reps"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "== torch 2.6 (the frameworks environment), $reps runs each, interleaved"
bash "$repo/scripts/in-root.sh" --bundle "$build/agent-bundle" \
  --ro-bind "$repo/bench:/opt/spawnpoint-bench" --env PYTHONDONTWRITEBYTECODE=1 "$root" -- \
  "$python" /opt/spawnpoint-bench/restart_vs_torchrun.py \
  --agent /opt/spawnpoint/bin/spawnpoint-agent --reps "$reps" | tee "$out/26"
echo
echo "== torch 1.13 (Debian's /usr/bin/python3), the torchvision script, $reps runs each"
PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 "$repo/bench/restart_vs_torchrun.py" \
  --agent "$build/bin/spawnpoint-agent" --reps "$reps" --trainers torchvision | tee "$out/113"

ratios26=$(grep '^ratios ' "$out/26" | tail -n 1 | cut -d' ' -f2-)
ratios113=$(grep '^ratios ' "$out/113" | tail -n 1 | cut -d' ' -f2- |
  sed 's/restart_torchvision=/restart_torchvision_113=/; s/start_overhead_pct=/start_overhead_pct_113=/')
echo "ratios $ratios26 $ratios113"
