#!/usr/bin/env bash
# Installs everything spawnpoint needs to build, test and run its demo: Debian 12 packages,
# then (scripts/install-tools.sh) the pinned tools Debian lacks, built into .tools/bin.
# Idempotent: packages already present are skipped without touching apt.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config clang-format
  ccache  # CI's fresh clones reuse the machine's compiled objects (CMakeLists.txt, .ci/run)
  libtorch-dev libgloo-dev
  libcpprest-dev libssl-dev libboost-system-dev
  libyaml-cpp-dev nlohmann-json3-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-torch python3-yaml
  python3-torchvision  # bench-loader: the Python rows' real-world pipeline (FakeData, transforms)
  procps
  openssl  # /usr/bin/openssl: kube_transport_test and scripts/cluster.sh make TLS certificates
  curl  # scripts/cluster.sh asks the API server's /readyz
  prometheus  # /usr/bin/prometheus and promtool: the metrics tests scrape the agent with them
  clang-14 libclang-rt-14-dev  # make fuzz: libFuzzer, ASan and UBSan (tests/fuzz)
  elfutils  # eu-stack: a stalled C++ rank's native frames (agent/run/rank_stacks.h)
  # scripts/foreign-root.sh: the foreign trainer roots (Debian 11 and 13) of tests/foreign,
  # and the trixie-frameworks root of scripts/frameworks-env.sh (tests/frameworks).
  # apt checks their Release files with debian-archive-keyring's keys (below).
  mmdebstrap
  # scripts/images.sh (make images) and tests/images: the images built without a Docker
  # engine (buildah: daemonless, chroot isolation, vfs storage) and run; the operator image
  # carries this machine's CA bundle.
  buildah ca-certificates
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
# Debian 13 (trixie)'s archive keys came with Debian 12's debian-archive-keyring
# 2023.3+deb12u2; an older one is upgraded so that mmdebstrap can build the trixie root.
if [ ! -e /usr/share/keyrings/debian-archive-trixie-stable.gpg ]; then
  missing+=(debian-archive-keyring)
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  echo "install-deps: done"
fi

# What Debian lacks (kubectl), pinned by version and checksum into .tools/bin. The control
# plane of scripts/cluster.sh is built by `make test` and `make cluster-up` (install-tools.sh
# --control-plane): the demo does not need it.
bash "$(dirname "${BASH_SOURCE[0]}")/install-tools.sh"
