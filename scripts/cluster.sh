#!/usr/bin/env bash
# A real Kubernetes control plane on loopback, for tests, scripts and `make cluster-up`:
# etcd, kube-apiserver (generated certificates, ServiceAccount signing keys,
# --authorization-mode=Node,RBAC, the default admission plugins, an audit log),
# kube-controller-manager (garbage collection, namespace deletion, ServiceAccount tokens)
# and kube-scheduler, at the pinned versions scripts/install-tools.sh builds into .tools/bin.
#
#   scripts/cluster.sh up [--dir DIR] [--port PORT] [--nodes N] [--pod-start-delay S]
#                         [--gpus G] [--simulate-pods] [--apply FILE]... [--kueue] [--volcano]
#                                          start; the last line is "kubeconfig: PATH"
#   scripts/cluster.sh down [--dir DIR]    stop what `up` started in DIR, remove DIR
#   scripts/cluster.sh status [--dir DIR]  exit 0 when it answers /readyz
#
# With --nodes N (default 1; 0: none) it also starts tests/cluster/local_node.py: N Ready
# nodes that run the pods bound to them as local processes, from the repository's root, their
# logs in DIR/node/pods/<namespace>_<pod>_<uid>/<container>.log (no `kubectl logs`: there is
# no kubelet endpoint), each with G `nvidia.com/gpu` (--gpus, default 0; nothing but the
# count: no device is given to the pods); --pod-start-delay S simulates image pull and
# sandbox creation;
# --simulate-pods runs nothing: bound pods are reported Running and left to the caller, who
# finishes them by patching pods/status (the operator's tests).
#
# --apply FILE (repeatable): `kubectl apply -f FILE` as soon as the API server answers, before
# the controllers start, so that a CRD in it is known to the garbage collector from its first
# discovery (a CRD made later is seen at its next sync, up to 30 s on).
#
# --kueue, --volcano: also Kueue (plain-pod groups) and the Volcano scheduler, with their CRDs,
# at that same point (scripts/gang.sh up kueue|volcano, which says how; their logs: kueue.log and
# vc-scheduler.log in DIR); `down` stops them.
#
# DIR (default <repo>/.cache/cluster) holds everything: certificates and keys, kubeconfigs
# (admin.kubeconfig: system:masters), the components' logs (*.log), etcd's data, the audit
# log and pids. PORT is the API server's secure port (default: a free one); etcd and the
# components take free ports too, all on 127.0.0.1. `up` waits until /readyz answers and the
# default ServiceAccount of namespace default exists (so pods can be created), and prints
# how long start-up took. A second `up` on a DIR whose control plane answers reuses it.
# Nothing listens beyond 127.0.0.1 and nothing but the processes in DIR is touched.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools=${SPAWNPOINT_TOOLS_BIN:-$repo/.tools/bin}
cmd=${1:-}
[ $# -gt 0 ] && shift
dir=$repo/.cache/cluster
port="" nodes=1 start_delay=0 simulate="" gpus=0 apply=() gang=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --pod-start-delay) start_delay=$2; shift 2 ;;
    --simulate-pods) simulate=--simulate; shift ;;
    --gpus) gpus=$2; shift 2 ;;
    --apply) apply+=("$2"); shift 2 ;;
    --kueue) gang+=(kueue); shift ;;
    --volcano) gang+=(volcano); shift ;;
    *) echo "cluster: unknown argument $1 (usage: cluster.sh up|down|status [--dir DIR] [--port PORT] [--nodes N] [--pod-start-delay S] [--gpus G] [--simulate-pods] [--apply FILE] [--kueue] [--volcano])" >&2; exit 2 ;;
  esac
done

say() { echo "cluster: $*" >&2; }
die() {
  say "$*"
  exit 1
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

readyz() {
  [ -f "$dir/apiserver.port" ] || return 1
  curl -sf --max-time 2 --cacert "$dir/pki/ca.crt" --cert "$dir/pki/admin.crt" \
    --key "$dir/pki/admin.key" "https://127.0.0.1:$(cat "$dir/apiserver.port")/readyz" >/dev/null 2>&1
}

. "$repo/scripts/pidfile.sh"  # stop_pidfile DIR NAME
stop_all() {
  local name
  for name in local-node kueue vc-scheduler kube-scheduler kube-controller-manager kube-apiserver etcd; do
    stop_pidfile "$dir" "$name"
  done
}

case "$cmd" in
  status) readyz && { echo "kubeconfig: $dir/admin.kubeconfig"; exit 0; }; exit 1 ;;
  down)
    stop_all
    rm -rf --one-file-system "$dir"
    exit 0 ;;
  up) ;;
  *) die "usage: cluster.sh up|down|status [--dir DIR] [--port PORT]" ;;
esac

for tool in etcd kube-apiserver kube-controller-manager kube-scheduler; do
  [ -x "$tools/$tool" ] || die "$tools/$tool is missing: run scripts/install-tools.sh (make deps) to build the pinned control plane"
done
command -v openssl >/dev/null || die "openssl is missing (scripts/install-deps.sh installs it)"

if readyz; then
  say "already up in $dir"
  echo "kubeconfig: $dir/admin.kubeconfig"
  exit 0
fi
stop_all
rm -rf --one-file-system "$dir"
mkdir -p "$dir/pki"
start=$(date +%s.%N)

# --- certificates: one CA, the serving certificate, a client certificate per user ---
pki=$dir/pki
openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=spawnpoint-test-ca" \
  -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
cert() {  # NAME SUBJECT [SAN]
  local name=$1 subject=$2 san=${3:-}
  openssl req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$pki/$name.key" \
    -out "$pki/$name.csr" 2>/dev/null
  if [ -n "$san" ]; then
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" >"$pki/$name.ext"
  else
    printf 'extendedKeyUsage=clientAuth\n' >"$pki/$name.ext"
  fi
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -days 30 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
}
cert apiserver "/CN=kube-apiserver" \
  "IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
cert admin "/O=system:masters/CN=spawnpoint-admin"
cert controller-manager "/CN=system:kube-controller-manager"
cert scheduler "/CN=system:kube-scheduler"
openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null

given_port=$port
kubeconfig() {  # USER -> DIR/USER.kubeconfig
  cat >"$dir/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: spawnpoint-test
  cluster: {server: "$server", certificate-authority: "$pki/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$pki/$1.crt", client-key: "$pki/$1.key"}
contexts:
- name: $1
  context: {cluster: spawnpoint-test, user: $1, namespace: default}
current-context: $1
EOF
}

cat >"$dir/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
EOF

launch() {  # NAME ARGS...: .tools/bin/NAME in its own session, output to DIR/NAME.log
  local name=$1
  shift
  launch_as "$name" "$tools/$name" "$@"
}
launch_as() {  # NAME COMMAND...
  local name=$1
  shift
  setsid "$@" >"$dir/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/$name.pid"
}

failed() {
  local name
  for name in etcd kube-apiserver kube-controller-manager kube-scheduler local-node kueue vc-scheduler; do
    [ -f "$dir/$name.pid" ] || continue
    if ! kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null; then
      say "$name exited; the end of $dir/$name.log:"
      tail -n 20 "$dir/$name.log" >&2
      stop_all
      exit 1
    fi
  done
}
# etcd and kube-apiserver on free ports. A port free when picked may be taken by another
# process before the server binds it (tests start clusters side by side): then both are
# stopped and started again on new ports, up to 3 times. Returns 1 for that case only.
start_api() {
  local name
  port=${given_port:-$(free_port)}
  echo "$port" >"$dir/apiserver.port"
  server=https://127.0.0.1:$port
  for user in admin controller-manager scheduler; do kubeconfig "$user"; done
  etcd_client=$(free_port) etcd_peer=$(free_port)
  rm -rf --one-file-system "$dir/etcd"
  launch etcd --name spawnpoint-test --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "spawnpoint-test=http://127.0.0.1:$etcd_peer" \
    --unsafe-no-fsync --log-level warn --quota-backend-bytes 4294967296
  launch kube-apiserver --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$port" \
    --etcd-servers "http://127.0.0.1:$etcd_client" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 --authorization-mode Node,RBAC \
    --audit-log-path "$dir/audit.log" --audit-policy-file "$dir/audit-policy.yaml" \
    --allow-privileged=false --profiling=false --v=1
  say "starting etcd and kube-apiserver (https://127.0.0.1:$port) in $dir"
  until readyz; do
    for name in etcd kube-apiserver; do
      if ! kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null &&
        grep -q "address already in use" "$dir/$name.log"; then
        say "$name lost its port to another process; starting both again on new ports"
        stop_pidfile "$dir" kube-apiserver
        stop_pidfile "$dir" etcd
        return 1
      fi
    done
    failed
    [ $SECONDS -lt $deadline ] || { say "no /readyz within the deadline"; tail -n 20 "$dir/kube-apiserver.log" >&2; stop_all; exit 1; }
    sleep 0.2
  done
}
deadline=$((SECONDS + ${SPAWNPOINT_CLUSTER_TIMEOUT:-180}))
tries=0
until start_api; do
  tries=$((tries + 1))
  [ -z "$given_port" ] && [ $tries -lt 3 ] || { say "etcd or kube-apiserver could not bind its port (${tries} tries)"; stop_all; exit 1; }
done
for file in "${apply[@]}"; do
  "$tools/kubectl" --kubeconfig "$dir/admin.kubeconfig" apply -f "$file" >/dev/null ||
    { say "kubectl apply -f $file failed"; stop_all; exit 1; }
done
for what in "${gang[@]}"; do
  SPAWNPOINT_TOOLS_BIN=$tools SPAWNPOINT_CLUSTER_TIMEOUT=$((deadline - SECONDS)) \
    bash "$repo/scripts/gang.sh" up "$what" --dir "$dir" || { stop_all; exit 1; }
done
# The controllers once the API server is ready: before, its RBAC bootstrap policy may not be
# there yet, and kube-controller-manager exits when it cannot read its configmap. They serve
# no HTTPS (--secure-port 0): nothing reads their health endpoints, and a port picked free
# could be taken before they bind it.
say "starting kube-controller-manager and kube-scheduler"
launch kube-controller-manager --kubeconfig "$dir/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$dir/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
  --secure-port 0 --leader-elect=false \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --use-service-account-credentials --profiling=false --v=1
launch kube-scheduler --kubeconfig "$dir/scheduler.kubeconfig" \
  --authentication-kubeconfig "$dir/scheduler.kubeconfig" \
  --authorization-kubeconfig "$dir/scheduler.kubeconfig" \
  --secure-port 0 --leader-elect=false --profiling=false --v=1

kubectl=$tools/kubectl
until "$kubectl" --kubeconfig "$dir/admin.kubeconfig" -n default get serviceaccount default >/dev/null 2>&1; do
  failed
  [ $SECONDS -lt $deadline ] || { say "the default ServiceAccount never appeared (is kube-controller-manager running? $dir/kube-controller-manager.log)"; stop_all; exit 1; }
  sleep 0.2
done
if [ "$nodes" -gt 0 ]; then
  say "starting the local node ($nodes nodes that run pods as local processes)"
  mkdir -p "$dir/node"
  launch_as local-node python3 "$repo/tests/cluster/local_node.py" --kubeconfig "$dir/admin.kubeconfig" \
    --nodes "$nodes" --work-dir "$dir/node" --cwd "$repo" --pod-start-delay "$start_delay" --gpus "$gpus" $simulate
  until grep -q "local-node: ready" "$dir/local-node.log" 2>/dev/null &&
    [ "$("$kubectl" --kubeconfig "$dir/admin.kubeconfig" get nodes --no-headers 2>/dev/null | grep -c ' Ready ')" -ge "$nodes" ]; do
    failed
    [ $SECONDS -lt $deadline ] || { say "the local node's $nodes nodes were not Ready in time ($dir/local-node.log)"; stop_all; exit 1; }
    sleep 0.2
  done
fi
say "up in $(python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$start" "$(date +%s.%N)") s ($("$tools/kube-apiserver" --version))"
echo "kubeconfig: $dir/admin.kubeconfig"
