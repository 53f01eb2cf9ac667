#!/usr/bin/env bash
# Installs the Debian packages this project needs; idempotent: installs only what is missing.
#   tools/install-deps.sh             build + test dependencies
#   tools/install-deps.sh --runtime   build + run dependencies only (no torch, gtest, benchmark)
# Works as root on a fresh Debian 12; uses sudo when not root.
set -euo pipefail

build_pkgs=(cmake ninja-build g++ pkg-config libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools
            libboost-program-options-dev libopenblas-openmp-dev bible-kjv)
test_pkgs=(libgtest-dev libbenchmark-dev python3-torch python3-h5py python3-numpy python3-matplotlib
           slurm-wlm munge
           # the fuzzers (tools/fuzz.sh): clang with libFuzzer and its sanitizer runtimes, clang's OpenMP
           clang libclang-rt-14-dev libomp-dev)

pkgs=("${build_pkgs[@]}")
[[ "${1:-}" == "--runtime" ]] || pkgs+=("${test_pkgs[@]}")

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi

SUDO=""
[[ $(id -u) -eq 0 ]] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
