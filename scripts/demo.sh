#!/usr/bin/env bash
# make demo / make demo-cpp: a real 2-rank DDP job on this machine through the agent.
#   demo.sh python   examples/python/demo.yaml: train_ddp.py, a plain PyTorch DDP script on
#                    Debian's torch, with the agent's loader workers (make demo; the default)
#   demo.sh cpp      examples/local-cpu.yaml: the libtorch example trainer (make demo-cpp)
# Shows the ranks' output as it happens, then checks that both ranks ended with the same
# parameters: each prints `final rank=R loss=L params=H`. The agent is $BUILD/bin (default
# build/bin). The rendezvous port is a free one (--master-port 0), not the default 29500.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
kind=${1:-python}

die() {
  echo "== demo FAILED: $*" >&2
  exit 1
}

case "$kind" in
  python) manifest=examples/python/demo.yaml ;;
  cpp) manifest=examples/local-cpu.yaml ;;
  *) echo "usage: scripts/demo.sh [python|cpp]  (got '$kind')" >&2; exit 2 ;;
esac
agent=$build/bin/spawnpoint-agent
[ -x "$agent" ] || die "$agent is not built (make demo builds it)"

if [ "$kind" = python ]; then
  # The manifest's python3 is found on PATH, as a shell finds it. A python3 without torch
  # first on PATH (a pyenv or venv one) would fail every rank: Debian's, which make demo
  # installs with python3-torch, is put first instead, and that is said.
  if ! python3 -c 'import torch' >/dev/null 2>&1; then
    if /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
      echo "== python3 on PATH ($(command -v python3 || echo none)) cannot import torch: the demo uses Debian's /usr/bin/python3"
      export PATH=/usr/bin:$PATH
    else
      die "no python3 that imports torch: install Debian's python3-torch (scripts/install-deps.sh --demo does)"
    fi
  fi
elif [ ! -x "$build/bin/spawnpoint-example-trainer" ]; then
  die "$build/bin/spawnpoint-example-trainer is not built (make demo-cpp builds it)"
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "== spawnpoint demo: $agent run -f $manifest"
set +e
"$agent" run -f "$manifest" --master-port 0 2>&1 | tee "$log"
code=${PIPESTATUS[0]}
set -e
[ "$code" -eq 0 ] || die "the agent exited $code"
finals=$(grep -o 'final rank=[0-9]* loss=[0-9.]* params=[0-9a-f]*' "$log" || true)
ranks=$(printf '%s\n' "$finals" | grep -c final || true)
hashes=$(printf '%s\n' "$finals" | sed 's/.*params=//' | sort -u | wc -l)
echo "== $ranks ranks finished:"
printf '%s\n' "$finals"
if [ "$ranks" -ne 2 ] || [ "$hashes" -ne 1 ]; then
  die "expected 2 ranks with equal params=, got $ranks ranks and $hashes distinct hashes"
fi
echo "== demo OK: both ranks hold the same parameters (DDP kept them in sync)"
