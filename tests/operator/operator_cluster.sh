#!/usr/bin/env bash
# The control plane of the operator's integration tests (ctest fixture operator_cluster):
#
#   operator_cluster.sh up DIR [run]
#                                   scripts/cluster.sh up --dir DIR with 2 local nodes of 8
#                                   GPUs each that simulate pods (the tests play the kubelet;
#                                   with `run`, CPU-only nodes that run the pods as local
#                                   processes: the end-to-end tests), the TrainingJob CRD
#                                   applied, and kube-controller-manager's garbage collector
#                                   shown to know TrainingJobs
#   operator_cluster.sh down DIR    scripts/cluster.sh down --dir DIR
#
# Why the CRD is applied by cluster.sh, before kube-controller-manager starts, and the
# garbage-collector probe: the collector picks up a CRD made later only at its next discovery
# sync (up to 30 s on; 44 s measured here); until then a deleted job's pods stay, and the tests
# that wait for them to go would fail on whichever test ran first. The probe makes a
# TrainingJob that owns a ConfigMap, deletes the job and waits (at most 90 s) until the
# ConfigMap is gone.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
kubectl=${KUBECTL:-$repo/.tools/bin/kubectl}
cmd=${1:?usage: operator_cluster.sh up|down DIR}
dir=${2:?usage: operator_cluster.sh up|down DIR}

if [ "$cmd" = down ]; then
  exec bash "$repo/scripts/cluster.sh" down --dir "$dir"
fi
[ "$cmd" = up ] || { echo "operator_cluster: unknown command $cmd (up|down)" >&2; exit 2; }

nodes=(--nodes 2 --gpus 8 --simulate-pods)
[ "${3:-}" = run ] && nodes=(--nodes 2)
bash "$repo/scripts/cluster.sh" up --dir "$dir" "${nodes[@]}" --apply "$repo/crds/trainingjob.yaml"
k() { "$kubectl" --kubeconfig "$dir/admin.kubeconfig" "$@"; }
started=$SECONDS
k apply -f "$repo/crds/trainingjob.yaml" >/dev/null
# Polled, not `kubectl wait --for condition=Established`: that fails at once while the CRD
# has no conditions yet.
deadline=$((SECONDS + 60))
until [ "$(k get crd trainingjobs.spawnpoint.dev \
  -o jsonpath='{.status.conditions[?(@.type=="Established")].status}')" = True ]; do
  [ $SECONDS -lt $deadline ] || { echo "operator_cluster: the CRD was not Established" >&2; exit 1; }
  sleep 0.2
done
k delete trainingjob gc-probe configmap gc-probe --ignore-not-found --wait=false >/dev/null
k apply -f - >/dev/null <<'YAML'
apiVersion: spawnpoint.dev/v1alpha1
kind: TrainingJob
metadata: {name: gc-probe, namespace: default}
spec:
  nodes: 1
  template:
    spec:
      containers: [{name: trainer, image: none, command: ["true"]}]
YAML
uid=$(k get trainingjob gc-probe -o jsonpath='{.metadata.uid}')
k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: ConfigMap
metadata:
  name: gc-probe
  namespace: default
  ownerReferences:
    - {apiVersion: spawnpoint.dev/v1alpha1, kind: TrainingJob, name: gc-probe, uid: "$uid"}
YAML
k delete trainingjob gc-probe --wait=false >/dev/null
deadline=$((SECONDS + 90))
until ! k get configmap gc-probe >/dev/null 2>&1; do
  if [ $SECONDS -ge $deadline ]; then
    echo "operator_cluster: the garbage collector did not remove a deleted TrainingJob's" \
      "ConfigMap within 90 s ($dir/kube-controller-manager.log)" >&2
    exit 1
  fi
  sleep 0.5
done
echo "operator_cluster: the CRD applied and garbage-collected in $((SECONDS - started)) s"
echo "kubeconfig: $dir/admin.kubeconfig"
