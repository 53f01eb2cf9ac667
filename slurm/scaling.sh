#!/usr/bin/env bash
# Scaling sweep: one benchmark job per rank (GPU) count 1, 2, 4, ... up to a maximum, for weak scaling
# (fixed micro-batch per rank, global batch grows with the ranks) and strong scaling (fixed global
# batch, gradient accumulation shrinks as ranks grow). Each point is its own sbatch job and output
# directory <sweep>/<mode>-<n>/, running `gpt2-train --benchmark` and then `bench_allreduce` with the same
# ranks, on the path training takes (GPUs: NCCL on device buffers in bf16, or fp32 with --precision fp32;
# CPUs and --comm mpi: MPI on the host). tools/scaling_report turns the sweep into report.md, report.csv
# and scaling.png.
#
# Submit from the repository root (each job runs there):
#   slurm/scaling.sh --max-gpus 64 --config configs/gpt2-124m.ini --out runs/scaling-124m    # 8 GPUs/node
#   slurm/scaling.sh --max-gpus 16 --gpus-per-node 4 --modes weak --sbatch-arg --partition=gpu
#   slurm/scaling.sh --cpu --max-ranks 4 --ranks-per-node 2 --config configs/ci.ini --steps 10   # CPU only
#   slurm/scaling.sh --local --max-ranks 2 --config configs/ci.ini --out /tmp/sw   # no SLURM: mpirun here
#   slurm/scaling.sh --dry-run ...          # write the job scripts and the manifest, submit nothing
# then, when the jobs are done (squeue -u $USER empty):
#   tools/scaling_report runs/scaling-124m          # -> report.md, report.csv, scaling.png in the sweep
#
# Options:
#   --max-gpus N | --max-ranks N   largest rank count (default 8); points are 1, 2, 4, ... <= N (and N)
#   --modes weak,strong            which sweeps (default both)
#   --config FILE                  gpt2-train config (default configs/gpt2-124m.ini)
#   --steps N                      benchmark steps per point (default 20; the first is not counted)
#   --gpus-per-node N              ranks per node on GPU jobs (default 8); --ranks-per-node is the same
#   --cpu                          CPU-only: no --gpus-per-node request, --device cpu
#   --cpus-per-task N              cores per rank (default 8 on GPU jobs, 1 with --cpu); also --threads
#   --threads N                    OpenMP threads per rank (default: cpus-per-task; --local: cores / max)
#   --micro-batch B, --seq-len T   override the config's
#   --global-batch-tokens G        strong scaling's fixed global batch (default: the config's if set,
#                                  else B x T x max ranks); must divide by B x T x n at every point
#   --bucket-mb M                  gradient bucket size (default 25; also the all-reduce benchmark's)
#   --allreduce-max-mb M           largest all-reduce message (default 256, or 4 with --local)
#   --time HH:MM:SS                job time limit (default 00:30:00)
#   --shared                       do not ask for whole nodes (default: --exclusive, for clean timings)
#   --sbatch-arg ARG               extra sbatch option (repeatable), e.g. --sbatch-arg --account=abc
#   --bin-dir DIR                  where gpt2-train and bench_allreduce are (default build/bin)
#   --out DIR                      sweep directory (default runs/scaling-<date>-<time>)
#   --local                        run every point now, one after the other, with mpirun (no SLURM)
#   --dry-run                      write everything, submit nothing (prints the sbatch commands)
#   -- ARGS                        more gpt2-train options for every point
# Environment: GPT2_LAUNCHER=mpirun inside the jobs uses Open MPI's mpirun instead of srun --mpi=pmix;
# NCCL_* settings are passed through to the jobs untouched (see slurm/train.sbatch for the useful ones).
#
# The sweep manifest <sweep>/sweep.json lists the settings and the points (mode, ranks, nodes, dir,
# job id); each point writes train.log, metrics.jsonl, allreduce.json, allreduce.log and done.json
# (exit statuses of both programs) into its directory.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "scaling.sh: $*" >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
max=8 modes=weak,strong config=configs/gpt2-124m.ini steps=20 gpn=8 cpu=0 cpt="" threads=""
mb="" seq="" gbt="" bucket=25 armax="" tlimit=00:30:00 out="" local=0 dry=0 exclusive=1
sbatch_args=() extra=() bindir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --max-gpus|--max-ranks) max=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --gpus-per-node|--ranks-per-node) gpn=$2; shift 2 ;;
    --cpu) cpu=1; shift ;;
    --cpus-per-task) cpt=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --micro-batch) mb=$2; shift 2 ;;
    --seq-len) seq=$2; shift 2 ;;
    --global-batch-tokens) gbt=$2; shift 2 ;;
    --bucket-mb) bucket=$2; shift 2 ;;
    --allreduce-max-mb) armax=$2; shift 2 ;;
    --time) tlimit=$2; shift 2 ;;
    --sbatch-arg) sbatch_args+=("$2"); shift 2 ;;
    --out) out=$2; shift 2 ;;
    --bin-dir) bindir=$2; shift 2 ;;
    --shared) exclusive=0; shift ;;
    --local) local=1; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

isint() { [[ "$1" =~ ^[0-9]+$ ]] && [[ "$1" -gt 0 ]]; }
isint "$max" || die "--max-gpus must be a positive integer (got '$max')"
isint "$steps" || die "--steps must be a positive integer (got '$steps')"
isint "$gpn" || die "--gpus-per-node must be a positive integer (got '$gpn')"
[[ -r "$config" ]] || die "config '$config' not readable"
config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")
IFS=, read -r -a mode_list <<<"$modes"
for m in "${mode_list[@]}"; do [[ "$m" == weak || "$m" == strong ]] || die "--modes: weak and/or strong (got '$m')"; done

# The config's value of an option (last assignment wins, as in gpt2-train), or a default.
ini_get() {
  local v
  v=$(sed -n "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*\([^#[:space:]]*\).*/\1/p" "$config" | tail -n 1)
  echo "${v:-$2}"
}
[[ -n "$mb" ]] || mb=$(ini_get micro-batch 4)
[[ -n "$seq" ]] || seq=$(ini_get seq-len 64)
if [[ -z "$gbt" ]]; then
  gbt=$(ini_get global-batch-tokens 0)
  [[ "$gbt" != 0 ]] || gbt=$((mb * seq * max))
fi
[[ -n "$cpt" ]] || { if [[ $cpu == 1 ]]; then cpt=1; else cpt=8; fi; }
if [[ -z "$threads" ]]; then
  if [[ $local == 1 ]]; then
    threads=$(( $(nproc) / max )); [[ $threads -ge 1 ]] || threads=1
  else
    threads=$cpt
  fi
fi
[[ -n "$armax" ]] || { if [[ $local == 1 ]]; then armax=4; else armax=256; fi; }
device=auto; [[ $cpu == 1 ]] && device=cpu
[[ -n "$out" ]] || out=runs/scaling-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
out=$(cd "$out" && pwd)
[[ -n "$bindir" ]] || bindir=$repo/build/bin
bindir=$(cd "$bindir" 2>/dev/null && pwd) || die "--bin-dir: no such directory"
train_bin=$bindir/gpt2-train
ar_bin=$bindir/bench_allreduce
for b in "$train_bin" "$ar_bin"; do
  [[ -x "$b" || $dry == 1 ]] || die "$b not found (build first: tools/build.sh, or ninja -C build gpt2-train bench_allreduce)"
done
if [[ $local == 0 && $dry == 0 ]]; then
  command -v sbatch >/dev/null || die "sbatch not found: run on a SLURM login node, or use --local / --dry-run"
fi

# Rank counts: powers of two below max, and max itself.
counts=()
for ((n = 1; n < max; n *= 2)); do counts+=("$n"); done
counts+=("$max")

json_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }
points_json=()
write_manifest() {
  local extra_json="" a
  for a in "${extra[@]+"${extra[@]}"}"; do extra_json+="${extra_json:+, }$(json_str "$a")"; done
  {
    echo "{"
    echo "  \"format\": \"gpt2-scaling-sweep/1\","
    echo "  \"created\": $(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)"),"
    echo "  \"launcher\": \"$( [[ $local == 1 ]] && echo local || echo slurm )\","
    echo "  \"config\": $(json_str "$config"),"
    echo "  \"steps\": $steps, \"max_ranks\": $max, \"gpus_per_node\": $gpn, \"cpu\": $( [[ $cpu == 1 ]] && echo true || echo false ),"
    echo "  \"device\": \"$device\", \"threads\": $threads, \"cpus_per_task\": $cpt,"
    echo "  \"micro_batch\": $mb, \"seq_len\": $seq, \"strong_global_batch_tokens\": $gbt,"
    echo "  \"bucket_mb\": $bucket, \"allreduce_max_mb\": $armax,"
    echo "  \"extra_args\": [$extra_json],"
    echo "  \"points\": ["
    local i
    for i in "${!points_json[@]}"; do
      echo -n "    ${points_json[$i]}"; [[ $i -lt $((${#points_json[@]} - 1)) ]] && echo "," || echo
    done
    echo "  ]"
    echo "}"
  } >"$out/sweep.json.tmp"
  mv "$out/sweep.json.tmp" "$out/sweep.json"
}

q() { printf '%q ' "$@"; }
# bench_allreduce measures the path training takes: the device reducer over NCCL in the run's precision on
# GPUs (bf16 unless --precision fp32), the host's MPI all-reduce of fp32 on CPUs or with --comm mpi, whose
# GPU runs stage bf16 buckets through the host as fp32 (twice the bytes). Read from the options after --
# (the last one of each wins); a precision or comm set in the --config file is not seen here.
bench_device=$device bench_dtype=bf16 host_comm=0
prev=
for a in "${extra[@]+"${extra[@]}"}"; do
  case "$prev|$a" in
    "--precision|fp32" | *"|--precision=fp32") bench_dtype=fp32 ;;
    "--precision|bf16" | *"|--precision=bf16") bench_dtype=bf16 ;;
    "--comm|mpi" | *"|--comm=mpi") host_comm=1 ;;
    "--comm|nccl" | *"|--comm=nccl") host_comm=0 ;;
    "--device|cpu" | *"|--device=cpu") bench_device=cpu ;;
  esac
  prev=$a
done
bench_bucket=$bucket
if ((host_comm)) && [[ $bench_device != cpu ]]; then
  [[ $bench_dtype == bf16 ]] && bench_bucket=$(awk -v b="$bucket" 'BEGIN { print 2 * b }')
  bench_device=cpu
fi

fails=0
for m in "${mode_list[@]}"; do
  for n in "${counts[@]}"; do
    name=$m-$n
    dir=$out/$name
    nodes=$(( (n + gpn - 1) / gpn ))
    rpn=$(( n < gpn ? n : gpn ))
    targs=(--config "$config" --benchmark --max-steps "$steps" --out "$dir" --threads "$threads"
           --micro-batch "$mb" --seq-len "$seq" --bucket-mb "$bucket" --device "$device" --ckpt-every 0)
    if [[ $m == weak ]]; then
      targs+=(--global-batch-tokens 0)
    else
      if (( gbt % (mb * seq * n) != 0 )); then
        echo "scaling.sh: skipping $name: global batch $gbt tokens does not divide by micro-batch $mb x seq-len $seq x $n ranks" >&2
        continue
      fi
      targs+=(--global-batch-tokens "$gbt")
    fi
    targs+=("${extra[@]+"${extra[@]}"}")
    mkdir -p "$dir"
    rm -f "$dir/done.json" "$dir/metrics.jsonl" "$dir/allreduce.json"
    if [[ $local == 1 ]]; then
      default_launch="mpirun -np $n --oversubscribe"
    else
      default_launch="srun --mpi=pmix --kill-on-bad-exit=1"
    fi
    # The job script: #SBATCH lines for sbatch, ignored by bash when --local runs it directly.
    {
      echo "#!/usr/bin/env bash"
      echo "# Scaling point $name: written by slurm/scaling.sh; submit with sbatch or run with bash."
      echo "#SBATCH --job-name=gpt2-scale-$name"
      echo "#SBATCH --nodes=$nodes"
      if (( n % rpn == 0 )); then echo "#SBATCH --ntasks-per-node=$rpn"; else echo "#SBATCH --ntasks=$n"; fi
      [[ $cpu == 1 ]] || echo "#SBATCH --gpus-per-node=$rpn"
      echo "#SBATCH --cpus-per-task=$cpt"
      echo "#SBATCH --time=$tlimit"
      [[ $exclusive == 0 ]] || echo "#SBATCH --exclusive"
      echo "#SBATCH --output=$dir/slurm-%j.out"
      echo "#SBATCH --chdir=$repo"
      echo "set -uo pipefail"
      echo "cd $(q "$repo")"
      echo "case \"\${GPT2_LAUNCHER:-default}\" in"
      echo "  mpirun) launch=(mpirun -np \"\${SLURM_NTASKS:-$n}\" --map-by \"ppr:\${SLURM_NTASKS_PER_NODE:-$rpn}:node\") ;;"
      echo "  *) launch=($default_launch) ;;"
      echo "esac"
      echo "export GPT2_BENCH_MAX_MB=$armax GPT2_BENCH_BUCKET_MB=$bench_bucket GPT2_BENCH_DEVICE=$bench_device GPT2_BENCH_DTYPE=$bench_dtype"
      echo "\"\${launch[@]}\" $(q "$train_bin" "${targs[@]}")> $(q "$dir/train.log") 2>&1"
      echo "train_rc=\$?"
      echo "\"\${launch[@]}\" $(q "$ar_bin" "--benchmark_out=$dir/allreduce.json" --benchmark_out_format=json)> $(q "$dir/allreduce.log") 2>&1"
      echo "ar_rc=\$?"
      echo "echo \"{\\\"train_rc\\\": \$train_rc, \\\"allreduce_rc\\\": \$ar_rc, \\\"job_id\\\": \\\"\${SLURM_JOB_ID:-local}\\\", \\\"nodelist\\\": \\\"\${SLURM_JOB_NODELIST:-\$(hostname)}\\\"}\" > $(q "$dir/done.json")"
      echo "[[ \$train_rc == 0 && \$ar_rc == 0 ]]"
    } >"$dir/job.sh"
    chmod +x "$dir/job.sh"

    job_id=null
    if [[ $local == 1 ]]; then
      echo "scaling.sh: $name: running $n rank(s) locally"
      if [[ $dry == 0 ]]; then
        if ! bash "$dir/job.sh"; then
          echo "scaling.sh: $name failed; see $dir/train.log and $dir/allreduce.log" >&2
          fails=$((fails + 1))
        fi
      fi
    else
      cmd=(sbatch --parsable "${sbatch_args[@]+"${sbatch_args[@]}"}" "$dir/job.sh")
      if [[ $dry == 1 ]]; then
        echo "scaling.sh: would run: $(q "${cmd[@]}")"
      else
        jid=$("${cmd[@]}") || die "sbatch failed for $name"
        jid=${jid%%;*}
        job_id=$(json_str "$jid")
        echo "scaling.sh: $name: job $jid ($nodes node(s), $n rank(s))"
      fi
    fi
    points_json+=("{\"mode\": \"$m\", \"ranks\": $n, \"nodes\": $nodes, \"ranks_per_node\": $rpn, \"dir\": \"$name\", \"job_id\": $job_id}")
    write_manifest
  done
done
write_manifest
echo "scaling.sh: manifest $out/sweep.json (${#points_json[@]} points)"
if [[ $local == 1 ]]; then
  [[ $fails == 0 ]] || { echo "scaling.sh: $fails point(s) failed" >&2; exit 1; }
  echo "scaling.sh: done; report: tools/scaling_report $(q "$out")"
else
  echo "scaling.sh: when the jobs are done: tools/scaling_report $(q "$out")"
fi
