#!/usr/bin/env bash
# Times `make demo` on a fresh machine: a new Debian 12 root (mmdebstrap --variant=minbase
# plus git and make, what it takes to type the command: no compiler, no CMake, nothing of the
# project's packages), this repository's HEAD cloned into it, and `make demo` run there as
# root through chroot with an empty ccache. So the figure includes apt installing everything
# the demo needs. Prints each line of make demo
# with the seconds since it started, then one line:
#   fresh-root demo: first rank line at S s, done at S s, exit C (make demo; apt done at S s;
#   CPU user+sys S s; N CPUs, load L L L)
# (the CPU time is what make demo's processes used: on a busy machine, the wall times grow).
# The figure in README.md was made so. Needs root, mmdebstrap and the network (the Debian
# mirror, PyPI for cloudpickle). The root (~1.5 GB once the demo ran) is deleted at the end
# unless --keep DIR is given, where it is then left.
# --deps-only runs scripts/install-deps.sh (the whole package list: what make test and CI
# install) instead of make demo, and its last line is
#   fresh-root deps: Debian's packages installed at S s (N packages in the root; ...)
# which is apt's share of a fresh machine's CI run (scripts/ci-cold-run.sh times the rest).
#   scripts/demo-fresh-root.sh [--keep DIR] [--mirror URL] [--deps-only]
# --mirror (or env SPAWNPOINT_DEBIAN_MIRROR): default http://deb.debian.org/debian.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
keep=""
deps_only=""
mirror=${SPAWNPOINT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) [ $# -ge 2 ] || { echo "demo-fresh-root: --keep needs a directory" >&2; exit 2; }
      keep=$2; shift 2 ;;
    --mirror) [ $# -ge 2 ] || { echo "demo-fresh-root: --mirror needs a URL" >&2; exit 2; }
      mirror=$2; shift 2 ;;
    --deps-only) deps_only=1; shift ;;
    *) echo "demo-fresh-root: unknown argument $1 (usage: demo-fresh-root.sh [--keep DIR] [--mirror URL] [--deps-only])" >&2
      exit 2 ;;
  esac
done
die() {
  echo "demo-fresh-root: $*" >&2
  exit 1
}
[ "$(id -u)" -eq 0 ] || die "needs root (mmdebstrap's root mode, chroot)"
command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (apt-get install mmdebstrap)"
[ -z "$keep" ] || [ ! -e "$keep" ] || die "--keep $keep exists already"

work=$(mktemp -d /var/tmp/spawnpoint-demo-root.XXXXXX)
root=$work/root
cleanup() {
  set +e
  if [ -n "$keep" ]; then
    mv "$root" "$keep" && echo "demo-fresh-root: the root is kept in $keep"
  fi
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

echo "demo-fresh-root: building a Debian 12 minbase root with git and make from $mirror"
mmdebstrap --quiet --variant=minbase --include=git,make bookworm "$root" \
  "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
  "deb ${mirror%/debian}/debian-security bookworm-security main" ||
  die "mmdebstrap failed (is $mirror reachable?)"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# As Debian's installer leaves it: the host name resolves (gloo warns otherwise).
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n' "$(cat "$root/etc/hostname" 2>/dev/null || hostname)" \
  >"$root/etc/hosts"
# This machine's local CAs (e.g. a TLS-inspecting proxy's), as a machine behind that proxy has
# them: ca-certificates, installed by make demo, adds them to the root's bundle.
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi
git clone --quiet --no-hardlinks "$repo" "$root/root/spawnpoint"
target="make demo"
[ -z "$deps_only" ] || target="bash scripts/install-deps.sh"
echo "demo-fresh-root: cloned $(git -C "$repo" rev-parse --short HEAD) into the root; running $target"

# In a private mount namespace, so that the mounts go with it: /proc, /sys and /dev (with
# /dev/shm) as a machine has them. A clean environment, as a root login's.
inner='mount -t proc proc "$1/proc" && mount --rbind /sys "$1/sys" && mount --rbind /dev "$1/dev" &&
  exec chroot "$1" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "cd /root/spawnpoint && CCACHE_DIR=\$(mktemp -d) $2; rc=\$?;
      times >/tmp/times; echo demo-fresh-root: cpu \$(tail -n 1 /tmp/times); exit \$rc"'
start=$EPOCHREALTIME
first="" apt_done="" code="" cpu=""
set +e
while IFS= read -r line; do
  now=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  printf '%7s %s\n' "$now" "$line"
  case "$line" in
    "[rank "*) [ -n "$first" ] || first=$now ;;
    "install-deps: done"*) apt_done=$now ;;
    "demo-fresh-root: make demo exited "*) code=${line##* } ;;
    "demo-fresh-root: cpu "*) cpu=$(awk '{ split($3, u, /m|s/); split($4, s, /m|s/)
        printf "%.0f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' <<<"$line") ;;
  esac
done < <(unshare --mount --propagation private bash -c "$inner" inner "$root" "$target" 2>&1
  echo "demo-fresh-root: make demo exited $?")
set -e
end=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
if [ -n "$deps_only" ]; then
  # install-deps.sh goes on to install-tools.sh, which needs Go (a prerequisite the root does
  # not have): apt's share ends at "install-deps: done".
  echo "fresh-root deps: Debian's packages installed at ${apt_done:-never} s" \
    "($(chroot "$root" dpkg-query -f '.\n' -W | wc -l) packages in the root; then" \
    "install-deps.sh exited ${code:-?}; CPU user+sys ${cpu:-?} s; $(nproc) CPUs, load" \
    "$(cut -d' ' -f1-3 /proc/loadavg))"
  [ -n "$apt_done" ]
  exit
fi
echo "fresh-root demo: first rank line at ${first:-never} s, done at $end s, exit ${code:-?}" \
  "(make demo; apt done at ${apt_done:-?} s; CPU user+sys ${cpu:-?} s; $(nproc) CPUs," \
  "load $(cut -d' ' -f1-3 /proc/loadavg))"
[ "${code:-1}" = 0 ]
