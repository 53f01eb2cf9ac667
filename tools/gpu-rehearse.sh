#!/usr/bin/env bash
# Rehearses, on this machine without a GPU, every phase that tools/gpu-phase.sh runs on the lent one:
# the bundle is packed, unpacked in a clean folder, and each phase runs with the system's own Open MPI,
# PMIx, HDF5, Boost, OpenBLAS and Google Benchmark hidden (a private mount namespace lays empty folders
# and /dev/null over them), so a library missing from the bundle fails here, not there. GPU steps SKIP;
# everything else must PASS. Checks each phase's limits: at most 8 files in $OUT, within the time
# budget, the table printed last.
#
#   tools/gpu-rehearse.sh                        packs from build/ (tools/test.sh's CUDA build)
#   tools/gpu-rehearse.sh --build-dir DIR [--phases "A B C D"] [--no-pack] [-- GPU_BUNDLE_ARGS...]
#   (CI: --build-dir build -- --fast --max-mib 100: its build holds sm_80 and sm_90, so only the
#    size of the real, sm_90-only bundle is held to the 40 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=build phases="A B C D" pack=1 bundle_args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --build-dir) build_dir=$2; shift 2 ;;
    --phases) phases=$2; shift 2 ;;
    --no-pack) pack=0; shift ;;
    --) shift; bundle_args=("$@"); break ;;
    *) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
readonly budget_s=540  # a device call is 10 minutes; the machine's start and the transfers need the rest

((pack)) && tools/gpu-bundle.sh --build-dir "$build_dir" "${bundle_args[@]}"

# What the lent machine lacks (GPU.md): hidden for the phase's processes only.
ma=/usr/lib/x86_64-linux-gnu
hide_dirs=("$ma/openmpi" "$ma/pmix2" /usr/share/openmpi /etc/openmpi "$ma/hdf5" "$ma/openblas-openmp")
hide_files=()
for pattern in 'libmpi.so.*' 'libopen-pal.so.*' 'libopen-rte.so.*' 'libpmix.so.*' 'libhdf5_serial.so.*' \
               'libboost_program_options.so.*' 'libbenchmark.so.*' 'libhwloc.so.*' 'libevent*-2.1.so.*' 'libsz.so.*' \
               'libaec.so.*' 'libcurl.so.*' 'libgfortran.so.*' 'libopenblas.so.*' 'libmunge.so.*'; do
  for f in "$ma"/$pattern; do [[ -f $f && ! -L $f ]] && hide_files+=("$f"); done
done
hide_script='set -e
for d in '"${hide_dirs[*]}"'; do [ -d "$d" ] && mount -t tmpfs -o size=1m none "$d"; done
for f in '"${hide_files[*]}"'; do mount --bind /dev/null "$f"; done
exec "$@"'
isolate=(unshare -m --propagation private bash -c "$hide_script" isolate)
if ! "${isolate[@]}" true 2>/dev/null; then
  echo "gpu-rehearse: warning: cannot make a private mount namespace (not root?): the system's libraries stay visible"
  isolate=()
fi

status=0
for p in $phases; do
  out=$(mktemp -d /tmp/gpt2-rehearse-$p.XXXXXX)
  t0=$SECONDS
  set +e
  OUT=$out "${isolate[@]}" bash tools/gpu-phase.sh "$p" --deadline-s 480 > "$out.log" 2>&1
  rc=$?
  set -e
  took=$((SECONDS - t0))
  files=$(find "$out" -type f | wc -l)
  problems=()
  ((rc == 0)) || problems+=("exit $rc")
  # the table's rows: "name | RESULT | figure | target"
  rows_of() { grep -E "^[a-z0-9_]+ +\| $1 " "$out.log"; }
  rows_of FAIL >/dev/null && problems+=("failed steps: $(rows_of FAIL | cut -d'|' -f1 | xargs)")
  ((files <= 8)) || problems+=("$files files in \$OUT (at most 8 come back)")
  ((took <= budget_s)) || problems+=("took $took s (budget $budget_s s)")
  tail -1 "$out.log" | grep -q "^phase $p: " || problems+=("the table is not the last thing printed")
  rows_of PASS >/dev/null || problems+=("no step passed")
  if ((${#problems[@]})); then
    echo "FAIL  phase $p ($took s, $files files): ${problems[*]}"
    tail -40 "$out.log"
    status=1
  else
    echo "ok    phase $p ($took s, $files files in \$OUT, $(rows_of PASS | wc -l) PASS, $(rows_of SKIP | wc -l) SKIP)"
  fi
  rm -rf "$out" "$out.log"
done
exit $status
