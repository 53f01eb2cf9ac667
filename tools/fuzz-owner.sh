# Sourced by tools/fuzz.sh (and its test, tests/tools/test_fuzz_owner.sh): whether a crash the HDF5
# harnesses (token_file, checkpoint) find is libhdf5's own or ours.

# report_owner: reads a sanitizer report on stdin and prints "libhdf5" when every stack it prints has its
# innermost frame (past sanitizer interceptors, the allocator and libc's mem*/str* routines) in libhdf5:
# the crash itself, and for a memory error also where the memory was allocated or freed, or the stack
# frame that holds it (so one of our buffers overrun inside an HDF5 read counts as ours). "ours" when
# one is elsewhere, "none" when the report has no stack (the input did not crash).
report_owner() {
  awk '
    /^[[:space:]]+#[0-9]+ 0x/ {
      if (!in_stack) { in_stack = 1; open = 1; stacks++ }
      if (open && $0 !~ / in (__interceptor_[^ ]*|__asan[^ ]*|__sanitizer[^ ]*|__ubsan[^ ]*|operator new|operator delete|malloc|calloc|realloc|free|__(mem|str)[a-z0-9_]*|(mem|str)[a-z]*)[ ([]/) {
        open = 0
        if ($0 !~ /libhdf5/) ours++
      }
      next
    }
    { in_stack = 0 }
    END { print (stacks == 0 ? "none" : ours == 0 ? "libhdf5" : "ours") }'
}
# crash_owner BINARY INPUT ASAN_OPTIONS REPORT_DIR: replays a crash and prints report_owner's verdict.
# A crash that does not happen again alone ("none") came from state an earlier input of the same fuzzing
# process left behind (libhdf5 keeps free lists and caches across files): it is libhdf5's when every
# report the fuzzing run wrote to REPORT_DIR is (and there is one), and ours otherwise.
crash_owner() {
  local owner f
  owner=$(ASAN_OPTIONS=$3 timeout 60 "$1" "$2" 2>&1 | report_owner) || true  # it crashes: that is the point
  if [[ $owner == none ]]; then
    local verdict libhdf5_reports=0
    owner=libhdf5
    for f in "$4"/*; do
      [[ -f $f ]] || continue
      # libFuzzer's own stack prints for a timeout, a malloc over the limit or the RSS limit: fork mode
      # ignores those by policy (-ignore_timeouts, -ignore_ooms), so they judge nothing here.
      grep -q -E 'fuzzer::Fuzzer::(AlarmCallback|HandleMalloc|RssLimitCallback)' "$f" && continue
      verdict=$(report_owner < "$f")
      [[ $verdict == ours ]] && owner=ours
      [[ $verdict == libhdf5 ]] && libhdf5_reports=$((libhdf5_reports + 1))
    done
    ((libhdf5_reports > 0)) || owner=ours  # no report to judge by: not proven libhdf5's
    [[ $owner == libhdf5 ]] && owner="libhdf5 (does not crash alone; every report of the run is inside libhdf5)"
  fi
  echo "$owner"
}
