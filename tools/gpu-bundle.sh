#!/usr/bin/env bash
# Builds here, for the lent GPU machine (../shared/GPU.md: build here, run there), one xz-packed bundle
# that a `device` call carries: .gpubundle/gpt2-bundle.tar.xz (git-ignored, at most 40 MiB).
#
#   tools/gpu-bundle.sh                     configure + build build-bundle/ (sm_90, tests, benchmarks)
#   tools/gpu-bundle.sh --build-dir build   pack an existing CUDA build instead
#     --max-mib N   the size limit (default 40); --fast   xz -1 (the CI rehearsal packs build/, which holds
#                   sm_80 and sm_90, so it relaxes the limit and packs fast: only the real bundle must fit)
#
# The bundle (unpacked: bundle/) holds
#   libexec/   the project's binaries (cudart linked statically)
#   bin/       one wrapper per binary that sets LD_LIBRARY_PATH for that binary alone (bundle/lib plus
#              $GPT2_DEVICE_LIBS, the device's cuBLASLt and NCCL) and execs it, so the machine's own
#              python and cmake never see our libraries; bin/mpirun is Open MPI's orterun, relocated
#   lib/       the ldd closure of every binary and plugin, minus glibc, the NVIDIA driver, cuBLASLt
#              and NCCL (those come from the device: see tools/gpu-phase.sh)
#   ompi/      Open MPI's runtime tree (plugins, help files), found through OPAL_PREFIX
#   pmix/      PMIx's plugins, found through PMIX_INSTALL_PREFIX
#   data/      test data: the CI token files, GPT-2's BPE vocabulary, a few MB of varied text
#   MANIFEST   commit, date, build flags, every file with its size
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build-bundle max_mib=40 xz_level=-9e
while [[ $# -gt 0 ]]; do
  case $1 in
    --build-dir) build_dir=$2; shift 2 ;;
    --max-mib) max_mib=$2; shift 2 ;;
    --fast) xz_level=-1; shift ;;
    *) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
out=.gpubundle
stage=$out/stage/bundle

die() { echo "gpu-bundle: error: $*" >&2; exit 1; }

if [[ $build_dir == build-bundle ]]; then
  tools/install-deps.sh >/dev/null
  # Only the H100's architecture: half the compile time and half the size of the CI build (80;90).
  BUILD_DIR=$build_dir tools/build.sh -DGPT2_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGPT2_BUILD_TESTS=ON -DGPT2_BUILD_BENCH=ON >/dev/null
fi
[[ -x $build_dir/bin/gpt2-train ]] || die "$build_dir/bin/gpt2-train not found: build first"
grep -q 'GPT2_HAVE_CUDA:INTERNAL=ON\|gpt2: CUDA backend ON' "$build_dir/CMakeCache.txt" 2>/dev/null ||
  [[ -x $build_dir/tests/test_gpu_model ]] || die "$build_dir was built without CUDA (no tests/test_gpu_model)"

# ---- what goes in -----------------------------------------------------------------------------
binaries=("$build_dir"/bin/gpt2-train "$build_dir"/bin/gpt2-sample "$build_dir"/bin/gpt2-data
          "$build_dir"/bin/bench_gpu_kernels "$build_dir"/bin/bench_allreduce "$build_dir"/bin/bench_cpu_step
          "$build_dir"/tests/test_gpu_* "$build_dir"/tests/hf_logits "$build_dir"/tests/tokenizer_bpe_tool)
for b in "${binaries[@]}"; do [[ -x $b ]] || die "missing binary $b"; done

multiarch=/usr/lib/x86_64-linux-gnu
ompi_lib=$multiarch/openmpi/lib
ompi_plugins=$ompi_lib/openmpi3
pmix_root=$multiarch/pmix2
# Open MPI plugins for networks the device has no libraries for (UCX, libfabric, verbs, PSM) are left
# out: Open MPI skips a component it cannot find, and we run with pml ob1 + btl self,vader anyway.
skip_plugin_deps='libuc[pst]\.|libfabric\.|libibverbs\.|librdmacm\.|libpsm'
# Provided by the device, never carried: glibc, the NVIDIA driver, cuBLASLt/cuBLAS, NCCL.
provided='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libnss_.*|libcuda|libnvidia-.*|libcublasLt|libcublas|libnccl)\.so'

rm -rf "$out/stage" && mkdir -p "$stage"/{bin,libexec,lib,ompi/bin,data}
closure=()  # libraries to carry, resolved paths

add_closure() {  # add_closure ELF: the resolved dependencies of ELF that the device does not provide
  local line name path
  while read -r line; do
    name=${line%% *}
    [[ $name =~ $provided ]] && continue
    if [[ $line == *"not found"* ]]; then die "$1 needs $name, which is not found here"; fi
    path=$(awk '{print $3}' <<<"$line")
    [[ -n $path && -f $path ]] && closure+=("$name=$path")
  done < <(ldd "$1" | awk '/=>/ {print $1, $2, $3}')
}

for b in "${binaries[@]}"; do
  install -m 755 "$b" "$stage/libexec/"
  # Symbols go; the device code (.nv_fatbin, an allocated section) and its line info stay.
  strip --strip-unneeded "$stage/libexec/$(basename "$b")"
  add_closure "$b"
done

# Open MPI: orterun (mpirun), its plugins and help files, laid out as under /usr so OPAL_PREFIX works.
install -m 755 /usr/bin/orterun "$stage/ompi/bin/orterun"
add_closure /usr/bin/orterun
mkdir -p "$stage/ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3" "$stage/ompi/share"
for p in "$ompi_plugins"/*.so "$ompi_lib"/libmca_common_*.so*; do
  [[ -e $p ]] || continue
  # (ldd's output taken whole first: under pipefail, grep -q's early exit made ldd's SIGPIPE the
  # pipeline's status, and the plugin was kept or skipped by chance: 55 or 73 libraries, 2 MiB apart)
  deps=$(ldd "$p" 2>/dev/null || true)
  if grep -Eq "$skip_plugin_deps" <<<"$deps"; then continue; fi
  if [[ $p == "$ompi_plugins"/* ]]; then
    cp -L "$p" "$stage/ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/"
  else
    cp -L "$p" "$stage/lib/"
  fi
  add_closure "$p"
done
cp -r /usr/share/openmpi "$stage/ompi/share/openmpi"
# PMIx (external to Debian's Open MPI): its plugins and parameter files, found via PMIX_INSTALL_PREFIX.
mkdir -p "$stage/pmix/lib"
cp -r "$pmix_root/lib/pmix" "$stage/pmix/lib/pmix"
cp -r "$pmix_root/share" "$stage/pmix/share"
for p in "$stage"/pmix/lib/pmix/*.so; do add_closure "$p"; done

# The closure, one file per soname (ldd already walks it transitively).
declare -A seen=()
for entry in "${closure[@]}"; do
  name=${entry%%=*} path=${entry#*=}
  [[ -n ${seen[$name]:-} ]] && continue
  seen[$name]=1
  cp -L "$path" "$stage/lib/$name"
done

# Wrappers: each binary runs with the bundle's libraries and the device's; nothing else does.
wrapper() {  # wrapper NAME TARGET [EXTRA_EXPORTS]
  cat > "$stage/bin/$1" <<EOF
#!/usr/bin/env bash
# Runs $2 with the bundle's libraries (bundle/lib) and the device's cuBLASLt and NCCL (GPT2_DEVICE_LIBS).
here=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")/.." && pwd)
export LD_LIBRARY_PATH="\$here/lib\${GPT2_DEVICE_LIBS:+:\$GPT2_DEVICE_LIBS}"
${3:-}
exec "\$here/$2" "\$@"
EOF
  chmod 755 "$stage/bin/$1"
}
# Open MPI's environment, for mpirun and for every binary: one started without mpirun (gpt2-train in most
# GPU steps) is an MPI singleton, whose MPI_Init looks for Open MPI's plugins under OPAL_PREFIX and would
# start an orted, which the bundle does not carry, unless told to stay isolated.
ompi_env='export OPAL_PREFIX="$here/ompi" PMIX_INSTALL_PREFIX="$here/pmix"
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
export OMPI_MCA_ess_singleton_isolated=${OMPI_MCA_ess_singleton_isolated:-1}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# orterun starts the ranks with this environment: they find the bundle (their own wrappers reset it).
export PATH="$here/bin:$PATH"'
for b in "${binaries[@]}"; do n=$(basename "$b"); wrapper "$n" "libexec/$n" "$ompi_env"; done
wrapper mpirun ompi/bin/orterun "$ompi_env"
ln -s mpirun "$stage/bin/mpiexec"

# ---- data ---------------------------------------------------------------------------------------
[[ -f data/ci/train.h5 ]] || BUILD_DIR=$build_dir tools/prepare-data.sh --passages gen1:1-gen50:26 --out data/ci --val-fraction 0.1 >/dev/null
cp data/ci/train.h5 data/ci/val.h5 "$stage/data/"
vocab=$(tools/get-gpt2-vocab.sh)
mkdir -p "$stage/data/gpt2-vocab"
cp "$vocab/encoder.json" "$vocab/vocab.bpe" "$stage/data/gpt2-vocab/"
# A few MB of varied text for the tokenizer oracle (tiktoken there): English prose, our own source
# code (the oracle script adds seeded text from many scripts and symbol classes).
mkdir -p "$stage/data/text"
bible gen1:1-ps150:6 > "$stage/data/text/kjv.txt"
cat src/*/*.cpp src/*/*.hpp kernels/*/*.cu > "$stage/data/text/source.txt"

# ---- pack ---------------------------------------------------------------------------------------
{
  echo "gpt2 GPU bundle"
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "built $(date -u +%FT%TZ) on $(hostname) from $build_dir"
  grep -E '^(CMAKE_CUDA_ARCHITECTURES|CMAKE_BUILD_TYPE|GPT2_[A-Z_]+):' "$build_dir/CMakeCache.txt" || true
  (cd "$stage" && find . -type f -printf '%s %p\n' | sort -k2)
} > "$stage/MANIFEST"
rm -f "$out/gpt2-bundle.tar.xz"
# -9: a 64 MiB dictionary spans the binaries, which share their kernels' device code (23 MiB against
# 40 MiB at -6 for the same files, measured 2026-11-23).
XZ_OPT="-T0 $xz_level" tar -C "$out/stage" -cJf "$out/gpt2-bundle.tar.xz" bundle
rm -rf "$out/stage"
size=$(stat -c %s "$out/gpt2-bundle.tar.xz")
mib=$(( (size + 1048575) / 1048576 ))
echo "gpu-bundle: $out/gpt2-bundle.tar.xz, $mib MiB (limit $max_mib), ${#seen[@]} libraries, ${#binaries[@]} binaries"
(( mib <= max_mib )) || die "the bundle is $mib MiB, over the $max_mib MiB a device call can carry"
