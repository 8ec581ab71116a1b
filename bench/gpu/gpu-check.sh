#!/usr/bin/env bash
# The project's GPU check (bench/gpu/gpu_check.py says what it checks): on a machine with
# NVIDIA GPUs, nvidia-smi and a python3 with CUDA torch, with the agent bundle of this tree
# (make agent-bundle; the bundle runs on any distribution). Fits in 5 minutes; prints one table
# and a last line `gpu-check device=... plan=ok ddp=ok metrics=ok notebook=ok first_step=A/B
# restart=C/D`.
#
#   bench/gpu/gpu-check.sh [--bundle DIR] [--python PY] [--nvidia-smi CMD] [-- AGENT_FLAGS...]
#
# --bundle: the agent bundle (default build/agent-bundle of this tree); --python: the
# interpreter whose torch runs the ranks and torchrun (default python3); AGENT_FLAGS go to
# `spawnpoint-agent plan` and `run` (the fakes' --gpu-backend nvml --nvml-library ...).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bundle=$here/../../build/agent-bundle
python=python3
smi=nvidia-smi
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --nvidia-smi) smi=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "gpu-check.sh: unknown argument $1 (allowed: --bundle DIR, --python PY," \
         "--nvidia-smi CMD, -- AGENT_FLAGS)" >&2; exit 2 ;;
  esac
done
agent=$bundle/bin/spawnpoint-agent
[ -x "$agent" ] || { echo "gpu-check.sh: no agent at $agent (make agent-bundle)" >&2; exit 2; }
exec "$python" "$here/gpu_check.py" --agent "$agent" --nvidia-smi "$smi" -- "$@"
