#!/usr/bin/env bash
# Builds the gang schedulers the `gang` tests run on the control plane (issue 40) into
# <repo>/.tools (git-ignored), pinned by version and checksum, from the Go module proxy only:
#   kueue         Kueue's manager       tools/kueue   (sigs.k8s.io/kueue, ./cmd/kueue)
#   vc-scheduler  the Volcano scheduler tools/volcano (volcano.sh/volcano, ./cmd/scheduler)
# and copies from the same module zips what the fixture applies (scripts/gang.sh):
#   .tools/kueue/crds/*.yaml               Kueue's CRDs (config/components/crd/bases)
#   .tools/kueue/webhook-manifests.yaml    its webhook configurations (config/components/webhook)
#   .tools/kueue/conversion-webhook-crds   the CRDs its kustomization gives a conversion webhook
#   .tools/volcano/crds/*.yaml             scheduling.volcano.sh podgroups and queues, and the
#                                          other CRDs the scheduler watches (config/crd/volcano/bases)
#   .tools/volcano/volcano-scheduler.conf  the scheduler configuration of Volcano's chart
# tools/NAME/go.mod names the version and tools/NAME/go.sum the module zip's h1: hash, which
# `go mod download` checks; the zip is extracted to .tools/src/NAME-VERSION and the command is
# built there from the module's OWN go.mod and go.sum (Volcano's replace directives hold only
# there), with the user's module and build caches. Idempotent: nothing is done when the stamp
# (versions, the recipe below and a hash of tools/NAME) matches. Called by scripts/install-tools.sh
# --control-plane (make test, make cluster-up); on its own: scripts/install-gang-tools.sh.
# The first build, its times and sizes: tests/gang/README.md.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools=$root/.tools
bin=$tools/bin
stamps=$tools/stamps
mkdir -p "$bin" "$stamps"

# One install at a time; scripts/install-tools.sh holds the lock already when it calls this.
if [ -z "${SPAWNPOINT_TOOLS_LOCKED:-}" ] && command -v flock >/dev/null; then
  exec 9>"$tools/.lock"
  flock 9
fi

die() {
  echo "install-gang-tools: $*" >&2
  exit 1
}

# find_go NEED: the Go toolchain to build with (scripts/find-go.sh).
. "$root/scripts/find-go.sh"

# download PIN_DIR MODULE: the module at the version PIN_DIR/go.mod requires, checked against
# PIN_DIR/go.sum; prints three lines: its folder in the module cache, its version, its commit.
download() {
  local pin=$1 module=$2 json
  json=$(cd "$pin" && GOTOOLCHAIN=local GOFLAGS="-mod=readonly" "$go" mod download -json "$module" \
    2>"$tools/.download.err") ||
    die "downloading $module (pinned in ${pin#"$root"/}/go.sum) failed (the Go module proxy must be reachable the first time): $json $(cat "$tools/.download.err")"
  python3 -c '
import json, sys
info = json.loads(sys.argv[1])
if info.get("Error") or not info.get("Dir"):
    sys.exit("install-gang-tools: downloading %s: %s" % (sys.argv[2], info.get("Error")))
print(info["Dir"])
print(info["Version"])
print((info.get("Origin") or {}).get("Hash", "unknown"))
' "$json" "$module"
}

# How the commands are built here (ldflags, the staging folder): bump it when that changes,
# so that every machine rebuilds.
recipe=1

# stamp_of NAME: the line that says what is installed (the pinned modules, the recipe and a
# hash of the pin); a build happens only when the recorded one differs.
stamp_of() {
  local name=$1
  echo "$name $(awk '$2 !~ /go.mod$/ { printf "%s@%s ", $1, $2 }' "$root/tools/$name/go.sum")recipe-$recipe $(cat \
    "$root/tools/$name/go.mod" "$root/tools/$name/go.sum" | sha256sum | cut -d' ' -f1)"
}

present() {  # NAME BINARY MANIFEST...
  local name=$1 binary=$2 file
  shift 2
  [ -x "$bin/$binary" ] && [ "$(cat "$stamps/$binary" 2>/dev/null)" = "$(stamp_of "$name")" ] || return 1
  for file in "$@"; do [ -s "$file" ] || return 1; done
}

# extract DIR SCRATCH: a writable copy of the module cache's read-only DIR.
extract() {
  rm -rf --one-file-system "$2"
  mkdir -p "$(dirname "$2")"
  cp -r "$1" "$2"
  chmod -R u+w "$2"
}

# build SCRATCH PACKAGE BINARY LDFLAGS: go build in the module's own folder.
build() {
  local scratch=$1 package=$2 binary=$3 ldflags=$4 start=$SECONDS
  (cd "$scratch" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
    "$go" build -trimpath -ldflags "-s -w $ldflags" -o "$bin/$binary.tmp" "$package") ||
    die "building $binary failed (the Go module proxy must be reachable the first time)"
  mv -f "$bin/$binary.tmp" "$bin/$binary"
  echo "install-gang-tools: built $bin/$binary in $((SECONDS - start)) s ($(du -m "$bin/$binary" | cut -f1) MiB)"
}

need_go() {  # PIN_DIR
  local need
  need=$(awk '$1 == "go" { print $2; exit }' "$1/go.mod")
  go=$(find_go "$need") || die "building the gang schedulers needs Go >= $need (${1#"$root"/}/go.mod); \
found none (tried \$GO, go on PATH, /usr/local/go/bin/go). Install Go $need or newer, or set GO=/path/to/go"
}

# --- Kueue ---
kueue_out=$tools/kueue
if present kueue kueue "$kueue_out/webhook-manifests.yaml" "$kueue_out/crds/kueue.x-k8s.io_workloads.yaml" \
  "$kueue_out/conversion-webhook-crds"; then
  echo "install-gang-tools: kueue present ($(stamp_of kueue | cut -d' ' -f2))"
else
  pin=$root/tools/kueue
  need_go "$pin"
  start=$SECONDS
  rm -f "$stamps/kueue"
  info=$(download "$pin" sigs.k8s.io/kueue) || exit 1
  { read -r dir; read -r version; read -r commit; } <<<"$info"
  echo "install-gang-tools: building kueue $version with $("$go" env GOVERSION) (the first time: 5-25 min on 2 cores)"
  scratch=$tools/src/kueue-$version
  extract "$dir" "$scratch"
  [ -f "$scratch/config/components/webhook/manifests.yaml" ] ||
    die "sigs.k8s.io/kueue@$version has no config/components/webhook/manifests.yaml"
  build "$scratch" ./cmd/kueue kueue "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$version \
-X sigs.k8s.io/kueue/pkg/version.GitCommit=$commit"
  rm -rf --one-file-system "$kueue_out"
  mkdir -p "$kueue_out/crds"
  cp "$scratch"/config/components/crd/bases/*.yaml "$kueue_out/crds/"
  cp "$scratch/config/components/webhook/manifests.yaml" "$kueue_out/webhook-manifests.yaml"
  # The CRDs Kueue's kustomization gives a conversion webhook (patches/webhook_in_PLURAL.yaml).
  sed -n 's|^- path: patches/webhook_in_\([a-z]*\)\.yaml$|\1|p' \
    "$scratch/config/components/crd/kustomization.yaml" >"$kueue_out/conversion-webhook-crds"
  [ -s "$kueue_out/conversion-webhook-crds" ] ||
    die "sigs.k8s.io/kueue@$version: no conversion webhook patches in config/components/crd/kustomization.yaml"
  echo "$version" >"$kueue_out/VERSION"
  rm -rf --one-file-system "$scratch"
  stamp_of kueue >"$stamps/kueue"
  echo "install-gang-tools: kueue $version installed in $((SECONDS - start)) s"
fi

# --- the Volcano scheduler ---
volcano_out=$tools/volcano
if present volcano vc-scheduler "$volcano_out/crds/scheduling.volcano.sh_podgroups.yaml" \
  "$volcano_out/crds/shard.volcano.sh_nodeshards.yaml" "$volcano_out/volcano-scheduler.conf"; then
  echo "install-gang-tools: vc-scheduler present ($(stamp_of volcano | cut -d' ' -f2-3))"
else
  pin=$root/tools/volcano
  need_go "$pin"
  start=$SECONDS
  rm -f "$stamps/vc-scheduler"
  info=$(download "$pin" volcano.sh/volcano) || exit 1
  { read -r dir; read -r version; read -r commit; } <<<"$info"
  info=$(download "$pin" volcano.sh/apis) || exit 1
  apis=$(head -n1 <<<"$info")
  echo "install-gang-tools: building vc-scheduler $version with $("$go" env GOVERSION) (the first time: 5-25 min on 2 cores)"
  scratch=$tools/src/volcano-$version
  extract "$dir" "$scratch"
  grep -q '^[[:space:]]*volcano.sh/apis => ./staging/src/volcano.sh/apis$' "$scratch/go.mod" ||
    die "volcano.sh/volcano@$version: its go.mod no longer replaces volcano.sh/apis with ./staging/src/volcano.sh/apis (see tools/volcano/go.mod)"
  extract "$apis" "$scratch/staging/src/volcano.sh/apis"
  # The one declaration v1.15's staging adds that the scheduler uses (tools/volcano/go.mod).
  if ! grep -rq 'QueueAllocationGateKey' "$scratch/staging/src/volcano.sh/apis/pkg/apis/scheduling/v1beta1"; then
    cat >"$scratch/staging/src/volcano.sh/apis/pkg/apis/scheduling/v1beta1/zz_spawnpoint_v1_15.go" <<'EOF'
package v1beta1

// QueueAllocationGateKey as volcano.sh/volcano v1.15.1's staging/src/volcano.sh/apis
// declares it (added by scripts/install-gang-tools.sh; see tools/volcano/go.mod).
const QueueAllocationGateKey = GroupName + "/queue-allocation-gate"
EOF
  fi
  build "$scratch" ./cmd/scheduler vc-scheduler "-X volcano.sh/volcano/pkg/version.Version=$version \
-X volcano.sh/volcano/pkg/version.GitSHA=$commit"
  rm -rf --one-file-system "$volcano_out"
  mkdir -p "$volcano_out/crds"
  # The CRDs of what the scheduler's informers watch (pkg/scheduler/cache/cache.go): without
  # one its caches never sync. And the scheduler configuration Volcano's chart deploys.
  for crd in scheduling.volcano.sh_podgroups scheduling.volcano.sh_queues \
    topology.volcano.sh_hypernodes nodeinfo.volcano.sh_numatopologies shard.volcano.sh_nodeshards; do
    cp "$scratch/config/crd/volcano/bases/$crd.yaml" "$volcano_out/crds/" ||
      die "volcano.sh/volcano@$version has no config/crd/volcano/bases/$crd.yaml"
  done
  cp "$scratch/installer/helm/chart/volcano/config/volcano-scheduler.conf" "$volcano_out/" ||
    die "volcano.sh/volcano@$version has no installer/helm/chart/volcano/config/volcano-scheduler.conf"
  echo "$version" >"$volcano_out/VERSION"
  rm -rf --one-file-system "$scratch"
  stamp_of volcano >"$stamps/vc-scheduler"
  echo "install-gang-tools: vc-scheduler $version installed in $((SECONDS - start)) s"
fi
