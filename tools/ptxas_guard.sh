#!/usr/bin/env bash
# CUDA compiler launcher of the sm_90a kernels (CMakeLists.txt, gpt2_sm90a): runs the compile it is given,
# passes its output through, and flags what ptxas says about the wgmma schedule it had to break.
#
# ptxas reports those as "info", not as warnings, so --Werror=all-warnings lets them through:
#   "Potential Performance Loss: wgmma.mma_async instructions are serialized ..." (every wgmma of the
#   kernel waits for the one before: C7510, C7520, ...), "... 'setmaxnreg' ignored ..." (C7508), and
#   "warpgroup.arrive / warpgroup.wait is injected ..." (C7519, C7517).
# The wgmma attention backward carried C7520 from 678fa73 to 2026-11-29 without anyone seeing it in the
# build log: 25 WARPGROUP.ARRIVE / DEPBAR pairs in its SASS, one around each HGMMA, instead of 3 and 5.
#
# usage: ptxas_guard.sh [--error] COMPILER ARGS...
#   --error (GPT2_WERROR, as CI builds): such a report fails the compile; without it, a warning.
set -u
strict=0
if [[ ${1:-} == --error ]]; then
  strict=1
  shift
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2> "$log"
rc=$?
cat "$log" >&2
if [[ $rc -eq 0 ]] && grep -qE 'Potential Performance Loss|warpgroup\.(arrive|wait) is injected' "$log"; then
  if [[ $strict -eq 1 ]]; then
    echo "error: ptxas broke the wgmma schedule of a kernel (the lines above); tools/ptxas_guard.sh says why this fails" >&2
    exit 1
  fi
  echo "warning: ptxas broke the wgmma schedule of a kernel (the lines above)" >&2
fi
exit $rc
