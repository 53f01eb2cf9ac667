#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz, clang, ASan+UBSan) in ${FUZZ_BUILD_DIR:-build-fuzz} and
# runs them over their committed seed corpus (tests/fuzz/corpus/NAME).
#   tools/fuzz.sh                   every harness for ${GPT2_FUZZ_SECONDS:-30} s each (what CI runs)
#   tools/fuzz.sh NAME [SECONDS]    one harness, e.g. tools/fuzz.sh json 3600
#   tools/fuzz.sh --build-only      build, do not run
# Harnesses: json train_options safetensors token_file checkpoint tokenizer.
# New inputs that reach new code go to BUILD/corpus/NAME (the committed corpus is only read; copy a
# useful one there by hand). A finding leaves its input in BUILD/artifacts/NAME/ and the script exits
# non-zero; replay it with BUILD/fuzz/fuzz_NAME FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
all=(json train_options safetensors token_file checkpoint tokenizer)
build=${FUZZ_BUILD_DIR:-build-fuzz}
seconds=${GPT2_FUZZ_SECONDS:-30}
build_only=false
names=("${all[@]}")
if [[ ${1:-} == --build-only ]]; then
  build_only=true
elif [[ $# -ge 1 ]]; then
  [[ " ${all[*]} " == *" $1 "* ]] || { echo "fuzz.sh: unknown harness '$1' (have: ${all[*]})" >&2; exit 2; }
  names=("$1")
  seconds=${2:-$seconds}
fi

# Clang for libFuzzer; CUDA off (nvcc code is not instrumented). Our code is instrumented with ASan,
# UBSan and libFuzzer's coverage; the system libraries (HDF5, Boost, OpenBLAS, MPI) are not. Clang's
# OpenMP runtime is libomp (libomp-14-dev); the harnesses never enter a parallel region.
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  werror=OFF
  [[ "${CI:-}" == "true" ]] && werror=ON
  cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DGPT2_ENABLE_CUDA=OFF -DGPT2_BUILD_TESTS=OFF -DGPT2_BUILD_BENCH=OFF \
    -DGPT2_SANITIZE=address,undefined -DGPT2_BUILD_FUZZERS=ON -DGPT2_WERROR=$werror >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target "${names[@]/#/fuzz_}"
$build_only && exit 0

if [[ " ${names[*]} " == *" tokenizer "* ]]; then
  GPT2_VOCAB_DIR=$(tools/get-gpt2-vocab.sh)
  export GPT2_VOCAB_DIR
fi
# intercept_tls_get_addr=0: as tools/sanitize-tests.sh (LeakSanitizer's tracer crashing on dynamic TLS)
export ASAN_OPTIONS="halt_on_error=1:print_stacktrace=1:detect_leaks=1:intercept_tls_get_addr=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitize/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
export TMPDIR=$(mktemp -d)
trap 'rm -rf "$TMPDIR"' EXIT

# CI (every harness) uses a fixed seed, so a run explores the same inputs each time: a slower machine
# tries a prefix of what a faster one tried. A run of one harness is random unless GPT2_FUZZ_SEED is set.
seed=${GPT2_FUZZ_SEED:-}
[[ -z "$seed" && ${#names[@]} -gt 1 ]] && seed=1
# Who owns a crash the HDF5 harnesses find: report_owner, crash_owner (tests/tools/test_fuzz_owner.sh).
source tools/fuzz-owner.sh

failed=()
for name in "${names[@]}"; do
  rm -rf "$build/artifacts/$name"  # a finding of an earlier run is re-found, or fixed
  mkdir -p "$build/corpus/$name" "$build/artifacts/$name"
  echo "fuzz.sh: $name for ${seconds} s${seed:+, seed $seed}"
  flags=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1
         -artifact_prefix="$build/artifacts/$name/")
  [[ -n "$seed" ]] && flags+=(-seed="$seed")
  [[ -f tests/fuzz/$name.dict ]] && flags+=(-dict="tests/fuzz/$name.dict")
  asan=$ASAN_OPTIONS
  if [[ $name == token_file || $name == checkpoint ]]; then
    # libhdf5 1.10 (Debian 12) trusts lengths in a corrupt file: it asks malloc for terabytes (glibc
    # returns NULL and HDF5 reports an error, so ASan must too) and may spin on a huge vlen string.
    # Those timeouts and out-of-memory cases are inside libhdf5, not ours to fix: fork mode notes and
    # skips them. Memory errors and crashes still fail, wherever they are.
    # It also has memory errors of its own on corrupt files (a SEGV reading a vlen string attribute
    # from a corrupt global heap, an overflow iterating attribute messages): fork mode goes on after a
    # crash too, and every crash is replayed below: one whose innermost frame is inside libhdf5 is
    # noted and kept aside, any other (our code, the C++ runtime, an uncaught exception) fails.
    # The sanitizers' reports of the fuzzing processes also go to files (a crash may need the state an
    # earlier input left, and not happen again when replayed alone: see crash_owner).
    flags+=(-fork=1 -ignore_timeouts=1 -ignore_ooms=1 -ignore_crashes=1)
    asan="allocator_may_return_null=1:$asan"
    # No -close_fd_mask here: it hands the sanitizers libFuzzer's copy of stderr
    # (__sanitizer_set_report_fd), which overrides log_path, so the reports went to the jobs' logs that
    # libFuzzer deletes and crash_owner had none to judge a crash that needs earlier inputs' state
    # (CI, 2026-11-26: such a libhdf5 SEGV failed the run). The jobs' own output (libhdf5's error
    # stacks) goes to those logs anyway.
  else
    flags+=(-close_fd_mask=2)  # the harness's stderr (error messages of rejected inputs) is noise
  fi
  reports=$build/artifacts/$name/reports
  fuzz_asan=$asan fuzz_ubsan=$UBSAN_OPTIONS
  if [[ $name == token_file || $name == checkpoint ]]; then
    mkdir -p "$reports"
    fuzz_asan="$asan:log_path=$reports/asan" fuzz_ubsan="$UBSAN_OPTIONS:log_path=$reports/ubsan"
  fi
  set +e
  ASAN_OPTIONS=$fuzz_asan UBSAN_OPTIONS=$fuzz_ubsan "$build/fuzz/fuzz_$name" "${flags[@]}" "$build/corpus/$name" \
    "tests/fuzz/corpus/$name" 2>&1 |
    tee "$build/artifacts/$name.log" |
    grep -v -E '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)|^\s+NEW_FUNC|# Uses: [0-9]+$|^###### (Recommended dictionary|End of recommended)'
  rc=${PIPESTATUS[0]}
  set -e
  # libFuzzer's last words ("Done N runs", or in fork mode "INFO: exiting: ... time:") say it fuzzed for
  # its time; without them the harness did not run (a missing library, a crash at start-up), whatever
  # the exit status says.
  completed=true
  grep -q -E '^Done [0-9]+ runs in|^INFO: exiting: [0-9]+ time:' "$build/artifacts/$name.log" || completed=false
  if [[ $name == token_file || $name == checkpoint ]]; then
    mkdir -p "$build/artifacts/$name/libhdf5"
    for f in $(find "$build/artifacts/$name" -maxdepth 1 -type f ! -name 'timeout-*' ! -name 'oom-*' ! -name 'slow-unit-*'); do
      owner=$(crash_owner "$build/fuzz/fuzz_$name" "$f" "$asan" "$reports")
      if [[ $owner == libhdf5* ]]; then
        echo "fuzz.sh: note: $name: $(basename "$f") crashes inside $owner, not our code: kept in $build/artifacts/$name/libhdf5/"
        mv "$f" "$build/artifacts/$name/libhdf5/"
      fi
    done
    rc=0  # -ignore_crashes: fork mode exits non-zero after any; what failed is what is left in artifacts/
  fi
  found=$(find "$build/artifacts/$name" -maxdepth 1 -type f ! -name 'timeout-*' ! -name 'oom-*' ! -name 'slow-unit-*')
  if ! $completed; then
    echo "fuzz.sh: FAIL $name: libFuzzer did not run to the end (log: $build/artifacts/$name.log)"; failed+=("$name")
  elif [[ $rc -ne 0 || -n "$found" ]]; then
    echo "fuzz.sh: FAIL $name (exit $rc): inputs in $build/artifacts/$name/"; failed+=("$name")
  elif [[ -n "$(ls -A "$build/artifacts/$name")" ]]; then
    echo "fuzz.sh: note: $name: libhdf5 timeouts/out-of-memory/slow inputs skipped, inputs in $build/artifacts/$name/"
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz.sh: findings in: ${failed[*]}"
  exit 1
fi
echo "fuzz.sh: ${names[*]}: no findings"
