#!/usr/bin/env bash
# tools/plot_metrics on two real (tiny, synthetic-token) runs and a resumed run's metrics: a PNG with
# every run, one point per step; bad input (no directory, a corrupt line, no steps) fails naming the file.
# usage: test_plot_metrics.sh SOURCE_DIR BIN_DIR WORK_DIR
set -uo pipefail
src=$1 bin=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fails=0
fail() { echo "FAIL $*"; fails=$((fails+1)); }
tiny=(--n-layer 1 --n-head 2 --n-embd 32 --vocab-size 256 --max-seq-len 32 --seq-len 16 --micro-batch 2
      --benchmark --max-steps 6 --threads 1)
for r in a b; do
  "$bin/gpt2-train" "${tiny[@]}" --seed $([[ $r == a ]] && echo 1 || echo 2) --out "$work/run_$r" >/dev/null 2>&1 ||
    fail "training run $r"
done
# A resumed run: steps 3-4 written twice (the run died after step 4, resumed from step 2's checkpoint).
mkdir -p "$work/resumed"
printf '%s\n' '{"step":0,"val_loss":5.5}' '{"step":1,"loss":5.4,"tokens_per_s":100,"comm_exposed_ms":1}' \
  '{"step":2,"loss":5.2,"tokens_per_s":100,"comm_exposed_ms":1}' '{"step":3,"loss":9.9,"tokens_per_s":100,"comm_exposed_ms":1}' \
  '{"step":4,"loss":9.9,"tokens_per_s":100,"comm_exposed_ms":1}' '{"step":3,"loss":5.0,"tokens_per_s":100,"comm_exposed_ms":1}' \
  '{"step":4,"loss":4.8,"tokens_per_s":100,"comm_exposed_ms":1}' > "$work/resumed/metrics.jsonl"
out=$(/usr/bin/python3 "$src/tools/plot_metrics" "$work/run_a" "$work/run_b" "$work/resumed/metrics.jsonl" -o "$work/m.png" 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "plot_metrics exited $rc: $out"
[[ $(head -c 8 "$work/m.png" 2>/dev/null | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "m.png is not a PNG"
grep -q "^run_a: steps 1-6, last loss" <<<"$out" || fail "no summary of run_a: $out"
grep -q "^run_b: steps 1-6" <<<"$out" || fail "no summary of run_b: $out"
# The later lines of steps 3 and 4 win: the last loss is 4.8, not 9.9.
grep -q "^resumed: steps 1-4, last loss 4.8000, last val loss 5.5000" <<<"$out" || fail "resumed steps not replaced: $out"

expect_fail() {  # NAME PATTERN ARGS...
  local name=$1 pattern=$2; shift 2
  local o rc
  o=$(/usr/bin/python3 "$src/tools/plot_metrics" "$@" -o "$work/bad.png" 2>&1); rc=$?
  if [[ $rc -eq 0 ]]; then fail "$name: exit 0"; elif ! grep -Eq -- "$pattern" <<<"$o"; then fail "$name: '$o'"; else echo "ok   $name"; fi
}
mkdir -p "$work/empty" "$work/corrupt" "$work/nosteps"
echo '{"step":1,"loss":' > "$work/corrupt/metrics.jsonl"
echo '{"step":0,"val_loss":5.0}' > "$work/nosteps/metrics.jsonl"
expect_fail missing-dir "nowhere: no such file" "$work/nowhere"
expect_fail no-metrics "empty/metrics.jsonl: no such file" "$work/empty"
expect_fail corrupt-line "corrupt/metrics.jsonl:1: not JSON" "$work/corrupt"
expect_fail no-steps "nosteps/metrics.jsonl: no training steps" "$work/nosteps"
echo "$fails failure(s)"
[[ $fails -eq 0 ]]
