#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of keel from Debian packages.
# Idempotent: packages already present are left alone and nothing is downloaded twice.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  clang libclang-rt-14-dev          # libFuzzer and sanitizer runtimes
  nlohmann-json3-dev libcli11-dev libtomlplusplus-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libomp-dev
  libdnnl-dev                       # gemm backend (docs/blas.md)
  libopenblas-dev libopenblas0-openmp libblis-dev   # OpenBLAS beside oneDNN (AVX2), the alternative backend, the BLAS benchmark
  chromium                          # renders the `keel compare` report in a test (headless)
  libopenmpi-dev openmpi-bin        # data parallelism (docs/distributed.md)
  iproute2                          # the two-namespace TCP test of data parallelism (ip netns, veth)
)

# The PyTorch peer: benchmarks against it (bench/), fixture regeneration (tools/make_fixtures.py)
# and the PyTorch cross-checks under experiments/. Not needed to build or test: the tests read
# committed fixtures. `install-deps.sh --torch` adds it.
if [[ "${1:-}" == "--torch" ]]; then
  # jemalloc: one of the allocators the peer search tries under PyTorch (bench/train_step_vs_pytorch.py).
  PACKAGES+=(python3-torch python3-numpy libjemalloc2)
elif [[ $# -gt 0 ]]; then
  echo "usage: $0 [--torch]" >&2
  exit 2
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all packages present"
fi
