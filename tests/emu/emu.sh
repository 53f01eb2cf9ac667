#!/usr/bin/env bash
# The sm_90a attention forward (kernels/attention/attention_sm90.cu: TMA, mbarriers, wgmma) run on the
# CPU, without a GPU: the real kernel source compiled by g++ as host C++, every GPU thread of a block a
# std::thread, and the Hopper features it uses emulated from NVIDIA's documentation (README.md here).
#
#   tests/emu/emu.sh BUILD_DIR            build, then the checks CI runs (~1 min): the repository's
#                                         descriptor and fragment helpers against the emulator's, the
#                                         kernel on partial tiles and on AttentionWgmmaForward's shapes,
#                                         other shared-memory offsets and TMA/wgmma timings
#   tests/emu/emu.sh BUILD_DIR --all      also every T in {1..300} x B x NH (~3 min) and GPT-2's shape
#   tests/emu/emu.sh BUILD_DIR --mutants  ten mutants of the kernel, each of which must be caught (~5 min)
# Exit status 0 when every check passes.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:?usage: emu.sh BUILD_DIR [--all|--mutants]}
mode=${2:-ci}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cuda_inc=${GPT2_EMU_CUDA_INCLUDE:-${CUDA_HOME:-/usr/local/cuda}/include}
cxx=(g++ -std=c++17 -O2 -pthread -fno-strict-aliasing -Wall -Wno-unknown-pragmas -Wno-attributes -Wno-class-memaccess)
inc=(-I"$here/include" -I"$repo" -I"$repo/src" -I"$cuda_inc")

# build_kernel SRC BINARY: the emulator around a copy of SRC whose only change is the <<<...>>> launch.
build_kernel() {
  local src=$1 bin=$2 gen="$2.emu.cpp" o
  sed -E 's/([A-Za-z_][A-Za-z_0-9]*)<<<(.*)>>>\((.*)\);/::emu::Launch(\2).run(\1, \3);/' "$src" > "$gen"
  local changed
  changed=$(diff "$src" "$gen" | grep -c '^>')
  [[ $changed == 1 ]] || { echo "emu: expected the launch line alone rewritten in $src, got $changed lines" >&2; return 1; }
  for o in emu_runtime cudart_stubs attention_driver; do
    if [[ ! -f $out/$o.o || $here/src/$o.cpp -nt $out/$o.o || $here/include/emu/runtime.h -nt $out/$o.o ]]; then
      "${cxx[@]}" "${inc[@]}" -c "$here/src/$o.cpp" -o "$out/$o.o" || return 1
    fi
  done
  # The repository's tensor-map helper, unmodified (the stubbed driver entry point hands it the emulator's encoder).
  if [[ ! -f $out/sm90a_host.o || $repo/kernels/common/sm90a_host.cu -nt $out/sm90a_host.o ]]; then
    "${cxx[@]}" "${inc[@]}" -x c++ -c "$repo/kernels/common/sm90a_host.cu" -o "$out/sm90a_host.o" || return 1
  fi
  "${cxx[@]}" "${inc[@]}" -D__CUDA_ARCH_FEAT_SM90_ALL -DKERNEL_SRC="\"$gen\"" -c "$here/src/kernel_tu.cpp" -o "$bin.o" &&
    "${cxx[@]}" -o "$bin" "$out"/{emu_runtime,cudart_stubs,attention_driver,sm90a_host}.o "$bin.o"
}

status=0
check() {  # check NAME CMD...: runs CMD, prints its verdict line
  local name=$1
  shift
  if "$@" > "$out/$name.log" 2>&1; then
    echo "PASS  $name: $(tail -1 "$out/$name.log" | cut -c1-110)"
  else
    echo "FAIL  $name (log: $out/$name.log)"
    grep -E 'FAIL|ERROR' "$out/$name.log" | head -5
    status=1
  fi
}

if [[ $mode == --mutants ]]; then
  python3 "$here/mutations/mutate.py" "$repo/kernels/attention/attention_sm90.cu" "$out/mutants" > "$out/mutants.list" || exit 1
  caught=0 total=0
  while read -r m; do
    total=$((total + 1))
    if ! build_kernel "$out/mutants/$m.cu" "$out/mutant_$m" > "$out/mutant_$m.build.log" 2>&1; then
      echo "MUTANT $m: BUILD FAILED (log: $out/mutant_$m.build.log)"
      continue
    fi
    # wgmma retire up to 2 ms late, so a stage released too early is refilled while a product still reads it
    if EMU_WAIT_DELAY_US=2000 EMU_TIMEOUT_S=15 timeout 120 "$out/mutant_$m" --quick --stop-on-fail \
      > "$out/mutant_$m.log" 2>&1; then
      echo "MUTANT $m: NOT CAUGHT"
    else
      caught=$((caught + 1))
      echo "MUTANT $m: caught: $(grep -m1 -E '\[emu\] ERROR|FAIL ' "$out/mutant_$m.log" | cut -c1-150)"
    fi
  done < "$out/mutants.list"
  echo "mutants caught: $caught of $total"
  ((caught == total)) && exit 0
  exit 1
fi

build_kernel "$repo/kernels/attention/attention_sm90.cu" "$out/emu_attention" || exit 1
# The repository's wgmma_desc and wgmma_acc_row/col (host-callable), taken from ptx.cuh as text.
s=$(grep -n '^enum class WgmmaSwizzle' "$repo/kernels/common/ptx.cuh" | cut -d: -f1)
e=$(grep -n '^__host__ __device__ constexpr int wgmma_acc_col' "$repo/kernels/common/ptx.cuh" | cut -d: -f1)
[[ -n $s && -n $e ]] || { echo "emu: ptx.cuh's layout helpers not found" >&2; exit 1; }
sed -n "${s},$((e + 2))p" "$repo/kernels/common/ptx.cuh" > "$out/repo_ptx_helpers.h"
"${cxx[@]}" -I"$here/include" -I"$out" -I"$repo" -I"$cuda_inc" "$here/src/check_ptx_helpers.cpp" -o "$out/check_ptx_helpers" ||
  exit 1
check layout_helpers "$out/check_ptx_helpers"
check quick_shapes "$out/emu_attention" --quick
check test_shapes "$out/emu_attention" --test-shapes
check smem_offset_0 env EMU_SMEM_OFFSET=0 "$out/emu_attention" --quick
check smem_offset_16 env EMU_SMEM_OFFSET=16 EMU_SEED=2 "$out/emu_attention" --quick
check smem_offset_1008 env EMU_SMEM_OFFSET=1008 EMU_SEED=3 "$out/emu_attention" --quick
check no_delays env EMU_TMA_DELAY_US=0 EMU_WAIT_DELAY_US=0 "$out/emu_attention" --quick
check long_tma_delay env EMU_TMA_DELAY_US=3000 EMU_WAIT_DELAY_US=100 EMU_SEED=7 "$out/emu_attention" --quick
if [[ $mode == --all ]]; then
  check all_shapes "$out/emu_attention"
  check gpt2_shape "$out/emu_attention" --gpt2
fi
echo "emu: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
exit $status
