#!/usr/bin/env bash
# Ultralytics' time from train() to its first training batch, the agent's loader pool against
# stock DataLoader (loader.pythonPool: false), in the frameworks environment: N runs of
# tests/frameworks/ultralytics_under_agent.py (each a pair of 1-rank jobs of
# YOLO('yolov8n.yaml').train() on 32 generated images, workers 2, CPU), then a table of
# medians (min-max) and their ratio. Needs root (the environment is a chroot root).
#
#   make bench-frameworks [BENCH_ARGS=N]        (default N: 3)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD:-$repo/build}
runs=${1:-3}
pool=() stock=()
for i in $(seq 1 "$runs"); do
  line=$(bash "$repo/tests/frameworks/run_frameworks_test.sh" --bundle "$build/agent-bundle" \
    ultralytics_under_agent.py | grep '^SPAWNPOINT-BENCH ') ||
    { echo "bench-frameworks: run $i failed (run the frameworks_ultralytics test to see why)" >&2; exit 1; }
  read -r p s < <(sed -n 's/.*pool \([0-9.]*\) s, stock \([0-9.]*\) s.*/\1 \2/p' <<<"$line")
  pool+=("$p") stock+=("$s")
  echo "  [$i/$runs] train() -> first batch: pool ${p} s, stock ${s} s (load $(cut -d' ' -f1 /proc/loadavg))" >&2
done
python3 - "${pool[*]}" "${stock[*]}" <<'PY'
import statistics, sys
pool, stock = ([float(x) for x in a.split()] for a in sys.argv[1:3])
ratios = [s / p for p, s in zip(pool, stock)]
cell = lambda v, u: "%.2f %s (%.2f-%.2f)" % (statistics.median(v), u, min(v), max(v))
print("| workload | metric | agent's pool (pythonPool: true) | stock DataLoader (spawn, persistent) | ratio |")
print("| --- | --- | --- | --- | --- |")
print("| Ultralytics yolov8n, 32 images, workers 2 | train() -> first batch | %s | %s | %.2fx sooner |"
      % (cell(pool, "s"), cell(stock, "s"), statistics.median(ratios)))
print("ratios ultralytics_first_batch=%.2f" % statistics.median(ratios))
PY
