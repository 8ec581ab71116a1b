#!/usr/bin/env bash
# Builds the self-contained agent bundle: the agent, every shared library it needs, the
# dynamic loader and a static launcher, so it runs inside images of other distributions.
#
#   make-bundle.sh <agent binary> <shim file> <out dir> <launcher binary> [<python deps dir>]
#
# Layout under <out dir> (the agent image installs it as /opt/spawnpoint; the operator's
# init container copies it to /spawnpoint in the trainer pod; it works from any path):
#   bin/spawnpoint-agent                    static launcher (agent/bundle/launcher.c)
#   libexec/spawnpoint-agent                the agent itself, debug info stripped
#   lib/ld-linux-x86-64.so.2                the dynamic loader the launcher executes
#   lib/<soname>                            what `ldd <agent>` lists, plus glibc's small
#                                           companion libraries (see below)
#   share/spawnpoint/python/sitecustomize.py  the Python start-up shim (its bootstrap)
#   share/spawnpoint/python/spawnpoint_rank/  the rank side it loads: every *.py of the
#                                           spawnpoint_rank package beside <shim file>,
#                                           and __pycache__/ of both for the build's python3
#   share/spawnpoint/python/spawnpoint/     the trainers' package beside it (spawnpoint.step(),
#                                           spawnpoint.launch() from a notebook)
#   share/spawnpoint/python-deps/           what <python deps dir> holds (cloudpickle: the
#                                           shim appends it to sys.path where it is missing)
#   share/spawnpoint/bundle-manifest.txt    where each file came from
set -euo pipefail

die() {
  echo "make-bundle: $*" >&2
  exit 1
}

[ $# -eq 4 ] || [ $# -eq 5 ] ||
  die "usage: make-bundle.sh <agent binary> <shim file> <out dir> <launcher binary> [<python deps dir>]"
deps=${5:-}
agent=$1
shim=$2
out=$3
launcher=$4
for f in "$agent" "$shim" "$launcher"; do [ -f "$f" ] || die "$f does not exist"; done
package=$(dirname "$shim")/spawnpoint_rank
[ -f "$package/__init__.py" ] || die "$package/__init__.py does not exist (the shim's package)"
public=$(dirname "$shim")/spawnpoint
[ -f "$public/__init__.py" ] || die "$public/__init__.py does not exist (the trainers' package)"

# ldd prints "name => /path (addr)", "/path/ld-linux... (addr)" or "name => not found".
listing=$(ldd "$agent") || die "ldd $agent failed"
if grep -q "not found" <<<"$listing"; then
  echo "$listing" >&2
  die "ldd reports missing libraries for $agent (above); refusing to build an incomplete bundle"
fi

tmp="$out.tmp.$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/libexec" "$tmp/lib" "$tmp/share/spawnpoint/python/spawnpoint_rank" \
  "$tmp/share/spawnpoint/python/spawnpoint"
manifest="$tmp/share/spawnpoint/bundle-manifest.txt"
{
  echo "# spawnpoint agent bundle: file <- source"
  echo "# $(ldd --version | head -n 1)"
} >"$manifest"

copy() {  # copy <source> <destination relative to the bundle> <mode>
  install -m "$3" "$(readlink -f "$1")" "$tmp/$2"
  echo "$2 <- $1" >>"$manifest"
}

loader=""
libc_dir=""
while read -r line; do
  case "$line" in
    *"=>"*)
      name=${line%% =>*}
      path=$(awk '{print $3}' <<<"$line")
      [ -f "$path" ] || die "ldd names $path for $name, which does not exist"
      copy "$path" "lib/$name" 0644
      if [ "$name" = "libc.so.6" ]; then libc_dir=$(dirname "$path"); fi
      ;;
    /*)
      loader=$(awk '{print $1}' <<<"$line")
      ;;
    *) ;;  # linux-vdso.so.1: provided by the kernel
  esac
done <<<"$listing"
[ -n "$loader" ] || die "ldd names no dynamic loader for $agent (is it statically linked?)"
[ -n "$libc_dir" ] || die "ldd names no libc.so.6 for $agent"
[ "$(basename "$loader")" = "ld-linux-x86-64.so.2" ] ||
  die "unexpected dynamic loader $loader (the launcher executes lib/ld-linux-x86-64.so.2)"
copy "$loader" "lib/ld-linux-x86-64.so.2" 0755

# glibc's companion libraries, none of which the agent links: a library the agent dlopens
# from the image (NVML needs libpthread, libdl and librt; NSS modules libresolv) must get
# them from the bundle's glibc, never from the image's glibc of another version.
for name in libpthread.so.0 libdl.so.2 librt.so.1 libutil.so.1 libanl.so.1 libresolv.so.2 \
  libnss_files.so.2 libnss_dns.so.2; do
  if [ -e "$tmp/lib/$name" ]; then continue; fi
  [ -e "$libc_dir/$name" ] || die "$libc_dir/$name does not exist (glibc is incomplete?)"
  copy "$libc_dir/$name" "lib/$name" 0644
done

copy "$agent" "libexec/spawnpoint-agent" 0755
copy "$launcher" "bin/spawnpoint-agent" 0755
copy "$shim" "share/spawnpoint/python/sitecustomize.py" 0644
for f in "$package"/*.py; do
  copy "$f" "share/spawnpoint/python/spawnpoint_rank/$(basename "$f")" 0644
done
for f in "$public"/*.py; do
  copy "$f" "share/spawnpoint/python/spawnpoint/$(basename "$f")" 0644
done
if [ -n "$deps" ] && [ -d "$deps" ]; then
  while IFS= read -r f; do
    case "$f" in */__pycache__/*) continue ;; esac
    mkdir -p "$(dirname "$tmp/share/spawnpoint/python-deps/$f")"
    copy "$deps/$f" "share/spawnpoint/python-deps/$f" 0644
  done < <(cd "$deps" && find . -type f | sed 's|^\./||' | sort)
fi
chmod 0644 "$manifest"
# The package's bytecode for the build's python3 (see agent/CMakeLists.txt: images often set
# PYTHONDONTWRITEBYTECODE); other Python versions compile the sources as before.
if [ -x /usr/bin/python3 ]; then
  /usr/bin/python3 -m compileall -q --invalidation-mode checked-hash "$tmp/share/spawnpoint" ||
    die "python3 -m compileall failed on the shim's package"
  find "$tmp/share/spawnpoint" -name '*.pyc' -exec chmod 0644 {} +
fi

# Debian's libraries carry no debug info; the agent built RelWithDebInfo does (~30 MB).
for f in "$tmp/libexec/spawnpoint-agent" "$tmp/bin/spawnpoint-agent" "$tmp"/lib/*; do
  objcopy --strip-debug "$f"
done

# The bundle's loader must resolve every library of the agent inside the bundle.
resolved=$("$tmp/lib/ld-linux-x86-64.so.2" --library-path "$tmp/lib" --list \
  "$tmp/libexec/spawnpoint-agent") || die "the bundled loader cannot load the agent"
while read -r line; do
  case "$line" in
    *"=>"*)
      path=$(awk '{print $3}' <<<"$line")
      case "$path" in
        "$tmp/lib/"*) ;;
        *) die "the bundled agent resolves ${line%% =>*} outside the bundle: $path" ;;
      esac
      ;;
  esac
done <<<"$resolved"

rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "make-bundle: $out ($(du -sh "$out" | cut -f1)): $(find "$out" -type f | wc -l) files"
