#!/usr/bin/env bash
# Configures and builds (Release) into ${BUILD_DIR:-build}. Extra arguments go to cmake.
#   tools/build.sh                       CPU + CUDA (when nvcc is found)
#   tools/build.sh -DGPT2_ENABLE_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  cmake -S . -B "$build_dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
elif [[ $# -gt 0 ]]; then
  cmake -S . -B "$build_dir" "$@"
fi
cmake --build "$build_dir" -j "$(nproc)"
