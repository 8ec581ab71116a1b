#!/usr/bin/env bash
# Installs what spawnpoint needs from Debian 12's packages, then (scripts/install-tools.sh)
# the pinned tools Debian lacks, built or fetched into .tools/. Idempotent: packages already
# present are skipped without touching apt. As root, or as a user with sudo; never a prompt.
#   install-deps.sh          everything: build, test, benches, images (make build, make test)
#   install-deps.sh --demo   only what make demo needs: a C++ compiler, CMake, Ninja, yaml-cpp,
#                            nlohmann-json and Debian's python3-torch, plus cloudpickle for the
#                            Python shim (install-tools.sh --demo). No kubectl, helm or Go.
set -euo pipefail

demo=0
for arg in "$@"; do
  case "$arg" in
    --demo) demo=1 ;;
    *) echo "install-deps: unknown argument $arg (usage: install-deps.sh [--demo])" >&2; exit 2 ;;
  esac
done

# make demo: the agent and its Python shim (the agent-only tree, CMakeLists.txt's
# SPAWNPOINT_AGENT_ONLY) and the Python example's 2 CPU ranks on Debian's torch.
demo_packages=(
  build-essential cmake ninja-build
  ccache  # CI's fresh clones reuse the machine's compiled objects (CMakeLists.txt, .ci/run)
  libyaml-cpp-dev nlohmann-json3-dev
  python3 python3-torch
  curl ca-certificates  # install-tools.sh fetches cloudpickle's wheel from PyPI
)
packages=(
  "${demo_packages[@]}"
  pkg-config clang-format
  libtorch-dev libgloo-dev  # the C++ example trainer (make demo-cpp), its tests, the benches
  libcpprest-dev libssl-dev libboost-system-dev  # the operator's Kubernetes client
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  python3-yaml
  python3-torchvision  # bench-loader: the Python rows' real-world pipeline (FakeData, transforms)
  # tests/notebook (label notebook): notebooks executed on a real Jupyter kernel
  python3-ipykernel python3-nbclient python3-nbformat python3-jupyter-client
  procps
  openssl  # /usr/bin/openssl: kube_transport_test and scripts/cluster.sh make TLS certificates
  # curl (above): scripts/cluster.sh asks the API server's /readyz
  prometheus  # /usr/bin/prometheus and promtool: the metrics tests scrape the agent with them
  clang-14 libclang-rt-14-dev  # make fuzz: libFuzzer, ASan and UBSan (tests/fuzz)
  elfutils  # eu-stack: a stalled C++ rank's native frames (agent/run/rank_stacks.h)
  # scripts/foreign-root.sh: the foreign trainer roots (Debian 11 and 13) of tests/foreign,
  # and the trixie-frameworks root of scripts/frameworks-env.sh (tests/frameworks).
  # apt checks their Release files with debian-archive-keyring's keys (below).
  mmdebstrap
  # scripts/images.sh (make images) and tests/images: the images built without a Docker
  # engine (buildah: daemonless, chroot isolation, vfs storage) and run; the operator image
  # carries this machine's CA bundle (ca-certificates, above).
  buildah
)
if [ "$demo" -eq 1 ]; then
  packages=("${demo_packages[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
# Debian 13 (trixie)'s archive keys came with Debian 12's debian-archive-keyring
# 2023.3+deb12u2; an older one is upgraded so that mmdebstrap can build the trixie root.
if [ "$demo" -eq 0 ] && [ ! -e /usr/share/keyrings/debian-archive-trixie-stable.gpg ]; then
  missing+=(debian-archive-keyring)
fi

what="all ${#packages[@]} packages"
[ "$demo" -eq 1 ] && what="the demo's ${#packages[@]} packages"
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: $what present"
else
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null ||
      { echo "install-deps: not root and no sudo: install ${missing[*]} as root, or run as root" >&2; exit 1; }
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  echo "install-deps: done"
fi

# What Debian lacks, pinned by version and checksum into .tools/: kubectl, helm and
# cloudpickle (--demo: cloudpickle only). The control plane of scripts/cluster.sh is built
# by `make test` and `make cluster-up` (install-tools.sh --control-plane).
tools_args=()
[ "$demo" -eq 1 ] && tools_args=(--demo)
bash "$(dirname "${BASH_SOURCE[0]}")/install-tools.sh" "${tools_args[@]}"
