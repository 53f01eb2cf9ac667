#!/usr/bin/env bash
# One phase of the GPU verification (../shared/GPU.md), made to run on a bare lent machine:
#
#   tools/gpu-bundle.sh                      here: build and pack .gpubundle/gpt2-bundle.tar.xz
#   device run, carry [".gpubundle"], timeout_s 600 (the device budget is 15 minutes a session, the
#   machine's start included, and a second start needs 4 of them left):
#     all phases:   bash tools/gpu-phase.sh A; bash tools/gpu-phase.sh B, then on the warm machine (a call
#                   within 30 s of the last) C and D (2026-11-27: A+B 435 s with the start, C 86 s, D 73 s)
#     list:         bash tools/gpu-phase.sh C --list [--steps REGEX]: the phase's step names, nothing run
#                   (fails naming a --steps entry that is no step of the phase)
#     reruns:       the "rerun:" lines of the last summaries, with --deadline-s to share the call out
#                   (docs/performance.md, "The next lent GPU", says what the next call runs)
#     phase C's step_table judges the call's 124M runs: its A/A steps and its opt-ins against phase A's
#     default steps need phase A in the same call (one $OUT); otherwise run tools/gpu/step_table.py here
#     on both calls' returned folders
#
#   A  is it right, and how fast by default (360 s): the machine (os, glibc, driver, libraries), every
#      GPU test suite, the 124M step with cuBLASLt and the hand GEMM, the two ceilings (copy, cuBLASLt
#      8192^3 bf16) and every kernel against them, the opt-in sm_90a kernels' tests, SASS and benchmarks
#   B  races and the whole program (220 s): gpu.train's end-to-end checks, checkpoint + resume + sampling,
#      compute-sanitizer synccheck/memcheck/racecheck on small filters, tiktoken ids, 2 ranks sharing the GPU
#   C  what decides the defaults (360 s): every opt-in kernel end to end at 124M, the CUDA Graph step,
#      micro-batch 32, ZeRO-1 and --recompute on one GPU, transformers logits on export-hf, ncu
#   D  memory (220 s): --recompute none|selective|full at 124M (tokens/s, device memory measured after
#      the first step), and the 1558M preset at the micro-batch its config says fits on 80 GB
#
# Steps run in the order of what they are worth per device second. Every step runs under `timeout`,
# inside the phase's deadline (--deadline-s; the defaults above add up to 580 s a call); a step the
# deadline leaves no time for is a SKIP, one it cuts short a SKIP "cut", and the phase ends by printing
# the command that reruns exactly those and the failures (`--steps REGEX`, an extended regex matched
# against the whole step name; the kernel table comes with the benchmarks it reads). $OUT holds
# summary_<P>.txt and phase_<P>_logs.tar.gz (the benchmark JSON inside), rewritten after every step, and
# the running step's log: a call that the device budget ends inside a step still brings back what ran
# and that step's output, and its summary names the step and the rerun. The table "step | result | s |
# figure | target" is printed last. GPU steps SKIP on a machine without a GPU, so every phase is rehearsed here
# (tools/gpu-rehearse.sh). A --steps entry that names no step of the phase fails it. Exit status: 0 when no
# step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

phase=${1:-}
shift || true
bundle_archive=$repo/.gpubundle/gpt2-bundle.tar.xz
case $phase in
  A | C) deadline_s=360 ;;
  B | D) deadline_s=220 ;;
  *) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
only_steps=""
list_only=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --bundle) bundle_archive=$2; shift 2 ;;
    --deadline-s) deadline_s=$2; shift 2 ;;
    --steps) only_steps=$2; shift 2 ;;
    --list) list_only=1; shift ;;
    *) echo "gpu-phase: unknown argument $1" >&2; exit 2 ;;
  esac
done

# compute-sanitizer, ncu and cuobjdump: the image's CUDA may not be on PATH (then 12 steps would SKIP)
export PATH="$PATH:/usr/local/cuda/bin"
work=$(mktemp -d /tmp/gpt2-phase.XXXXXX)
OUT=${OUT:-/tmp/gpt2-phase-$phase}
((list_only)) && OUT=$work/out  # --list runs nothing and leaves nothing
mkdir -p "$OUT"
logs=$work/logs
mkdir -p "$logs"
t_start=$SECONDS
declare -a rows=()
declare -a rerun=()  # failed steps and those the deadline skipped or cut: the next call's --steps
failures=0
state="still running"  # in the summary's last line: still running, done or interrupted
running=""  # the step under way, in the summary: a call cut short names the step it was in

# ---- the table and the logs in $OUT after every step, and the 8-file limit, whatever happens ------
write_summary() {
  {
    printf '\n%-30s | %-6s | %4s | %-52s | %s\n' step result s figure target
    printf '%s\n' "-------------------------------+--------+------+------------------------------------------------------+--------------------"
    printf '%s\n' "${rows[@]}"
    local again=("${rerun[@]}")
    if [[ -n $running ]]; then
      # Read from a call that ended inside this step: it and every step after it are still to run.
      printf 'running: %s (if the call ended here: this step and the ones after it did not finish)\n' "$running"
      again+=("${running%% *}")
    fi
    if ((${#again[@]})); then
      local IFS='|'
      printf 'rerun: bash tools/gpu-phase.sh %s --steps '"'"'%s'"'"'\n' "$phase" "${again[*]}"
    fi
    printf 'phase %s: %d step(s), %d failed, %d s, %s%s\n' "$phase" "${#rows[@]}" "$failures" $((SECONDS - t_start)) \
      "$([[ $state == done ]] || echo "$state, ")" "${gpu_name:-no GPU}"
  } > "$OUT/summary_$phase.txt"
  # gzip, not xz: this runs after every step, and the logs are text
  tar -C "$work" -czf "$OUT/phase_${phase}_logs.tar.gz" logs 2>/dev/null
}
# On exit, whatever ended the phase: the final summary and logs, then the table as the last output.
# $OUT holds only each phase's summary and logs archive (the benchmark JSON is in the archive), and the
# running step's log while a step runs: 3 files a phase, within the 8 a device call brings back.
finish() {
  local rc=$?
  trap - EXIT INT TERM
  [[ $state == interrupted ]] || state=done
  # interrupted inside a step: its log into the archive, and the step stays in the rerun line
  [[ -f $OUT/running_step_$phase.log ]] && mv "$OUT/running_step_$phase.log" "$logs/${running%% *}.log"
  [[ $state == interrupted ]] || running=""
  write_summary
  rm -rf "$work"
  cat "$OUT/summary_$phase.txt"
  ((failures == 0 && rc == 0)) && exit 0
  exit 1
}
trap finish EXIT
trap 'echo "gpu-phase: interrupted"; state=interrupted; exit 1' INT TERM

# selected NAME: the step is wanted (no --steps, or its name matches it). The bundle's unpacking is
# always reported. Every step calls it first, so known_steps ends up naming every step of the phase; under
# --list nothing is selected, so the phase runs through naming its steps and running none.
declare -a known_steps=()
selected() {
  known_steps+=("$1")
  ((list_only == 0)) || return 1
  [[ -z $only_steps || $1 == unpack ]] || [[ $1 =~ ^($only_steps)$ ]]
}

# row NAME RESULT FIGURE TARGET [SECONDS]: one line now, one row of the final table (rewritten in $OUT)
row() {
  selected "$1" || return 0
  local line
  line=$(printf '%-30s | %-6s | %4s | %-52s | %s' "$1" "$2" "${5:-}" "${3:0:52}" "$4")
  rows+=("$line")
  printf '[%4d s] %s\n' $((SECONDS - t_start)) "$line"
  [[ $2 == FAIL ]] && failures=$((failures + 1))
  # (and what the sandbox kept from running: the next lent machine may be a Firecracker one)
  if [[ $2 == FAIL || $3 == "deadline: not started" || $3 == cut* || $3 == "no benchmark results" ||
        $3 == *"on gVisor" ]]; then
    case $1 in
      # the kernel table reads what these write: it and they go together
      ceilings | kernels | bench_gemm_wgmma | bench_attention_wgmma | kernel_table) add_rerun ceilings kernels "$1" kernel_table ;;
      *) add_rerun "$1" ;;
    esac
  fi
  write_summary
  return 0
}
add_rerun() {
  local n
  for n in "$@"; do [[ " ${rerun[*]} " == *" $n "* ]] || rerun+=("$n"); done
}

# step NAME TIMEOUT_S TARGET CMD...: runs CMD with its output in logs/NAME.log. Exit 77 = SKIP (the
# project's "no GPU"). The figure is what figure_NAME prints from the log, if that function exists.
# A step is not started with under 10 s of the phase's deadline left, and one whose timeout the
# deadline shortened and that runs into it is "cut", not failed: both SKIP, both in the rerun line.
step() {
  local name=$1 limit=$2 target=$3
  shift 3
  selected "$name" || return 0
  local left=$((deadline_s - (SECONDS - t_start))) cut=0
  if ((left < 10)); then row "$name" SKIP "deadline: not started" "$target"; return 0; fi
  ((limit > left)) && { limit=$left; cut=1; }
  local t0=$SECONDS rc
  running="$name (from $((SECONDS - t_start)) s, limit $limit s)"
  write_summary
  # Through bash -c so that the phase's own functions (exported below) run under timeout too. The log is
  # in $OUT while the step runs, so that a call ended inside it still brings it back.
  timeout -k 5 "$limit" bash -c '"$@"' "$name" "$@" > "$OUT/running_step_$phase.log" 2>&1
  rc=$?
  mv "$OUT/running_step_$phase.log" "$logs/$name.log"
  running=""
  local fig="" took=$((SECONDS - t0))
  declare -F "figure_$name" >/dev/null && fig=$("figure_$name" "$logs/$name.log" 2>/dev/null | head -1)
  case $rc in
    0) row "$name" PASS "${fig:-ok}" "$target" "$took" ;;
    77) row "$name" SKIP "$(grep -m1 -o 'skipped.*' "$logs/$name.log" | cut -c1-52)" "$target" "$took" ;;
    124 | 137)
      if ((cut)); then row "$name" SKIP "cut by the phase deadline after ${limit} s" "$target" "$took"
      else row "$name" FAIL "timed out after ${limit} s" "$target" "$took"; fi ;;
    *) row "$name" FAIL "exit $rc: $(grep -m1 -iE 'error|fail' "$logs/$name.log" | cut -c1-30)" "$target" "$took" ;;
  esac
}
# gpu_step: a step that needs the GPU; without one it is a SKIP, not a FAIL. A caller that sets
# gpu_skip (local) to a reason makes it a SKIP for that reason (a tool missing, or useless in this sandbox),
# after its filter is checked.
gpu_step() {
  selected "$1" || return 0
  filter_selects "$1" "$3" "${@:4}" || return 0
  if [[ -n ${gpu_skip:-} ]]; then row "$1" SKIP "$gpu_skip" "$3"; return 0; fi
  if [[ -z ${gpu_name:-} ]]; then row "$1" SKIP "no GPU on this machine" "$3"; return 0; fi
  step "$@"
}

# ---- unpack the bundle (never into /) and find the device's cuBLASLt and NCCL --------------------
B=$work/bundle
bin=$B/bin
if ((list_only)); then
  :  # no bundle needed: nothing runs
elif [[ ! -f $bundle_archive ]]; then
  row unpack FAIL "no $bundle_archive" "tools/gpu-bundle.sh here, carry .gpubundle"
  exit 1
else
  tar -C "$work" -xJf "$bundle_archive" || { row unpack FAIL "cannot unpack $bundle_archive" ""; exit 1; }
  row unpack PASS "$(du -sm "$B" | cut -f1) MiB, $(sed -n 2p "$B/MANIFEST" | cut -c8-19)" "bundle unpacked"
fi

# lib_dir SONAME: the first directory holding SONAME among the device's CUDA and the torch wheels.
lib_dir() {
  local d
  for d in $(python3 - "$1" 2>/dev/null <<'PY'
import importlib, sys
for mod in ("nvidia.nccl", "nvidia.cublas", "nvidia.cu13", "nvidia"):
    try:
        m = importlib.import_module(mod)
    except Exception:
        continue
    for p in list(getattr(m, "__path__", [])):  # namespace packages have no __file__
        print(p + "/lib"); print(p + "/cu13/lib")
PY
  ) /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    [[ -e $d/$1 ]] && { echo "$d"; return 0; }
  done
  return 1
}
nccl_dir=$(lib_dir libnccl.so.2)
cublas_dir=$(lib_dir libcublasLt.so.13)
export GPT2_DEVICE_LIBS=${cublas_dir}${nccl_dir:+:$nccl_dir}
# NCCL's bootstrap in a VM that has only loopback (GPU.md).
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_IB_DISABLE=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
# The lent machines run under Firecracker or gVisor (the device tool's KINDS.md). gVisor reports kernel
# 4.4.0, and there compute-sanitizer refuses the device ("Device not supported", error 999) and ncu cannot
# load its profiler library: those steps SKIP with that reason instead of failing for the sandbox's sake.
sandbox=$([[ $(uname -r) == 4.4.0* ]] && echo gvisor || echo other)

probe() {
  echo "date: $(date -u +%FT%TZ)"; cat /etc/os-release 2>/dev/null | grep -E '^(PRETTY_NAME|VERSION_ID)='
  ldd --version | head -1; echo "kernel $(uname -r) ($sandbox)"; nproc; free -g | sed -n 2p
  nvidia-smi || echo "nvidia-smi: none"
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv 2>/dev/null
  command -v nvcc && nvcc --version | tail -2
  echo "cuBLASLt from: ${cublas_dir:-NOT FOUND}"; echo "NCCL from: ${nccl_dir:-NOT FOUND}"
  python3 -c 'import sys; print("python", sys.version.split()[0])'
  for m in torch transformers tiktoken h5py; do
    python3 -c "import $m; print('$m', getattr($m, '__version__', '?'))" 2>/dev/null || echo "$m: missing"
  done
  for t in compute-sanitizer ncu cuobjdump; do command -v $t || echo "$t: missing"; done
  cat "$B/MANIFEST" | head -8
}
figure_probe() { echo "${gpu_name:-no GPU}${driver:+, driver $driver}, $(grep -m1 PRETTY_NAME /etc/os-release | cut -d'"' -f2)"; }

# Every bundled ELF resolves every library: from the bundle, the device's cuBLASLt/NCCL, or the system.
ldd_check() {
  local f deps missing=0
  for f in "$B"/libexec/* "$B"/lib/*.so* "$B"/ompi/bin/* "$B"/ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so \
           "$B"/pmix/lib/pmix/*.so; do
    [[ -f $f ]] || continue
    deps=$(LD_LIBRARY_PATH="$B/lib:$GPT2_DEVICE_LIBS" ldd "$f" 2>&1)  # whole: no SIGPIPE status under pipefail
    if grep -q "not found" <<<"$deps"; then
      echo "$f:"; grep "not found" <<<"$deps"
      missing=$((missing + 1))
    fi
  done
  echo "files with unresolved libraries: $missing"
  ((missing == 0))
}
figure_ldd_check() { grep -o 'unresolved libraries: [0-9]*' "$1"; }

# listed CMD...: how many tests or benchmarks the filter in CMD (--gtest_filter= or --benchmark_filter=)
# selects from the bundled binary CMD runs, by the binary's own listing, which needs no GPU; nothing when
# CMD has no filter. A filter that selects nothing would make a step pass on a lent GPU having run nothing
# (a lookahead that Google Benchmark 1.7 could not compile did, in `kernels`), so it fails everywhere.
listed() {
  local exe="" filter="" a flags=()
  for a in "$@"; do
    case $a in
      "$bin"/*) [[ -z $exe ]] && exe=$a ;;
      --gtest_filter=* | --benchmark_filter=*) filter=$a ;;
      --benchmark_out=* | --benchmark_out_format=*) ;;
      # the other flags go to the listing too: one the bundle's Google Benchmark does not know (1.7 takes
      # --benchmark_min_time=0.2, not 0.2s) ends it with an error, and selects nothing
      --benchmark_*) flags+=("$a") ;;
    esac
  done
  [[ -n $exe && -n $filter ]] || return 0
  local listing
  case $filter in
    --gtest_filter=*) listing=$("$exe" --gtest_list_tests "$filter" 2>&1) || { echo "-1"; return 0; }
                      grep -c '^  ' <<<"$listing" ;;
    *) listing=$("$exe" --benchmark_list_tests=true "$filter" "${flags[@]}" 2>/dev/null) || { echo "-1"; return 0; }
       grep -c . <<<"$listing" ;;
  esac
}
# filter_selects NAME TARGET CMD...: true when CMD's filter selects something (or it has none); otherwise
# the step's FAIL row.
filter_selects() {
  local n
  n=$(listed "${@:3}")
  [[ -z $n || $n -gt 0 ]] && return 0
  if ((n < 0)); then row "$1" FAIL "listing failed (a flag, a library?)" "$2"
  else row "$1" FAIL "its filter selects no test or benchmark" "$2"; fi
  return 1
}
# ran_kernels RES METRICS CMD...: runs CMD (gpt2-train); it must succeed and its "kernels:" line must match
# every regex in RES, one a line (the paths the step is about: train_124m). The run's metrics.jsonl (its --out)
# is copied to METRICS, in the logs archive: the per-step times that tools/gpu/step_table.py judges it by.
ran_kernels() {
  local res=$1 metrics=$2 out re line rc a prev="" dir=""
  shift 2
  for a in "$@"; do [[ $prev == --out ]] && dir=$a; prev=$a; done
  out=$(mktemp)
  "$@" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  line=$(grep -m1 '^kernels: ' "$out")
  rm -f "$out"
  [[ -n $dir && -f $dir/metrics.jsonl ]] && cp "$dir/metrics.jsonl" "$metrics"
  ((rc == 0)) || return "$rc"
  mapfile -t res <<< "$res"
  for re in "${res[@]}"; do
    [[ $line =~ $re ]] || { echo "error: the run did not use the kernel it is about: '${line:-no kernels: line}' lacks /$re/"; return 1; }
  done
}
# Runs a bundled test binary, mapping the project's "skipped: no GPU" (exit 77) through; a filter that
# selects no test is an error (listed).
gtest() {
  local n
  n=$(listed "$bin/$1" "${@:2}")
  if [[ -n $n && $n -lt 0 ]]; then echo "error: $1 failed to list its tests (an unknown flag, a missing library?)"; return 1; fi
  if [[ -n $n && $n -eq 0 ]]; then echo "error: the filter selects no test: $1 ${*:2}"; return 1; fi
  "$bin/$1" --gtest_color=no "${@:2}"
}

# ---- the steps, one function each where a phase runs them ------------------------------------------
# train_124m NAME TARGET MICRO_BATCH GEMM [VAR=VALUE ...] [-- MORE_ARGS]: 12 steps of the 124M model on
# synthetic tokens (--benchmark), one micro-batch a step unless MORE_ARGS names --global-batch-tokens; the
# figure is the tokens/s and MFU of the mean step after the first without the profiled one (--benchmark's
# mean; until 2026-12-07 the last step's), and the two kinds of op that took most of step 11's device time
# (--profile-step 11: its table, every op's ms, share and rate, is in the step's log and metrics.jsonl, which
# goes to the logs archive as logs/NAME.metrics.jsonl). TARGET is read by tools/gpu/step_table.py: clauses
# ">= NK tok/s", "within N% of STEP", "faster than STEP", "slower than STEP", "vs STEP", "same as STEP"
# (an A/A repeat), joined by "; " (tests/tools/test_step_table.py holds every target here to that). The run's "kernels:"
# line must show the GEMM backend asked for and, for each GPT2_ATTENTION_*/GPT2_GEMM_SM90 opt-in, that
# the opt-in ran: one that does not apply falls back without an error, and the step would have measured
# the default under the opt-in's name.
train_124m() {
  local name=$1 target=$2 mb=$3 gemm=$4 vars=() more=() v
  shift 4
  while [[ $# -gt 0 && $1 != -- ]]; do vars+=("$1"); shift; done
  [[ ${1:-} == -- ]] && { shift; more=("$@"); }
  local batch=(--global-batch-tokens $((mb * 1024)))
  [[ " ${more[*]:-} " == *" --global-batch-tokens "* ]] && batch=()
  local expect=("gemm: ([^;]*, )?$([[ $gemm == hand ]] && echo hand || echo cublaslt)")
  # The hand GEMM's default on compute capability 9.0 is its wgmma kernel with 128x256 tiles: a run that fell
  # back (a binary without sm_90a code) would give mma.sync's figure under the default's name.
  if [[ $gemm == hand && " ${vars[*]:-} " != *" GPT2_GEMM_SM90="* &&
        $(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1) == 9.0 ]]; then
    expect+=("gemm: ([^;]*, )?hand wgmma 128x256(,|;|\$)")
  fi
  for v in "${vars[@]}"; do
    case $v in
      GPT2_ATTENTION_FWD=mma-sync) expect+=("attention forward: mma\\.sync(;|\$)") ;;  # recorded as mma.sync
      GPT2_ATTENTION_FWD=*) expect+=("attention forward: ${v#*=}(;|\$)") ;;
      GPT2_ATTENTION_BWD=*) expect+=("attention backward: ${v#*=}(;|\$)") ;;
      GPT2_GEMM_SM90=0) expect+=("gemm: hand mma\\.sync(;|\$)") ;;  # mma.sync alone, no wgmma product
      GPT2_GEMM_SM90=1) expect+=("gemm: ([^;]*, )?hand wgmma 128x128(,|;|\$)") ;;
      GPT2_GEMM_SM90=by-shape) expect+=("gemm: ([^;]*, )?hand wgmma 128x256(,|;|\$)"
                                        "gemm: ([^;]*, )?hand wgmma 128x128-pingpong(,|;|\$)") ;;
      GPT2_GEMM_SM90=*) expect+=("gemm: ([^;]*, )?hand wgmma ${v#*=}(,|;|\$)") ;;
      # at least one bias gradient in a cuBLASLt epilogue, a weight gradient's (BGRADA, or BGRADB on row-major
      # layouts) or MLP down's GELU gradient's (DGELU_BGRAD: MLP up's); the others: the bias kernel
      GPT2_CUBLASLT_BIAS_GRAD=bf16)
        expect+=("bias gradient: ([^;]*, )?cublaslt (dgelu |row-major )?epilogue bf16(,|;|\$)") ;;
      # at least one hand GEMM epilogue stored its rows with bulk copies
      GPT2_GEMM_STORE=bulk) expect+=("gemm store: bulk(;|\$)") ;;
      # every launch of ours with the programmatic attribute, none in plain stream order
      GPT2_PDL=on) expect+=("launch: programmatic(;|\$)") ;;
      # the qkv bias gradient from the attention backward's column sums
      GPT2_ATTENTION_BIAS_SUMS=on) expect+=("bias gradient: ([^;]*, )?attention column sums(,|;|\$)") ;;
    esac
  done
  declare -F "figure_$name" >/dev/null || eval "figure_$name() { train_figure \"\$1\"; }"
  gpu_step "$name" 150 "$target" ran_kernels "$(printf '%s\n' "${expect[@]}")" "$logs/$name.metrics.jsonl" env "${vars[@]}" "$bin/gpt2-train" --model gpt2-124m --device cuda --benchmark \
    --gemm "$gemm" --max-steps 12 --log-every 1 --micro-batch "$mb" --seq-len 1024 \
    "${batch[@]}" --profile-step 11 --out "$work/$name" "${more[@]}"
}
# sanitize NAME TOOL TARGET BINARY FILTER: compute-sanitizer on a small gtest filter
sanitize() {
  local gpu_skip=""
  command -v compute-sanitizer >/dev/null || gpu_skip="compute-sanitizer not installed"
  [[ $sandbox == gvisor ]] && gpu_skip="compute-sanitizer does not run on gVisor"
  gpu_step "$1" 240 "$3" compute-sanitizer --target-processes all --error-exitcode 9 --print-limit 20 --tool "$2" \
    "$bin/$4" --gtest_filter="$5"
}

# ncu_hot_kernels: ncu's speed-of-light and memory sections of the hottest kernels of a 124M step (the
# default step's GEMMs are cuBLASLt's: nvjet_* on Hopper with CUDA 12.6+, sm90_xmma_* or cutlass_* before)
ncu_hot_kernels() {
  local gpu_skip=""
  command -v ncu >/dev/null || gpu_skip="ncu not installed"
  [[ $sandbox == gvisor ]] && gpu_skip="ncu has no counters on gVisor"
  gpu_step ncu_hot_kernels 180 "profiles" ncu --clock-control none --target-processes all \
    -k 'regex:gemm|nvjet|xmma|cutlass|attention|layernorm|softmax' --launch-skip 40 --launch-count 12 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --csv --page details \
    "$bin/gpt2-train" --model gpt2-124m --device cuda --benchmark --max-steps 3 --micro-batch 8 --seq-len 1024 \
    --global-batch-tokens 8192 --out "$work/ncu"
}

# ncu_launches STEP LIMIT KERNEL=BENCHMARK...: one launch of each KERNEL (a regex of its name) profiled in
# bench_gpu_kernels' run of BENCHMARK (a regex of the benchmark's full name), with the sections and stall
# metrics that say what holds a kernel back; tools/gpu/ncu_summary.py makes one line of each
# (docs/performance.md, "Attention's block order", says how to read them).
ncu_launches() {
  local name=$1 limit=$2 gpu_skip="" stalls="" r specs
  shift 2
  specs=$(printf '%q ' "$@")  # quoted for the script below (a kernel regex may hold '|')
  command -v ncu >/dev/null || gpu_skip="ncu not installed"
  [[ $sandbox == gvisor ]] && gpu_skip="ncu has no counters on gVisor"
  for r in long_scoreboard short_scoreboard barrier mio_throttle math_pipe_throttle wait not_selected lg_throttle \
      membar dispatch_stall no_instruction; do
    stalls+="${stalls:+,}smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
  done
  # One log per launch ($logs/STEP_N.csv), summarised under the benchmark it ran in.
  gpu_step "$name" "$limit" "one line a kernel" bash -c "
    i=0
    for k in $specs; do
      i=\$((i + 1))
      ncu --clock-control none -k \"regex:\${k%%=*}\" --launch-count 1 --section SpeedOfLight --section LaunchStats \
        --section Occupancy --section SchedulerStats --section ComputeWorkloadAnalysis \
        --metrics $stalls,smsp__warps_eligible.avg.per_cycle_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum \
        --csv --page details '$bin/bench_gpu_kernels' --benchmark_filter=\"\${k#*=}\" \
        --benchmark_min_time=0.01 > '$logs/${name}_'\$i.csv || exit 1
      echo \"in \${k#*=}\"
      python3 '$repo/tools/gpu/ncu_summary.py' '$logs/${name}_'\$i.csv || exit 1
    done"
}
# ncu_attention: why attention misses its targets (H100: the backward at 103 of 200 TFLOP/s): the default
# forward and backward (mma.sync, recompute-dq) and the wgmma backward at B*T = 8192.
ncu_attention() {
  ncu_launches ncu_attention 150 attention_fwd_tc='^BM_attention_forward_bf16/8/0/0/' \
    attention_bwd_tc='^BM_attention_backward_bf16/8/0/0/' attention_bwd_wgmma_tma='^BM_attention_backward_bf16/8/0/2/'
}
# ncu_layernorm: why layernorm misses 80% of copy (H200: the backward at 40% at 8192 rows, 61% at 65536; the
# forward 46% and 72%): is the backward's row loop issue-bound (its shared-memory dweight/dbias sums) or
# latency-bound (a warp's rows one after another; 4 blocks of 8 warps an SM since 2026-11-28, 3
# before)? And what its second kernel (the partial sums: 192 blocks at C = 768 since 2026-11-28, 48
# before) adds at 8192 rows. The 124M step's 16384 rows sit between. Last, the backward with two rows in
# flight a warp (2026-12-02) at 65536 rows, against the line before it.
ncu_layernorm() {
  ncu_launches ncu_layernorm 110 layernorm_fwd_warp_per_row_vec='^BM_layernorm_fwd_bf16/65536/768/' \
    layernorm_bwd_warp_per_row_vec='^BM_layernorm_bwd_bf16/8192/768/' \
    column_sums_add='^BM_layernorm_bwd_bf16/8192/768/' \
    layernorm_bwd_warp_per_row_vec='^BM_layernorm_bwd_bf16/65536/768/' \
    layernorm_bwd_warp_per_row_vec='^BM_layernorm_bwd_prefetch_bf16/65536/768/'
}
# ncu_gemm_epilogue: why the hand GEMM's GELU epilogues cost what they do (H200, 2026-11-27: mlp_up's forward
# 1.51x the same product without its epilogue on 128x128 tiles, mlp_down's input gradient 1.63x, and 2.61x on
# the 128x256 default; cuBLASLt 1.34x and 1.40x): each with and without its epilogue, the 128x256 kernel's
# input gradient also without its L2 prefetch of the pre-activations (2026-12-06), and cuBLASLt's forward for
# what its epilogue does. Issue slots, stalls and the tensor pipe
# say whether the epilogue waits on latency (a warpgroup's dependent chains while the tensor cores idle) or
# on issue, and so whether more vectors in flight or fewer instructions is the fix.
ncu_gemm_epilogue() {
  ncu_launches ncu_gemm_epilogue 120 gemm_bf16_wgmma_tma_persistent='^Gemm/bf16/hand_wgmma/mlp_up/fwd/BT:8192/' \
    gemm_bf16_wgmma_tma_persistent='^GemmNoEpilogue/bf16/hand_wgmma/mlp_up/fwd/BT:8192/' \
    gemm_bf16_wgmma_tma_persistent='^Gemm/bf16/hand_wgmma/mlp_down/dinp/BT:8192/' \
    gemm_bf16_wgmma_tma_persistent='^GemmNoEpilogue/bf16/hand_wgmma/mlp_down/dinp/BT:8192/' \
    gemm_bf16_wgmma_tma_persistent='^Gemm/bf16/hand_wgmma256/mlp_down/dinp/BT:8192/' \
    gemm_bf16_wgmma_tma_persistent='^GemmNoEpilogue/bf16/hand_wgmma256/mlp_down/dinp/BT:8192/' \
    gemm_bf16_wgmma_tma_persistent='^GemmNoAuxPrefetch/bf16/hand_wgmma256/mlp_down/dinp/BT:8192/' \
    'nvjet|xmma|gemm|cutlass=^Gemm/bf16/cublaslt/mlp_up/fwd/BT:8192/'
}

# ---- phase A: is it right, and how fast by default -------------------------------------------------
bench_json=$logs/bench_gpu_kernels.json
phase_A() {
  step probe 60 "os, glibc, driver, libraries" probe
  step ldd_check 120 "0 unresolved" ldd_check
  # Most GPU steps start gpt2-train without mpirun (an MPI singleton): it must start from the bundle alone.
  step cpu_train_singleton 60 "starts without mpirun" "$bin/gpt2-train" --config "$repo/configs/ci.ini" --device cpu \
    --train-data "$B/data/train.h5" --val-data "$B/data/val.h5" --max-steps 3 --out "$work/cpu1"
  step gpu_smoke 60 "kernel == CPU" "$bin/test_gpu_smoke"
  local fam
  for fam in encoder layernorm gemm attention elementwise; do
    step "kernels_$fam" 240 "== CPU reference" gtest "test_gpu_$fam" \
      --gtest_filter='-GemmWgmma.*:AttentionWgmmaForward.*:AttentionWgmmaBackward.*:AttentionWgmmaStoreDs.*'
  done
  step model_step_vs_cpu 240 "loss 1e-5, grads 1e-4" gtest test_gpu_model
  # A diagnosis, not a check: GemmRounding under each split-K setting (fp32 sums, the default; any scheme;
  # K never split), with every cuBLASLt plan logged: which algorithms the card's cuBLASLt picks, and how
  # they round (H200, 2026-11-27: C += rounds the product first unless K is split)
  step diagnose_lt_reduction 90 "outputs over 1% rounded twice, per split-K" bash -c 'for r in fp32 any none; do
      echo "== GPT2_CUBLASLT_REDUCTION=$r"
      GPT2_CUBLASLT_REDUCTION=$r GPT2_CUBLASLT_LOG_PLANS=1 gtest test_gpu_gemm --gtest_filter="GemmRounding.*" 2>&1
      rc=$?; ((rc == 77)) && exit 77; ((rc > 1)) && exit $rc  # 1: a test failed, which is the figure; else a crash
    done; exit 0'
  # The sm_90a kernels' own suites (wgmma + TMA), each family in a process of its own: a kernel that traps
  # (a barrier wait that never completes traps after ~10 s) leaves the CUDA context unusable for the rest of
  # its process. (kernels_gemm, above, is a process of its own too: on 9.0 the hand GEMM's default is its
  # wgmma kernel with 128x256 tiles since 2026-12-02.)
  step kernels_gemm_wgmma 240 "== CPU, all transposes" gtest test_gpu_gemm --gtest_filter='GemmWgmma.*'
  step kernels_attention_wgmma 240 "== CPU and mma.sync" gtest test_gpu_attention \
    --gtest_filter='AttentionWgmmaForward.*:AttentionWgmmaBackward.*:AttentionWgmmaStoreDs.*'
  # They were compiled here without a disassembler: their SASS must hold HGMMA and UTMALDG.
  if command -v cuobjdump >/dev/null; then
    step sass_sm90a 60 "HGMMA + UTMALDG, no HMMA" sass_sm90a
  else
    row sass_sm90a SKIP "cuobjdump not installed" "HGMMA + UTMALDG, no HMMA"
  fi
  # The headline figures: the default step, then the hand GEMM in its place (on compute capability 9.0 its
  # wgmma kernel with 128x256 tiles; phase C's opt_gemm_mma_sync runs mma.sync there).
  train_124m train_124m_cublaslt_mb16 ">= 470K tok/s" 16 cublaslt
  train_124m train_124m_hand_mb16 "within 15% of train_124m_cublaslt_mb16" 16 hand
  # The same default step with the work between optimizer steps that llm.c's ~468K tok/s a GPU on 8 H100s is
  # measured with (-b 64 -t 1024: 65536 tokens a GPU): 4 micro-batches of 16 accumulated, so the update, the
  # gradient norm and the gradients' zeroing come once in 65536 tokens, not once in 16384 as above
  train_124m train_124m_cublaslt_64k ">= 470K tok/s" 16 cublaslt -- --global-batch-tokens 65536
  gpu_step ceilings 90 "~3.0 TB/s, ~800 TFLOP/s" "$bin/bench_gpu_kernels" --benchmark_filter='^Ceiling/' \
    --benchmark_out="$logs/ceilings.json" --benchmark_out_format=json --benchmark_min_time=0.2
  # Every kernel on its default path (the hand GEMM's `hand` rows on mma.sync: its 9.0 default is among the
  # hand_wgmma256 rows below); the Hopper kernels below, in processes of their own. (A
  # leading '-' excludes what the rest matches: the bundle's Google Benchmark 1.7 has POSIX regexes, where
  # a (?!...) lookahead does not compile and selects nothing.)
  gpu_step kernels 240 "see kernel_table" "$bin/bench_gpu_kernels" \
    --benchmark_filter='-^(Ceiling/|(Gemm|GemmNoEpilogue|GemmAuxFromGlobal|GemmNoAuxPrefetch|GemmBulkStore|WeightBiasGrad)/bf16/hand_wgmma|BM_attention_forward_bf16/[0-9]+/0/[12]/|BM_attention_backward_bf16/[0-9]+/0/[24]/)' \
    --benchmark_out="$bench_json" --benchmark_out_format=json --benchmark_min_time=0.05
  # 128x128 tiles (hand_wgmma), 128x256 (hand_wgmma256), 128x128 ping-pong (hand_wgmma_pingpong), and the
  # 128x128 weight gradient with its bias gradient fused and not, the products with an epilogue again
  # without it, and the GELU gradient's pre-activations read in the epilogue instead of by TMA ...
  gpu_step bench_gemm_wgmma 150 ">= 80% of cuBLASLt" "$bin/bench_gpu_kernels" \
    --benchmark_filter='^(Gemm|GemmNoEpilogue|GemmAuxFromGlobal|GemmNoAuxPrefetch|GemmBulkStore|WeightBiasGrad)/bf16/hand_wgmma' \
    --benchmark_out="$logs/bench_gemm_wgmma.json" --benchmark_out_format=json --benchmark_min_time=0.05
  # ... and the attention forward (cooperative /0/1, ping-pong /0/2) and backward (/0/2; storing dS /0/4) on wgmma
  gpu_step bench_attention_wgmma 120 ">= 230 / 200 TFLOP/s" "$bin/bench_gpu_kernels" \
    --benchmark_filter='^BM_attention_(forward_bf16/[0-9]+/0/[12]|backward_bf16/[0-9]+/0/[24])/' \
    --benchmark_out="$logs/bench_attention_wgmma.json" --benchmark_out_format=json --benchmark_min_time=0.05
  # % of ceiling and of target for every kernel, and each opt-in against what runs by default: the
  # device's python, not the bundle's libraries.
  if [[ -f $logs/ceilings.json && -f $bench_json ]]; then
    local extra=() f
    for f in "$logs/bench_gemm_wgmma.json" "$logs/bench_attention_wgmma.json"; do [[ -f $f ]] && extra+=("$f"); done
    step kernel_table 30 "every kernel at target" python3 "$repo/tools/gpu/bench_table.py" "$logs/ceilings.json" \
      "$bench_json" "${extra[@]}"
  else
    row kernel_table SKIP "no benchmark results" "every kernel at target"
  fi
  step decode_kv_cache 120 "== CPU decode" gtest test_gpu_decode
  step reducer_1rank 60 "exact" "$bin/mpirun" -n 1 "$bin/test_gpu_reducer"
  # bench_allreduce's device path, what slurm/scaling.sh measures on GPUs: NCCL on one rank, every size checked
  # (a wrong result exits 1); the figure is its 64 MiB row, a device copy at one rank
  gpu_step allreduce_nccl_1rank 60 "nccl bf16 device, checked" env GPT2_BENCH_DEVICE=cuda GPT2_BENCH_MAX_MB=64 \
    "$bin/mpirun" -n 1 "$bin/bench_allreduce"
}

# ---- phase B: races and the whole program -------------------------------------------------------
phase_B() {
  step probe 60 "os, glibc, driver, libraries" probe
  # 200 s: inside the phase's 220 s when unpacking the bundle and the probe took under 20 s (a few s each),
  # so that a hang in it is a FAIL, not a SKIP "cut"
  gpu_step gpu_train 200 "7 end-to-end checks" python3 "$repo/tests/gpu/test_gpu_train.py" "$bin" "$work/gpu_train" \
    "$bin/mpirun"
  gpu_step checkpoint_resume 120 "resumes at step 20, samples" bash -c "
    '$bin/gpt2-train' --config '$repo/configs/ci.ini' --device cuda --train-data '$B/data/train.h5' --val-data '$B/data/val.h5' \
      --max-steps 20 --ckpt-every 10 --out '$work/ckpt' &&
    '$bin/gpt2-train' --config '$repo/configs/ci.ini' --device cuda --train-data '$B/data/train.h5' --val-data '$B/data/val.h5' \
      --max-steps 30 --ckpt-every 10 --resume auto --out '$work/ckpt' > '$work/resume.log' 2>&1; rc=\$?
    cat '$work/resume.log'
    ((rc == 0)) && grep -q 'resumed from .* at step 20' '$work/resume.log' &&
      grep -q 'step_00000030' '$work/ckpt/ckpt/latest' &&
    '$bin/gpt2-sample' --device cuda --ckpt '$work/ckpt' --prompt 'In the beginning' --max-new-tokens 64 --seed 1"
  # The Hopper kernels' TMA, mbarriers and wgmma across a producer and two consumer warpgroups (the
  # backward's named barriers around its dS^T tile and its dQ turns too), which nothing but a GPU checks.
  sanitize synccheck_attention_wgmma synccheck "0 hazards" test_gpu_attention 'AttentionWgmmaForward.AgreesWithMmaSync'
  sanitize synccheck_attention_wgmma_bwd synccheck "0 hazards" test_gpu_attention 'AttentionWgmmaBackward.AgreesWithRecomputeDq'
  sanitize synccheck_gemm_wgmma synccheck "0 hazards" test_gpu_gemm 'GemmWgmma.ForcedSplitK'
  sanitize memcheck_gemm memcheck "0 errors" test_gpu_gemm '*/bf16.ForcedPaths'
  sanitize memcheck_attention memcheck "0 errors" test_gpu_attention '*/1.SmallShapes*'
  sanitize memcheck_layernorm memcheck "0 errors" test_gpu_layernorm '*/fp32.Forward*:*/fp32.Backward*'
  # shared-memory races: the backward's named barriers around dS^T (the CPU emulator cannot check them),
  # the mma.sync kernels, and accumulate-dq's four warps sharing the dS^T tile each turn
  sanitize racecheck_attention_wgmma_bwd racecheck "0 hazards" test_gpu_attention 'AttentionWgmmaBackward.TwoKeyTilesMatchCpu'
  # the forward's and the GEMM's consumers share shared memory only through wgmma and their epilogue's
  # named barriers: racecheck says whether that holds (the backward's lse and D rows did not, 2026-11-27)
  sanitize racecheck_attention_wgmma racecheck "0 hazards" test_gpu_attention 'AttentionWgmmaForward.AgreesWithMmaSync'
  sanitize racecheck_gemm_wgmma racecheck "0 hazards" test_gpu_gemm 'GemmWgmma.ForcedSplitK'
  sanitize racecheck_attention racecheck "0 hazards" test_gpu_attention '*/1.SmallShapes*'
  sanitize racecheck_attention_accdq racecheck "0 hazards" test_gpu_attention 'AttentionAccumulateDq.AgreesWithRecomputeDq'
  # store-ds: the dS tiles' places in the scratch (hs = 64 and 128, T not a multiple of 64), and the dQ
  # launch's two stages of K and dS^T rows
  sanitize memcheck_attention_storeds memcheck "0 errors" test_gpu_attention 'AttentionStoreDs.AgreesWithRecomputeDq'
  sanitize racecheck_attention_storeds racecheck "0 hazards" test_gpu_attention 'AttentionStoreDs.AgreesWithRecomputeDq'
  # wgmma-store-ds: the dS^T writer warp's bulk copies into the tiles (every place inside the scratch), and
  # its hand-offs of the two dS^T buffers with the consumers (ds_full / ds_empty with 32 arrivals)
  sanitize memcheck_attention_wgmma_storeds memcheck "0 errors" test_gpu_attention 'AttentionWgmmaStoreDs.TwoKeyTilesMatchCpu'
  sanitize racecheck_attention_wgmma_storeds racecheck "0 hazards" test_gpu_attention 'AttentionWgmmaStoreDs.TwoKeyTilesMatchCpu'
  sanitize racecheck_layernorm racecheck "0 hazards" test_gpu_layernorm '*/bf16.BackwardMatches*'
  # CPU work, but only the device's python has tiktoken
  step oracle_tiktoken 90 "ids identical" python3 "$repo/tools/gpu/oracle_tiktoken.py" "$bin" "$B/data"
  step reducer_2ranks 120 "exact, shared GPU" "$bin/mpirun" -n 2 "$bin/test_gpu_reducer"
  gpu_step two_ranks_shared_gpu 120 "loss falls, exit 0" "$bin/mpirun" -n 2 "$bin/gpt2-train" --config "$repo/configs/ci.ini" \
    --device cuda --comm mpi --train-data "$B/data/train.h5" --val-data "$B/data/val.h5" --max-steps 30 --out "$work/two"
}

# ---- phase C: what decides the defaults ----------------------------------------------------------
phase_C() {
  step probe 60 "os, glibc, driver, libraries" probe
  # A/A: phase A's two default steps again, as the first of this phase: what two processes of the same run
  # differ by in this call (minutes apart, on this machine), which tools/gpu/step_table.py takes as the least
  # difference that decides anything below.
  train_124m aa_cublaslt_mb16 "same as train_124m_cublaslt_mb16" 16 cublaslt
  train_124m aa_hand_mb16 "same as train_124m_hand_mb16" 16 hand
  # Each opt-in (opt_*: the 124M step at micro-batch 16 with one opt-in kernel in place) against phase
  # A's train_124m_{cublaslt,hand}_mb16 or the opt-in it would follow: a hand kernel becomes the default
  # only where step_table says it is faster there.
  train_124m opt_attention_fwd_wgmma "faster than train_124m_cublaslt_mb16" 16 cublaslt GPT2_ATTENTION_FWD=wgmma
  train_124m opt_attention_fwd_pingpong "faster than opt_attention_fwd_wgmma; faster than train_124m_cublaslt_mb16" \
    16 cublaslt GPT2_ATTENTION_FWD=wgmma-pingpong
  train_124m opt_attention_bwd_accdq "faster than train_124m_cublaslt_mb16" 16 cublaslt GPT2_ATTENTION_BWD=accumulate-dq
  train_124m opt_attention_bwd_wgmma "faster than train_124m_cublaslt_mb16" 16 cublaslt GPT2_ATTENTION_BWD=wgmma
  train_124m opt_attention_bwd_storeds "faster than train_124m_cublaslt_mb16" 16 cublaslt GPT2_ATTENTION_BWD=store-ds
  train_124m opt_attention_bwd_wgmma_storeds "faster than opt_attention_bwd_storeds; faster than train_124m_cublaslt_mb16" \
    16 cublaslt GPT2_ATTENTION_BWD=wgmma-store-ds
  train_124m opt_gemm_mma_sync "slower than train_124m_hand_mb16" 16 hand GPT2_GEMM_SM90=0
  train_124m opt_gemm_wgmma "vs train_124m_hand_mb16" 16 hand GPT2_GEMM_SM90=1
  train_124m opt_gemm_wgmma_pingpong "faster than opt_gemm_wgmma" 16 hand GPT2_GEMM_SM90=128x128-pingpong
  train_124m opt_gemm_wgmma_by_shape "faster than train_124m_hand_mb16; within 15% of train_124m_cublaslt_mb16" \
    16 hand GPT2_GEMM_SM90=by-shape
  # The hand default without the 128x256 kernel's L2 prefetch of the GELU gradient's pre-activations (2026-12-06)
  train_124m opt_gemm_no_aux_prefetch "slower than train_124m_hand_mb16" 16 hand GPT2_GEMM_AUX_PREFETCH=0
  # The hand default's epilogue copying its finished rows out with cp.async.bulk, drained under the next tile's
  # products, instead of its threads storing them from the fp32 staging (2026-12-07)
  train_124m opt_gemm_bulk_store "faster than train_124m_hand_mb16" 16 hand GPT2_GEMM_STORE=bulk
  # cuBLASLt never splitting K: what the fp32-only split-K is worth to the default step (H200: 9%)
  train_124m opt_cublaslt_no_split "vs train_124m_cublaslt_mb16" 16 cublaslt GPT2_CUBLASLT_REDUCTION=none
  # The bias gradients in cuBLASLt's epilogues with bf16 sums (the weight gradients' BGRADA, and MLP up's on MLP
  # down's GELU gradient, DGELU_BGRAD), against the default's separate bias kernel (no algorithm for fp32 sums
  # so far): its second read of dout, ~2.7 GB a step, goes away (MLP up's alone: ~1.2 GB)
  train_124m opt_cublaslt_bias_grad_bf16 "faster than train_124m_cublaslt_mb16" 16 cublaslt GPT2_CUBLASLT_BIAS_GRAD=bf16
  # Programmatic dependent launch (2026-12-07): each of our kernels launched while the one before it finishes,
  # waiting on the device instead of for the launch (LaunchChain rows of the kernel table: what a boundary saves)
  train_124m opt_pdl "faster than train_124m_cublaslt_mb16" 16 cublaslt GPT2_PDL=on
  # The qkv bias gradient summed by the attention backward's blocks as they store dqkv (2026-12-07): the bias
  # kernel's pass over dqkv (75 MB a layer at micro-batch 16) goes (AttentionQkvBiasGrad rows of the kernel table)
  train_124m opt_attention_bias_sums "faster than train_124m_cublaslt_mb16" 16 cublaslt GPT2_ATTENTION_BIAS_SUMS=on
  train_124m opt_pdl_hand "faster than train_124m_hand_mb16" 16 hand GPT2_PDL=on
  # A/A again after the opt-ins: the default step drifting over the phase (clocks, heat) widens the band too,
  # against phase A's run and this phase's first
  train_124m aa_end_cublaslt_mb16 "same as train_124m_cublaslt_mb16; same as aa_cublaslt_mb16" 16 cublaslt
  # The mma.sync attention's block order (tile_order.hpp) at B = 8 and 64: each head alone and one group
  # over every head, against the default groups of heads (time / the default's; > 1.00x: the default wins)
  gpu_step attention_order 60 "default <= 1.00x of each" "$bin/bench_gpu_kernels" \
    --benchmark_filter='^(BM_attention_(forward|backward)_bf16/(8|64)/0/0/|AttentionTileOrder/)' \
    --benchmark_out="$logs/attention_order.json" --benchmark_out_format=json --benchmark_min_time=0.1
  # The step replayed as a CUDA Graph: what ~250 launches per step cost.
  train_124m opt_cuda_graph "faster than train_124m_cublaslt_mb16" 16 cublaslt -- --cuda-graph
  train_124m train_124m_cublaslt_mb32 ">= 470K tok/s" 32 cublaslt
  train_124m train_124m_hand_mb32 "within 15% of train_124m_cublaslt_mb32" 32 hand
  # Every 124M run of this call (phase A's in $OUT's archive, and this phase's so far) against its target with
  # its noise: the decisions (tools/gpu/step_table.py; its whole table is in the step's log)
  step step_table 30 "verdicts outside the noise" python3 "$repo/tools/gpu/step_table.py" "$OUT"
  # ZeRO-1's device path on one GPU (its shard is the whole buffer, so the losses must be --zero 0's);
  # the cross-rank collectives need one GPU per rank.
  gpu_step zero1_one_gpu 120 "losses == --zero 0" bash -c "
    for z in 0 1; do
      '$bin/gpt2-train' --config '$repo/configs/ci.ini' --device cuda --train-data '$B/data/train.h5' --val-data '$B/data/val.h5' \
        --max-steps 20 --val-every 0 --zero \$z --out '$work/zero'\$z || exit 1
    done
    python3 -c \"import json,sys; l=[[r['loss'] for r in map(json.loads, open(f'$work/zero{z}/metrics.jsonl')) if 'loss' in r] for z in (0,1)]; print('losses', l[0][-1], l[1][-1]); sys.exit(l[0] != l[1])\""
  # --recompute on the device: full reruns each block with the forward's own launches, so its losses
  # are --recompute none's bit for bit; selective recomputes the GELU with its own kernel, which rounds
  # differently from cuBLASLt's fused bf16 epilogue: within 1e-3.
  gpu_step recompute_one_gpu 150 "full == none, selective ~ none" bash -c "
    for r in none selective full; do
      '$bin/gpt2-train' --config '$repo/configs/ci.ini' --device cuda --train-data '$B/data/train.h5' --val-data '$B/data/val.h5' \
        --max-steps 20 --val-every 0 --recompute \$r --out '$work/recompute_'\$r || exit 1
    done
    python3 -c \"import json,sys; l={r: [x['loss'] for x in map(json.loads, open(f'$work/recompute_{r}/metrics.jsonl')) if 'loss' in x] for r in ('none','selective','full')}; print('losses', l['none'][-1], l['selective'][-1], l['full'][-1]); sys.exit(l['full'] != l['none'] or max(abs(a-b)/abs(b) for a,b in zip(l['selective'], l['none'])) > 1e-3)\""
  step oracle_transformers 150 "logits within 1e-4" python3 "$repo/tools/gpu/oracle_transformers.py" "$bin" "$work/hf"
  # The bundle's Open MPI, HDF5 and OpenBLAS with CPU ranks (phase B's 2-rank steps ran them on the GPU).
  step cpu_train_2ranks 90 "loss falls" "$bin/mpirun" -n 2 "$bin/gpt2-train" --config "$repo/configs/ci.ini" --device cpu \
    --train-data "$B/data/train.h5" --val-data "$B/data/val.h5" --max-steps 20 --log-every 5 --out "$work/cpu2"
  ncu_hot_kernels
  ncu_attention
  ncu_layernorm
  ncu_gemm_epilogue
}

# ---- phase D: memory (what recompute costs and saves; the largest preset fits) ---------------------
phase_D() {
  step probe 60 "os, glibc, driver, libraries" probe
  # What recompute costs at 124M (tokens/s) and saves (device memory measured after the first step).
  gpu_step recompute_cost 120 "tok/s and memory per mode" bash -c "
    for r in none selective full; do
      '$bin/gpt2-train' --model gpt2-124m --device cuda --benchmark --max-steps 8 --log-every 1 --micro-batch 16 \
        --seq-len 1024 --global-batch-tokens 16384 --recompute \$r --out '$work/recompute_cost_'\$r > '$work/rc_'\$r.log 2>&1 || exit 1
      echo \"\$r: \$(grep -E '^step +[0-9]+/' '$work/rc_'\$r.log | tail -1 | cut -d'|' -f6) |\" \
        \"\$(grep -o 'after the first step: [0-9.]* [GM]iB' '$work/rc_'\$r.log)\"
    done"
  # The largest preset at the micro-batch configs/gpt2-1558m.ini says fits on 80 GB with no recompute:
  # two steps run, and the memory measured after the first is printed next to the estimate.
  gpu_step preset_1558m_fits 180 "2 steps at micro-batch 16" bash -c "
    set -o pipefail
    '$bin/gpt2-train' --model gpt2-1558m --device cuda --benchmark --max-steps 2 --log-every 1 --micro-batch 16 \
      --seq-len 1024 --global-batch-tokens 16384 --out '$work/preset_1558m' 2>&1 | tee '$work/p1558.log' | tail -20 &&
    grep -q 'after the first step' '$work/p1558.log'"
}

# ---- the figures: figure_STEP LOG prints the table's figure for STEP ------------------------------
# sass_sm90a: per kernel family, its HGMMA (wgmma), UTMALDG (TMA), HMMA (mma.sync) and USETMAXREG
# (setmaxnreg) counts; the wgmma kernels must have the first two and none of the third, and the
# backward its two setmaxnreg (ptxas drops them, C7508, when it cannot tell the register count at entry).
# Per kernel: the least USETMAXREG count (setmaxnreg kept), and an HGMMA shape that must appear (the GEMM's
# 128x256 tiles run HGMMA.64x256x16). And no local-memory traffic (STL/LDL: spills; ptxas here said 0
# bytes for every one of them, some at exactly the 168-register limit), and no serialized wgmma: a
# WARPGROUP.ARRIVE for every HGMMA or two (the attention backward had 25 for 25 from 678fa73 to
# 2026-11-29; tools/sass.py counts the same here, tools/ptxas_guard.sh fails the build on ptxas's report).
sass_sm90a() {
  local spec fn binary setmaxreg shape
  for spec in attention_fwd_wgmma_tma:test_gpu_attention:0:HGMMA attention_bwd_wgmma_tma:test_gpu_attention:2:HGMMA \
      gemm_bf16_wgmma_tma_persistent:test_gpu_gemm:0:HGMMA.64x256; do
    IFS=: read -r fn binary setmaxreg shape <<< "$spec"
    cuobjdump -sass "$B/libexec/$binary" | awk -v fn="$fn" -v need="$setmaxreg" -v shape="$shape" '
      /Function :/ { inside = index($0, fn) > 0; if (inside) n++ }
      inside && /HGMMA/ { h++ } inside && /UTMALDG/ { t++ } inside && /HMMA/ { m++ } inside && /USETMAXREG/ { r++ }
      inside && index($0, shape) { s++ } inside && / (STL|LDL)[. ]/ { l++ } inside && /WARPGROUP.ARRIVE/ { a++ }
      END { printf "%s: %d functions, %d HGMMA, %d WARPGROUP.ARRIVE, %d UTMALDG, %d HMMA, %d USETMAXREG, %d %s, %d STL/LDL\n",
                   fn, n, h, a, t, m, r, s, shape, l
            exit !(n > 0 && h > 0 && 2 * a < h && t > 0 && m == 0 && r >= need && s > 0 && l == 0) }' ||
      return 1
  done
}
figure_sass_sm90a() { grep -o '[0-9]* HGMMA,' "$1" | tr -d , | paste -sd/ | sed 's/$/ (attention fwd\/bwd\/gemm)/'; }
figure_ceilings() { python3 "$repo/tools/gpu/bench_table.py" --ceilings-only "$logs/ceilings.json"; }
figure_kernel_table() { grep -m1 '^kernels at target' "$1"; }
figure_allreduce_nccl_1rank() {
  echo "$(grep -c 'nccl bf16 device' "$1") sizes on nccl bf16 device, 64 MiB: $(grep -m1 'BM_BucketedAllreduce/67108864' "$1" |
    grep -oE '[0-9.]+ us' | head -1)"
}
figure_step_table() { grep -m1 '^targets: ' "$1" | sed 's/^targets: //'; }
figure_attention_order() {
  python3 - "$repo/tools/gpu" "$(dirname "$1")/attention_order.json" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
from bench_table import attention_default_row
rows = {b["name"]: b["real_time"] for b in json.load(open(sys.argv[2]))["benchmarks"]}
out = []
for name, t in rows.items():
    base = rows.get(attention_default_row(name)) if name.startswith("AttentionTileOrder/") else None
    if base and t > 0:
        _, _, pass_, order, b = name.split("/")[:5]  # AttentionTileOrder/bf16/<pass>/<order>/B:<B>
        out.append(f"{pass_}{b[2:]} {order.split('_')[0]} {t / base:.2f}")
print(" ".join(out) or "no rows")
PY
}
# "attention_bwd_tc<64>: us 313.2; sm% ...": each kernel's duration
figure_ncu_attention() { grep -E '^attention_' "$1" | sed -E 's/^(attention_[a-z_]+)[^:]*: us ([0-9.]+).*/\1 \2 us/' | paste -sd, -; }
figure_ncu_layernorm() { grep -E '^(layernorm_|column_sums_add)' "$1" | sed -E 's/^(layernorm_)?([a-z_]+)[^:]*: us ([0-9.]+).*/\2 \3 us/; s/_warp_per_row_vec//' | paste -sd, -; }
# "benchmark: 35.12 ms/step | 466512 tokens/s | mfu 37.9% | ... (mean of 10 steps after the first)": the mean
# step's tok/s and MFU, then (a --profile-step run) the two kinds of op that took most of the profiled step's
# device time: "466.5K tok/s, mfu 37.9% | gemm 55% attention 28%"
train_figure() {
  local kinds
  kinds=$(grep -m1 '^  by kind: ' "$1" | sed 's/^  by kind: //' | awk -F' [|] ' '{for (i = 1; i <= 2 && i <= NF; i++) {
    split($i, f, " "); printf "%s%s %.0f%%", (i > 1 ? " " : ""), f[1], f[4]}}')
  grep -m1 '^benchmark: ' "$1" | awk -F' [|] ' -v k="$kinds" '{split($2, t, " "); sub(/ +$/, "", $3);
    printf "%.1fK tok/s, %s%s\n", t[1] / 1000, $3, (k != "" ? " | " k : "")}'
}
# first and last loss of a run's step lines
loss_figure() { grep -E '^step +[0-9]+/' "$1" | awk -F'|' '{split($2, a, " "); if (!f) f = a[2]; l = a[2]} END {print "loss " f " -> " l}'; }
# "[  PASSED  ] 12 tests." / "[  SKIPPED ] 2 tests, listed below:" / "[  FAILED  ] 1 test, ...": the
# counts, so a suite whose tests all skipped (the wgmma ones off compute capability 9.0) cannot pass
# unnoticed.
gtest_figure() {
  awk '/^\[  PASSED  \] [0-9]+ test/ { p = $4 } /^\[  SKIPPED \] [0-9]+ test/ { s = $4 }
       /^\[  FAILED  \] [0-9]+ test/ { f = $4 }
       END { printf "%d passed, %d skipped, %d failed\n", p, s, f }' "$1"
}
for f in encoder layernorm gemm attention elementwise gemm_wgmma attention_wgmma; do
  eval "figure_kernels_$f() { gtest_figure \"\$1\"; }"
done
figure_model_step_vs_cpu() { gtest_figure "$1"; }
figure_decode_kv_cache() { gtest_figure "$1"; }
figure_cpu_train_2ranks() { loss_figure "$1"; }
figure_two_ranks_shared_gpu() { loss_figure "$1"; }
figure_zero1_one_gpu() { grep -m1 '^losses' "$1"; }
figure_recompute_one_gpu() { grep -m1 '^losses' "$1"; }
figure_oracle_transformers() { grep -m1 -E '^max \|' "$1"; }
# per setting, how many of cuBLASLt's products have over 1% of their outputs rounded neither once nor
# with the product rounded first (test_gemm.cpp's "unexplained"), of how many
figure_diagnose_lt_reduction() {
  awk '/^== GPT2_CUBLASLT_REDUCTION=/ { if (r != "") printf "%s %d/%d, ", r, bad, n; r = substr($2, 25); bad = n = 0 }
       /^bf16 cublaslt .*unexplained \(/ { n++; s = $0; sub(/.*unexplained \(/, "", s); if (s + 0 > 1) bad++ }
       END { if (r != "") printf "%s %d/%d\n", r, bad, n }' "$1"
}
figure_oracle_tiktoken() { grep -m1 -E 'tokens compared' "$1"; }
figure_recompute_cost() { grep -E '^(none|selective|full):' "$1" | tr -s ' ' | paste -sd ';' -; }
figure_preset_1558m_fits() { grep -m1 -o 'after the first step: .*' "$1" | cut -c1-90; }

export B bin repo work nccl_dir cublas_dir sandbox
export -f probe ldd_check listed ran_kernels gtest sass_sm90a

"phase_$phase"

# Each --steps alternative must name a step of this phase: one that names none (a typo in a command copied
# from docs/performance.md) would leave the step it meant unrun, and the call would pass without it.
unknown=()
if [[ -n $only_steps ]]; then
  IFS='|' read -ra wanted <<< "$only_steps"
  for w in "${wanted[@]}"; do
    hit=0
    for n in "${known_steps[@]}"; do [[ $n =~ ^($w)$ ]] && { hit=1; break; }; done
    ((hit)) || unknown+=("$w")
  done
fi
if ((list_only)); then
  printf '%s\n' "${known_steps[@]}" | awk '!seen[$0]++'
  trap - EXIT
  rm -rf "$work"
  ((${#unknown[@]} == 0)) || { echo "gpu-phase: --steps names no step of phase $phase: ${unknown[*]}" >&2; exit 1; }
  exit 0
fi
for w in "${unknown[@]}"; do
  only_steps=""  # so that row reports it
  row "$w" FAIL "no step of phase $phase has this name" "--steps names steps of the phase"
done
