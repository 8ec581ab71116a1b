# Sourced by demo-cluster.sh and chart-local.sh, from the repository root, with `demo` set to
# the script's name (for its messages). It gives:
#   root, build (BUILD, relative to the root or absolute), after checking that the build has
#   the operator, the agent and the example trainer;
#   kubectl: the pinned one scripts/install-tools.sh builds (make deps), or env KUBECTL;
#   work: a directory of this run's, removed at exit after every pid in `pids` is stopped
#   (the last first) and the cluster is down;
#   say: a heading, bold on a terminal only (piped or logged, plain text);
#   start_cluster: scripts/cluster.sh's control plane in $work/cluster with 2 local nodes,
#   KUBECONFIG exported;
#   local_manifest FILE: FILE, or a copy of it whose example trainer is BUILD's;
#   wait_phase NS JOB: waits (3 minutes) until the job (in NS; "": the kubeconfig's namespace)
#   is Succeeded or Failed, in `phase`.
root=$PWD
build=${BUILD:-build}
case "$build" in /*) ;; *) build=$root/$build ;; esac

for bin in spawnpoint-operator spawnpoint-agent spawnpoint-example-trainer; do
  if [ ! -x "$build/bin/$bin" ]; then
    echo "$demo: $build/bin/$bin is missing; build first (make build)" >&2
    exit 1
  fi
done
kubectl_bin=${KUBECTL:-$root/.tools/bin/kubectl}
if [ ! -x "$kubectl_bin" ]; then
  echo "$demo: no kubectl at $kubectl_bin; run make deps (scripts/install-tools.sh)" >&2
  exit 1
fi
kubectl() { "$kubectl_bin" "$@"; }

work=$(mktemp -d "/tmp/spawnpoint-$demo.XXXXXX")
pids=()
cleanup() {
  local code=$?
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[$i]}" 2>/dev/null || true
    wait "${pids[$i]}" 2>/dev/null || true
  done
  bash scripts/cluster.sh down --dir "$work/cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -t 1 ]; then
  say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
else
  say() { printf '\n== %s\n' "$*"; }
fi

start_cluster() {
  bash scripts/cluster.sh up --dir "$work/cluster" --nodes 2 >"$work/cluster.out"
  tail -n 1 "$work/cluster.out"
  export KUBECONFIG=$work/cluster/admin.kubeconfig KUBECACHEDIR=$work/kubecache
}

local_manifest() {
  if [ "$build" = "$root/build" ]; then
    echo "$1"
  else
    sed "s#build/bin/spawnpoint-example-trainer#$build/bin/spawnpoint-example-trainer#" \
      "$1" >"$work/job.yaml"
    echo "$work/job.yaml"
  fi
}

wait_phase() {
  phase=
  for _ in $(seq 1800); do
    phase=$(kubectl get tj ${1:+-n "$1"} "$2" -o jsonpath='{.status.phase}' 2>/dev/null || true)
    [ "$phase" = Succeeded ] || [ "$phase" = Failed ] && break
    sleep 0.1
  done
}
