#!/usr/bin/env bash
# Rehearses, on this machine without a GPU, every phase that tools/gpu-phase.sh runs on the lent one:
# the bundle is packed, unpacked in a clean folder, and each phase runs with the system's own Open MPI,
# PMIx, HDF5, Boost, OpenBLAS and Google Benchmark hidden (a private mount namespace lays empty folders
# and /dev/null over them), so a library missing from the bundle fails here, not there. GPU steps SKIP;
# everything else must PASS. The phases run as the device calls run them, two to a call into one $OUT
# (A then B, C then D), and each call's limits are checked: at most 8 files in $OUT with every phase's
# summary and logs among them, within a device call's 600 s, each phase's table printed last.
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
readonly budget_s=590  # one device call runs at most 600 s, and runs two phases

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
for call in "A B" "C D"; do
  wanted=()
  for p in $call; do [[ " $phases " == *" $p "* ]] && wanted+=("$p"); done
  ((${#wanted[@]})) || continue
  out=$(mktemp -d /tmp/gpt2-rehearse.XXXXXX)
  t0=$SECONDS
  problems=()
  for p in "${wanted[@]}"; do
    set +e
    OUT=$out "${isolate[@]}" bash tools/gpu-phase.sh "$p" > "$out.$p.log" 2>&1
    rc=$?
    set -e
    ((rc == 0)) || problems+=("phase $p: exit $rc")
    # the table's rows: "name | RESULT | seconds | figure | target"
    rows_of() { grep -E "^[a-z0-9_]+ +\| $1 " "$out.$p.log"; }
    rows_of FAIL >/dev/null && problems+=("phase $p: failed steps: $(rows_of FAIL | cut -d'|' -f1 | xargs)")
    grep -q "deadline: not started\|cut by the phase deadline" "$out.$p.log" &&
      problems+=("phase $p: the deadline skipped steps here, where GPU steps take no time")
    tail -1 "$out.$p.log" | grep -q "^phase $p: [0-9]* step(s), [0-9]* failed, [0-9]* s, " ||
      problems+=("phase $p: the table is not the last thing printed")
    rows_of PASS >/dev/null || problems+=("phase $p: no step passed")
    [[ -f $out/summary_$p.txt && -f $out/phase_${p}_logs.tar.gz ]] || problems+=("phase $p: its summary or logs left \$OUT")
  done
  took=$((SECONDS - t0))
  files=$(find "$out" -type f | wc -l)
  ((files <= 8)) || problems+=("$files files in \$OUT (at most 8 come back)")
  ((took <= budget_s)) || problems+=("took $took s (one call: $budget_s s)")
  if ((${#problems[@]})); then
    echo "FAIL  call '${wanted[*]}' ($took s, $files files): ${problems[*]}"
    for p in "${wanted[@]}"; do tail -40 "$out.$p.log"; done
    status=1
  else
    echo "ok    call '${wanted[*]}' ($took s, $files files in \$OUT: $(cd "$out" && ls | xargs))"
  fi
  rm -rf "$out" "$out".*.log
done
exit $status
