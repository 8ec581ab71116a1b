#!/usr/bin/env bash
# `make demo`: a real 2-rank DDP job on this machine through the agent. Shows the ranks'
# output as it happens, then checks that every rank ended with the same parameters.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "== spawnpoint demo: build/bin/spawnpoint-agent run -f examples/local-cpu.yaml"
set +e
build/bin/spawnpoint-agent run -f examples/local-cpu.yaml --master-port 0 2>&1 | tee "$log"
code=${PIPESTATUS[0]}
set -e
if [ "$code" -ne 0 ]; then
  echo "== demo FAILED: the agent exited $code" >&2
  exit "$code"
fi
finals=$(grep -o 'final rank=[0-9]* loss=[0-9.]* params=[0-9a-f]*' "$log" || true)
ranks=$(printf '%s\n' "$finals" | grep -c final || true)
hashes=$(printf '%s\n' "$finals" | sed 's/.*params=//' | sort -u | wc -l)
echo "== $ranks ranks finished:"
printf '%s\n' "$finals"
if [ "$ranks" -ne 2 ] || [ "$hashes" -ne 1 ]; then
  echo "== demo FAILED: expected 2 ranks with equal params=, got $ranks ranks and $hashes distinct hashes" >&2
  exit 1
fi
echo "== demo OK: every rank holds the same parameters (DDP kept them in sync)"
