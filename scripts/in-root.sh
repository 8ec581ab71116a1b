#!/usr/bin/env bash
# Runs a command inside a root file system (a foreign trainer root made by
# scripts/foreign-root.sh, or any other) as a container would: chroot, in private mount,
# UTS and PID namespaces, so every mount and every process it starts ends with it, also
# when it fails or is killed. The root itself is seen read-only and is never changed.
#
#   scripts/in-root.sh [options] <root> -- <command> [args...]
#
#   --bundle DIR         the agent bundle (build/agent-bundle), read-only at /opt/spawnpoint
#   --ro-bind SRC:DST    SRC of this machine, read-only at DST in the root
#   --bind SRC:DST       the same, writable
#   --env NAME=VALUE     set in the command's environment (repeatable)
#   --workdir DIR        the command's working directory (default /tmp)
#   --shm-size SIZE      the size of /dev/shm (default 1g)
#
# What the command sees: the root read-only; fresh tmpfs at /tmp, /run, /mnt and /opt (so
# DST must be under one of them; its directories are made there); its own /proc (PID
# namespace: the command is one of the first processes), /sys read-only, and a /dev with
# null, zero, full, random, urandom, tty, the fd links and a fresh tmpfs /dev/shm; the host
# name spawnpoint-root (UTS namespace; the /etc/hosts foreign-root.sh writes maps it to
# 127.0.0.1, so nothing asks a DNS server for it); the machine's network (loopback). Its
# environment is only PATH, HOME=/tmp, LANG=C.UTF-8 and the --env values, as in a
# container, nothing of the caller's.
#
# Exit status: the command's; 125 when in-root.sh itself fails (the message says why);
# 126/127 when the command cannot be run or found in the root. Needs root.
set -euo pipefail

say() { echo "in-root: $*" >&2; }
die() {
  say "$*"
  exit 125
}

inside=0
if [ "${1-}" = --in-namespace ]; then  # the re-run of this script inside the namespaces
  inside=1
  shift
fi

binds=()  # triples: rw or ro, SRC, DST
envs=()
workdir=/tmp
shm_size=1g
root=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) [ $# -ge 2 ] || die "--bundle needs a directory"; binds+=("ro" "$2" "/opt/spawnpoint"); shift 2 ;;
    --ro-bind | --bind)
      [ $# -ge 2 ] && [[ "$2" == *:/* ]] || die "$1 needs SRC:DST with an absolute DST"
      mode=rw
      [ "$1" = --ro-bind ] && mode=ro
      binds+=("$mode" "${2%%:/*}" "/${2#*:/}")
      shift 2
      ;;
    --env) [ $# -ge 2 ] && [[ "$2" == [A-Za-z_]*=* ]] || die "--env needs NAME=VALUE"; envs+=("$2"); shift 2 ;;
    --workdir) [ $# -ge 2 ] || die "--workdir needs a directory"; workdir=$2; shift 2 ;;
    --shm-size) [ $# -ge 2 ] || die "--shm-size needs a size"; shm_size=$2; shift 2 ;;
    --) shift; break ;;
    -h | --help) sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) [ -z "$root" ] || die "one root only (got $root and $1); the command follows --"; root=$1; shift ;;
  esac
done
[ -n "$root" ] && [ $# -gt 0 ] || die "usage: in-root.sh [options] <root> -- <command> [args...]"

if [ "$inside" -eq 0 ]; then
  [ "$(id -u)" -eq 0 ] || die "needs root (chroot, mount and unshare)"
  [ -d "$root" ] || die "$root is not a directory (scripts/foreign-root.sh <suite> builds one)"
  root=$(realpath "$root")
  for f in bin/sh usr/bin/env; do
    [ -x "$root/$f" ] || die "$root has no /$f; is it a root file system?"
  done
  for ((i = 0; i < ${#binds[@]}; i += 3)); do
    src=${binds[i + 1]} dst=${binds[i + 2]}
    [ -e "$src" ] || die "$src does not exist"
    case "$dst" in
      /tmp/* | /run/* | /mnt/* | /opt/*) ;;
      *) die "$dst: mount points are made only under /tmp, /run, /mnt and /opt (the root stays untouched)" ;;
    esac
    case "/$dst/" in */../*) die "$dst: no .. in a mount point" ;; esac
  done
  self=$(realpath "${BASH_SOURCE[0]}")
  # Rebuild the argument list with absolute sources, for the re-run inside.
  args=()
  for ((i = 0; i < ${#binds[@]}; i += 3)); do
    flag=--bind
    [ "${binds[i]}" = ro ] && flag=--ro-bind
    args+=("$flag" "$(realpath "${binds[i + 1]}"):${binds[i + 2]}")
  done
  for e in ${envs[@]+"${envs[@]}"}; do args+=(--env "$e"); done
  args+=(--workdir "$workdir" --shm-size "$shm_size" "$root" -- "$@")
  # --kill-child: if unshare dies (SIGKILL from a test's timeout, or ours below), the first
  # process of the PID namespace gets SIGKILL, and with it every process in the namespace;
  # the mount namespace goes with its last process. Nothing of the run survives it.
  # --pdeathsig: unshare dies with this script, even if this script is killed with SIGKILL.
  setpriv --pdeathsig KILL -- unshare --mount --propagation private --uts --pid --fork --kill-child -- \
    bash "$self" --in-namespace "${args[@]}" <&0 &
  child=$!
  signalled=""
  trap 'signalled=130; kill -KILL "$child" 2>/dev/null' INT
  trap 'signalled=143; kill -KILL "$child" 2>/dev/null' TERM
  trap 'signalled=129; kill -KILL "$child" 2>/dev/null' HUP
  set +e
  wait "$child"
  rc=$?
  # A trapped signal interrupts wait: wait again for unshare's real exit.
  while kill -0 "$child" 2>/dev/null; do
    wait "$child"
    rc=$?
  done
  exit "${signalled:-$rc}"
fi

# Inside: PID 1 of a new PID namespace, in private mount and UTS namespaces.
r=$root
echo spawnpoint-root >/proc/sys/kernel/hostname || die "cannot set the host name"
mount --bind "$r" "$r" || die "cannot bind $r onto itself"
mount -o remount,bind,ro "$r" || die "cannot make $r read-only"
mount -t proc -o nosuid,nodev,noexec proc "$r/proc" || die "cannot mount /proc in $r"
if ! mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$r/sys" 2>/dev/null; then
  mount --rbind /sys "$r/sys" || die "cannot mount /sys in $r"
  mount -o remount,bind,ro "$r/sys" || true
fi
mount -t tmpfs -o mode=0755,nosuid,size=1m spawnpoint-dev "$r/dev" || die "cannot mount /dev in $r"
for node in null zero full random urandom tty; do
  [ -e "/dev/$node" ] || continue
  : >"$r/dev/$node"
  mount --bind "/dev/$node" "$r/dev/$node" || die "cannot bind /dev/$node"
done
ln -s /proc/self/fd "$r/dev/fd"
ln -s /proc/self/fd/0 "$r/dev/stdin"
ln -s /proc/self/fd/1 "$r/dev/stdout"
ln -s /proc/self/fd/2 "$r/dev/stderr"
mkdir "$r/dev/shm" "$r/dev/pts"
mount -t tmpfs -o mode=1777,nosuid,nodev,size="$shm_size" spawnpoint-shm "$r/dev/shm" ||
  die "cannot mount a $shm_size tmpfs at /dev/shm"
for d in tmp run mnt opt; do
  [ -d "$r/$d" ] || die "$r has no /$d to mount a tmpfs on"
  mode=0755
  [ "$d" = tmp ] && mode=1777
  mount -t tmpfs -o mode=$mode,nosuid,nodev spawnpoint-$d "$r/$d" || die "cannot mount a tmpfs at /$d"
done
for ((i = 0; i < ${#binds[@]}; i += 3)); do
  mode=${binds[i]} src=${binds[i + 1]} dst=$r${binds[i + 2]}
  if [ -d "$src" ]; then mkdir -p "$dst"; else mkdir -p "$(dirname "$dst")"; : >"$dst"; fi
  mount --bind "$src" "$dst" || die "cannot bind $src at ${binds[i + 2]}"
  if [ "$mode" = ro ]; then
    mount -o remount,bind,ro "$dst" || die "cannot make ${binds[i + 2]} read-only"
  fi
done

# PID 1 stays this shell: it reaps what the command orphans and forwards INT and TERM.
chroot "$r" /usr/bin/env -i \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp LANG=C.UTF-8 \
  ${envs[@]+"${envs[@]}"} \
  /bin/sh -c 'cd "$1" || exit 125; shift; exec "$@"' in-root "$workdir" "$@" <&0 &
cmd=$!
trap 'kill -TERM "$cmd" 2>/dev/null' TERM
trap 'kill -INT "$cmd" 2>/dev/null' INT
set +e
wait "$cmd"
rc=$?
while kill -0 "$cmd" 2>/dev/null; do
  wait "$cmd"
  rc=$?
done
exit "$rc"
