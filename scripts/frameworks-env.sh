#!/usr/bin/env bash
# Makes (or reuses) the pinned environment of the users' training stacks: Debian 13's
# python3-torch 2.6 (CPU-only) and python3-torchvision in a trixie root, plus Lightning (and
# the other pins of scripts/frameworks-requirements.txt) from PyPI in a venv inside it.
#
#   scripts/frameworks-env.sh [--rebuild]
#   scripts/frameworks-env.sh --resolve    re-pin: resolve the requirements file's top-level
#                                          line in the root and rewrite its pinned lines
#
# The root is scripts/foreign-root.sh's trixie-frameworks (trixie + pip, venv, torchvision;
# cached in .cache/roots/ or SPAWNPOINT_ROOTS_DIR); the venv is /srv/spawnpoint-frameworks in
# it, made with --system-site-packages so Debian's torch and torchvision are the ones used,
# its packages installed with `pip install --no-deps --require-hashes` from the requirements
# file (exact versions and hashes: pip can never pull PyPI's torch and its GBs of nvidia
# wheels), then checked: `pip check`, and torch must still be Debian's. Reused while its stamp
# (<venv>/.spawnpoint-env) names the same requirements (sha256); --rebuild makes it anew.
# Progress goes to stderr; the last line on stdout is
#   python: /srv/spawnpoint-frameworks/bin/python (in ROOT; run it with scripts/in-root.sh ROOT -- ...)
# i.e. the interpreter's path inside the root. Needs root (chroot), mmdebstrap
# (scripts/install-deps.sh) and PyPI once; reuse needs neither network nor PyPI.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
requirements=$repo/scripts/frameworks-requirements.txt
venv=/srv/spawnpoint-frameworks
stamp_name=.spawnpoint-env

say() { echo "frameworks-env: $*" >&2; }
die() {
  say "$*"
  exit 1
}

rebuild=0 resolve=0
for arg in "$@"; do
  case "$arg" in
    --rebuild) rebuild=1 ;;
    --resolve) resolve=1 ;;
    -h | --help) sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $arg (usage: frameworks-env.sh [--rebuild | --resolve])" ;;
  esac
done
[ "$(id -u)" -eq 0 ] || die "needs root (the environment lives in a chroot root made by mmdebstrap)"
[ -f "$requirements" ] || die "no $requirements"

started=$(date +%s)
say "the trixie-frameworks root (scripts/foreign-root.sh trixie-frameworks)"
root=$(bash "$repo/scripts/foreign-root.sh" trixie-frameworks | tail -n 1) ||
  die "scripts/foreign-root.sh trixie-frameworks failed (its output above)"
[ -d "$root" ] || die "scripts/foreign-root.sh gave no root ('$root')"

req_sum=$(sha256sum "$requirements" | cut -d' ' -f1)
want_stamp="venv=$venv
system-site-packages=true
requirements=$req_sum"

lock=$(dirname "$root")/.frameworks-env.lock
exec 8>"$lock"
if ! flock -n 8; then
  say "another frameworks-env.sh holds $lock; waiting for it"
  flock 8
fi

env_is_current() {
  [ -f "$root$venv/$stamp_name" ] &&
    [ "$(head -n "$(wc -l <<<"$want_stamp")" "$root$venv/$stamp_name")" = "$want_stamp" ]
}

report() {
  say "python: $venv/bin/python in $root"
  echo "python: $venv/bin/python (in $root; run it with: scripts/in-root.sh $root -- $venv/bin/python ...)"
}

if [ "$rebuild" -eq 0 ] && [ "$resolve" -eq 0 ] && env_is_current; then
  say "cached: $root$venv ($(sed -n 's/^built=//p' "$root$venv/$stamp_name")); ready in $(($(date +%s) - started))s"
  report
  exit 0
fi

# Runs a command in the root, writable, with the network: a private mount namespace (its
# /proc, /dev and /tmp mounts end with it), the host's resolv.conf for PyPI's name, and the
# host's CA bundle (PIP_CERT, SSL_CERT_FILE or Debian's; a TLS-intercepting proxy's CA is in
# it) at /tmp/host-ca.crt for pip. Proxy variables set here are passed on.
host_ca=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
[ -f "$host_ca" ] || die "no CA bundle at $host_ca (set PIP_CERT to one) for pip's TLS to PyPI"
passed_env=()
for name in HTTPS_PROXY https_proxy HTTP_PROXY http_proxy NO_PROXY no_proxy PIP_INDEX_URL; do
  [ -n "${!name:-}" ] && passed_env+=("$name=${!name}")
done
in_root_rw() {
  unshare --mount --propagation private --fork -- bash -c '
    set -e
    root=$1 ca=$2 n=$3; shift 3
    passed=("${@:1:$n}"); shift "$n"
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs tmpfs "$root/tmp"
    cp "$ca" "$root/tmp/host-ca.crt"
    [ -e "$root/etc/resolv.conf" ] || touch "$root/etc/resolv.conf"
    mount --bind /etc/resolv.conf "$root/etc/resolv.conf"
    exec chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp LANG=C.UTF-8 \
      PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_CERT=/tmp/host-ca.crt \
      "${passed[@]}" "$@"
  ' in-root-rw "$root" "$host_ca" "${#passed_env[@]}" "${passed_env[@]}" "$@"
}

if [ "$resolve" -eq 1 ]; then
  # What pip's resolver installs for the top-level requirements over the root's Debian
  # packages (a scratch venv with --system-site-packages, so Debian's torch counts as there),
  # written back as exact pins with the wheels' sha256.
  top=$(sed -n 's/^# top-level: //p' "$requirements")
  [ -n "$top" ] || die "no '# top-level: ...' line in $requirements"
  say "resolving $top in $root (pip install --dry-run --report)"
  report=$(in_root_rw bash -c 'python3 -m venv --system-site-packages /tmp/resolve >&2 &&
    /tmp/resolve/bin/python -m pip install --dry-run --quiet --only-binary=:all: \
      --report /tmp/report.json "$@" >&2 && cat /tmp/report.json' resolve $top) ||
    die "pip could not resolve $top (above)"
  pins=$(python3 -c '
import json, sys
for item in sorted(json.load(sys.stdin)["install"], key=lambda i: i["metadata"]["name"].lower()):
    digest = item["download_info"]["archive_info"]["hashes"]["sha256"]
    print("%s==%s --hash=sha256:%s" % (item["metadata"]["name"], item["metadata"]["version"], digest))
' <<<"$report") || die "cannot read pip's report"
  { grep '^#' "$requirements"; echo "$pins"; } >"$requirements.new"
  mv "$requirements.new" "$requirements"
  say "wrote $(wc -l <<<"$pins") pins to $requirements"
  exit 0
fi

say "making $venv in $root (venv --system-site-packages; pip install --no-deps --require-hashes" \
  "-r scripts/frameworks-requirements.txt from PyPI); a minute or two"
rm -rf --one-file-system "$root$venv"
in_root_rw python3 -m venv --system-site-packages "$venv" ||
  die "python3 -m venv failed in the root"
cp "$requirements" "$root$venv/requirements.txt"
in_root_rw "$venv/bin/python" -m pip install --no-deps --require-hashes --only-binary=:all: \
  -r "$venv/requirements.txt" >&2 ||
  die "pip install failed (its output above); nothing was cached"
say "checking: pip check, that torch and torchvision are Debian's, and that the stacks import"
in_root_rw "$venv/bin/python" -m pip check >&2 || die "pip check failed (above)"
versions=$(in_root_rw "$venv/bin/python" -c '
import contextlib, io
import torch, torchvision, lightning, cv2, ipykernel, nbclient
with contextlib.redirect_stdout(io.StringIO()):  # its first import writes a settings file, loudly
    import ultralytics
for m in (torch, torchvision):
    assert m.__file__.startswith("/usr/lib/python3/dist-packages/"), (m.__name__, m.__file__)
print("torch=%s\ntorchvision=%s\nlightning=%s\nultralytics=%s\nopencv=%s" % (torch.__version__,
      torchvision.__version__, lightning.__version__, ultralytics.__version__, cv2.__version__))
') || die "the environment does not import torch, torchvision, lightning, ultralytics and cv2 as expected (above)"
seconds=$(($(date +%s) - started))
size=$(du -sh --one-file-system "$root$venv" | cut -f1)
{
  echo "$want_stamp"
  echo "$versions"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) in ${seconds}s, venv $size, root $(du -sh --one-file-system "$root" | cut -f1)"
} >"$root$venv/$stamp_name"
say "made in ${seconds}s: $(echo "$versions" | tr '\n' ' ')(venv $size)"
report
