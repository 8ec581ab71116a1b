#!/usr/bin/env bash
# The gang schedulers on the control plane of scripts/cluster.sh (issue 40): Kueue (plain-pod
# groups) and the Volcano scheduler, as scripts/install-gang-tools.sh builds them into
# .tools, run out of cluster with the cluster's admin kubeconfig. cluster.sh up --kueue /
# --volcano calls this; it can also add them to a running cluster:
#
#   scripts/gang.sh up kueue|volcano --dir DIR   start it on the cluster of DIR (cluster.sh's)
#   scripts/gang.sh down kueue|volcano --dir DIR stop it (cluster.sh down stops both)
#
# kueue: its CRDs (server-side apply; conversion webhooks for the CRDs its kustomization
#   names) and namespace kueue-system; a configuration (DIR/kueue/config.yaml) with the `pod`
#   integration, internal certificate management off, no leader election, the webhook server
#   on 127.0.0.1:PORT with a serving certificate (SAN IP:127.0.0.1) that cluster.sh's CA signs
#   in DIR/kueue/certs, and the visibility API server off (it needs an APIService); then, once
#   /readyz answers, its webhook configurations from the module, each webhook's clientConfig
#   made `url: https://127.0.0.1:PORT/<path>` with the CA as caBundle (the API server cannot
#   reach a Service here: no kube-proxy, and Endpoints may not be loopback addresses), and the
#   framework webhooks given the namespaceSelector of Kueue's kustomization (not kube-system,
#   not kueue-system). Pods are gated when they carry kueue.x-k8s.io/queue-name (Kueue's own
#   rule, manageJobsWithoutQueueName false), or, as Kueue does, when a LocalQueue named
#   `default` exists in their namespace.
#   With internal certificate management off, Kueue v0.19 reads its metrics server's
#   certificate from the fixed /etc/kueue/metrics/certs (cmd/kueue/main.go) even when metrics
#   are off; a self-signed one is made there if none is (the only path outside DIR touched).
# volcano: the CRDs the scheduler watches and the Queue `default`, opened (state Open, as
#   Volcano's controllers would; the scheduler alone does not), then vc-scheduler with the
#   scheduler configuration of Volcano's chart (DIR/volcano/volcano-scheduler.conf: actions
#   enqueue, allocate, backfill; plugins priority, gang, conformance, overcommit, drf,
#   predicates, proportion, nodeorder, binpack), a 1 s period, no leader election, healthz on
#   127.0.0.1. No webhooks and no controllers: PodGroups are made by their owner.
# Logs: DIR/kueue.log, DIR/vc-scheduler.log. Nothing listens beyond 127.0.0.1.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools=${SPAWNPOINT_TOOLS_BIN:-$repo/.tools/bin}
share=$(dirname "$tools")
usage="usage: gang.sh up|down kueue|volcano --dir DIR"
cmd=${1:-}
what=${2:-}
[ $# -ge 2 ] && shift 2 || { echo "gang: $usage" >&2; exit 2; }
dir=$repo/.cache/cluster
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=$2; shift 2 ;;
    *) echo "gang: unknown argument $1 ($usage)" >&2; exit 2 ;;
  esac
done
case "$what" in
  kueue) binary=kueue ;;
  volcano) binary=vc-scheduler ;;
  *) echo "gang: unknown component '$what' ($usage)" >&2; exit 2 ;;
esac

say() { echo "gang: $*" >&2; }
die() {
  say "$*"
  exit 1
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

. "$repo/scripts/pidfile.sh"  # stop_pidfile DIR NAME
stop() { stop_pidfile "$dir" "$binary"; }

case "$cmd" in
  down) stop; exit 0 ;;
  up) ;;
  *) die "$usage" ;;
esac

kubeconfig=$dir/admin.kubeconfig
[ -f "$kubeconfig" ] || die "no control plane in $dir (scripts/cluster.sh up --dir $dir)"
[ -x "$tools/$binary" ] || die "$tools/$binary is missing: run scripts/install-tools.sh --control-plane (make deps) to build the pinned gang schedulers"
kubectl() { "$tools/kubectl" --kubeconfig "$kubeconfig" "$@"; }
deadline=$((SECONDS + ${SPAWNPOINT_CLUSTER_TIMEOUT:-180}))

launch() {  # NAME COMMAND...: in its own session, output to DIR/NAME.log
  local name=$1
  shift
  setsid "$@" >"$dir/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/$name.pid"
}

# wait_for WHAT COMMAND...: until COMMAND succeeds; fails when the component exits or at the
# deadline, with the end of its log.
wait_for() {
  local what=$1
  shift
  until "$@" >/dev/null 2>&1; do
    if [ -f "$dir/$binary.pid" ] && ! kill -0 "$(cat "$dir/$binary.pid")" 2>/dev/null; then
      say "$binary exited; the end of $dir/$binary.log:"
      tail -n 30 "$dir/$binary.log" >&2
      stop
      exit 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      say "$what within the deadline; the end of $dir/$binary.log:"
      tail -n 30 "$dir/$binary.log" >&2
      stop
      exit 1
    fi
    sleep 0.2
  done
}

established() {  # CRD...
  local crd
  for crd in "$@"; do
    [ "$(kubectl get crd "$crd" -o 'jsonpath={.status.conditions[?(@.type=="Established")].status}' 2>/dev/null)" = True ] || return 1
  done
}

apply_crds() {  # FILE...: server-side (Kueue's Workload CRD is too big for the last-applied annotation)
  kubectl apply --server-side --force-conflicts --field-manager spawnpoint-gang -f - >/dev/null <<<"$(
    for file in "$@"; do cat "$file"; echo "---"; done)" || die "applying the CRDs of $what failed"
}

if [ -f "$dir/$binary.pid" ] && kill -0 "$(cat "$dir/$binary.pid")" 2>/dev/null; then
  say "$binary already runs in $dir"
  exit 0
fi

if [ "$what" = kueue ]; then
  out=$share/kueue
  for file in "$out/webhook-manifests.yaml" "$out/conversion-webhook-crds" "$out/crds/kueue.x-k8s.io_workloads.yaml"; do
    [ -s "$file" ] || die "$file is missing: run scripts/install-tools.sh --control-plane"
  done
  [ -f "$dir/pki/ca.key" ] || die "$dir/pki/ca.key is missing (a cluster of scripts/cluster.sh signs Kueue's certificate)"
  work=$dir/kueue
  mkdir -p "$work/certs"
  webhook_port=$(free_port) health_port=$(free_port)
  # The webhook server's certificate, signed by the cluster's CA, for 127.0.0.1.
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kueue-webhook" -keyout "$work/certs/tls.key" \
    -out "$work/certs/tls.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$work/certs/tls.ext"
  openssl x509 -req -in "$work/certs/tls.csr" -CA "$dir/pki/ca.crt" -CAkey "$dir/pki/ca.key" \
    -CAcreateserial -days 30 -extfile "$work/certs/tls.ext" -out "$work/certs/tls.crt" 2>/dev/null ||
    die "signing Kueue's webhook certificate failed"
  # The metrics certificate Kueue reads from a fixed path (see the header).
  metrics=/etc/kueue/metrics/certs
  if [ ! -s "$metrics/tls.crt" ] || [ ! -s "$metrics/tls.key" ]; then
    mkdir -p "$(dirname "$metrics")" 2>/dev/null ||
      die "Kueue reads its metrics certificate from $metrics, which cannot be made (run as root, or make $metrics/tls.crt and tls.key)"
    tmp=$(mktemp -d "$(dirname "$metrics")/.certs.XXXXXX")
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=kueue-metrics-test-only" \
      -addext "subjectAltName=IP:127.0.0.1" -keyout "$tmp/tls.key" -out "$tmp/tls.crt" 2>/dev/null
    chmod 0755 "$tmp"
    mv -T "$tmp" "$metrics" 2>/dev/null || rm -rf "$tmp"  # another cluster made it meanwhile
  fi
  crds=("$out"/crds/*.yaml)
  apply_crds "${crds[@]}"
  ca=$(base64 -w0 "$dir/pki/ca.crt")
  # Conversion webhooks, as Kueue's kustomization patches them in.
  while read -r plural; do
    kubectl patch crd "$plural.kueue.x-k8s.io" --type merge -p "{\"spec\": {\"conversion\": {\"strategy\": \"Webhook\",
      \"webhook\": {\"conversionReviewVersions\": [\"v1\"], \"clientConfig\": {
      \"url\": \"https://127.0.0.1:$webhook_port/convert\", \"caBundle\": \"$ca\"}}}}}" >/dev/null ||
      die "setting the conversion webhook of $plural.kueue.x-k8s.io failed"
  done <"$out/conversion-webhook-crds"
  kubectl create namespace kueue-system >/dev/null 2>&1 || kubectl get namespace kueue-system >/dev/null ||
    die "cannot create namespace kueue-system"
  cat >"$work/config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:$health_port
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: $webhook_port
  certDir: $work/certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
manageJobsWithoutQueueName: false
integrations:
  frameworks:
  - pod
EOF
  say "starting kueue $(cat "$out/VERSION" 2>/dev/null) (webhooks on https://127.0.0.1:$webhook_port)"
  launch kueue "$tools/kueue" --config "$work/config.yaml" --kubeconfig "$kubeconfig" \
    --feature-gates VisibilityOnDemand=false --zap-log-level info
  wait_for "Kueue's CRDs were not Established" established workloads.kueue.x-k8s.io \
    clusterqueues.kueue.x-k8s.io localqueues.kueue.x-k8s.io resourceflavors.kueue.x-k8s.io
  wait_for "kueue's /readyz did not answer" curl -sf --max-time 2 "http://127.0.0.1:$health_port/readyz"
  # The webhook configurations of the module, pointed at it (see the header).
  python3 - "$out/webhook-manifests.yaml" "https://127.0.0.1:$webhook_port" "$ca" \
    >"$work/webhooks.yaml" <<'PY' || die "rewriting Kueue's webhook configurations failed"
import sys, yaml
manifests, base, ca = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(manifests)) if d]
for doc in docs:
    doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]  # as config/default names them
    for hook in doc["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": base + path, "caBundle": ca}
        if "-kueue-x-k8s-io-" not in path:  # a framework's webhook (kustomization's replacements)
            hook["namespaceSelector"] = {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": ["kube-system", "kueue-system"]}]}
yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
PY
  kubectl apply --server-side --force-conflicts --field-manager spawnpoint-gang -f "$work/webhooks.yaml" \
    >/dev/null || die "applying Kueue's webhook configurations failed"
  echo "$webhook_port" >"$work/webhook.port"
  say "kueue ready ($dir/kueue.log)"
else
  out=$share/volcano
  for file in "$out/volcano-scheduler.conf" "$out/crds/scheduling.volcano.sh_podgroups.yaml"; do
    [ -s "$file" ] || die "$file is missing: run scripts/install-tools.sh --control-plane"
  done
  work=$dir/volcano
  mkdir -p "$work"
  cp "$out/volcano-scheduler.conf" "$work/volcano-scheduler.conf"
  apply_crds "$out"/crds/*.yaml
  wait_for "Volcano's CRDs were not Established" established podgroups.scheduling.volcano.sh \
    queues.scheduling.volcano.sh
  kubectl apply --server-side --field-manager spawnpoint-gang -f - >/dev/null <<'EOF' || die "creating the Queue default failed"
apiVersion: scheduling.volcano.sh/v1beta1
kind: Queue
metadata:
  name: default
spec:
  weight: 1
  reclaimable: true
EOF
  kubectl patch queue default --subresource status --type merge -p '{"status": {"state": "Open"}}' \
    >/dev/null || die "opening the Queue default failed"
  health_port=$(free_port)
  say "starting vc-scheduler $(cat "$out/VERSION" 2>/dev/null)"
  launch vc-scheduler "$tools/vc-scheduler" --kubeconfig "$kubeconfig" \
    --scheduler-conf "$work/volcano-scheduler.conf" --schedule-period 1s --leader-elect=false \
    --enable-healthz --healthz-address "127.0.0.1:$health_port" \
    --listen-address "127.0.0.1:$(free_port)" --cache-dumper=false -v 3
  wait_for "vc-scheduler's /healthz did not answer" curl -sf --max-time 2 "http://127.0.0.1:$health_port/healthz"
  say "vc-scheduler ready ($dir/vc-scheduler.log)"
fi
