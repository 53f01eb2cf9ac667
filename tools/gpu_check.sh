#!/usr/bin/env bash
# FALLBACK ONLY: the first choice is tools/gpu-bundle.sh here + tools/gpu-phase.sh A|B|C|D there (built
# here, nothing compiled on the device). This script builds on the device from carried .debs instead.
# One call that verifies the project on the lent GPU machine (../shared/GPU.md): probes the machine,
# unpacks the carried Debian packages into a prefix (never into /), builds Release with CUDA, runs
# ctest (GPU tests included), the benchmarks and short training runs, and writes everything to $OUT
# with a summary printed last. Prepare here first: tools/fetch-gpu-deps.sh (fills .gpudeps/), then
#   device run, carry [".gpudeps"]:  bash tools/gpu_check.sh
# Every step runs even if an earlier one failed; the summary says which did.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
prefix=/opt/gpudeps
declare -a summary
step() {  # step NAME CMD...: runs CMD with output to $OUT/NAME.log, records ok/FAIL and the time
  local name=$1; shift
  local t0=$SECONDS
  if "$@" > "$OUT/$name.log" 2>&1; then summary+=("ok    $name ($((SECONDS - t0)) s)")
  else summary+=("FAIL  $name ($((SECONDS - t0)) s): see $name.log"); fi
}

probe() {
  date -u; hostname; nvidia-smi || true
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv || true
  command -v nvcc && nvcc --version; ls -d /usr/local/cuda* 2>/dev/null
  cmake --version | head -1; command -v ninja; nproc; free -g
  python3 -c "import nvidia.nccl as m; print('nccl wheel', list(m.__path__)[0])" || true
  find / -name 'libnccl.so*' -not -path '*/proc/*' 2>/dev/null | head -5
  find / -name 'libcublasLt.so*' -not -path '*/proc/*' 2>/dev/null | head -5
  which mpirun || true; ls /usr/include/mpi.h /usr/include/hdf5* /usr/include/boost 2>&1 | head
}
step probe probe

unpack() {
  [[ -d .gpudeps ]] || { echo "no .gpudeps/: run tools/fetch-gpu-deps.sh here and carry it"; return 1; }
  mkdir -p "$prefix"
  for d in .gpudeps/*.deb; do dpkg -x "$d" "$prefix"; done
  # Debian's mpicxx/mpiexec are symlinks through /etc/alternatives, which the prefix lacks: CMake gets
  # the MPI header and library directly (configure below) and the launcher is orterun itself.
  ls "$prefix/usr/bin" | head -30
}
step unpack unpack

lib=$prefix/usr/lib/x86_64-linux-gnu
# The nvidia-nccl wheel has no __init__.py (a namespace package: __file__ is None), hence __path__.
nccl_root=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null || true)
export PATH=$prefix/usr/bin:$PATH
export OPAL_PREFIX=$prefix/usr   # relocated Open MPI finds its components and help files here
export LD_LIBRARY_PATH=$lib:$lib/openmpi/lib:$lib/hdf5/serial:$lib/openblas-openmp:${nccl_root:+$nccl_root/lib:}${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_ROOT=${nccl_root}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_IB_DISABLE=1  # the VM has only loopback

configure() {
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPT2_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$prefix/usr" \
    -DMPI_CXX_SKIP_MPICXX=ON -DMPI_CXX_HEADER_DIR="$lib/openmpi/include" -DMPI_CXX_LIB_NAMES=mpi \
    -DMPI_mpi_LIBRARY="$lib/openmpi/lib/libmpi.so" -DMPIEXEC_EXECUTABLE="$prefix/usr/bin/orterun" \
    -DHDF5_C_INCLUDE_DIR="$prefix/usr/include/hdf5/serial" -DHDF5_C_LIBRARY_hdf5="$lib/hdf5/serial/libhdf5.so" \
    -DHDF5_C_LIBRARIES="$lib/hdf5/serial/libhdf5.so" -DBoost_INCLUDE_DIR="$prefix/usr/include" \
    -DGPT2_CBLAS_INCLUDE="$prefix/usr/include/x86_64-linux-gnu/openblas-openmp" \
    -DGPT2_OPENBLAS_LIB="$lib/openblas-openmp/libopenblas.so" -DNCCL_ROOT="$nccl_root"
}
step configure configure
step build cmake --build build-gpu -j "$(nproc)"
# The GPU suites again, verbosely, so their logs show every comparison and the skip reason if any.
step gpu_tests ctest --test-dir build-gpu --output-on-failure -V -L gpu
step bench_gpu_kernels build-gpu/bin/bench_gpu_kernels --benchmark_out="$OUT/bench_gpu_kernels.json" \
  --benchmark_out_format=json
step bench_cpu_kernels build-gpu/bin/bench_cpu_kernels --benchmark_out="$OUT/bench_cpu_kernels.json" --benchmark_out_format=json
step bench_allreduce orterun -n 2 build-gpu/bin/bench_allreduce --benchmark_out="$OUT/bench_allreduce.json" \
  --benchmark_out_format=json
# Whole 124M steps (issue target: >= 470K tokens/s with cuBLASLt on one H100; hand kernels within 15%).
# B=16 x T=1024 per micro-step, 2 accumulation steps: 32768 tokens per step.
for gemm in cublaslt hand; do
  step train_124m_bf16_$gemm build-gpu/bin/gpt2-train --config configs/gpt2-124m.ini --device cuda --benchmark \
    --gemm $gemm --max-steps 12 --micro-batch 16 --seq-len 1024 --global-batch-tokens 32768 --log-every 1 \
    --out "$OUT/train_124m_bf16_$gemm"
done
step train_124m_fp32 build-gpu/bin/gpt2-train --config configs/gpt2-124m.ini --device cuda --benchmark \
  --precision fp32 --max-steps 4 --micro-batch 4 --seq-len 1024 --out "$OUT/train_124m_fp32"
step train_2ranks_shared_gpu orterun -n 2 build-gpu/bin/gpt2-train --model d4 --vocab-size 256 --device cuda \
  --comm mpi --benchmark --max-steps 10 --out "$OUT/train_2ranks"
step quickstart_cuda build-gpu/bin/gpt2-train --config configs/ci.ini --device cuda --train-data build-gpu/tests/gpu_train_tmp/data/train.h5 \
  --val-data build-gpu/tests/gpu_train_tmp/data/val.h5 --out "$OUT/ci_cuda"
cp -r build-gpu/Testing/Temporary "$OUT/ctest_logs" 2>/dev/null || true

{
  echo "gpu_check summary ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
  printf '%s\n' "${summary[@]}"
} | tee "$OUT/summary.txt"
