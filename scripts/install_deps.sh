#!/usr/bin/env bash
# Installs the Debian 12 packages peng needs to build, test and fetch models.
# Idempotent: does nothing (not even `apt-get update`) when all are installed.
# Runs apt-get directly as root, through sudo otherwise.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  clang libclang-rt-14-dev
  nlohmann-json3-dev libcli11-dev libpcre2-dev libxxhash-dev
  libspdlog-dev libfmt-dev libcpp-httplib-dev libboost-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-venv python3-pip
  unzip ca-certificates iproute2
  prometheus  # promtool, to check /metrics in the tests
  nginx       # the proxy of deploy/nginx/peng.conf, for scripts/failover_test.sh
  valgrind    # bench/insn_count.sh: instruction counts of a fixed decode (CI work counter)
  libopenmpi-dev openmpi-bin  # multi-process tensor / expert / data parallel (mpirun)
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install_deps: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install_deps: need root or sudo" >&2; exit 1; }
  SUDO=(sudo)
fi

echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
