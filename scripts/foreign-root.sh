#!/usr/bin/env bash
# Builds a foreign trainer root file system: another Debian release with its own Python,
# torch and glibc, in which the tests run the agent's bundle (tests/foreign/).
#
#   scripts/foreign-root.sh [--rebuild] <suite>
#      suite: bullseye | trixie | trixie-frameworks | bookworm-busybox
#
# Prints the root's path on stdout (its last line); progress goes to stderr. The root is
#   mmdebstrap --variant=minbase --include=python3-torch,python3-numpy <suite> DIR <mirror>
# except bookworm-busybox: nothing but Debian 12's static busybox (no libc, no package
# manager; mmdebstrap --variant=extract --include=busybox-static, then the applets' links,
# /etc/passwd and /etc/group with root and nonroot 65532): the trainer image with nothing
# in it of tests/images, and the agent image's base when no registry is reachable
# (scripts/images.sh). 2 MB, a few seconds.
# cached in <repo>/.cache/roots/<suite> (git-ignored; env SPAWNPOINT_ROOTS_DIR moves it)
# and reused while its stamp (<root>/.spawnpoint-root) names the same suite, variant and
# packages; --rebuild builds it anew. The mirror is the Debian mirror this machine's apt
# uses for its own release (/etc/apt/sources.list, /etc/apt/sources.list.d/*), or env
# SPAWNPOINT_DEBIAN_MIRROR. A build goes into a temporary directory beside the root (inside
# a private mount namespace, so no mount of mmdebstrap's outlives it) and is renamed into
# place only when complete: an interrupted build never leaves a root that looks done.
# Needs root (mmdebstrap's root mode; the roots are run with chroot) and mmdebstrap
# (scripts/install-deps.sh). A root takes 1.5 to 6 minutes (as busy as the machine is) and
# 0.9 GB (bullseye) or 1.2 GB (trixie).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
variant=minbase
packages=python3-torch,python3-numpy
suites=(bullseye trixie trixie-frameworks bookworm-busybox)
# trixie-frameworks: trixie's root plus pip, venv and Debian's torchvision, the base of the
# users' frameworks environment (scripts/frameworks-env.sh adds Lightning into a venv there).
frameworks_packages=python3-pip,python3-venv,python3-torchvision,libgl1,libglib2.0-0t64

say() { echo "foreign-root: $*" >&2; }
die() {
  say "$*"
  exit 1
}

rebuild=0
suite=""
for arg in "$@"; do
  case "$arg" in
    --rebuild) rebuild=1 ;;
    -h | --help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $arg (usage: foreign-root.sh [--rebuild] <suite>)" ;;
    *) [ -z "$suite" ] || die "one suite at a time"; suite=$arg ;;
  esac
done
[ -n "$suite" ] || die "usage: foreign-root.sh [--rebuild] <suite> (one of: ${suites[*]})"
case " ${suites[*]} " in
  *" $suite "*) ;;
  *) die "unknown suite '$suite' (one of: ${suites[*]}; add it to this script's list and to tests/foreign/foreign_common.py's expected versions)" ;;
esac
dist=$suite  # the Debian release mmdebstrap installs
case "$suite" in
  *-frameworks) dist=${suite%-frameworks}; packages=$packages,$frameworks_packages ;;
  bookworm-busybox) dist=bookworm; variant=extract; packages=busybox-static ;;
esac
added="/etc/hosts /etc/hostname"
[ "$suite" = bookworm-busybox ] &&
  added="/etc/hosts /etc/hostname /etc/passwd /etc/group, applet links; no /etc/apt /var /dev"

[ "$(id -u)" -eq 0 ] || die "needs root: mmdebstrap builds the root in its root mode and the tests run it with chroot"
command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (scripts/install-deps.sh installs it)"

cache=${SPAWNPOINT_ROOTS_DIR:-$repo/.cache/roots}
root=$cache/$suite
stamp_name=.spawnpoint-root
# What the root is; a root whose stamp starts otherwise is built anew. After mmdebstrap, this
# script adds only what a container runtime would give the trainer: /etc/hosts and
# /etc/hostname for the host name scripts/in-root.sh sets (spawnpoint-root), so that torch's
# gloo resolves it without asking a DNS server.
want_stamp="suite=$suite
variant=$variant
packages=$packages
added=$added"

# The stamp's first lines are want_stamp; the rest (mirror, time, size) is history.
root_is_current() {
  [ -f "$root/$stamp_name" ] &&
    [ "$(head -n "$(wc -l <<<"$want_stamp")" "$root/$stamp_name")" = "$want_stamp" ]
}

mkdir -p "$cache"
# One builder per suite: a second caller waits, then finds the root done.
exec 9>"$cache/.$suite.lock"
if ! flock -n 9; then
  say "another build of $suite holds $cache/.$suite.lock; waiting for it"
  flock 9
fi

if [ "$rebuild" -eq 0 ] && root_is_current; then
  say "$suite: cached in $root ($(sed -n 's/^built=//p' "$root/$stamp_name"))"
  echo "$root"
  exit 0
fi

# Leftovers of builds that were killed (SIGKILL skips the trap below): no builder holds them,
# since we hold the lock; their mounts died with their mount namespace.
for old in "$cache/.$suite.tmp."* "$cache/.$suite.old."*; do
  [ -e "$old" ] || continue
  say "removing the leftover $old of an interrupted build"
  rm -rf --one-file-system "$old"
done

# The Debian mirror of this machine's apt: the first enabled "deb" source for its own release.
host_mirror() {
  local codename
  codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
  [ -n "$codename" ] || return 0
  local files=()
  [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && files+=("$f")
  done
  [ ${#files[@]} -gt 0 ] || return 0
  awk -v codename="$codename" '
    function has_word(list, word,   n, i, a) {
      n = split(list, a, /[ \t]+/)
      for (i = 1; i <= n; i++) if (a[i] == word) return 1
      return 0
    }
    function flush() {  # the deb822 stanza read so far
      if (uris != "" && has_word(types, "deb") && has_word(suites, codename) && enabled != "no") {
        split(uris, u, /[ \t]+/); print u[1]; found = 1; exit
      }
      types = uris = suites = enabled = ""
    }
    FNR == 1 { flush(); deb822 = (FILENAME ~ /\.sources$/) }
    deb822 && /^[ \t]*$/ { flush(); next }
    deb822 && /^[ \t]*#/ { next }
    deb822 {
      line = $0; key = tolower(line); sub(/:.*/, "", key); sub(/^[^:]*:[ \t]*/, "", line)
      if (key == "types") types = line
      else if (key == "uris") uris = line
      else if (key == "suites") suites = line
      else if (key == "enabled") enabled = tolower(line)
      next
    }
    /^[ \t]*deb[ \t]/ {  # one-line style: deb [options] uri suite components...
      line = $0; sub(/^[ \t]*deb[ \t]+/, "", line)
      if (line ~ /^\[/) sub(/^\[[^]]*\][ \t]*/, "", line)
      n = split(line, f, /[ \t]+/)
      if (n >= 2 && f[2] == codename) { print f[1]; found = 1; exit }
    }
    END { if (!found) flush() }
  ' "${files[@]}"
}

mirror=${SPAWNPOINT_DEBIAN_MIRROR:-}
mirror_from="env SPAWNPOINT_DEBIAN_MIRROR"
if [ -z "$mirror" ]; then
  mirror=$(host_mirror || true)
  mirror_from="this machine's apt sources"
fi
if [ -z "$mirror" ]; then
  mirror=http://deb.debian.org/debian
  mirror_from="the default: no Debian source for this machine's release in /etc/apt"
fi

# apt checks the suite's Release file with the host's archive keys (debian-archive-keyring:
# Debian 12's 2023.3+deb12u2 and later carry trixie's keys).
if ! ls /etc/apt/trusted.gpg.d/debian-archive-"$dist"-*.asc /usr/share/keyrings/debian-archive-"$dist"-*.gpg \
  >/dev/null 2>&1; then
  say "warning: no archive key of $suite in /etc/apt/trusted.gpg.d or /usr/share/keyrings; if apt" \
    "rejects its Release file, upgrade debian-archive-keyring (scripts/install-deps.sh does)"
fi

tmp=$(mktemp -d "$cache/.$suite.tmp.XXXXXX")
chmod 0755 "$tmp"  # it becomes the root's /; apt's _apt user downloads into it
build=""
cleanup() {
  set +e  # whatever happens here, the temporary directory goes
  if [ -n "$build" ] && kill -0 "$build" 2>/dev/null; then  # interrupted: stop mmdebstrap first
    # Its whole process group, as a terminal's Ctrl-C would: mmdebstrap's main process only
    # waits for its setup process to end.
    kill -TERM -- "-$build" 2>/dev/null || kill -TERM "$build" 2>/dev/null
    wait "$build" 2>/dev/null
  fi
  rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT
trap 'say "interrupted; removing $tmp"; exit 130' INT
trap 'say "terminated; removing $tmp"; exit 143' TERM HUP

say "building the $suite root (mmdebstrap --variant=$variant --include=$packages) from $mirror" \
  "($mirror_from) in $tmp; this takes a minute or more"
started=$(date +%s)
# A private mount namespace: the /proc and /dev mounts mmdebstrap makes in the root cannot
# leak into this machine's, even if it is killed. In the background and in a session of its
# own (setsid: its pid is its process group), so that a signal to this script is handled at
# once, by cleanup, rather than after mmdebstrap finished.
setsid unshare --mount --propagation private -- \
  mmdebstrap --mode=root --variant="$variant" --include="$packages" "$dist" "$tmp" "$mirror" \
  </dev/null >&2 &
build=$!
rc=0
wait "$build" || rc=$?
build=""
if [ "$rc" -ne 0 ]; then
  die "mmdebstrap failed for $suite from $mirror (exit $rc, its output above); nothing was cached"
fi
seconds=$(($(date +%s) - started))
size=$(du -sh --one-file-system "$tmp" | cut -f1)
if [ "$suite" = bookworm-busybox ]; then
  # mmdebstrap's extract variant leaves apt's and dpkg's state and device nodes: a container
  # image has none of them. What is left is /bin/busybox and its documentation's copyright.
  rm -rf --one-file-system "${tmp:?}/etc" "$tmp/var" "$tmp/dev" "$tmp/usr/share/man" \
    "$tmp/usr/share/lintian"
  [ -x "$tmp/bin/busybox" ] || die "the $suite root has no /bin/busybox; mmdebstrap's result is incomplete"
  # Its applets as relative links (busybox --install would point them at /proc/self/exe).
  "$tmp/bin/busybox" --list-full | while read -r applet; do
    [ "$applet" = linuxrc ] && continue
    [ -e "$tmp/$applet" ] && continue
    mkdir -p "$tmp/$(dirname "$applet")"
    ln -s "$(realpath -m --relative-to="$tmp/$(dirname "$applet")" "$tmp/bin/busybox")" "$tmp/$applet"
  done
  for d in dev etc proc sys run mnt opt root home/nonroot; do mkdir -p "$tmp/$d"; done
  chmod 0700 "$tmp/root"
  install -d -m 1777 "$tmp/tmp"
  chown 65532:65532 "$tmp/home/nonroot"
  printf 'root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    >"$tmp/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$tmp/etc/group"
  for tool in bin/sh usr/bin/env bin/cp; do
    [ -x "$tmp/$tool" ] || die "the $suite root has no /$tool after linking busybox's applets"
  done
else
  for tool in python3 ldd; do
    [ -x "$tmp/usr/bin/$tool" ] || die "the $suite root has no /usr/bin/$tool; mmdebstrap's result is incomplete"
  done
fi
printf '127.0.0.1\tlocalhost spawnpoint-root\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
  >"$tmp/etc/hosts"
echo spawnpoint-root >"$tmp/etc/hostname"
{
  echo "$want_stamp"
  echo "mirror=$mirror"
  echo "mmdebstrap=$(mmdebstrap --version 2>/dev/null | head -n 1)"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) in ${seconds}s, $size"
} >"$tmp/$stamp_name"

if [ -e "$root" ]; then
  old="$cache/.$suite.old.$$"
  mv "$root" "$old"
  mv "$tmp" "$root"
  rm -rf --one-file-system "$old"
else
  mv "$tmp" "$root"
fi
trap - EXIT
say "$suite: built $root in ${seconds}s, $size"
echo "$root"
