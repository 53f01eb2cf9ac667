#!/usr/bin/env bash
# tools/ptxas_guard.sh against ptxas itself: a wgmma group retired where it was issued compiles through
# the guard (--error) without a word; the same group retired in another branch, which ptxas serializes and
# reports only as info, fails the compile with the guard's error. So a toolkit whose ptxas words it
# differently, or a guard that stops matching, fails here instead of letting a serialized kernel through.
# usage: check_guard.sh NVCC SOURCE_DIR
set -u
nvcc=${1:?usage: check_guard.sh NVCC SOURCE_DIR}
root=${2:?usage: check_guard.sh NVCC SOURCE_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
compile() {  # SPLIT: 0 or 1; the guard's output in $work/out.SPLIT
  bash "$root/tools/ptxas_guard.sh" --error "$nvcc" -DSPLIT="$1" -I"$root" -O3 -std=c++17 \
    -gencode arch=compute_90a,code=sm_90a -c "$root/tests/ptxas/wgmma_split_group.cu" -o "$work/k$1.o" \
    > "$work/out.$1" 2>&1
}
fail=0
if ! compile 0 || [[ -s $work/out.0 ]]; then
  echo "FAIL: the well-formed group did not compile quietly through the guard:"; cat "$work/out.0"; fail=1
else
  echo "ok: the group retired where it was issued compiles quietly"
fi
if compile 1; then
  echo "FAIL: the group split over two branches compiled through the guard:"; cat "$work/out.1"; fail=1
elif ! grep -q 'Potential Performance Loss' "$work/out.1" || ! grep -q 'error: ptxas broke the wgmma schedule' "$work/out.1"; then
  echo "FAIL: the split group failed, but not with ptxas's report and the guard's error:"; cat "$work/out.1"; fail=1
else
  echo "ok: the group split over two branches fails the compile: $(grep -o 'Potential Performance Loss: [^,]*' "$work/out.1" | head -1 | cut -c1-120)"
fi
exit $fail
