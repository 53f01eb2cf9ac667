#!/usr/bin/env bash
# PyTorch oracle driver: runs oracle_dump on two model configurations, then compares both against the
# fp64 torch GPT-2 in torch_gpt2.py. Exits non-zero on any failure, including a missing torch.
# usage: run_oracle.sh PATH/TO/oracle_dump TMP_DIR
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 PATH/TO/oracle_dump TMP_DIR" >&2
  exit 2
fi
dump=$1
tmp=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=/usr/bin/python3  # Debian's python3-torch and python3-h5py work only with the system interpreter

if [[ ! -x $py ]]; then
  echo "FAIL: $py not found; the PyTorch oracle needs it with python3-torch and python3-h5py" >&2
  exit 1
fi
if ! $py -c 'import torch, h5py, numpy' 2>/dev/null; then
  echo "FAIL: the PyTorch oracle needs torch and h5py for $py." >&2
  echo "      Install them with: apt-get install python3-torch python3-h5py python3-numpy" >&2
  exit 1
fi

rm -rf "$tmp"
mkdir -p "$tmp"

# Optimizer settings shared by both cases: lr weight_decay grad_clip beta1 beta2 eps
opt=(1e-3 0.1 1.0 0.9 0.95 1e-8)
steps=10
seed=1337

# name            L NH  C    V maxT B  T
cases=(
  "tiny_awkward   2  3  36   50  16 3  7"
  "typical        2  4  64  256  64 4 32"
)
dirs=()
for c in "${cases[@]}"; do
  read -r name L NH C V maxT B T <<<"$c"
  d="$tmp/$name"
  mkdir -p "$d"
  "$dump" "$d" "$L" "$NH" "$C" "$V" "$maxT" "$B" "$T" "$seed" "$steps" "${opt[@]}"
  dirs+=("$d")
done

exec "$py" "$here/torch_gpt2.py" "${dirs[@]}"
