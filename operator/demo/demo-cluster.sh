#!/usr/bin/env bash
# `make demo-cluster`: the operator end to end on this machine, on a real control plane:
# scripts/cluster.sh starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler
# on loopback and tests/cluster/local_node.py's 2 nodes, which run each pod's trainer
# container as a local process; spawnpoint-operator turns
# examples/local-cluster.yaml (2 nodes x 1 CPU rank of the example DDP trainer), or the
# manifest JOB names (e.g. JOB=examples/python/ddp.yaml), into a Service and one pod per
# node that runs spawnpoint-agent; `kubectl get tj -w` shows the job move to Succeeded; the
# ranks' final parameters (their `final rank=R ... params=H` lines) are compared. Everything
# is cleaned up.
set -euo pipefail
cd "$(dirname "$0")/../.."
demo=demo-cluster
. operator/demo/demo_lib.sh

say "a real control plane on loopback, and 2 local nodes that run pods as local processes"
start_cluster

say "kubectl apply -f crds/trainingjob.yaml"
kubectl apply -f crds/trainingjob.yaml
# Until the server has set Established, TrainingJobs are "no matches for kind" (and
# `kubectl wait` fails at once on a CRD that has no conditions yet): poll it.
for _ in $(seq 300); do
  established=$(kubectl get crd trainingjobs.spawnpoint.dev \
    -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null || true)
  [ "$established" = True ] && break
  sleep 0.1
done
[ "$established" = True ] || { echo "demo-cluster: the CRD was not Established in 30 s" >&2; exit 1; }

say "spawnpoint-operator (agent used in place, rendezvous on 127.0.0.1: pod DNS does not resolve here)"
"$build/bin/spawnpoint-operator" --kubeconfig "$KUBECONFIG" \
  --agent-path "$build/bin/spawnpoint-agent" --master-addr 127.0.0.1 \
  --health-addr off --metrics-addr off --utilisation-interval 0 2>"$work/operator.log" &
pids+=($!)
echo "logs: structured, one line per event (shown at the end)"

manifest=${JOB:-examples/local-cluster.yaml}
[ -f "$manifest" ] || { echo "demo-cluster: no manifest $manifest (JOB)" >&2; exit 2; }
shown=$manifest
manifest=$(local_manifest "$manifest")
say "kubectl apply -f $shown"
ref=$(kubectl apply -f "$manifest" -o name)
echo "$ref created"
job=${ref##*/}
nodes=$(kubectl get tj "$job" -o jsonpath='{.spec.nodes}')

say "kubectl get tj -w"
kubectl get tj -w &
pids+=($!)
watch_pid=$!
wait_phase "" "$job"
sleep 0.3
kill "$watch_pid" 2>/dev/null || true

say "kubectl get tj,pods,svc"
kubectl get tj -o wide
kubectl get pods,svc

say "the ranks' last lines (the local node's logs of pods $job-node-N)"
params=()
for ((node = 0; node < nodes; node++)); do
  logs=$(cat "$work"/cluster/node/pods/default_"$job"-node-"$node"_*/trainer.log)
  echo "$logs" | grep -E "final rank|ranks succeeded|failed" || echo "$logs" | tail -5
  params+=("$(echo "$logs" | sed -n 's/.*final rank=.*params=\([0-9a-f]*\).*/\1/p' | head -1)")
done

say "result"
kubectl get tj "$job" -o jsonpath='phase={.status.phase} restarts={.status.restarts} started={.status.startTime} completed={.status.completionTime}{"\n"}'
distinct=$(printf '%s\n' "${params[@]}" | sort -u)
if [ "$phase" = Succeeded ] && [ -n "${params[0]}" ] && [ "$distinct" = "${params[0]}" ]; then
  echo "the ranks of all $nodes nodes ended with params=${params[0]}: DDP kept them in step"
  echo
  echo "operator log (last lines):"
  tail -6 "$work/operator.log"
  exit 0
fi
echo "demo-cluster: the job did not succeed (phase '$phase')" >&2
kubectl get tj "$job" -o yaml >&2 || true
tail -20 "$work/operator.log" >&2
exit 1
