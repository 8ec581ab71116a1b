#!/usr/bin/env bash
# `make chart-local`: the Helm chart tried on this machine. scripts/cluster.sh starts the real
# control plane on loopback with tests/cluster/local_node.py's 2 nodes (they run pods'
# commands as local processes, not images); the pinned helm 3 installs charts/spawnpoint as a
# platform team would, namespace-scoped to the namespace `ml` (its Role, its NetworkPolicy,
# the status-token key). The operator Deployment's pod cannot run here (an image's entry
# point): it stays Pending, waiting with reason ImageNotRunnable. In its place the built
# spawnpoint-operator runs beside the cluster exactly as that pod would: the Deployment's
# arguments, the installed ServiceAccount's token (so the chart's RBAC is what the API server
# enforces) and the installed status-token key; only what differs on this machine is
# replaced (its ports, the agent used in place, the rendezvous on 127.0.0.1). The status
# watchdog's Deployment (the same image, arguments starting with `status-watchdog`) is run so
# too: `spawnpoint-operator status-watchdog` with its Deployment's arguments and its own
# ServiceAccount's token. Then examples/local-cluster.yaml runs in `ml` to Succeeded, not
# marked StatusStale, with the watchdog still running.
#
# CHART_LOCAL_KEEP=1 keeps everything running afterwards (kubectl, helm upgrade, your own
# jobs) until Ctrl-C; otherwise everything is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
demo=chart-local
. operator/demo/demo_lib.sh
ns=spawnpoint-system release=spawnpoint team=ml
[ -x "$root/.tools/bin/helm3" ] || { echo "chart-local: no helm3 in .tools/bin; run make deps (scripts/install-tools.sh)" >&2; exit 1; }
helm() { "$root/.tools/bin/helm3" "$@"; }

say "a real control plane on loopback, and 2 local nodes that run pods' commands"
start_cluster
export HOME=$work/home HELM_CACHE_HOME=$work/helm/cache HELM_CONFIG_HOME=$work/helm/config \
  HELM_DATA_HOME=$work/helm/data
mkdir -p "$HOME"

say "helm install $release charts/spawnpoint -n $ns (namespace-scoped to $team)"
kubectl create namespace "$team" >/dev/null
helm install "$release" charts/spawnpoint -n "$ns" --create-namespace \
  --set rbac.scope=namespace --set "watchNamespaces={$team}" | sed -n '1,/^NOTES:/p'
kubectl get deployment,serviceaccount,role,rolebinding,networkpolicy,secret -n "$ns"
kubectl get role,rolebinding,networkpolicy -n "$team"

# wait_image_only COMPONENT: the pod of that component's Deployment waits, Pending, with the
# local node's reason; prints "NAME PHASE REASON".
wait_image_only() {
  local component=$1 reason=
  for _ in $(seq 300); do
    reason=$(kubectl get pods -n "$ns" -l app.kubernetes.io/component="$component" \
      -o jsonpath='{.items[0].status.containerStatuses[0].state.waiting.reason}' 2>/dev/null || true)
    [ "$reason" = ImageNotRunnable ] && break
    sleep 0.1
  done
  kubectl get pods -n "$ns" -l app.kubernetes.io/component="$component" -o jsonpath='{range .items[*]}{.metadata.name} {.status.phase} {.status.containerStatuses[0].state.waiting.reason}{"\n"}{end}'
  [ "$reason" = ImageNotRunnable ] || { echo "chart-local: the $component pod never said why it waits" >&2; exit 1; }
}

# sa_kubeconfig SERVICEACCOUNT FILE: its credentials, as a pod would mount them (a
# TokenRequest token), in a kubeconfig.
sa_kubeconfig() {
  local server ca token
  server=$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
  ca=$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')
  token=$(kubectl create token "$1" -n "$ns" --duration=24h)
  cat >"$2" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$server", certificate-authority: "$ca"}}]
users: [{name: $1, user: {token: "$token"}}]
contexts: [{name: $1, context: {cluster: local, user: $1, namespace: $ns}}]
current-context: $1
EOF
}

say "the Deployments' pods: Pending (the local node runs commands, not images)"
wait_image_only operator
wait_image_only status-watchdog

say "spawnpoint-operator as that pod: its arguments, its ServiceAccount's token, its key"
# The installed Deployment's arguments, and where its key Secret is mounted.
helm get manifest "$release" -n "$ns" >"$work/manifest.yaml"
python3 - "$work/manifest.yaml" "$work" >"$work/args" <<'EOF'
import sys
import yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
pod = [d for d in docs if d["kind"] == "Deployment" and
       d["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"][0]["spec"]["template"]["spec"]
container = pod["containers"][0]
local = ("--metrics-addr", "--health-addr", "--agent-status-port", "--utilisation-interval")
for a in container.get("args", []):
    if a.startswith(local):
        continue
    if a.startswith("--status-token-key-file="):
        path = a.split("=", 1)[1]
        mount = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")][0]
        secret = [v for v in pod["volumes"] if v["name"] == mount["name"]][0]["secret"]
        print("KEY %s %s" % (secret["secretName"], path.rsplit("/", 1)[1]))
        a = "--status-token-key-file=%s/status-token-key" % sys.argv[2]
    print(a)
EOF
read -r _ key_secret key_name < <(grep '^KEY ' "$work/args")
kubectl get secret -n "$ns" "$key_secret" -o jsonpath="{.data.$key_name}" | base64 -d >"$work/status-token-key"
mapfile -t args < <(grep -v '^KEY ' "$work/args")
sa_kubeconfig "$release" "$work/operator.kubeconfig"
printf '  %s\n' "${args[@]}"
"$build/bin/spawnpoint-operator" "${args[@]}" --kubeconfig "$work/operator.kubeconfig" \
  --agent-path "$build/bin/spawnpoint-agent" --master-addr 127.0.0.1 \
  --health-addr off --metrics-addr off --utilisation-interval 2s 2>"$work/operator.log" &
pids+=($!)
echo "as $(KUBECONFIG=$work/operator.kubeconfig kubectl auth whoami -o jsonpath='{.status.userInfo.username}')"

say "spawnpoint-operator status-watchdog as the watchdog's pod: its arguments, its ServiceAccount's token"
# The installed watchdog Deployment's arguments; its --identity=$(POD_NAME), which the kubelet
# expands from the pod's name, is the name of the Pending pod.
watchdog_pod=$(kubectl get pods -n "$ns" -l app.kubernetes.io/component=status-watchdog \
  -o jsonpath='{.items[0].metadata.name}')
python3 - "$work/manifest.yaml" "$watchdog_pod" >"$work/watchdog-args" <<'EOF'
import sys
import yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
pod = [d for d in docs if d["kind"] == "Deployment" and
       d["metadata"]["labels"]["app.kubernetes.io/component"] == "status-watchdog"][0]["spec"]["template"]["spec"]
for a in pod["containers"][0].get("args", []):
    print(a.replace("$(POD_NAME)", sys.argv[2]))
EOF
mapfile -t watchdog_args <"$work/watchdog-args"
sa_kubeconfig "$release-status-watchdog" "$work/watchdog.kubeconfig"
printf '  %s\n' "${watchdog_args[@]}"
"$build/bin/spawnpoint-operator" "${watchdog_args[@]}" --kubeconfig "$work/watchdog.kubeconfig" \
  2>"$work/watchdog.log" &
watchdog_pid=$!
pids+=($watchdog_pid)
echo "as $(KUBECONFIG=$work/watchdog.kubeconfig kubectl auth whoami -o jsonpath='{.status.userInfo.username}')"

say "kubectl apply -n $team -f examples/local-cluster.yaml"
job=$(kubectl apply -n "$team" -f "$(local_manifest examples/local-cluster.yaml)" -o name)
job=${job##*/}
wait_phase "$team" "$job"
kubectl get tj -n "$team" -o wide
if [ "$phase" != Succeeded ]; then
  echo "chart-local: the job did not succeed (phase '$phase')" >&2
  kubectl get tj -n "$team" "$job" -o yaml >&2 || true
  tail -20 "$work/operator.log" >&2
  exit 1
fi
echo "the chart's operator ran $team/$job to Succeeded under the chart's RBAC"
# The operator held its Lease all along: the watchdog, still running, marked nothing stale.
stale=$(kubectl get tj -n "$team" "$job" -o jsonpath='{.status.conditions[?(@.type=="StatusStale")].status}')
if ! kill -0 "$watchdog_pid" 2>/dev/null || [ "$stale" = True ]; then
  echo "chart-local: the status watchdog exited, or marked $team/$job stale (StatusStale '$stale')" >&2
  tail -20 "$work/watchdog.log" >&2
  exit 1
fi
echo "the chart's status watchdog ran beside it, and marked nothing stale"

if [ "${CHART_LOCAL_KEEP:-0}" = 1 ]; then
  say "running until Ctrl-C"
  echo "export KUBECONFIG=$KUBECONFIG"
  echo "kubectl get tj -n $team; helm --kube-context admin list -n $ns (HELM_*_HOME under $work/helm)"
  echo "the operator's log: $work/operator.log; the status watchdog's: $work/watchdog.log"
  wait "${pids[0]}"
fi
