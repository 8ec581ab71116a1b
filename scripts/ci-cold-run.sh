#!/usr/bin/env bash
# Times `.ci/run` as on a fresh machine that has Debian 12's packages installed: a fresh clone
# of HEAD, run with every cache a machine keeps between runs pointed at new, empty directories
# — ccache (CCACHE_DIR), the foreign and frameworks roots (SPAWNPOINT_ROOTS_DIR), Go's module
# and build caches (GOMODCACHE, GOCACHE, GOPATH) — so it builds kubectl, the control plane,
# Kueue, the Volcano scheduler, the roots and every object once, as a new machine does. What
# it cannot make fresh is apt's part: scripts/demo-fresh-root.sh --deps-only times that in a
# new Debian root. Prints each line with the minutes and seconds since the start, then one
# line:
#   ci-cold-run: .ci/run exit C in S s (M min); CPU user+sys S s; N CPUs, load L L L
# The clone and its caches (~15 GB at the end) are deleted unless --keep DIR is given.
#   scripts/ci-cold-run.sh [--keep DIR]
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) [ $# -ge 2 ] || { echo "ci-cold-run: --keep needs a directory" >&2; exit 2; }
      keep=$2; shift 2 ;;
    *) echo "ci-cold-run: unknown argument $1 (usage: ci-cold-run.sh [--keep DIR])" >&2
      exit 2 ;;
  esac
done
[ -z "$keep" ] || [ ! -e "$keep" ] || { echo "ci-cold-run: --keep $keep exists already" >&2; exit 2; }

work=$(mktemp -d /var/tmp/spawnpoint-ci-cold.XXXXXX)
# mktemp's 0700 would keep the tests that drop privileges (bundle_run_test copies the bundle
# as the agent image's uid 65532) out of the clone, as no CI checkout does.
chmod 755 "$work"
cleanup() {
  set +e
  if [ -n "$keep" ]; then
    mv "$work" "$keep" && echo "ci-cold-run: the clone and its caches are kept in $keep"
  else
    # The Go module cache is read-only by design.
    chmod -R u+w "$work" 2>/dev/null
    rm -rf --one-file-system "$work"
  fi
}
trap cleanup EXIT

git clone --quiet --no-hardlinks "$repo" "$work/spawnpoint"
mkdir -p "$work/cache/ccache" "$work/cache/roots" "$work/cache/go" "$work/cache/go-build"
echo "ci-cold-run: cloned $(git -C "$repo" rev-parse --short HEAD) into $work/spawnpoint;" \
  "every cache under $work/cache is empty; running .ci/run"

start=$EPOCHREALTIME
set +e
(
  cd "$work/spawnpoint" || exit 1
  export CCACHE_DIR=$work/cache/ccache SPAWNPOINT_ROOTS_DIR=$work/cache/roots \
    GOPATH=$work/cache/go GOMODCACHE=$work/cache/go/pkg/mod GOCACHE=$work/cache/go-build
  bash .ci/run
  echo "$?" >"$work/exit-code"
  times >"$work/times"
) 2>&1 | while IFS= read -r line; do
  s=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", b - a }')
  printf '%3d:%02d %s\n' $((s / 60)) $((s % 60)) "$line"
done
set -e
elapsed=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", b - a }')
code=$(cat "$work/exit-code" 2>/dev/null || echo "?")
# times: the shell's own line, then its children's (user and sys, as NmS.SSSs).
cpu="?"
if [ -s "$work/times" ]; then
  cpu=$(tail -n 1 "$work/times" | awk '{
    total = 0
    for (i = 1; i <= 2; i++) { split($i, p, "m"); sub("s", "", p[2]); total += p[1] * 60 + p[2] }
    printf "%d", total }')
fi
echo "ci-cold-run: .ci/run exit $code in $elapsed s ($((elapsed / 60)) min); CPU user+sys $cpu s;" \
  "$(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$code" = 0 ]
