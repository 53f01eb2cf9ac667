#!/usr/bin/env bash
# Downloads (here, where apt works) the Debian packages the lent GPU machine lacks: Open MPI, HDF5,
# Boost.ProgramOptions, OpenBLAS, Google Benchmark and GoogleTest, into .gpudeps/ (git-ignored).
# Carry that folder with the device call; tools/gpu_check.sh unpacks it there (never into /).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libhwloc15 libevent-2.1-7 libevent-core-2.1-7
      libevent-pthreads-2.1-7 libpmix2 libfabric1 libucx0 libpsm2-2 libpsm-infinipath1 libibverbs1 librdmacm1
      libnl-3-200 libnl-route-3-200 libmunge2 libcurl4 libhdf5-dev libhdf5-103-1 libhdf5-hl-100 libsz2 libaec0
      libboost-program-options1.74-dev libboost-program-options1.74.0 libboost1.74-dev
      libopenblas-openmp-dev libopenblas0-openmp libgfortran5 libbenchmark-dev libbenchmark1debian libgtest-dev
      libnghttp2-14 librtmp1 libssh2-1 libpsl5 libbrotli1 libldap-2.5-0 libsasl2-2 libsasl2-modules-db
      libxnvctrl0 libnuma1)
mkdir -p .gpudeps
cd .gpudeps
apt-get download "${pkgs[@]}" >/dev/null
echo "fetch-gpu-deps: $(ls *.deb | wc -l) packages, $(du -sh . | cut -f1) in .gpudeps/"
