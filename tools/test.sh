#!/usr/bin/env bash
# The test command: installs what is missing, configures, builds and runs every test (ctest).
# Exits non-zero on any failure. GPU tests report "skipped: no GPU" on machines without one.
#   tools/test.sh               everything
#   tools/test.sh -R oracle     extra arguments go to ctest
# After the main suite come two more tiers (tools/sanitize-tests.sh: the CPU tests under ASan+UBSan;
# tools/fuzz.sh: every fuzzer for GPT2_FUZZ_SECONDS, default 30). They run when no ctest arguments
# are given (CI); GPT2_SANITIZERS=0 skips them, GPT2_SANITIZERS=1 runs them even with arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh

export BUILD_DIR=${BUILD_DIR:-build}
cmake_args=(-DGPT2_BUILD_TESTS=ON -DGPT2_BUILD_BENCH=ON)
# CI treats warnings in our own code as errors.
[[ "${CI:-}" == "true" ]] && cmake_args+=(-DGPT2_WERROR=ON)
tools/build.sh "${cmake_args[@]}"

# The CI recipe (configs/ci.ini) trains on Genesis, byte-level.
[[ -f data/ci/train.h5 ]] || tools/prepare-data.sh --passages gen1:1-gen50:26 --out data/ci --val-fraction 0.1 >/dev/null

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# ctest runs two tests at once on few cores: idle OpenMP threads must sleep, not spin.
export OMP_WAIT_POLICY=PASSIVE
ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2 "$@"

if [[ "${GPT2_SANITIZERS:-$([[ $# -eq 0 ]] && echo 1 || echo 0)}" == "1" ]]; then
  tools/sanitize-tests.sh
  tools/fuzz.sh
fi
