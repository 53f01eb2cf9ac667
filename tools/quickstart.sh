#!/usr/bin/env bash
# The main job on a built-in default: installs what is missing, builds (Release), prepares a
# byte-level dataset from the King James Bible, trains a small GPT-2 on 2 MPI ranks with
# configs/quickstart.ini (loss and val loss fall), saves a checkpoint and prints generated text.
#   tools/quickstart.sh                       the default corpus
#   tools/quickstart.sh --text my.txt         any other text (byte-level)
#   tools/quickstart.sh --bin DIR             the gpt2-data, -train and -sample in DIR: no install, no build
#   tools/quickstart.sh --work DIR            data/quickstart and runs/quickstart under DIR (default: here)
#   tools/quickstart.sh -- --max-steps 100    arguments after -- go to gpt2-train
set -euo pipefail
cd "$(dirname "$0")/.."
text="" ranks=${RANKS:-2} bin="" work=.
train_args=()
while [[ $# -gt 0 ]]; do
  [[ $1 == --text || $1 == --bin || $1 == --work ]] && [[ $# -lt 2 ]] &&
    { echo "quickstart: $1 needs a value (see --help)" >&2; exit 2; }
  case "$1" in
    --text) text="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --) shift; train_args=("$@"); break ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "quickstart: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [[ -z "$bin" ]]; then
  echo "== 1/4 dependencies"
  tools/install-deps.sh --runtime
  echo "== 2/4 build (Release)"
  tools/build.sh -DGPT2_BUILD_TESTS=OFF -DGPT2_BUILD_BENCH=OFF > /tmp/gpt2-quickstart-build.log 2>&1 \
    || { tail -30 /tmp/gpt2-quickstart-build.log; echo "quickstart: build failed (log above)" >&2; exit 1; }
  bin=${BUILD_DIR:-build}/bin
else
  echo "== 1-2/4 the binaries in $bin (no install, no build)"
fi
for b in gpt2-data gpt2-train gpt2-sample; do
  [[ -x "$bin/$b" ]] || { echo "quickstart: $bin/$b not found or not executable" >&2; exit 1; }
done
data=$work/data/quickstart run=$work/runs/quickstart
echo "== 3/4 data"
if [[ -n "$text" ]]; then
  tools/prepare-data.sh --bin "$bin" --text "$text" --out "$data"
else
  tools/prepare-data.sh --bin "$bin" --out "$data"
fi
paths=()  # the config's data and output paths are relative to the repository: elsewhere, given here
[[ "$work" != . ]] && paths=(--train-data "$data/train.h5" --val-data "$data/val.h5" --out "$run")
echo "== 4/4 train: mpirun -np $ranks $bin/gpt2-train --config configs/quickstart.ini ${paths[*]:-} ${train_args[*]:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # harmless when not root
mpirun_args=(-np "$ranks")
# More ranks than cores is fine for a demo.
[[ $(nproc) -lt $ranks ]] && mpirun_args+=(--oversubscribe)
mpirun "${mpirun_args[@]}" "$bin/gpt2-train" --config configs/quickstart.ini "${paths[@]}" "${train_args[@]}"
echo "== sample: $bin/gpt2-sample --ckpt $run --prompt 'And God said' --max-new-tokens 300 --top-k 10 --temperature 0.8"
"$bin/gpt2-sample" --ckpt "$run" --prompt "And God said" --max-new-tokens 300 --top-k 10 --temperature 0.8
echo "quickstart: metrics in $run/metrics.jsonl, checkpoints in $run/ckpt/"
