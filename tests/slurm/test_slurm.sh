#!/usr/bin/env bash
# slurm/train.sbatch on a real SLURM (munge + slurmctld + two slurmd as nodes n1, n2 on localhost):
#   (a) one node, 2 ranks; (b) two nodes, 1 rank each: both COMPLETED, loss falls by at least 1.0;
#   (c) preemption: `scancel --signal=USR1 --batch` a running 2-node job; it writes a checkpoint, exits 75,
#       requeues itself, comes back (restart 1), resumes at the checkpoint's step and finishes;
#   (d) scancel (SIGTERM, SIGKILL KillWait later): a checkpoint within KillWait; a resubmission resumes it.
# Usage: test_slurm.sh BIN_DIR WORK_DIR SOURCE_DIR   (root; slurm-wlm and munge installed)
set -uo pipefail

[[ $# -eq 3 ]] || { echo "usage: $0 BIN_DIR WORK_DIR SOURCE_DIR" >&2; exit 2; }
bin_dir=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" || exit 2
work=$(cd "$2" && pwd)
src=$(cd "$3" && pwd) || exit 2
here=$(cd "$(dirname "$0")" && pwd)
cluster=$here/slurm_cluster.sh
cdir=$work/cluster
jobs_dir=$work/jobs

if [[ $(id -u) -ne 0 ]]; then echo "test_slurm: skipped: needs root to run slurmd"; exit 0; fi
for p in sbatch slurmctld slurmd munged; do
  command -v "$p" >/dev/null || [[ -x /usr/sbin/$p ]] || {
    echo "test_slurm: FAIL: $p not installed (tools/install-deps.sh installs slurm-wlm munge)" >&2; exit 1; }
done

t_start=$(date +%s)
failed=0
all_jobs=()

dump() {  # job outputs and daemon log tails, for diagnosis
  local f
  for f in "$jobs_dir"/*.out; do
    [[ -f $f ]] || continue
    echo "===== $f"; tail -n 60 "$f"
  done
  for j in "${all_jobs[@]}"; do
    echo "===== scontrol show job $j"; timeout 10 scontrol show job "$j" 2>&1 | head -40
  done
  echo "===== sinfo"; timeout 10 sinfo -N -l 2>&1
  [[ -f $cdir/log/jobcomp.txt ]] && { echo "===== jobcomp"; cat "$cdir/log/jobcomp.txt"; }
  bash "$cluster" logs "$cdir"
}

cleanup() {
  local rc=$?
  [[ $failed -ne 0 || $rc -ne 0 ]] && dump
  bash "$cluster" stop "$cdir"
  echo "test_slurm: total $(( $(date +%s) - t_start )) s"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "test_slurm: FAIL: $*" >&2; failed=1; exit 1; }

rm -rf "$jobs_dir" "$work/runs"
mkdir -p "$jobs_dir" "$work/runs"

bash "$cluster" start "$cdir" || fail "cluster did not start"
export SLURM_CONF=$cdir/etc/slurm.conf

# The job environment: sbatch propagates the submit environment.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,tcp          # two "nodes" on one host: no shared-memory transport between them
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
# PMIx's shared-memory datastore (gds ds21/ds12) rarely segfaults at a rank's start-up on this setup
# (bench_allreduce rank 1, SIGSEGV in the sweep; openpmix#1114, open-mpi/ompi#7516): the documented
# workaround, the hash store, as docs/scaling.md tells users.
export PMIX_MCA_gds=hash
export GPT2_BIN=$bin_dir/gpt2-train
[[ -x $GPT2_BIN ]] || fail "$GPT2_BIN not built"

# Data for configs/ci.ini (tools/test.sh prepares data/ci; prepare a private copy when it is missing).
data=$src/data/ci
if [[ ! -f $data/train.h5 || ! -f $data/val.h5 ]]; then
  data=$work/data
  BUILD_DIR=$(dirname "$bin_dir") bash "$src/tools/prepare-data.sh" --passages gen1:1-gen50:26 \
    --out "$data" --val-fraction 0.1 >/dev/null || fail "could not prepare $data"
fi
data_args=(--train-data "$data/train.h5" --val-data "$data/val.h5")

cd "$src" || fail "cannot cd to $src"   # the job runs in the submit directory (configs/ci.ini is relative)
common=(--parsable --gpus-per-node=0 --cpus-per-task=1 --time=10)

submit() {  # name sbatch-options... -- train.sbatch arguments...; prints the job id
  local name=$1; shift
  local opts=()
  while [[ $# -gt 0 && $1 != -- ]]; do opts+=("$1"); shift; done
  shift
  local id
  id=$(GPT2_OUT=$work/runs/$name sbatch "${common[@]}" --job-name="$name" \
       --output="$jobs_dir/$name-%j.out" "${opts[@]}" "$src/slurm/train.sbatch" configs/ci.ini \
       "${data_args[@]}" "$@") || return 1
  id=${id%%;*}
  [[ $id =~ ^[0-9]+$ ]] || return 1
  echo "$id"
}

job_field() { timeout 10 scontrol show job "$1" 2>/dev/null | grep -oE "(^|[[:space:]])$2=[^[:space:]]*" | head -1 | cut -d= -f2; }

wait_done() {  # job timeout_s: wait until the job is in a final state; prints the state
  local j=$1 limit=$2 state="" t0
  t0=$(date +%s)
  while (( $(date +%s) - t0 < limit )); do
    state=$(job_field "$j" JobState)
    if [[ -z $state && -f $cdir/log/jobcomp.txt ]]; then  # purged from slurmctld: ask the jobcomp log
      state=$(grep "^JobId=$j " "$cdir/log/jobcomp.txt" | tail -1 | grep -oE 'JobState=[^ ]*' | cut -d= -f2)
      [[ $state == PENDING ]] && state=""
    fi
    case $state in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
        echo "$state"; return 0 ;;
    esac
    sleep 1
  done
  echo "TIMEOUT_WAITING(${state:-unknown})"
  return 1
}

check_completed() {  # name job
  local name=$1 j=$2 state ec out
  state=$(wait_done "$j" 240) || fail "$name: job $j not finished after 240 s (state $state)"
  [[ $state == COMPLETED ]] || fail "$name: job $j ended $state, want COMPLETED"
  ec=$(job_field "$j" ExitCode)
  [[ -z $ec || $ec == 0:0 ]] || fail "$name: job $j exit code $ec"
  out=$(ls "$jobs_dir/$name-$j.out" 2>/dev/null) || fail "$name: no output file"
  grep -q "^train.sbatch: job $j " "$out" || fail "$name: train.sbatch did not start"
  echo "test_slurm: $name: job $j COMPLETED (exit $ec)"
}

check_loss_falls() {  # name
  local m=$work/runs/$1/metrics.jsonl
  [[ -s $m ]] || fail "$1: no metrics at $m"
  python3 - "$m" "$1" <<'EOF' || fail "$1: loss did not fall (see above)"
import json, sys
losses = [(r["step"], r["loss"]) for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
if len(losses) < 2:
    sys.exit(f"{sys.argv[2]}: only {len(losses)} loss lines")
(s0, l0), (s1, l1) = losses[0], losses[-1]
print(f"test_slurm: {sys.argv[2]}: loss {l0:.3f} at step {s0} -> {l1:.3f} at step {s1}")
sys.exit(0 if l0 - l1 >= 1.0 else f"{sys.argv[2]}: loss fell by {l0 - l1:.3f} < 1.0")
EOF
}

# (a) one node, two ranks
ja=$(submit single --nodes=1 --ntasks-per-node=2 --) || fail "sbatch (single node) failed"
all_jobs+=("$ja")
check_completed single "$ja"
grep -q "2 rank(s) on 1 node(s)" "$jobs_dir/single-$ja.out" || fail "single: not 2 ranks on 1 node"
check_loss_falls single

# (b) two nodes, one rank each
jb=$(submit multi --nodes=2 --ntasks-per-node=1 --) || fail "sbatch (two nodes) failed"
all_jobs+=("$jb")
check_completed multi "$jb"
grep -q "2 rank(s) on 2 node(s)" "$jobs_dir/multi-$jb.out" || fail "multi: not 2 ranks on 2 nodes"
nl=$(job_field "$jb" NodeList)
[[ $nl == "n[1-2]" ]] || fail "multi: NodeList $nl, want n[1-2]"
check_loss_falls multi

# (c) preemption: a 2-node job long enough to be signalled while training; it requeues itself and
# resumes. Steps take ~7 ms here; the resumed run finishes the remaining steps in seconds.
steps=1500
jc=$(submit preempt --nodes=2 --ntasks-per-node=1 -- --max-steps $steps --ckpt-every 0 --log-every 10 \
       --val-every 500) || fail "sbatch (preemption) failed"
all_jobs+=("$jc")
outc=$jobs_dir/preempt-$jc.out
t0=$(date +%s)
until grep -qE '^step +[0-9]+/[0-9]+ \| loss' "$outc" 2>/dev/null; do
  (( $(date +%s) - t0 < 120 )) || fail "preempt: no training progress after 120 s"
  state=$(job_field "$jc" JobState)
  # empty: scontrol did not answer within its 10 s (a loaded machine); ask again
  [[ -z $state || $state == PENDING || $state == RUNNING || $state == CONFIGURING ]] ||
    fail "preempt: job $jc is $state before it was signalled"
  sleep 0.2
done
scancel --signal=USR1 --batch "$jc" || fail "preempt: scancel --signal=USR1 --batch $jc failed"
echo "test_slurm: preempt: sent USR1 to job $jc's batch script"

state=$(wait_done "$jc" 300) || fail "preempt: job $jc not finished after 300 s (state $state)"
[[ $state == COMPLETED ]] || fail "preempt: job $jc ended $state, want COMPLETED"
restarts=$(job_field "$jc" Restarts)
[[ $restarts == 1 ]] || fail "preempt: Restarts=$restarts, want 1"
grep -q "USR1 received" "$outc" || fail "preempt: train.sbatch did not forward USR1"
grep -q "requeueing job $jc" "$outc" || fail "preempt: train.sbatch did not requeue (status 75 expected)"
grep -q "^train.sbatch: job $jc (restart 1)" "$outc" || fail "preempt: no restart-1 run in the output"
ck=$(grep -oE 'checkpointing and exiting for requeue' "$outc" | head -1)
[[ -n $ck ]] || fail "preempt: the trainer did not checkpoint on the signal"
# the step of the checkpoint written on the signal: the first checkpoint line
ckline=$(grep -E '^step +[0-9]+ \| checkpoint ' "$outc" | head -1)
ckstep=$(sed -E 's/^step +([0-9]+) .*/\1/' <<<"$ckline")
ckfile=${ckline##* }
[[ -n $ckstep && -f $ckfile ]] || fail "preempt: checkpoint file missing ('$ckline')"
(( ckstep > 0 && ckstep < steps )) || fail "preempt: checkpoint step $ckstep not inside the run"
resline=$(grep -E '^resumed from .* at step [0-9]+' "$outc" | head -1)
[[ -n $resline ]] || fail "preempt: no 'resumed from' line"
resstep=$(sed -E 's/.* at step ([0-9]+).*/\1/' <<<"$resline")
[[ $resstep == "$ckstep" ]] || fail "preempt: resumed at step $resstep, checkpoint was at $ckstep"
[[ $resline == *"$(basename "$ckfile")"* ]] || fail "preempt: resumed from another file: $resline"
grep -qE "^step +$steps/$steps \| loss" "$outc" || fail "preempt: the resumed run did not reach step $steps"
# metrics: every step from 1 to the end once the resumed run's lines replace any past the checkpoint
python3 - "$work/runs/preempt/metrics.jsonl" "$ckstep" "$steps" <<'EOF' || fail "preempt: metrics do not cover the run"
import json, sys
ck, steps = int(sys.argv[2]), int(sys.argv[3])
s = [r["step"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
last = {}
for k, step in enumerate(s):
    last[step] = k
if sorted(last) != list(range(1, steps + 1)) or s[-1] != steps:
    sys.exit(f"metrics steps: {len(s)} lines, {len(last)} distinct, last {s[-1]}; want 1..{steps}")
print(f"test_slurm: preempt: metrics cover steps 1..{steps} ({len(s)} loss lines, checkpoint at {ck})")
EOF
echo "test_slurm: preempt: job $jc checkpointed at step $ckstep, requeued (Restarts=$restarts), resumed at step $resstep, COMPLETED"

# (d) scancel: SLURM sends SIGTERM to every task, then SIGKILL KillWait (15 s here: room for a loaded CI
# machine) later. train.sbatch passes KillWait to the ranks (GPT2_KILL_GRACE_S); the small checkpoint
# fits, so the ranks write it at an agreed step before the SIGKILL. The job ends CANCELLED (scancel is no requeue); submitting the same
# run again resumes from that checkpoint.
jd=$(submit cancel --nodes=1 --ntasks-per-node=2 -- --max-steps $steps --ckpt-every 0 --log-every 10 \
       --val-every 500) || fail "sbatch (scancel) failed"
all_jobs+=("$jd")
outd=$jobs_dir/cancel-$jd.out
t0=$(date +%s)
until grep -qE '^step +[0-9]+/[0-9]+ \| loss' "$outd" 2>/dev/null; do
  (( $(date +%s) - t0 < 120 )) || fail "cancel: no training progress after 120 s"
  sleep 0.2
done
grep -q "preemption: the launcher sends SIGKILL 15.0 s after SIGTERM" "$outd" ||
  fail "cancel: the ranks did not learn KillWait from train.sbatch"
scancel "$jd" || fail "cancel: scancel $jd failed"
state=$(wait_done "$jd" 120) || fail "cancel: job $jd not finished after 120 s (state $state)"
[[ $state == CANCELLED ]] || fail "cancel: job $jd ended $state, want CANCELLED"
ckline=$(grep -m1 -E "^step +[0-9]+ \| checkpoint " "$outd")
[[ -n $ckline ]] || fail "cancel: no checkpoint written on SIGTERM within KillWait"
# SLURM signals the tasks and the batch script at once; train.sbatch forwards its TERM as USR1, so the
# ranks may see either first. Both mean "checkpoint now and exit".
grep -qE "received signal (15|10)" "$outd" || fail "cancel: the ranks did not report SIGTERM (or the forwarded USR1)"
ckstep=$(sed -E 's/^step +([0-9]+) .*/\1/' <<<"$ckline")
"$bin_dir/gpt2-data" export-hf "$work/runs/cancel" "$work/cancel_export" >/dev/null ||
  fail "cancel: the checkpoint written on SIGTERM does not load"
je=$(submit cancel --nodes=1 --ntasks-per-node=2 -- --max-steps $((ckstep + 20)) --ckpt-every 0 --log-every 10 \
       --val-every 500) || fail "sbatch (resume after scancel) failed"
all_jobs+=("$je")
state=$(wait_done "$je" 240) || fail "cancel: resumed job $je not finished (state $state)"
[[ $state == COMPLETED ]] || fail "cancel: resumed job $je ended $state, want COMPLETED"
grep -qE "resumed from .* at step $ckstep " "$jobs_dir/cancel-$je.out" || fail "cancel: job $je did not resume at step $ckstep"
echo "test_slurm: cancel: SIGTERM with KillWait 15 s -> checkpoint at step $ckstep, CANCELLED; resubmitted, resumed there"

# (d) a small scaling sweep (1 and 2 ranks, weak and strong, one rank per node) submitted through this
# SLURM by slurm/scaling.sh, then tools/scaling_report: report.md, report.csv and scaling.png.
sweep=$work/sweep
rm -rf "$sweep"
"$src/slurm/scaling.sh" --cpu --max-ranks 2 --ranks-per-node 1 --config configs/ci.ini --steps 6 --shared \
  --allreduce-max-mb 1 --time 00:05:00 --bin-dir "$bin_dir" --out "$sweep" || fail "sweep: scaling.sh failed"
for j in $(python3 -c "import json,sys; print(' '.join(str(p['job_id']) for p in json.load(open(sys.argv[1]))['points']))" \
             "$sweep/sweep.json"); do
  state=$(wait_done "$j" 240) || fail "sweep: job $j not finished after 240 s (state $state)"
  [[ $state == COMPLETED ]] || fail "sweep: job $j ended $state, want COMPLETED"
done
/usr/bin/python3 "$src/tools/scaling_report" "$sweep" >/dev/null || fail "sweep: scaling_report failed"
for f in report.md report.csv scaling.png; do [[ -s $sweep/$f ]] || fail "sweep: $f missing"; done
[[ $(head -c 8 "$sweep/scaling.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "sweep: scaling.png is not a PNG"
[[ $(grep -c '^weak,\|^strong,' "$sweep/report.csv") -ge 4 ]] || fail "sweep: report.csv lacks the 4 points"
echo "test_slurm: sweep: 4 points through SLURM, report.md, report.csv and scaling.png written"

echo "test_slurm: PASS"
