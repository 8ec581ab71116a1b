#!/usr/bin/env bash
# Builds the tools Debian 12 lacks into <repo>/.tools/bin (git-ignored), pinned by version
# and checksum: each is a Go module under tools/ whose go.mod names the version and whose
# go.sum pins every module's checksum. Only the Go module proxy is used (GOPROXY/GOFLAGS
# as set by the user), with the user's module and build caches, so reruns are fast.
# Idempotent: a tool is rebuilt only when its stamp (version + hash of its module files and
# link flags) differs. Called by scripts/install-deps.sh (make deps/test/demo).
#   kubectl  tools/kubectl  -> .tools/bin/kubectl (the tests, the demo and the benches)
set -euo pipefail

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

# The Go toolchain: $GO, then go on PATH, then /usr/local/go; the first at least as new
# as the module's go directive (Debian 12's golang-go 1.19 is too old).
find_go() {
  local need=$1 candidate version
  for candidate in ${GO:-} "$(command -v go || true)" /usr/local/go/bin/go; do
    [ -n "$candidate" ] && [ -x "$candidate" ] || continue
    version=$(GOTOOLCHAIN=local "$candidate" env GOVERSION 2>/dev/null) || continue
    version=${version#go}
    if [ "$(printf '%s\n%s\n' "$need" "$version" | sort -V | head -n1)" = "$need" ]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

# Builds the main package of tools/<name> into .tools/bin/<name>; $3 is the version it
# reports, $4 extra -ldflags.
build_tool() {
  local name=$1 version=$2 ldflags=$3
  local src="$root/tools/$name" stamp go need hash start
  need=$(awk '$1 == "go" { print $2; exit }' "$src/go.mod")
  hash=$( (cat "$src/go.mod" "$src/go.sum" "$src"/*.go && echo "$ldflags") | sha256sum | cut -d' ' -f1)
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
    -ldflags "-s -w $ldflags" -o "$bin/$name.tmp" .) ||
    die "building $name failed (the Go module proxy must be reachable the first time)"
  mv -f "$bin/$name.tmp" "$bin/$name"
  echo "$stamp" >"$stamps/$name"
  echo "install-tools: built $bin/$name in $((SECONDS - start)) s"
}

# kubectl: the version is the one go.mod requires, k8s.io/kubectl v0.X.Y = kubectl v1.X.Y.
kubectl_module=$(awk '$1 == "k8s.io/kubectl" { print $2; exit }' "$root/tools/kubectl/go.mod")
[[ $kubectl_module =~ ^v0\.([0-9]+)\.([0-9]+)$ ]] ||
  die "tools/kubectl/go.mod: unexpected k8s.io/kubectl version '$kubectl_module'"
kubectl_minor=${BASH_REMATCH[1]}
kubectl_version="v1.${kubectl_minor}.${BASH_REMATCH[2]}"
kubectl_ldflags=""
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  kubectl_ldflags+=" -X $pkg.gitVersion=$kubectl_version -X $pkg.gitMajor=1"
  kubectl_ldflags+=" -X $pkg.gitMinor=$kubectl_minor -X $pkg.gitTreeState=clean"
done
build_tool kubectl "$kubectl_version" "$kubectl_ldflags"
