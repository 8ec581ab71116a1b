#!/usr/bin/env bash
# Builds the two images the chart pulls, from the build tree (`make images` builds
# spawnpoint-operator and agent-bundle first), and writes them as OCI archives:
#
#   scripts/images.sh [--build-dir DIR] [--out DIR] [--engine auto|docker|buildah]
#                     [--base auto|registry|local]
#
#   ghcr.io/spawnpoint/agent:VERSION     images/agent.Dockerfile     -> OUT/agent.tar
#   ghcr.io/spawnpoint/operator:VERSION  images/operator.Dockerfile  -> OUT/operator.tar
#
# VERSION is what the agent reports (`spawnpoint-agent --version`) and must be the chart's
# appVersion, the tag `helm template` names by default. OUT defaults to DIR/images.
#
# Engine: `docker build` when a Docker engine answers (`docker info`), else buildah
# (scripts/install-deps.sh installs it): daemonless, `--isolation chroot`, vfs storage of
# its own in OUT/storage. --engine forces one.
# Base: the agent image's busybox comes from a registry when one is reachable; otherwise
# (or with --base local) it is made here from Debian 12's busybox-static with mmdebstrap
# (scripts/foreign-root.sh bookworm-busybox, cached with the foreign roots) and named
# localhost/spawnpoint/busybox:bookworm. The operator image is FROM scratch: its
# binary, the libraries `ldd` lists and the loader, staged in OUT/context/operator-root.
# Prints which engine and base it used, then each image's size and its layers' sizes.
# Needs root with buildah (vfs storage and chroot isolation as root) or docker.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { echo "images: $*" >&2; }
die() {
  say "$*"
  exit 1
}

build=$repo/build
out=""
engine=auto
base=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) [ $# -ge 2 ] || die "--build-dir needs a directory"; build=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a directory"; out=$2; shift 2 ;;
    --engine) [ $# -ge 2 ] || die "--engine needs auto, docker or buildah"; engine=$2; shift 2 ;;
    --base) [ $# -ge 2 ] || die "--base needs auto, registry or local"; base=$2; shift 2 ;;
    -h | --help) sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
case "$engine" in auto | docker | buildah) ;; *) die "--engine $engine: auto, docker or buildah" ;; esac
case "$base" in auto | registry | local) ;; *) die "--base $base: auto, registry or local" ;; esac
build=$(realpath "$build")
out=$(realpath -m "${out:-$build/images}")

registry=ghcr.io/spawnpoint
registry_busybox=docker.io/library/busybox:1.36.1-musl
local_busybox=localhost/spawnpoint/busybox:bookworm
operator_bin=$build/bin/spawnpoint-operator
bundle=$build/agent-bundle
[ -x "$operator_bin" ] || die "no $operator_bin: build it first (make images does: ninja spawnpoint-operator)"
[ -x "$bundle/bin/spawnpoint-agent" ] ||
  die "no agent bundle in $bundle: build it first (make images does: ninja agent-bundle)"

# The version: the one the binaries report, which must be the tag the chart names.
reported=$("$bundle/bin/spawnpoint-agent" --version) || die "$bundle/bin/spawnpoint-agent --version failed"
version=${reported##* }
operator_reported=$("$operator_bin" --version) || die "$operator_bin --version failed"
[ "${operator_reported##* }" = "$version" ] ||
  die "the operator reports '$operator_reported' but the agent '$reported': one version for both"
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$repo/charts/spawnpoint/Chart.yaml")
[ "$version" = "$app_version" ] ||
  die "the agent reports version '$version' ($reported) but charts/spawnpoint/Chart.yaml's" \
    "appVersion is '$app_version': the chart would name images that make images does not tag"
source_url=$(sed -n 's/^home: *//p' "$repo/charts/spawnpoint/Chart.yaml")
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
agent_ref=$registry/agent:$version
operator_ref=$registry/operator:$version

if [ "$engine" = auto ]; then
  if command -v docker >/dev/null && timeout 20 docker info >/dev/null 2>&1; then
    engine=docker
  else
    engine=buildah
  fi
fi
say "engine: $engine"
if [ "$engine" = docker ]; then
  timeout 20 docker info >/dev/null 2>&1 || die "--engine docker: no Docker engine answers (docker info)"
fi
if [ "$engine" = buildah ]; then
  command -v buildah >/dev/null ||
    die "no Docker engine answers and buildah is not installed (scripts/install-deps.sh installs it)"
  [ "$(id -u)" -eq 0 ] || die "buildah here runs as root (vfs storage, chroot isolation); run as root or with a Docker engine"
  mkdir -p "$out/storage" "$out/run"
  bah() { buildah --root "$out/storage" --runroot "$out/run" --storage-driver vfs "$@"; }
fi

# --- the build context: the bundle, and the operator's root file system ----------------
context=$out/context
rm -rf "$context"
mkdir -p "$context"
cp -a "$bundle" "$context/agent-bundle"

stage_operator() {
  local root=$context/operator-root lib path real
  mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/usr/lib/ssl"
  install -d -m 1777 "$root/tmp"
  objcopy --strip-debug "$operator_bin" "$root/usr/local/bin/spawnpoint-operator"
  chmod 0755 "$root/usr/local/bin/spawnpoint-operator"
  local ldd_out
  ldd_out=$(ldd "$operator_bin") || die "ldd $operator_bin failed"
  if grep -q 'not found' <<<"$ldd_out"; then
    die "ldd $operator_bin: a library is missing on this machine: $(grep 'not found' <<<"$ldd_out")"
  fi
  # "libX.so => /path (0x...)" and the loader's "/lib64/ld-linux-x86-64.so.2 (0x...)"; copied
  # to the path ldd names (the loader finds them there: /lib/x86_64-linux-gnu is one of its
  # default directories), as the files they resolve to.
  while read -r path; do
    real=$(realpath "$path")
    mkdir -p "$root$(dirname "$path")"
    cp "$real" "$root$path"
    chmod 0755 "$root$path"
  done < <(sed -n -e 's/^.*=> \(\/[^ ]*\) (0x.*$/\1/p' -e 's/^[[:space:]]*\(\/[^ ]*\) (0x.*$/\1/p' <<<"$ldd_out")
  [ -e "$root/lib64/ld-linux-x86-64.so.2" ] || die "ldd $operator_bin named no /lib64/ld-linux-x86-64.so.2"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
  [ -s /etc/ssl/certs/ca-certificates.crt ] ||
    die "no /etc/ssl/certs/ca-certificates.crt on this machine (ca-certificates: scripts/install-deps.sh)"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
  chmod 0644 "$root/etc/ssl/certs/ca-certificates.crt"
  ln -s /etc/ssl/certs/ca-certificates.crt "$root/usr/lib/ssl/cert.pem"
  ln -s /etc/ssl/certs "$root/usr/lib/ssl/certs"
}
stage_operator

# --- the agent image's base -------------------------------------------------------------
registry_reachable() {  # Docker Hub's registry answers 401 (log in) when reachable
  local code
  code=$(curl -sS -o /dev/null -m 10 -w '%{http_code}' https://registry-1.docker.io/v2/ 2>/dev/null) || true
  [ "$code" = 401 ] || [ "$code" = 200 ]
}
base_image=""
if [ "$base" != local ]; then
  if registry_reachable; then
    say "base: $registry_busybox from its registry"
    if [ "$engine" = buildah ]; then
      if bah pull -q "$registry_busybox" >/dev/null; then
        base_image=$registry_busybox
      fi
    elif docker pull -q "$registry_busybox" >/dev/null; then
      base_image=$registry_busybox
    fi
    [ -n "$base_image" ] || say "base: pulling $registry_busybox failed; making it locally"
  else
    say "base: no registry reachable (https://registry-1.docker.io/v2/)"
  fi
  [ -n "$base_image" ] || [ "$base" = auto ] || die "--base registry: $registry_busybox could not be pulled"
fi
if [ -z "$base_image" ]; then
  busybox_root=$(bash "$repo/scripts/foreign-root.sh" bookworm-busybox | tail -n 1) ||
    die "scripts/foreign-root.sh bookworm-busybox failed (its output is above)"
  say "base: $local_busybox, made locally from $busybox_root (Debian 12's busybox-static, mmdebstrap)"
  base_tar=$out/busybox-base.tar
  # What a base image holds: not the stamp, nor the host name files of the test roots
  # (container runtimes give every container its own /etc/hosts and /etc/hostname).
  tar -C "$busybox_root" --numeric-owner --exclude=./.spawnpoint-root --exclude=./etc/hosts \
    --exclude=./etc/hostname -cf "$base_tar" .
  if [ "$engine" = buildah ]; then
    bah rmi -f "$local_busybox" >/dev/null 2>&1 || true
    # A scratch container with the tree added (buildah 1.28 has no import), committed.
    ctr=$(bah from scratch)
    bah add "$ctr" "$base_tar" / >/dev/null
    bah config --created-by "mmdebstrap --variant=extract --include=busybox-static bookworm" \
      --label org.opencontainers.image.description="Debian 12's busybox-static, nothing else" \
      "$ctr"
    bah commit -q --rm "$ctr" "$local_busybox" >/dev/null
  else
    docker import "$base_tar" "$local_busybox" >/dev/null
  fi
  rm -f "$base_tar"
  base_image=$local_busybox
fi

# --- the two images -----------------------------------------------------------------------
build_args=(--build-arg "VERSION=$version" --build-arg "REVISION=$revision"
  --build-arg "SOURCE=$source_url" --build-arg "LICENSES=Apache-2.0")
epoch=$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)
build_one() {  # NAME REF [extra build arguments]
  local name=$1 ref=$2 started=$SECONDS
  shift 2
  say "building $ref from images/$name.Dockerfile ($engine)"
  if [ "$engine" = buildah ]; then
    # --timestamp: the commit's time for the image and every file in its layers, so that
    # the same tree builds the same layers.
    bah bud -q --isolation chroot --layers --timestamp "$epoch" --pull=never \
      -f "$repo/images/$name.Dockerfile" "${build_args[@]}" "$@" -t "$ref" "$context" >/dev/null
    rm -f "$out/$name.tar"
    bah push -q "$ref" "oci-archive:$out/$name.tar:$ref"
  else
    docker build -q -f "$repo/images/$name.Dockerfile" "${build_args[@]}" "$@" -t "$ref" \
      "$context" >/dev/null
    docker save -o "$out/$name.tar" "$ref"
  fi
  say "built $ref in $((SECONDS - started)) s: $out/$name.tar"
}
build_one agent "$agent_ref" --build-arg "BASE_IMAGE=$base_image"
build_one operator "$operator_ref"
if [ "$engine" = buildah ]; then  # the intermediate images of --layers, no longer needed
  bah rmi --prune >/dev/null 2>&1 || true
fi
printf '%s %s\n' "$agent_ref" "$out/agent.tar" "$operator_ref" "$out/operator.tar" >"$out/images.txt"

python3 "$repo/scripts/oci_image.py" sizes "$out/agent.tar" "$out/operator.tar"
