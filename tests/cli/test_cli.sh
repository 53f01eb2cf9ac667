#!/usr/bin/env bash
# Command-line behaviour of gpt2-train and gpt2-data: bad options and bad files give the intended
# message and a non-zero exit on every rank, never a hang; good runs train and the loss falls.
#   test_cli.sh BIN_DIR WORK_DIR SOURCE_DIR
set -uo pipefail
bin=$1 work=$2 src=$3
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
/usr/bin/python3 "$src/tests/cli/make_bad_files.py" "$work" || { echo "FAIL: cannot write test files with h5py"; exit 1; }

fails=0
tiny=(--n-layer 1 --n-head 2 --n-embd 32 --vocab-size 256 --max-seq-len 32 --seq-len 16 --micro-batch 2 --max-steps 3)

# expect_fail NAME STATUS PATTERN CMD...: CMD exits with STATUS (any non-zero if "nz") within the
# timeout and its output matches PATTERN (extended regex).
expect_fail() {
  local name=$1 want=$2 pattern=$3; shift 3
  local out rc
  # -k: a process that hangs before its signal handling is ready may not end on SIGTERM (then 137,
  # which a command killed by SIGKILL also gives: hence the clock)
  local t0=$SECONDS
  out=$(timeout -k 5 60 "$@" 2>&1); rc=$?
  last_out=$out
  if [[ $rc -eq 124 || ( $rc -eq 137 && $((SECONDS - t0)) -ge 60 ) ]]; then echo "FAIL $name: timed out (hang)"; fails=$((fails+1)); return; fi
  if [[ $rc -eq 0 || ( $want != nz && $rc -ne $want ) ]]; then
    echo "FAIL $name: exit $rc, wanted $want"; echo "$out" | head -5; fails=$((fails+1)); return
  fi
  if ! grep -Eq -- "$pattern" <<<"$out"; then
    echo "FAIL $name: output does not match /$pattern/:"; echo "$out" | head -5; fails=$((fails+1)); return
  fi
  echo "ok   $name"
}
# expect_fail_once NAME STATUS PATTERN CMD...: as expect_fail, on 2 ranks that both fail alike, and the
# error is printed once for both, "(on all 2 ranks)", not once by each rank.
expect_fail_once() {
  local before=$fails
  expect_fail "$@"
  [[ $fails -ne $before ]] && return
  local n; n=$(grep -c '\] error: ' <<<"$last_out")
  if [[ $n -ne 1 ]] || ! grep -q '(on all 2 ranks)' <<<"$last_out"; then
    echo "FAIL $1: the error is printed $n times, wanted once for all 2 ranks:"; grep '\] error: ' <<<"$last_out" | head -3
    fails=$((fails+1))
  fi
}
expect_ok() {
  local name=$1; shift
  local out rc
  out=$(timeout 120 "$@" 2>&1); rc=$?
  if [[ $rc -ne 0 ]]; then echo "FAIL $name: exit $rc"; echo "$out" | tail -5; fails=$((fails+1)); return 1; fi
  echo "ok   $name"
}

train=("$bin/gpt2-train")
mpi2=(mpiexec -n 2 "$bin/gpt2-train")

# --- options ---
out=$("$bin/gpt2-train" --help) && grep -q "Optimizer and schedule" <<<"$out" && grep -q -- "--global-batch-tokens" <<<"$out" \
  && echo "ok   help" || { echo "FAIL help"; fails=$((fails+1)); }
expect_fail unknown-option 2 "unknown option '--lrr'.*did you mean --lr" "${train[@]}" "${tiny[@]}" --lrr 1
expect_fail no-prefix-guessing 2 "unknown option '--micro'" "${train[@]}" "${tiny[@]}" --micro 4
printf 'n-layer = 1\nlearning-rate = 3\n' > "$work/bad.ini"
expect_fail config-unknown-key 2 "bad.ini.*unknown option 'learning-rate'" "${train[@]}" --config "$work/bad.ini"
printf -- '--lr = 0.001\n' > "$work/dashes.ini"
expect_fail config-key-with-dashes 2 "dashes.ini.*unknown option '--lr' \(a config file names options without their dashes: 'lr = \.\.\.'\)" \
  "${train[@]}" --config "$work/dashes.ini"
printf 'lrr = 0.001\n' > "$work/typo.ini"
expect_fail config-key-typo 2 "typo.ini.*unknown option 'lrr' \(did you mean 'lr'\?\)" "${train[@]}" --config "$work/typo.ini"
printf 'config = other.ini\n' > "$work/nested.ini"
expect_fail config-nested 2 "'config' is not allowed inside a config file" "${train[@]}" --config "$work/nested.ini"
# Ranks that disagree about the options (rank 1 alone gets a bad one) still all exit 2, no hang.
expect_fail options-differ-per-rank 2 "error on rank 1: unknown option '--bogus'" \
  mpiexec -n 1 "$bin/gpt2-train" "${tiny[@]}" --train-data "$work/good.h5" : -n 1 "$bin/gpt2-train" "${tiny[@]}" --bogus 1
# Ranks given different values (rank 1 another --max-steps, another --lr) run different jobs: every rank exits 2
# before the first step, naming what differs (rank 0 had once ended after 3 steps inside Open MPI's all-reduce)
expect_fail ranks-different-values 2 "these differ \(rank 0 has\): --max-steps 3\. Give every rank the same" \
  mpiexec -n 1 "$bin/gpt2-train" "${tiny[@]}" --train-data "$work/good.h5" : -n 1 "$bin/gpt2-train" "${tiny[@]}" \
  --train-data "$work/good.h5" --max-steps 5
expect_fail ranks-different-lr 2 "these differ \(rank 0 has\): --lr 0\.1\." \
  mpiexec -n 1 "$bin/gpt2-train" "${tiny[@]}" --train-data "$work/good.h5" --lr 0.1 : -n 1 "$bin/gpt2-train" \
  "${tiny[@]}" --train-data "$work/good.h5"
# A word that is no option nor an option's value (Boost set it aside: --lr 0.1 0.2 trained with 0.1)
expect_fail stray-word 2 "unexpected argument '0\.2'" "${train[@]}" "${tiny[@]}" --train-data "$work/good.h5" --lr 0.1 0.2
expect_fail stray-config 2 "unexpected argument 'ci\.ini'.*a config file goes after --config" "${train[@]}" ci.ini
expect_fail stray-word-sample 2 "unexpected argument 'God'" "$bin/gpt2-sample" --ckpt "$work/none.h5" --prompt And God
expect_fail stray-word-data 2 "unexpected argument '0\.2'" "$bin/gpt2-data" prepare --input "$work/notes.h5" \
  --out "$work/stray" --val-fraction 0.1 0.2
expect_fail negative-seed 2 "--seed must be a whole number >= 0 \(got '-1'\)" "${train[@]}" "${tiny[@]}" --seed -1
printf 'seed = -5\n' > "$work/negseed.ini"
expect_fail negative-seed-in-config 2 "negseed.ini.*--seed must be a whole number >= 0" "${train[@]}" "${tiny[@]}" \
  --config "$work/negseed.ini"
expect_fail negative-seed-sample 2 "--seed must be a whole number >= 0" "$bin/gpt2-sample" --ckpt "$work/none.h5" --seed -1
expect_fail negative-top-k-sample 2 "--top-k must not be negative \(got -5\)" "$bin/gpt2-sample" --ckpt "$work/none.h5" --top-k -5
expect_fail benchmark-eval-only 2 "--benchmark and --eval-only cannot be combined" "${train[@]}" "${tiny[@]}" \
  --benchmark --eval-only --val-data "$work/good.h5"
expect_fail config-missing 2 "cannot read config file" "${train[@]}" --config "$work/nope.ini"
expect_fail bad-number 2 "invalid|lr" "${train[@]}" "${tiny[@]}" --lr abc
expect_fail no-model 2 "no model given" "${train[@]}" --train-data "$work/good.h5"
expect_fail unknown-preset 2 "unknown --model 'gpt3'" "${train[@]}" --model gpt3
expect_fail heads-divide 2 "n_head \(3\) must divide n_embd \(32\)" "${train[@]}" "${tiny[@]}" --n-head 3
expect_fail seq-too-long 2 "--seq-len 64 exceeds --max-seq-len 32" "${train[@]}" "${tiny[@]}" --seq-len 64
expect_fail bad-device 2 "--device must be cpu, cuda or auto" "${train[@]}" "${tiny[@]}" --device tpu
# resolve_backends: what the CPU backend does not implement is refused with the option to change.
expect_fail bf16-on-cpu 2 "--precision bf16 needs --device cuda" "${train[@]}" "${tiny[@]}" --device cpu --precision bf16 --max-steps 1
expect_fail nccl-on-cpu 2 "--comm nccl needs --device cuda" "${train[@]}" "${tiny[@]}" --device cpu --comm nccl --max-steps 1
expect_fail cuda-graph-on-cpu 2 "--cuda-graph needs --device cuda" "${train[@]}" "${tiny[@]}" --device cpu --cuda-graph --max-steps 1
expect_fail profile-on-cpu 2 "--profile-step times the CUDA backend's kernels: it needs --device cuda" \
  "${train[@]}" "${tiny[@]}" --device cpu --profile-step 1 --max-steps 1
expect_fail profile-past-the-end 2 "--profile-step must be a step of the run, 1 to --max-steps \(3\), or 0 for none \(got 4\)" \
  "${train[@]}" "${tiny[@]}" --profile-step 4 --max-steps 3
expect_fail bad-schedule 2 "--schedule must be" "${train[@]}" "${tiny[@]}" --schedule cosinus
expect_fail bad-recompute 2 "--recompute must be none, selective or full" "${train[@]}" "${tiny[@]}" --recompute some
# Boost.ProgramOptions formats its messages by replacing "%value%" until none is left: a value that
# contains its own placeholder hung (found by fuzz_train_options); it is an ordinary error now.
expect_fail placeholder-value 2 "the argument \\('% value%'\\) for option '--micro-batch' is invalid" \
  "${train[@]}" "${tiny[@]}" --micro-batch '%value%'
# The option's own name comes back through the derived "%canonical_option%": that hung too.
expect_fail placeholder-option-name 2 "the argument for option '--a% canonical_option%' should follow" \
  "${train[@]}" "${tiny[@]}" '--a%canonical_option%='
printf 'log-every = x%%value%%%%value%%\n' > "$work/placeholder.ini"
expect_fail placeholder-value-in-config 2 "placeholder.ini.*for option 'log-every' is invalid" \
  "${train[@]}" "${tiny[@]}" --config "$work/placeholder.ini"
expect_fail bad-zero 2 "--zero must be 0 or 1 \\(got 2\\)" "${train[@]}" "${tiny[@]}" --zero 2
expect_fail bad-option-2-ranks 2 "unknown option" "${mpi2[@]}" "${tiny[@]}" --bogus 1

# --- files ---
expect_fail missing-data 1 "file not found: $work/missing.h5" "${train[@]}" "${tiny[@]}" --train-data "$work/missing.h5"
expect_fail glob-no-match 1 "no files match" "${train[@]}" "${tiny[@]}" --train-data "$work/shard_*.h5"
expect_fail not-hdf5 1 "not an HDF5 file" "${train[@]}" "${tiny[@]}" --train-data "$work/notes.h5"
expect_fail truncated 1 "not an HDF5 file|truncated|corrupt" "${train[@]}" "${tiny[@]}" --train-data "$work/truncated.h5"
expect_fail no-tokens 1 "no /tokens dataset" "${train[@]}" "${tiny[@]}" --train-data "$work/notokens.h5"
expect_fail vocab-too-big 2 "vocab_size 50257 but the model's vocabulary is 256" "${train[@]}" "${tiny[@]}" --train-data "$work/vocab_big.h5"
expect_fail token-out-of-range 1 "token id 300 at index 5000 of .*oob.h5 is >= the file's vocab_size 256" \
  "${train[@]}" "${tiny[@]}" --train-data "$work/oob.h5" --micro-batch 64 --max-steps 20
expect_fail too-short 1 "fewer than one global batch" "${train[@]}" "${tiny[@]}" --train-data "$work/tiny.h5"
expect_fail batch-divisibility 2 "does not divide into micro-batches" "${train[@]}" "${tiny[@]}" --train-data "$work/good.h5" --global-batch-tokens 48
expect_fail_once missing-data-2-ranks 1 "file not found" "${mpi2[@]}" "${tiny[@]}" --train-data "$work/missing.h5"
# The same failures on 2 ranks: every rank ends non-zero, nobody hangs; one that every rank finds at start-up
# is printed once for all (comm/fail_together.hpp), with the status 2 of a bad command line where the
# options cannot work together.
expect_fail token-out-of-range-2-ranks 1 "token id 300 at index 5000" "${mpi2[@]}" "${tiny[@]}" --train-data "$work/oob.h5" \
  --micro-batch 32 --max-steps 20
expect_fail_once world-size-divides-2-ranks 2 "does not divide into micro-batches of 2 on 2 ranks" "${mpi2[@]}" "${tiny[@]}" \
  --train-data "$work/good.h5" --global-batch-tokens 48
expect_fail_once truncated-2-ranks 1 "not an HDF5 file|truncated|corrupt" "${mpi2[@]}" "${tiny[@]}" --train-data "$work/truncated.h5"
expect_fail_once too-short-2-ranks 1 "fewer than one global batch" "${mpi2[@]}" "${tiny[@]}" --train-data "$work/tiny.h5"
# Runs that work but not as the user meant: a warning says so (a warmup that never ends, threads beyond the cores)
out=$(timeout 60 "${train[@]}" "${tiny[@]}" --train-data "$work/good.h5" --warmup-steps 3 --threads 1 2>&1)
if [[ $? -eq 0 ]] && grep -q "warning: --warmup-steps 3 reaches --max-steps 3: the learning rate rises for the whole run" <<<"$out"; then
  echo "ok   warmup-reaches-max-steps"
else echo "FAIL warmup-reaches-max-steps: $(tail -3 <<<"$out")"; fails=$((fails+1)); fi
out=$(timeout 60 "${train[@]}" "${tiny[@]}" --train-data "$work/good.h5" --threads 4096 --max-steps 1 2>&1)
if [[ $? -eq 0 ]] && grep -q "warning: --threads 4096 .*asks for [0-9]* cores, and .* [0-9]*: threads share cores" <<<"$out" &&
    ! grep -q "warning: --threads" <<<"$(timeout 60 "${train[@]}" "${tiny[@]}" --train-data "$work/good.h5" --threads 1 --max-steps 1 2>&1)"; then
  echo "ok   threads-beyond-cores"
else echo "FAIL threads-beyond-cores: $(grep -m1 warning <<<"$out")"; fails=$((fails+1)); fi
# validation data shorter than a micro-batch: refused at start-up with the training data's checks, once, before
# anything is printed of the run (it was found at the first validation, after the banner, with MPI's abort)
expect_fail_once val-too-short-2-ranks 1 "validation data .*tiny.h5 holds 0 windows of 17 tokens, fewer than one micro-batch of 2" \
  "${mpi2[@]}" "${tiny[@]}" --train-data "$work/good.h5" --val-data "$work/tiny.h5"
if grep -q "gpt2-train | model" <<<"$last_out"; then echo "FAIL val-too-short-2-ranks: found after the banner"; fails=$((fails+1)); fi
# errors_printed NAME N: the last expect_fail's output holds N error lines.
errors_printed() {
  local n; n=$(grep -c '\] error: ' <<<"$last_out")
  [[ $n -eq $2 ]] || { echo "FAIL $1: $n error lines, wanted $2:"; grep '\] error: ' <<<"$last_out" | head -3; fails=$((fails+1)); }
}
# A file missing on one rank's node only: that rank says so; two ranks that fail differently: one line each.
f=$fails; expect_fail missing-on-one-rank 1 "rank 1 .*file not found: $work/missing.h5 \(on this rank only, of 2\)" \
  mpiexec -n 1 "$bin/gpt2-train" "${tiny[@]}" --train-data "$work/good.h5" : -n 1 "$bin/gpt2-train" "${tiny[@]}" \
  --train-data "$work/missing.h5"
[[ $fails -eq $f ]] && errors_printed missing-on-one-rank 1
f=$fails; expect_fail two-errors-2-ranks 1 "rank 0 .*file not found: $work/missing.h5 \(on this rank only, of 2\)" \
  mpiexec -n 1 "$bin/gpt2-train" "${tiny[@]}" --train-data "$work/missing.h5" : -n 1 "$bin/gpt2-train" "${tiny[@]}" \
  --train-data "$work/notes.h5"
if [[ $fails -eq $f ]]; then
  if grep -Eq "rank 1 .*not an HDF5 file.*\(on this rank only, of 2\)" <<<"$last_out"; then
    errors_printed two-errors-2-ranks 2
  else
    echo "FAIL two-errors-2-ranks: rank 1's own error is missing"; fails=$((fails+1))
  fi
fi
# --resume auto on one rank and none on the other would take different collectives: refused together, once.
expect_fail_once resume-kind-differs 2 "--resume and --init-from must be given alike on every rank" \
  mpiexec -n 1 "$bin/gpt2-train" "${tiny[@]}" --train-data "$work/good.h5" --out "$work/rk" --resume auto : \
  -n 1 "$bin/gpt2-train" "${tiny[@]}" --train-data "$work/good.h5" --out "$work/rk"
# A failure found on values every rank shares (the update overflows): rank 0 reports it, once.
f=$fails; expect_fail diverged-2-ranks 1 "rank 0 .*the update of step 1 made the weights non-finite" "${mpi2[@]}" "${tiny[@]}" \
  --train-data "$work/good.h5" --lr 1e38
[[ $fails -eq $f ]] && errors_printed diverged-2-ranks 1
# A lost peer: rank 1 dies (SIGKILL) at step 3 of a long run; the job must end, non-zero, promptly
# (expect_fail's 60 s), with the launcher naming the rank and the signal.
GPT2_FAULT_INJECT=1:3 expect_fail lost-peer nz "process rank 1 .* exited on signal 9" mpiexec -x GPT2_FAULT_INJECT -n 2 "$bin/gpt2-train" "${tiny[@]}" \
  --train-data "$work/good.h5" --max-steps 100000
expect_fail eval-only-needs-val 2 "--eval-only needs --val-data" "${train[@]}" "${tiny[@]}" --train-data "$work/good.h5" --eval-only
expect_fail init-from-missing 1 "file not found" "${train[@]}" "${tiny[@]}" --train-data "$work/good.h5" --init-from "$work/none.h5"
expect_fail data-missing-text 1 "cannot read text file" "$bin/gpt2-data" prepare --text "$work/none.txt" --out "$work/d"
expect_fail data-inspect-bad 1 "not an HDF5 file" "$bin/gpt2-data" inspect "$work/notes.h5"
out=$("$bin/gpt2-data" inspect --help) && grep -q "A checkpoint (or a run's --out directory" <<<"$out" \
  && echo "ok   data-inspect-help" || { echo "FAIL data-inspect-help: $out"; fails=$((fails+1)); }
expect_fail data-inspect-unknown-option 2 "unknown option '--verbose'" "$bin/gpt2-data" inspect --verbose "$work/notes.h5"
# gpt2-data writes /tokens with its CRC-32 (zlib's over the stored uint16s, as Python computes it); inspect reads
# every token back and verifies it, and fails on a token file one of whose bytes changed on disk
if expect_ok data-prepare-crc "$bin/gpt2-data" prepare --tokenizer byte --input "$src/README.md" --out "$work/tokcrc" \
    --val-fraction 0.2 --no-progress; then
  if out=$("$bin/gpt2-data" inspect "$work/tokcrc/train.h5" 2>&1) && grep -q "CRC-32 verified" <<<"$out"; then
    echo "ok   data-inspect-crc"
  else
    echo "FAIL data-inspect-crc: $out"; fails=$((fails+1))
  fi
  # --verify-data: 2 ranks share the reading and find both files' CRC-32s right
  if out=$(timeout 120 "${mpi2[@]}" "${tiny[@]}" --max-steps 1 --train-data "$work/tokcrc/train.h5" \
        --val-data "$work/tokcrc/val.h5" --verify-data 2>&1) \
      && grep -q "training data verified: .* 1 file(s), 1 of them against their CRC-32 (read by 2 rank(s)" <<<"$out" \
      && grep -q "validation data verified: .* 1 file(s), 1 of them against their CRC-32" <<<"$out"; then
    echo "ok   train-verify-data"
  else
    echo "FAIL train-verify-data:"; echo "$out" | tail -5; fails=$((fails+1))
  fi
  mkdir -p "$work/copy_a" "$work/copy_b" && cp "$work/tokcrc/train.h5" "$work/copy_a/" && cp "$work/tokcrc/val.h5" "$work/copy_a/"
  /usr/bin/python3 - "$work/tokcrc/train.h5" <<'PY' || { echo "FAIL data-crc-h5py"; fails=$((fails+1)); }
import sys, zlib
import h5py
with h5py.File(sys.argv[1], "r") as f:
    d = f["tokens"]
    assert d.attrs["crc32"] == zlib.crc32(d[...].astype("<u2").tobytes()), "crc32 is not zlib's"
    at = d.id.get_chunk_info(0).byte_offset + 1000
with open(sys.argv[1], "r+b") as raw:
    raw.seek(at)
    b = raw.read(1)[0]
    raw.seek(at)
    raw.write(bytes([b ^ 0x04]))  # stays a byte-level id (< 256): only the CRC-32 can tell
PY
  expect_fail data-inspect-flipped 1 "train.h5: /tokens fails its CRC-32 check" "$bin/gpt2-data" inspect "$work/tokcrc/train.h5"
  # Several files and a quoted glob, in order, to the first damaged one: val.h5 verified, then train.h5 refused
  f=$fails; expect_fail data-inspect-several 1 "train.h5: /tokens fails its CRC-32 check" "$bin/gpt2-data" inspect \
    "$work/tokcrc/val.h5" "$work/tokcrc/t*.h5"
  [[ $fails -eq $f ]] && ! grep -q "CRC-32 verified" <<<"$last_out" && { echo "FAIL data-inspect-several: val.h5 not inspected first"; fails=$((fails+1)); }
  # The same flipped byte in training: read as a valid id, so only --verify-data tells, once for both ranks
  expect_fail_once train-verify-data-flipped 1 "train.h5: /tokens fails its CRC-32 check" "${mpi2[@]}" "${tiny[@]}" \
    --max-steps 1 --train-data "$work/tokcrc/train.h5" --verify-data
  # Two copies at the same relative path, as on two nodes' local disks, one of them damaged: --verify-data local
  # reads each copy in full and names the rank (and host) with the damaged one; each rank runs in its copy's folder.
  cp "$work/tokcrc/train.h5" "$work/copy_b/" && cp "$work/tokcrc/val.h5" "$work/copy_b/"
  f=$fails; expect_fail train-verify-data-local 1 "rank 1 host [^]]+\] error: train.h5: /tokens fails its CRC-32 check.*\(on this rank only, of 2\)" \
    mpiexec -n 1 -wdir "$work/copy_a" "$bin/gpt2-train" "${tiny[@]}" --max-steps 1 --train-data train.h5 --verify-data local : \
    -n 1 -wdir "$work/copy_b" "$bin/gpt2-train" "${tiny[@]}" --max-steps 1 --train-data train.h5 --verify-data local
  [[ $fails -eq $f ]] && errors_printed train-verify-data-local 1
  # A file from another tool (h5py, no crc32): its ids are read and checked, and a warning says what was not
  if out=$(timeout 120 "${mpi2[@]}" "${tiny[@]}" --max-steps 1 --train-data "$work/good.h5" --verify-data 2>&1) \
      && grep -q "1 training data file(s) have no crc32 attribute .*good.h5: their token ids were checked" <<<"$out"; then
    echo "ok   train-verify-data-no-crc"
  else
    echo "FAIL train-verify-data-no-crc:"; echo "$out" | tail -5; fails=$((fails+1))
  fi
fi
expect_fail data-unknown-cmd 2 "unknown command" "$bin/gpt2-data" frobnicate

# --- good runs ---
# h5py-written files (uint16 and uint32) train.
expect_ok h5py-uint16-trains "${train[@]}" "${tiny[@]}" --train-data "$work/good.h5"
expect_ok h5py-uint32-trains "${train[@]}" "${tiny[@]}" --vocab-size 300 --train-data "$work/good32.h5"
# eval-only writes the initial validation loss to metrics.jsonl and stdout.
if expect_ok eval-only "${train[@]}" "${tiny[@]}" --val-data "$work/good.h5" --eval-only --out "$work/eval"; then
  grep -q '"val_loss"' "$work/eval/metrics.jsonl" && echo "ok   eval-only-metrics" || { echo "FAIL eval-only-metrics"; fails=$((fails+1)); }
fi
# The CI recipe trains and the loss falls; the checkpoint is written and --init-from reads it.
cd "$src"
if expect_ok ci-config "${train[@]}" --config configs/ci.ini --out "$work/ci"; then
  /usr/bin/python3 - "$work/ci/metrics.jsonl" <<'PY' && echo "ok   ci-loss-falls" || { echo "FAIL ci-loss-falls"; fails=$((fails+1)); }
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
train = [r["loss"] for r in rows if "loss" in r]
val = [r["val_loss"] for r in rows if "val_loss" in r]
need = {"step", "loss", "lr", "grad_norm", "ms", "tokens_per_s", "mfu", "comm_exposed_ms"}
assert all(need <= set(r) for r in rows if "loss" in r), "metrics lines lack fields"
assert len(train) == 40 and len(val) == 3, (len(train), len(val))
assert train[-1] < train[0] - 1.0, f"train loss did not fall: {train[0]} -> {train[-1]}"
assert val[-1] < val[0] - 1.0, f"val loss did not fall: {val}"
PY
  ck=$(cat "$work/ci/ckpt/latest" 2>/dev/null)
  expect_ok init-from "${train[@]}" --config configs/ci.ini --out "$work/ci2" --init-from "$work/ci/ckpt/$ck" --max-steps 2
  expect_fail resume-other-batch 2 "written with --global-batch-tokens 512 and --seq-len 64; resume with the same" \
    "${train[@]}" --config configs/ci.ini --out "$work/ci4" --resume "$work/ci/ckpt/$ck" --global-batch-tokens 1024
  expect_fail init-from-wrong-model 2 "holds a model .* but this run builds" "${train[@]}" --config configs/ci.ini \
    --n-embd 32 --out "$work/ci3" --init-from "$work/ci/ckpt/$ck"
  # A finished run resumed again (a requeued job): nothing to train, said so, exit 0, its checkpoint not rewritten
  cp "$work/ci/ckpt/$ck" "$work/ck_before_rerun.h5"
  out=$(timeout 120 "${train[@]}" --config configs/ci.ini --out "$work/ci" --resume auto --max-steps 10 2>&1)
  if [[ $? -eq 0 ]] && grep -q "already reaches --max-steps 10: nothing to train" <<<"$out" &&
      cmp -s "$work/ci/ckpt/$ck" "$work/ck_before_rerun.h5" && ! grep -q "checkpoint " <<<"$(grep '^step' <<<"$out")"; then
    echo "ok   resume-finished-run"
  else
    echo "FAIL resume-finished-run: $(tail -3 <<<"$out")"; fails=$((fails+1))
  fi
  # --model on the command line overrides the shape a config file gives (the command line overrides files)
  printf 'n-layer = 2\n' > "$work/nlayer.ini"
  out=$(timeout 60 "${train[@]}" --config "$work/nlayer.ini" --model d4 --vocab-size 256 --max-seq-len 16 --seq-len 16 \
    --micro-batch 1 --benchmark --max-steps 1 2>&1)
  out2=$(timeout 60 "${train[@]}" --config "$work/nlayer.ini" --model d4 --n-layer 3 --vocab-size 256 --max-seq-len 16 \
    --seq-len 16 --micro-batch 1 --benchmark --max-steps 1 2>&1)
  if grep -q "model L4 H4 C256" <<<"$out" && grep -q "model L3 H4 C256" <<<"$out2"; then echo "ok   cmdline-model-over-file"
  else echo "FAIL cmdline-model-over-file: $(grep -m1 'model L' <<<"$out") / $(grep -m1 'model L' <<<"$out2")"; fails=$((fails+1)); fi
  # Damaged copies of it, made with h5py: a NaN in a parameter (loads nowhere: training, sampling, export; its
  # crc32 updated as the error message says, so the NaN check is what refuses it), a value changed without
  # that, one byte flipped on disk, a tensor's crc32 dropped, no optimizer state (--resume refuses,
  # --init-from is for that), a negative step. Every tensor's crc32 attribute is zlib's, as Python computes it.
  /usr/bin/python3 - "$work/ci/ckpt/$ck" "$work" <<'PY' || { echo "FAIL damaged-checkpoints: h5py"; fails=$((fails+1)); }
import shutil, sys, zlib
import h5py
src, work = sys.argv[1], sys.argv[2]
with h5py.File(src, "r") as f:
    assert f.attrs["tensor_checksum"] == "crc32", dict(f.attrs)
    names = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    assert len(names) == 3 * len(f["model"]), names
    for n in names:
        d = f[n]
        assert d.attrs["crc32"] == zlib.crc32(d[...].astype("<f4").tobytes()), n
for name in ("nan", "edited", "flipped", "nocrc", "noopt", "negstep"):
    shutil.copy(src, f"{work}/ck_{name}.h5")
with h5py.File(f"{work}/ck_nan.h5", "r+") as f:
    w = f["model/ln_f.weight"]
    x = w[...]
    x[3] = float("nan")
    w[...] = x
    w.attrs["crc32"] = zlib.crc32(x.astype("<f4").tobytes())
with h5py.File(f"{work}/ck_edited.h5", "r+") as f:
    w = f["model/ln_f.weight"]
    w[0] = w[0] * 2
with h5py.File(f"{work}/ck_flipped.h5", "r") as f:
    at = f["optimizer/v/h.0.mlp.c_proj.weight"].id.get_offset() + 1001
with open(f"{work}/ck_flipped.h5", "r+b") as raw:
    raw.seek(at)
    b = raw.read(1)[0]
    raw.seek(at)
    raw.write(bytes([b ^ 1]))
with h5py.File(f"{work}/ck_nocrc.h5", "r+") as f:
    del f["model/wpe.weight"].attrs["crc32"]
with h5py.File(f"{work}/ck_noopt.h5", "r+") as f:
    del f["optimizer"]
with h5py.File(f"{work}/ck_negstep.h5", "r+") as f:
    f.attrs["step"] = -7
PY
  expect_fail resume-edited-checkpoint 1 "ck_edited.h5: dataset /model/ln_f.weight fails its CRC-32 check .*a bad disk, copy or transfer" \
    "${train[@]}" --config configs/ci.ini --out "$work/ckedit" --resume "$work/ck_edited.h5"
  expect_fail sample-edited-checkpoint 1 "dataset /model/ln_f.weight fails its CRC-32 check" \
    "$bin/gpt2-sample" --ckpt "$work/ck_edited.h5" --max-new-tokens 4
  expect_fail export-edited-checkpoint 1 "dataset /model/ln_f.weight fails its CRC-32 check" \
    "$bin/gpt2-data" export-hf "$work/ck_edited.h5" "$work/hfedit"
  expect_fail resume-flipped-byte 1 "ck_flipped.h5: dataset /optimizer/v/h.0.mlp.c_proj.weight fails its CRC-32 check" \
    "${train[@]}" --config configs/ci.ini --out "$work/ckflip" --resume "$work/ck_flipped.h5"
  # gpt2-data inspect reads every tensor back: a run directory's latest passes with all 84 CRC-32s verified
  # (28 parameters, m and v), a flipped byte fails it
  if out=$("$bin/gpt2-data" inspect "$work/ci" 2>&1) && grep -q "tensors:    84 read back .* CRC-32 verified on 84 (all)" <<<"$out"; then
    echo "ok   inspect-checkpoint"
  else
    echo "FAIL inspect-checkpoint: $out"; fails=$((fails+1))
  fi
  expect_fail inspect-flipped-byte 1 "dataset /optimizer/v/h.0.mlp.c_proj.weight fails its CRC-32 check" \
    "$bin/gpt2-data" inspect "$work/ck_flipped.h5"
  expect_fail init-from-without-crc 1 "dataset /model/wpe.weight has no crc32 attribute, which this file promises" \
    "${train[@]}" --config configs/ci.ini --out "$work/cknocrc" --init-from "$work/ck_nocrc.h5" --max-steps 2
  # --resume auto passes over a latest checkpoint whose bytes changed (its probe reads every tensor) and continues
  # from the newest one that loads, saying why: a requeued job does not fail on it at every start
  if expect_ok ckpt-every-20 "${train[@]}" --config configs/ci.ini --out "$work/ciauto" --ckpt-every 20; then
    /usr/bin/python3 - "$work/ciauto/ckpt/step_00000040.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    at = f["model/h.1.attn.c_attn.weight"].id.get_offset() + 77
with open(sys.argv[1], "r+b") as raw:
    raw.seek(at)
    b = raw.read(1)[0]
    raw.seek(at)
    raw.write(bytes([b ^ 0x40]))
PY
    # (inspect of the run directory verifies the checkpoint latest names, with no fallback to an older one)
    expect_fail inspect-run-dir-damaged-latest 1 "step_00000040.h5: dataset /model/h.1.attn.c_attn.weight fails its CRC-32 check" \
      "$bin/gpt2-data" inspect "$work/ciauto"
    out=$(timeout 120 "${train[@]}" --config configs/ci.ini --out "$work/ciauto" --resume auto --max-steps 22 2>&1)
    if [[ $? -eq 0 ]] && grep -q "names step_00000040.h5, which does not load: /model/h.1.attn.c_attn.weight fails its CRC-32 check" <<<"$out" \
        && grep -q "resumed from .*step_00000020.h5 at step 20" <<<"$out"; then
      echo "ok   resume-auto-skips-damaged"
    else
      echo "FAIL resume-auto-skips-damaged: $(tail -5 <<<"$out")"; fails=$((fails+1))
    fi
  fi
  expect_fail resume-nan-checkpoint 1 "checkpoint $work/ck_nan.h5 is corrupt: parameter ln_f.weight holds nan at index 3" \
    "${train[@]}" --config configs/ci.ini --out "$work/cknan" --resume "$work/ck_nan.h5"
  expect_fail sample-nan-checkpoint 1 "ck_nan.h5 is corrupt: parameter ln_f.weight holds nan" \
    "$bin/gpt2-sample" --ckpt "$work/ck_nan.h5" --max-new-tokens 4
  expect_fail export-nan-checkpoint 1 "ck_nan.h5 is corrupt" "$bin/gpt2-data" export-hf "$work/ck_nan.h5" "$work/hfnan"
  expect_fail resume-without-optimizer 1 "has no optimizer state .*use --init-from" \
    "${train[@]}" --config configs/ci.ini --out "$work/cknoopt" --resume "$work/ck_noopt.h5"
  expect_ok init-from-without-optimizer "${train[@]}" --config configs/ci.ini --out "$work/cknoopt2" \
    --init-from "$work/ck_noopt.h5" --max-steps 2
  expect_fail resume-negative-step 1 "ck_negstep.h5 is corrupt: attribute step is -7" \
    "${train[@]}" --config configs/ci.ini --out "$work/ckneg" --resume "$work/ck_negstep.h5"
fi
# A run that diverges stops at the first loss, gradient norm or validation loss that is not finite, with no
# checkpoint of that step, and its metrics.jsonl stays JSON
if expect_fail diverged nz "the (validation loss|loss|gradient norm) is -?(nan|inf)" "${train[@]}" --config configs/ci.ini \
    --out "$work/diverge" --lr 1e6 --val-every 1 --ckpt-every 1 --max-steps 6; then
  /usr/bin/python3 - "$work/diverge" <<'PY' && echo "ok   diverged-metrics-json" || { echo "FAIL diverged-metrics-json"; fails=$((fails+1)); }
import glob, json, math, sys
import h5py
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
for path in glob.glob(f"{sys.argv[1]}/ckpt/step_*.h5"):
    with h5py.File(path) as f:
        assert all(math.isfinite(v) for d in f["model"].values() for v in d[...].ravel()), path
PY
fi
# A checkpoint write that fails leaves the previous checkpoint and `latest` intact: the step-20 file
# cannot be created (a directory squats on its temporary name), the run fails with a message, and
# resuming from latest still works.
mkdir -p "$work/ckfail/ckpt/step_00000020.h5.tmp"
expect_fail ckpt-write-fails 1 "cannot create HDF5 file" "${train[@]}" --config configs/ci.ini --out "$work/ckfail" \
  --ckpt-every 10 --max-steps 30
if [[ "$(cat "$work/ckfail/ckpt/latest" 2>/dev/null)" == "step_00000010.h5" ]]; then
  expect_ok ckpt-survives-failed-write "${train[@]}" --config configs/ci.ini --out "$work/ckfail" --resume auto --max-steps 12
else
  echo "FAIL ckpt-survives-failed-write: latest is '$(cat "$work/ckfail/ckpt/latest" 2>/dev/null)'"; fails=$((fails+1))
fi
# Preemption: SIGUSR1 to a running job (mpiexec forwards it to the ranks) -> all ranks stop at one step,
# a checkpoint is written there, the exit status is 75; --resume auto then continues from that step.
rm -rf "$work/pre"
mpiexec -n 2 "$bin/gpt2-train" --config configs/ci.ini --max-steps 100000 --log-every 100000 --out "$work/pre" \
  > "$work/pre.log" 2>&1 &
pid=$!
# Until the first step (a loaded CI machine, or the sanitizer tier, can take far longer than 20 s to start),
# or until the job has ended: a signal before the first step would test something else.
started=0
for _ in $(seq 1500); do
  grep -q "step .*1/100000" "$work/pre.log" 2>/dev/null && { started=1; break; }
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.2
done
if ((started)); then
  sleep 1
  kill -USR1 "$pid"
else
  kill -TERM "$pid" 2>/dev/null  # mpirun ends its ranks
fi
timeout 60 tail --pid="$pid" -f /dev/null; wait "$pid"; rc=$?
ck=$(cat "$work/pre/ckpt/latest" 2>/dev/null)
if ((!started)); then
  echo "FAIL preempt-checkpoint: the job did not reach step 1 (it exited $rc, or ran 300 s without), so no signal was sent"
  tail -5 "$work/pre.log"; fails=$((fails+1))
elif [[ $rc -eq 75 && -n "$ck" ]] && grep -q "received signal 10" "$work/pre.log"; then
  echo "ok   preempt-checkpoint ($ck)"
  step=$((10#$(sed 's/step_0*\([0-9]*\)\.h5/\1/' <<<"$ck")))
  # The preempted job ran 2 ranks x 8 sequences: 1 rank resumes it with the same global batch (2 micro-steps).
  expect_ok preempt-resume "${train[@]}" --config configs/ci.ini --out "$work/pre" --resume auto --max-steps $((step + 2)) \
    --global-batch-tokens 1024
  grep -q "\"step\":$((step + 1))," "$work/pre/metrics.jsonl" && echo "ok   preempt-resume-step" \
    || { echo "FAIL preempt-resume-step: no step $((step + 1)) after resume"; fails=$((fails+1)); }
else
  echo "FAIL preempt-checkpoint: exit $rc, latest '$ck'"; tail -5 "$work/pre.log"; fails=$((fails+1))
fi
# A run killed after its step-10 checkpoint wrote metrics for steps 11-15; resuming must not repeat them.
rm -rf "$work/dedupe"
GPT2_FAULT_INJECT=0:15 timeout 60 "${train[@]}" --config configs/ci.ini --out "$work/dedupe" --ckpt-every 10 >/dev/null 2>&1
if expect_ok resume-after-crash "${train[@]}" --config configs/ci.ini --out "$work/dedupe" --resume auto --max-steps 20; then
  steps=$(grep -o '"step":[0-9]*,"loss"' "$work/dedupe/metrics.jsonl" | sort | uniq -d | wc -l)
  n=$(grep -c '"loss"' "$work/dedupe/metrics.jsonl")
  [[ $steps -eq 0 && $n -eq 20 ]] && echo "ok   metrics-no-duplicate-steps" \
    || { echo "FAIL metrics-no-duplicate-steps: $steps duplicated, $n step lines"; fails=$((fails+1)); }
fi
# --recompute selective|full recomputes dropped activations bit-exactly: every step's loss and grad norm
# in metrics.jsonl equal --recompute none's, on 2 threads; the banner names the mode.
for mode in none selective full; do
  expect_ok "recompute-$mode" "${train[@]}" "${tiny[@]}" --n-layer 2 --max-steps 4 --threads 2 --recompute $mode \
    --train-data "$work/good.h5" --out "$work/rc-$mode"
done
/usr/bin/python3 - "$work" <<'PY' && echo "ok   recompute-same-losses" || { echo "FAIL recompute-same-losses"; fails=$((fails+1)); }
import json, sys
def steps(mode):
    rows = [json.loads(l) for l in open(f"{sys.argv[1]}/rc-{mode}/metrics.jsonl")]
    return [(r["step"], r["loss"], r["grad_norm"]) for r in rows if "loss" in r]
none = steps("none")
assert len(none) == 4, none
for mode in ("selective", "full"):
    assert steps(mode) == none, (mode, steps(mode), none)
PY
out=$("${train[@]}" "${tiny[@]}" --max-steps 1 --recompute selective --train-data "$work/good.h5" 2>&1)
grep -q "memory per rank (estimate, --recompute selective, --zero 0)" <<<"$out" && echo "ok   recompute-banner" \
  || { echo "FAIL recompute-banner"; echo "$out" | head -5; fails=$((fails+1)); }
echo "$fails failure(s)"
[[ $fails -eq 0 ]]
