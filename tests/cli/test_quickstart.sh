#!/usr/bin/env bash
# The README's first command, tools/quickstart.sh, on this build: `--bin` skips its install and build
# steps (tools/test.sh has just done both), the rest runs as a new user's does. The King James Bible is
# prepared, 2 ranks train configs/quickstart.ini for 200 of its 600 steps, and then:
#   the validation loss falls by more than 2 nats (5.58 at step 0, about 2.4 at step 200);
#   a checkpoint is written at the last step and is the latest;
#   gpt2-sample prints 300 new tokens from it.
#   test_quickstart.sh BIN_DIR WORK_DIR SOURCE_DIR
set -uo pipefail
bin=$1 work=$2 src=$3
rm -rf "$work" && mkdir -p "$work"
log=$work/quickstart.log
# Bad options: named, exit non-zero, before anything runs
out=$(bash "$src/tools/quickstart.sh" --bin "$work/nowhere" 2>&1) && { echo "FAIL: --bin with no binaries exited 0"; exit 1; }
grep -q "nowhere/gpt2-data not found" <<<"$out" || { echo "FAIL: --bin with no binaries: $out"; exit 1; }
out=$(bash "$src/tools/quickstart.sh" --work 2>&1) && { echo "FAIL: --work without a value exited 0"; exit 1; }
grep -q -- "--work needs a value" <<<"$out" || { echo "FAIL: --work without a value: $out"; exit 1; }
timeout -k 5 500 bash "$src/tools/quickstart.sh" --bin "$bin" --work "$work" -- --max-steps 200 > "$log" 2>&1
rc=$?
fail() { echo "FAIL: $*"; tail -25 "$log"; exit 1; }
((rc == 0)) || fail "tools/quickstart.sh exited $rc"
run=$work/runs/quickstart
python3 - "$run/metrics.jsonl" <<'PY' || fail "the validation loss did not fall by 2 nats"
import json, sys
val = [(r["step"], r["val_loss"]) for r in map(json.loads, open(sys.argv[1])) if "val_loss" in r]
print("val loss by step:", ", ".join(f"{s}: {v:.3f}" for s, v in val))
sys.exit(not (len(val) >= 2 and val[0][0] == 0 and val[-1][0] == 200 and val[-1][1] < val[0][1] - 2.0))
PY
[[ $(cat "$run/ckpt/latest" 2>/dev/null) == step_00000200.h5 && -s $run/ckpt/step_00000200.h5 ]] ||
  fail "no checkpoint of step 200 as the latest in $run/ckpt"
grep -Eq 'gpt2-sample: [0-9]+ prompt \+ 300 new tokens' "$log" || fail "gpt2-sample did not print 300 new tokens"
echo "ok: quickstart trained, checkpointed and sampled ($(grep -c '^step .*/200 |' "$log") progress lines)"
