#!/usr/bin/env bash
# The CUDA kernels run on the CPU, without a GPU: each kernel's real source compiled by g++ as host C++, every
# GPU thread of a block a std::thread (or a fiber), and the GPU features they use emulated from NVIDIA's
# documentation (README.md here).
#
#   tests/emu/emu.sh BUILD_DIR            build, then the sm_90a kernels' checks CI runs (~90 s): the
#                                         repository's descriptor and fragment helpers against the emulator's;
#                                         the attention forward on partial tiles and on AttentionWgmmaForward's
#                                         shapes; the GEMM (128x128, 128x256 and ping-pong) on every
#                                         transpose, epilogue and split-K; all
#                                         under other shared-memory offsets, grids and TMA/wgmma timings
#   tests/emu/emu.sh BUILD_DIR --all      also every attention T x B x NH and GPT-2's shapes, fwd + bwd (~4 min)
#   tests/emu/emu.sh BUILD_DIR --build    builds the sm_90a kernels' drivers only: BUILD_DIR/emu_{attention,
#                                         attention_bwd,gemm} (their options: the checks below)
#   tests/emu/emu.sh BUILD_DIR --gpu-tests  the repository's GPU test suites (tests/gpu: GEMM's hand backend,
#                                         attention, layernorm, elementwise, encoder, model, decode) against
#                                         every kernel file of kernels/, CI's cases, and bench_gpu_kernels on
#                                         a few cheap benchmarks (bench_emu.py) (~4.5 min); --gpu-tests-build
#                                         builds them only
#   tests/emu/emu.sh BUILD_DIR --train [MPIEXEC]  gpt2-train, gpt2-sample and the device reducer on the GPU path,
#                                         NCCL emulated over MPI (train_emu.py: against the CPU backend, 1 and 2
#                                         ranks, resume, ZeRO-1, the wgmma kernels; ~4 min); --train-build builds
#                                         them only, in BUILD_DIR/train
#   tests/emu/emu.sh BUILD_DIR --mutants [KERNELS]  mutants of the kernels and of the training code's stream
#                                         ordering (mutate.py's tables; KERNELS: a quoted subset of "attention
#                                         attention_bwd gemm gemm_mma attention_mma attention_bwd_storeds
#                                         attention_decode nccl_comm device_reducer model_cuda"), each must be
#                                         caught, not hang
# Exit status 0 when every check passes.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:?usage: emu.sh BUILD_DIR [--all|--build|--mutants [KERNELS]|--gpu-tests|--gpu-tests-build|--train [MPIEXEC]|--train-build]}
mode=${2:-ci}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cuda_inc=${GPT2_EMU_CUDA_INCLUDE:-${CUDA_HOME:-/usr/local/cuda}/include}
cxx=(g++ -std=c++17 -O2 -pthread -fno-strict-aliasing -Wall -Wno-unknown-pragmas -Wno-attributes -Wno-class-memaccess
  -Wno-psabi)
inc=(-I"$here/include" -I"$repo" -I"$repo/src" -I"$cuda_inc")
# The g++ flags of a kernel file rewritten by cuda_to_host.py
kernel_flags=(-include emu/prelude.h -DEMU_REWRITTEN_SOURCES)

# build_kernel KERNEL SRC BINARY (KERNEL: attention, attention_bwd or gemm): the emulator around SRC (a kernel
# file or a mutant of it) rewritten by cuda_to_host.py, and its driver (src/KERNEL_driver.cpp).
build_kernel() {
  local kernel=$1 src=$2 bin=$3 gen="$3.emu.cpp" o
  python3 "$here/cuda_to_host.py" "$src" "$gen" 2> "$gen.log" || { cat "$gen.log" >&2; return 1; }
  for o in emu_runtime cudart_stubs fatal_stub "${kernel}_driver"; do
    if [[ ! -f $out/$o.o || $here/src/$o.cpp -nt $out/$o.o ||
          -n $(find "$here/include/emu" -newer "$out/$o.o" -print -quit) ]]; then
      "${cxx[@]}" "${inc[@]}" -c "$here/src/$o.cpp" -o "$out/$o.o" || return 1
    fi
  done
  # The repository's tensor-map helper, unmodified (the stubbed driver entry point hands it the emulator's encoder),
  # and its launch decision (GPT2_PDL; kernels/common/launch.cpp) with the kernel-path record it writes to.
  local f
  for f in sm90a_host.cu launch.cpp kernel_paths.cpp; do
    if [[ ! -f $out/${f%.*}.o || $repo/kernels/common/$f -nt $out/${f%.*}.o ||
          -n $(find "$here/include" "$repo/kernels/common" -newer "$out/${f%.*}.o" -print -quit) ]]; then
      "${cxx[@]}" "${inc[@]}" -x c++ -c "$repo/kernels/common/$f" -o "$out/${f%.*}.o" || return 1
    fi
  done
  "${cxx[@]}" "${inc[@]}" -D__CUDA_ARCH_FEAT_SM90_ALL "${kernel_flags[@]}" -c "$gen" -o "$bin.o" &&
    "${cxx[@]}" -o "$bin" "$out"/{emu_runtime,cudart_stubs,fatal_stub,"${kernel}_driver",sm90a_host,launch,kernel_paths}.o \
      "$bin.o"
}
# The GPU test suites (tests/gpu/test_<family>.cpp, as the lent GPU builds them) linked against every CUDA file
# of kernels/ (mma.sync GEMM and attention, layernorm, softmax-xent, GELU, AdamW, encoder, reductions, the
# sm_90a kernels, the cuBLASLt backend's wrapper) and the CUDA model, each rewritten by cuda_to_host.py and
# compiled by g++ against the emulator (cuBLASLt itself: src/cublaslt_emu.cpp), with src/core and the CPU
# references.
gpu_kernel_srcs=(kernels/common/cuda_device.cu kernels/encoder/encoder.cu kernels/layernorm/layernorm.cu
  kernels/gemm/gemm.cu kernels/attention/attention.cu kernels/attention/attention_decode.cu kernels/gelu/gelu.cu
  kernels/softmax_xent/softmax_xent.cu kernels/adamw/adamw.cu kernels/reduce/reduce.cu
  kernels/common/sm90a_host.cu kernels/gemm/gemm_sm90.cu kernels/attention/attention_sm90.cu
  kernels/attention/attention_bwd_sm90.cu kernels/gemm/gemm_cublaslt.cu src/model/gpt2_cuda.cu)
gpu_host_srcs=(src/core/error.cpp src/core/log.cpp src/core/json.cpp src/core/file_io.cpp src/core/backend.cpp
  src/core/param_segment.cpp kernels/common/device.cpp kernels/common/kernel_paths.cpp kernels/common/launch.cpp
  kernels/encoder/encoder_cpu.cpp
  kernels/layernorm/layernorm_cpu.cpp kernels/gemm/gemm_cpu.cpp kernels/attention/attention_cpu.cpp
  kernels/gelu/gelu_cpu.cpp kernels/softmax_xent/softmax_xent_cpu.cpp kernels/adamw/adamw_cpu.cpp
  kernels/reduce/reduce_cpu.cpp src/model/config.cpp src/model/params.cpp src/model/gpt2.cpp src/model/step_profile.cpp
  src/optim/adamw.cpp src/optim/schedule.cpp src/train/sample.cpp)
gpu_test_families=(gemm attention layernorm elementwise encoder model decode)
# The cases CI runs (--gpu-tests), about 4.5 min on 2 cores plus the build; every case of the suites passes (~35 min: run
# BUILD_DIR/gpu/test_gpu_<family> after --gpu-tests-build, with EMU_FIBERS=1). Left out here: the GPT-2-sized shapes, the
# cases that repeat a kernel on more data, and bf16 repeats of the decode suite's fp32 model cases.
declare -A gpu_test_filter=(
  [gemm]='GemmTest/*.AwkwardShapesAllTransposesAndEpilogues:GemmTest/*.ForcedPaths:GemmTest/*.MisalignedPointers:GemmTest/*.BiasBackwardAccumulatesDeterministically:GemmTest/bf16.DGeluBiasGradMatchesGemmAndCpu:GemmTest/fp32.Gpt2LinearLayersAt256Rows:GemmHandPaths.*:GemmWgmma.AllTransposesAndEpiloguesAgainstDoubleLoop:GemmWgmma.PathSelectionAndFallback:GemmWgmma.EnvironmentPicksTheTile:GemmWgmma.ByShapeRunsTheKernelItNames:GemmWgmma.ForcedSplitK:GemmWgmma.SplitTail:GemmWgmma.SplitTailPlan:GemmWgmma.DGeluPreActivationsByTmaMatchGlobalReads:GemmWgmma.BulkStoreMatchesThreadStores:GemmRounding.*:GemmCublasLtEnvironment.*:GemmHandEnvironment.*'
  [attention]='AttentionDeathTest.*:AttentionTest/*.SmallShapesMatchCpu:AttentionTileOrder.*:AttentionAccumulateDq.AgreesWithRecomputeDq:AttentionStoreDs.MatchesCpu:AttentionStoreDs.AgreesWithRecomputeDq:AttentionScratch.*:AttentionWgmma*.FallsBack*:AttentionWgmmaForward.RecordsThePathItRan:AttentionWgmmaForward.AgreesWithMmaSync:AttentionWgmmaBackward.TwoKeyTilesMatchCpu:AttentionWgmmaStoreDs.TwoKeyTilesMatchCpu:AttentionWgmmaStoreDs.AgreesWithWgmma:AttentionFallback.GenericPathMatchesCpuAtTensorCoreHeadSizes:AttentionFallback.TensorCoreAndGenericPathsAgree:AttentionBiasSums.*'
  [elementwise]='-ElementwiseTest/fp32.AdamWMatchesCpu:ElementwiseTest/bf16.SumSquaresIsAccurateAndDeterministic:ElementwiseTest/fp32.SoftmaxXentMatchesCpu'
  [model]='*MatchesCpuStep/fp32_hand:*RepeatsBitForBit/bf16_hand:*ShardedAdamWMatchesCpuShard/fp32_hand:*WaitsForParamsStillArriving/fp32_hand:*CudaGraphMatchesEager/bf16_hand:*CudaGraphDeferredForwardUsesItsWeights/fp32_hand:*MatchesCpuStep/bf16_cublaslt:*ProgrammaticLaunchChangesNoBit/bf16_hand:*AttentionBiasSumsMatchTheBiasKernel/bf16_hand:ModelLaunchEnvironment.*'
  [decode]='AttentionDecode*:*ModelDecode.*/fp32_hand'
)
# The kernels whose mutants run through a GPU test suite (--mutants gemm_mma attention_mma attention_decode
# attention_bwd_storeds): the suite each one's mutants run, and that suite's quick cases they run
declare -A gpu_mutant_suite=([gemm_mma]=gemm [attention_mma]=attention [attention_decode]=decode
  [attention_bwd_storeds]=attention)
declare -A gpu_mutant_filter=(
  [gemm_mma]='GemmTest/bf16.AwkwardShapesAllTransposesAndEpilogues:GemmTest/*.ForcedPaths'
  [attention_mma]='AttentionTest/1.SmallShapesMatchCpu:AttentionAccumulateDq.MatchesCpu:AttentionStoreDs.MatchesCpu'
  [attention_decode]='AttentionDecodeTest/*.MatchesCpu'
  [attention_bwd_storeds]='AttentionWgmmaStoreDs.TwoKeyTilesMatchCpu:AttentionWgmmaStoreDs.AgreesWithWgmma')
gpu_lib_objs=()
# build_gpu_mutant KERNEL MUTANT_SRC BINARY (KERNEL: one of gpu_mutant_suite's): its GPU test suite linked
# against the mutant in place of its kernel file (after build_gpu_tests).
# compile_rewritten CUDA_SRC OBJ: a .cu file (a mutant) rewritten by cuda_to_host.py and compiled as the GPU
# test build compiles its kernel files (OBJ.emu.cpp beside it)
compile_rewritten() {
  python3 "$here/cuda_to_host.py" "$1" "$2.emu.cpp" 2> /dev/null &&
    "${cxx[@]}" "${inc[@]}" "${gpu_flags[@]}" "${kernel_flags[@]}" -c "$2.emu.cpp" -o "$2"
}
build_gpu_mutant() {
  local kernel=$1 src=$2 bin=$3 family=${gpu_mutant_suite[$1]} o lib=()
  local replaced=$out/gpu/$(basename "$(src_of "$kernel")" .cu).o
  compile_rewritten "$src" "$bin.o" || return 1
  for o in "${gpu_lib_objs[@]}"; do [[ $o == "$replaced" ]] || lib+=("$o"); done
  "${cxx[@]}" -fopenmp -o "$bin" "$out/gpu/test_$family.o" "$bin.o" "${lib[@]}" -lgtest -lopenblas
}
# The g++ flags of the GPU test build's objects (the rewritten kernel files also get -include emu/prelude.h).
gpu_flags=(-DGPT2_HAVE_CUDA=1 -DGPT2_HAVE_SM90A=1 -D__CUDA_ARCH_FEAT_SM90_ALL -fopenmp)
cblas_inc=$(ls -d /usr/include/*/openblas-openmp /usr/include/*/openblas-pthread /usr/include/openblas 2>/dev/null | head -1)
[[ -n $cblas_inc ]] && gpu_flags+=(-I"$cblas_inc")
build_gpu_tests() {
  local g=$out/gpu f name objs=() pids=()
  mkdir -p "$g"
  # compile SRC OBJ [FLAGS...]: in the background, as many at a time as there are cores; skipped when OBJ is
  # newer than SRC and than every header it could include (the repository's and the emulator's)
  compile() {
    local src=$1 obj=$2
    shift 2
    objs+=("$obj")
    [[ -f $obj && $obj -nt $src && -z $(find "$here/include" "$repo/kernels" "$repo/src" "$repo/tests/gpu" "$repo/tools/bench/gpu" \
           \( -name '*.h*' -o -name '*.cuh' \) -newer "$obj" -print -quit) ]] && return 0
    while (($(jobs -rp | wc -l) >= $(nproc))); do wait -n; done
    "${cxx[@]}" "${inc[@]}" "${gpu_flags[@]}" "$@" -c "$src" -o "$obj" || { echo "emu: compiling $src failed" >&2; return 1; } &
    pids+=($!)
  }
  for f in "${gpu_kernel_srcs[@]}"; do
    name=$(basename "$f" .cu)
    if [[ ! -f $g/$name.emu.cpp || $repo/$f -nt $g/$name.emu.cpp || $here/cuda_to_host.py -nt $g/$name.emu.cpp ]]; then
      python3 "$here/cuda_to_host.py" "$repo/$f" "$g/$name.emu.cpp" || return 1
    fi
    compile "$g/$name.emu.cpp" "$g/$name.o" "${kernel_flags[@]}"
  done
  for f in "${gpu_host_srcs[@]}"; do compile "$repo/$f" "$g/$(echo "$f" | tr / _).o"; done
  for f in emu_runtime cudart_stubs cublaslt_emu; do compile "$here/src/$f.cpp" "$g/$f.o"; done
  compile "$repo/tests/gpu/gpu_test_main.cpp" "$g/gpu_test_main.o"
  gpu_lib_objs=("${objs[@]}")
  local lib=("${objs[@]}")
  for f in "${gpu_test_families[@]}"; do compile "$repo/tests/gpu/test_$f.cpp" "$g/test_$f.o"; done
  local bench_objs=()
  if ((have_benchmark)); then
    for f in "$repo"/tools/bench/gpu/*.cpp; do
      compile "$f" "$g/bench_$(basename "$f" .cpp).o"
      bench_objs+=("$g/bench_$(basename "$f" .cpp).o")
    done
  fi
  local p ok=1
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  ((ok)) || return 1
  for f in "${gpu_test_families[@]}"; do
    "${cxx[@]}" -fopenmp -o "$g/test_gpu_$f" "$g/test_$f.o" "${lib[@]}" -lgtest -lopenblas || return 1
  done
  ((have_benchmark)) || return 0
  local o bench_lib=()  # the suites' objects but their main
  for o in "${lib[@]}"; do [[ $o == */gpu_test_main.o ]] || bench_lib+=("$o"); done
  "${cxx[@]}" -fopenmp -o "$g/bench_gpu_kernels" "${bench_objs[@]}" "${bench_lib[@]}" -lbenchmark -lopenblas
}
# bench_gpu_kernels needs Google Benchmark, as the real build's GPT2_BUILD_BENCH does (tools/install-deps.sh)
have_benchmark=$([[ -f /usr/include/benchmark/benchmark.h ]] && echo 1 || echo 0)

# The training programs (gpt2-train, gpt2-sample, gpt2-data), the device reducer's test and the emulated CUDA
# graphs' test (graph_capture_test.cpp), on the GPU path:
# the GPU test build's objects (the kernels, core, model, optimizer) and the rest of src/ (comm, data,
# train, the options), with MPI and HDF5 as the real build has them and NCCL emulated over MPI
# (src/nccl_emu.cpp). In BUILD_DIR/train after --train-build.
train_srcs=(src/core/hdf5.cpp src/comm/mpi_env.cpp src/comm/communicator.cpp src/comm/fail_together.cpp src/comm/bucket_plan.cpp
  src/comm/bucket_scheduler.cpp src/comm/nccl_version.cpp src/comm/device_reducer.cpp src/comm/nccl_communicator.cpp
  src/data/token_file.cpp src/data/byte_tokenizer.cpp src/data/sampler.cpp src/data/batch_loader.cpp
  src/data/prepare.cpp src/data/gpt2_tokenizer.cpp src/data/unicode_tables.cpp src/train/batch_source.cpp
  src/train/checkpoint.cpp src/train/checkpointer.cpp src/train/restore.cpp src/train/zero.cpp src/train/metrics.cpp
  src/train/trainer.cpp src/train/stop_signal.cpp src/train/runner_cpu.cpp src/train/runner_cuda.cpp
  src/train/safetensors.cpp src/train/hf_interop.cpp src/train/memory.cpp src/train/verify_data.cpp src/app/train_options.cpp
  tests/emu/src/nccl_emu.cpp)
declare -A train_mains=([gpt2-train]=src/app/train_main.cpp [gpt2-sample]=src/app/sample_main.cpp
  [gpt2-data]=src/app/data_main.cpp [test_device_reducer]=tests/gpu/test_device_reducer.cpp
  [test_graph_capture]=tests/emu/src/graph_capture_test.cpp)
train_lib_objs=()
train_flags=(-I/usr/include/hdf5/serial)
for f in $(mpicxx --showme:incdirs 2> /dev/null); do train_flags+=(-I"$f"); done
# (zlib: the CRC-32s of checkpoints and token files, src/core/hdf5.cpp)
train_link=(-lboost_program_options -L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5 -lz $(mpicxx --showme:link 2> /dev/null)
  -lopenblas)
build_train() {
  build_gpu_tests || return 1
  local t=$out/train f objs=() pids=() p ok=1 name
  mkdir -p "$t"
  for f in "${train_srcs[@]}"; do compile "$repo/$f" "$t/$(echo "$f" | tr / _).o" "${train_flags[@]}"; done
  for name in "${!train_mains[@]}"; do compile "$repo/${train_mains[$name]}" "$t/main_$name.o" "${train_flags[@]}"; done
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  ((ok)) || return 1
  train_lib_objs=()
  for f in "${gpu_lib_objs[@]}"; do [[ $f == */gpu_test_main.o ]] || train_lib_objs+=("$f"); done
  for f in "${train_srcs[@]}"; do train_lib_objs+=("$t/$(echo "$f" | tr / _).o"); done
  for name in "${!train_mains[@]}"; do
    "${cxx[@]}" -fopenmp -o "$t/$name" "$t/main_$name.o" "${train_lib_objs[@]}" "${train_link[@]}" || return 1
  done
  # bench_allreduce's CUDA path (the DeviceGradReducer over NCCL, as the scaling sweep runs it on GPUs)
  if ((have_benchmark)); then
    "${cxx[@]}" "${inc[@]}" "${gpu_flags[@]}" "${train_flags[@]}" -c "$repo/tools/bench/bench_allreduce.cpp" \
      -o "$t/main_bench_allreduce.o" &&
      "${cxx[@]}" -fopenmp -o "$t/bench_allreduce" "$t/main_bench_allreduce.o" "${train_lib_objs[@]}" -lbenchmark \
        "${train_link[@]}" || return 1
  fi
}
# The training code's stream-ordering mutants (--mutants nccl_comm device_reducer model_cuda): the object each
# one's file replaces
declare -A train_mutant_obj=([nccl_comm]=train/src_comm_nccl_communicator.cpp.o
  [device_reducer]=train/src_comm_device_reducer.cpp.o [model_cuda]=gpu/gpt2_cuda.o)
# stream_checks BIN_DIR LOG: train_emu.py --streams on BIN_DIR's programs, streams asynchronous (the checks the
# training mutants must fail and the unmutated programs pass); stdin closed, or mpiexec would read the
# caller's (the mutant list)
stream_checks() {
  EMU_ASYNC_STREAMS=1 timeout 600 python3 "$here/train_emu.py" "$1" "$1/work" "${MPIEXEC:-mpiexec}" --streams \
    > "$2" 2>&1 < /dev/null
}
# build_train_mutant KERNEL MUTANT_SRC DIR (after build_train): DIR/gpt2-train built with the mutant in place of
# its file, and DIR/gpt2-data (train_emu.py's binaries)
build_train_mutant() {
  local kernel=$1 src=$2 dir=$3 o lib=() replaced=$out/${train_mutant_obj[$1]}
  mkdir -p "$dir"
  if [[ $kernel == model_cuda ]]; then
    compile_rewritten "$src" "$dir/mutant.o" || return 1
  else
    "${cxx[@]}" "${inc[@]}" "${gpu_flags[@]}" "${train_flags[@]}" -x c++ -c "$src" -o "$dir/mutant.o" || return 1
  fi
  for o in "${train_lib_objs[@]}"; do [[ $o == "$replaced" ]] || lib+=("$o"); done
  "${cxx[@]}" -fopenmp -o "$dir/gpt2-train" "$out/train/main_gpt2-train.o" "$dir/mutant.o" "${lib[@]}" "${train_link[@]}" &&
    ln -sf "$out/train/gpt2-data" "$dir/gpt2-data"
}

src_of() {  # the file KERNEL's mutations apply to (mutate.py's table)
  echo "$repo/$(python3 "$here/mutations/mutate.py" --source "$1")"
}

status=0
check() {  # check NAME CMD...: runs CMD, prints its verdict line
  local name=$1 log
  shift
  log=$out/$(echo "$name" | tr ' =' '_-').log
  if "$@" > "$log" 2>&1; then
    echo "PASS  $name: $(tail -1 "$log" | cut -c1-110)"
  elif grep -q 'deadlock: ' "$log" && mv "$log" "$log.deadlock" && "$@" > "$log" 2>&1; then
    # A grid-wide stall that a second run does not repeat: the backward's CI checks stalled twice in 30+
    # loaded runs, most likely a gap in which the process did not run (a paused VM), which the detector's
    # run clock no longer counts (README, Deadlocks). One rerun in case that was not the only cause, with
    # the first run's deadlock report in the output, so that CI's log shows what every block waited in.
    echo "PASS  $name (on a second run; the first deadlocked: $log.deadlock): $(tail -1 "$log" | cut -c1-80)"
    grep -E '^\[emu\] (deadlock report|  |ERROR)' "$log.deadlock" | head -40 | sed 's/^/      /'
  else
    echo "FAIL  $name (log: $log)"
    grep -E 'FAIL|ERROR' "$log" | head -5
    grep -E '^\[emu\] (deadlock report|  )' "$log" | head -40 | sed 's/^/      /'
    status=1
  fi
}

if [[ $mode == --train || $mode == --train-build ]]; then
  build_train || exit 1
  [[ $mode == --train-build ]] && exit 0
  # Streams that run as on a GPU (cudart_stubs.cpp): the host and the streams wait only where the code says so
  EMU_ASYNC_STREAMS=${EMU_ASYNC_STREAMS:-1} python3 "$here/train_emu.py" "$out/train" "$out/train_work" "${3:-mpiexec}"
  exit $?
fi

if [[ $mode == --gpu-tests || $mode == --gpu-tests-build ]]; then
  build_gpu_tests || exit 1
  [[ $mode == --gpu-tests-build ]] && exit 0
  for f in "${gpu_test_families[@]}"; do
    # the emulator's default TMA and wgmma latencies: the suites' wgmma tests, through the library's own
    # dispatch, see late copies and late retires (with fibers they cost a few seconds in all); streams that
    # run as on a GPU (a test that reads a result its stream has not finished, or orders a legacy-stream
    # memset with a non-blocking stream's kernels, fails: test_attention.cpp's poison did, 2026-11-26)
    check "gpu_tests $f" env EMU_FIBERS=1 EMU_ASYNC_STREAMS=${EMU_ASYNC_STREAMS:-1} "$out/gpu/test_gpu_$f" \
      "--gtest_filter=${gpu_test_filter[$f]:-*}"
  done
  # phase A's kernel benchmarks and their table: a few cheap ones, one failing by design (bench_emu.py)
  if ((have_benchmark)); then
    check "bench_gpu_kernels" env EMU_ASYNC_STREAMS=${EMU_ASYNC_STREAMS:-1} python3 "$here/bench_emu.py" \
      "$out/gpu/bench_gpu_kernels" "$repo" "$out/bench_work"
  else
    echo "SKIP  bench_gpu_kernels: Google Benchmark (libbenchmark-dev) is not installed"
  fi
  echo "emu: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
  exit $status
fi

if [[ $mode == --mutants ]]; then
  caught=0 total=0
  kernels=${3:-attention attention_bwd gemm gemm_mma attention_mma attention_bwd_storeds attention_decode nccl_comm
    device_reducer model_cuda}
  need=
  for kernel in $kernels; do
    [[ -n ${gpu_mutant_suite[$kernel]:-} && -z $need ]] && need=gpu_tests
    [[ -n ${train_mutant_obj[$kernel]:-} ]] && need=train
  done
  if [[ $need == train ]]; then  # (the GPU test suites too)
    build_train || exit 1
    # The control: the unmutated programs must pass the checks the training mutants must fail
    if ! stream_checks "$out/train" "$out/train_control.log"; then
      echo "emu: the unmutated training programs fail train_emu.py --streams (log: $out/train_control.log)"
      exit 1
    fi
  fi
  if [[ $need == gpu_tests ]]; then build_gpu_tests || exit 1; fi
  for kernel in $kernels; do
    python3 "$here/mutations/mutate.py" $kernel "$(src_of $kernel)" "$out/mutants_$kernel" > "$out/mutants_$kernel.list" ||
      exit 1
    while read -r m; do
      total=$((total + 1))
      bin=$out/mutant_${kernel}_$m
      if [[ -n ${gpu_mutant_suite[$kernel]:-} ]]; then builder=build_gpu_mutant
      elif [[ -n ${train_mutant_obj[$kernel]:-} ]]; then builder=build_train_mutant
      else builder=build_kernel; fi
      if ! $builder $kernel "$out/mutants_$kernel/$m.cu" "$bin" > "$bin.build.log" 2>&1; then
        echo "MUTANT $kernel/$m: BUILD FAILED (log: $bin.build.log)"
        continue
      fi
      if [[ -n ${train_mutant_obj[$kernel]:-} ]]; then
        # The training code's stream ordering: the emulated training programs with streams that run as on a
        # GPU (EMU_ASYNC_STREAMS=1), the checks that ordering decides, stopping at the first failure
        stream_checks "$bin" "$bin.log"
        rc=$?
        context=0
      elif [[ -n ${gpu_mutant_suite[$kernel]:-} ]]; then
        # The default path's kernels: the GPU test suite's quick cases, stopping at the first failure (always
        # fibers: with an OS thread per GPU thread the suites take hours)
        EMU_FIBERS=1 EMU_TIMEOUT_S=15 timeout 300 "$bin" --gtest_fail_fast "--gtest_filter=${gpu_mutant_filter[$kernel]}" \
          > "$bin.log" 2>&1
        rc=$?
        context=2  # gtest's failure message follows its "Failure" line
      else
        # wgmma retire up to 2 ms late, so a stage released too early is refilled while a product still reads
        # it; the backward's blocks start last ticket first, each once the others stand still, so dQ turns
        # that the blocks' timing happened to keep in order are not (turn_order_broken; with a random start
        # delay of up to 1 s it was caught in 2 runs of 3). Fibers by default (EMU_FIBERS=0: OS threads, about
        # 3x slower): each way all 61 are caught.
        extra=()
        [[ $kernel == attention_bwd ]] && extra=(EMU_START_LAST_FIRST=1)
        env EMU_FIBERS=${EMU_FIBERS:-1} "${extra[@]}" EMU_WAIT_DELAY_US=2000 EMU_TIMEOUT_S=15 timeout 180 "$bin" --quick \
          --stop-on-fail > "$bin.log" 2>&1
        rc=$?
        if ((rc == 0)) && [[ $kernel == attention ]]; then  # and the forward's ping-pong schedule
          env EMU_FIBERS=${EMU_FIBERS:-1} EMU_WAIT_DELAY_US=2000 EMU_TIMEOUT_S=15 timeout 180 "$bin" --quick --stop-on-fail \
            --pingpong >> "$bin.log" 2>&1
          rc=$?
        fi
        context=0
      fi
      if ((rc == 0)); then
        echo "MUTANT $kernel/$m: NOT CAUGHT"
      elif ((rc == 2)) && [[ -n ${train_mutant_obj[$kernel]:-} ]]; then
        echo "MUTANT $kernel/$m: NOT CAUGHT (its checks could not run: $bin.log)"
      elif ((rc == 124)); then
        # On a GPU this mutant would hang the launch: no bounded wait (trap) or emulator check ended it.
        echo "MUTANT $kernel/$m: NOT CAUGHT (hung until the timeout, as the kernel would on a GPU)"
      else
        caught=$((caught + 1))
        echo "MUTANT $kernel/$m: caught: $(grep -m1 -A$context -E '\[emu\] ERROR|FAIL|Failure' "$bin.log" | tr '\n' ' ' | cut -c1-150)"
      fi
    done < "$out/mutants_$kernel.list"
  done
  echo "mutants caught: $caught of $total"
  ((caught == total)) && exit 0
  exit 1
fi

build_kernel attention "$(src_of attention)" "$out/emu_attention" || exit 1
build_kernel attention_bwd "$(src_of attention_bwd)" "$out/emu_attention_bwd" || exit 1
build_kernel gemm "$(src_of gemm)" "$out/emu_gemm" || exit 1
[[ $mode == --build ]] && exit 0
# The repository's wgmma_desc and wgmma_acc_row/col (host-callable), taken from ptx.cuh as text.
s=$(grep -n '^enum class WgmmaSwizzle' "$repo/kernels/common/ptx.cuh" | cut -d: -f1)
e=$(grep -n '^__host__ __device__ constexpr int wgmma_acc_col' "$repo/kernels/common/ptx.cuh" | cut -d: -f1)
[[ -n $s && -n $e ]] || { echo "emu: ptx.cuh's layout helpers not found" >&2; exit 1; }
sed -n "${s},$((e + 2))p" "$repo/kernels/common/ptx.cuh" > "$out/repo_ptx_helpers.h"
"${cxx[@]}" -I"$here/include" -I"$out" -I"$repo" -I"$cuda_inc" "$here/src/check_ptx_helpers.cpp" -o "$out/check_ptx_helpers" ||
  exit 1
check layout_helpers "$out/check_ptx_helpers"
# The deadlock detector and its report (src/deadlock_report_test.cpp): a deadlocked block must end the process,
# and the report must name each thread's wait, with fibers and with OS threads.
"${cxx[@]}" "${inc[@]}" "$here/src/deadlock_report_test.cpp" "$out"/{emu_runtime,cudart_stubs,fatal_stub}.o \
  -o "$out/deadlock_report_test" || exit 1
deadlock_report() {  # deadlock_report LOG VAR=VALUE...: passes when the run fails with the report's four waits
  local log=$1 want
  shift
  if env "$@" EMU_TIMEOUT_S=1 "$out/deadlock_report_test" > "$log" 2>&1; then
    echo "the deadlocked block finished: the detector missed it"
    return 1
  fi
  # what|regex (the failure names the what: a message with the regex's "deadlock: " in it would make check()
  # take it for a run that deadlocked and run it again)
  for want in 'the deadlock error|ERROR in .*deadlock: ' \
      'the shuffle|31 thread\(s\) in shfl\.sync \(warp of threads 0\.\.31\): 0-30$' \
      'the named barrier|1 thread\(s\) in bar\.sync 1, 64 \(named barrier\): 31$' \
      'the mbarrier|1 thread\(s\) in mbarrier\.try_wait\.parity 0x[0-9a-f]+ parity 0 \(phase 0: 1 of 2 arrivals, 0 bytes pending\): 63$' \
      'the flag spin|31 thread\(s\) in a spin on the global flag 0x[0-9a-f]+, reading 0: 32-62$'; do
    grep -qE "${want#*|}" "$log" || { echo "the report lacks ${want%%|*} ($log)"; return 1; }
  done
  echo "the report names the 4 waits"
}
for v in EMU_FIBERS=1 EMU_FIBERS=0; do check "deadlock_report $v" deadlock_report "$out/deadlock_report_${v#*=}.txt" $v; done
# Every GPU thread a fiber (README, Fibers): the checks take a fifth of the time they take with an OS thread
# per GPU thread, and the sm_90a kernels' mutants (73 since 2026-11-29) are caught either way. A few checks
# below keep OS threads (EMU_FIBERS=0), whose real concurrency interleaves threads anywhere, not only where
# the emulator switches.
export EMU_FIBERS=${EMU_FIBERS:-1}
check attention_quick "$out/emu_attention" --quick
check attention_test_shapes "$out/emu_attention" --test-shapes
check gemm_all_cases "$out/emu_gemm"
# The forward's persistent grid: 3 blocks (the default) take several units each; one block takes them
# all; 64 blocks take one unit each, as a grid as large as the work does on the GPU.
for v in "EMU_SMEM_OFFSET=0" "EMU_SMEM_OFFSET=16 EMU_SEED=2" "EMU_SMEM_OFFSET=1008 EMU_SEED=3" \
         "EMU_TMA_DELAY_US=0 EMU_WAIT_DELAY_US=0" "EMU_TMA_DELAY_US=3000 EMU_WAIT_DELAY_US=100 EMU_SEED=7" \
         "EMU_SMS=1" "EMU_SMS=64 EMU_SEED=4" "EMU_FIBERS=0"; do
  check "attention_quick $v" env $v "$out/emu_attention" --quick
done
# The ping-pong schedule: the consumers' turns (named barriers) on every grid size and timing.
for v in "EMU_SEED=1" "EMU_SMS=1 EMU_SEED=5" "EMU_SMS=64 EMU_SEED=6" "EMU_TMA_DELAY_US=0 EMU_WAIT_DELAY_US=0" \
         "EMU_TMA_DELAY_US=3000 EMU_WAIT_DELAY_US=100 EMU_SEED=8" "EMU_FIBERS=0"; do
  check "attention_quick --pingpong $v" env $v "$out/emu_attention" --quick --pingpong
done
check "attention_test_shapes --pingpong" "$out/emu_attention" --test-shapes --pingpong
check attention_bwd_quick "$out/emu_attention_bwd" --quick
check attention_bwd_test_shapes "$out/emu_attention_bwd" --test-shapes
# A key tile waits for the dQ turns of the key tiles above it while the grid advances: not a deadlock,
# even with a 5 s bound (a per-wait bound failed this at 4 s on an idle machine, and CI at 20 s, when the
# turns went lowest key tile first and the waits were seconds long).
check "attention_bwd_test_shapes EMU_TIMEOUT_S=5" env EMU_TIMEOUT_S=5 "$out/emu_attention_bwd" --test-shapes
# One and two blocks at a time in ticket order (a ticket order the dQ turns could deadlock in stops here);
# blocks held up to 1 s after taking their ticket, and blocks started last ticket first, each once the
# others stand still (turns that relied on the blocks' timing rather than their waits give wrong sums
# there, and waits that could form a cycle deadlock).
for v in "EMU_CONCURRENT_BLOCKS=1 EMU_SMEM_OFFSET=16 EMU_SEED=2" "EMU_CONCURRENT_BLOCKS=2 EMU_SMEM_OFFSET=1008 EMU_SEED=3" \
         "EMU_TMA_DELAY_US=0 EMU_WAIT_DELAY_US=0" "EMU_TMA_DELAY_US=3000 EMU_WAIT_DELAY_US=100 EMU_SEED=7" \
         "EMU_START_DELAY_US=1000000 EMU_SEED=9" "EMU_START_LAST_FIRST=1 EMU_SEED=10" "EMU_FIBERS=0"; do
  check "attention_bwd_quick $v" env $v "$out/emu_attention_bwd" --quick
done
for v in "EMU_SMS=2" "EMU_SMS=4" "EMU_SMS=4 EMU_CONCURRENT_BLOCKS=1" "EMU_SMEM_OFFSET=16 EMU_SEED=2" \
         "EMU_SMEM_OFFSET=1008 EMU_SEED=3" "EMU_TMA_DELAY_US=0 EMU_WAIT_DELAY_US=0" \
         "EMU_TMA_DELAY_US=3000 EMU_WAIT_DELAY_US=100 EMU_SEED=7" "EMU_FIBERS=0"; do
  check "gemm_quick $v" env $v "$out/emu_gemm" --quick
done
if [[ $mode == --all ]]; then
  check attention_all_shapes "$out/emu_attention"
  check attention_gpt2 "$out/emu_attention" --gpt2
  # 8 blocks at a time (in ticket order, as resident blocks would be) and no added latencies: a key tile
  # waits for the dQ turns of the key tiles above it, and GPT-2's 16 key tiles take long enough as it is
  local_bwd_env=(EMU_CONCURRENT_BLOCKS=8 EMU_TMA_DELAY_US=0 EMU_WAIT_DELAY_US=0)
  check attention_bwd_all_shapes env "${local_bwd_env[@]}" "$out/emu_attention_bwd"
  check attention_bwd_gpt2 env "${local_bwd_env[@]}" "$out/emu_attention_bwd" --gpt2
  check gemm_gpt2 "$out/emu_gemm" --gpt2
fi
echo "emu: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
exit $status
