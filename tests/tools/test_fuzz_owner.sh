#!/usr/bin/env bash
# tools/fuzz-owner.sh: who owns a crash the HDF5 fuzz harnesses find. Synthetic sanitizer reports: a
# crash whose stacks all end in libhdf5 is libhdf5's; one of our frames (the crash, or where the memory
# was allocated) makes it ours; a crash that does not happen again alone is judged by the reports the
# fuzzing run wrote (an allocation warning without a stack counts for neither side; no report to judge
# by is ours).
# usage: test_fuzz_owner.sh SOURCE_DIR WORK_DIR
set -uo pipefail
src=$1 work=$2
rm -rf "$work" && mkdir -p "$work/reports_hdf5" "$work/reports_ours"
source "$src/tools/fuzz-owner.sh"
fails=0
expect() {  # expect WHAT WANT GOT
  if [[ $3 == "$2" ]]; then echo "ok   $1: $3"; else echo "FAIL $1: want '$2', got '$3'"; fails=$((fails + 1)); fi
}

hdf5=$work/hdf5.txt ours_crash=$work/ours_crash.txt ours_alloc=$work/ours_alloc.txt quiet=$work/quiet.txt
printf '%s\n' '==1==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x6110000003b0' \
  '    #0 0x560bafcf35e3 in __interceptor_memcpy (/x/fuzz_token_file+0x935e3)' \
  '    #1 0x7fc2b9990f18  (/lib/x86_64-linux-gnu/libhdf5_serial.so.103+0x190f18)' \
  '    #2 0x7fc2b99b4ca4 in H5O__msg_iterate_real (/lib/x86_64-linux-gnu/libhdf5_serial.so.103+0x1b4ca4)' \
  '' 'allocated by thread T0 here:' \
  '    #0 0x560bafd0a1b2 in malloc (/x/fuzz_token_file+0xaa1b2)' \
  '    #1 0x7fc2b9a01234 in H5FL_blk_malloc (/lib/x86_64-linux-gnu/libhdf5_serial.so.103+0x201234)' > "$hdf5"
printf '%s\n' '==2==ERROR: AddressSanitizer: heap-use-after-free on address 0x61200000d290' \
  '    #0 0x55d397d145e4 in __interceptor_memcpy (/x/fuzz_token_file+0x935e4)' \
  '    #1 0x55d397e00000 in gpt2::data::TokenFile::read_window(long) /src/data/token_file.cpp:120:5' > "$ours_crash"
printf '%s\n' '==3==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x6110000004f0' \
  '    #0 0x55ca553d35e4 in __interceptor_memcpy (/x/fuzz_token_file+0x935e4)' \
  '    #1 0x7fc2b9990f18 in H5D__read (/lib/x86_64-linux-gnu/libhdf5_serial.so.103+0x190f18)' \
  '' 'allocated by thread T0 here:' \
  '    #0 0x55ca553e0000 in operator new[](unsigned long) (/x/fuzz_token_file+0xa0000)' \
  '    #1 0x55ca55400000 in gpt2::data::TokenFile::open(std::string const&) /src/data/token_file.cpp:40:3' > "$ours_alloc"
echo 'WARNING: AddressSanitizer failed to allocate 0x10000000000 bytes' > "$quiet"

expect "crash and allocation inside libhdf5" libhdf5 "$(report_owner < "$hdf5")"
expect "our frame is the crash" ours "$(report_owner < "$ours_crash")"
expect "our buffer overrun inside an HDF5 read" ours "$(report_owner < "$ours_alloc")"
expect "no stack: no crash" none "$(report_owner < "$quiet")"

# crash_owner replays BINARY INPUT: `cat REPORT` stands for a harness that crashes with that report,
# and `true` for one that does not crash when replayed alone.
expect "replayed: libhdf5" libhdf5 "$(crash_owner cat "$hdf5" "" "$work/reports_hdf5")"
expect "replayed: ours" ours "$(crash_owner cat "$ours_crash" "" "$work/reports_hdf5")"
cp "$hdf5" "$work/reports_hdf5/asan.101"
cp "$quiet" "$work/reports_hdf5/asan.102"
expect "not alone, every report libhdf5's" \
  "libhdf5 (does not crash alone; every report of the run is inside libhdf5)" \
  "$(crash_owner true "$quiet" "" "$work/reports_hdf5")"
cp "$hdf5" "$work/reports_ours/asan.201"
cp "$ours_alloc" "$work/reports_ours/asan.202"
expect "not alone, one report ours" ours "$(crash_owner true "$quiet" "" "$work/reports_ours")"
expect "not alone, no reports at all" ours "$(crash_owner true "$quiet" "" "$work/empty_dir_that_does_not_exist")"
# libFuzzer's stack print for a malloc over its limit runs through our frames (the file being opened) and
# its own: fork mode ignores out-of-memory inputs, so the report must not make a libhdf5 crash ours.
mkdir -p "$work/reports_oom"
cp "$hdf5" "$work/reports_oom/asan.301"
printf '%s\n' '    #0 0x5652b3d78301 in __sanitizer_print_stack_trace (/x/fuzz_token_file+0x10a301)' \
  '    #1 0x5652b3ceac58 in fuzzer::PrintStackTrace() (/x/fuzz_token_file+0x7cc58)' \
  '    #2 0x5652b3ccf765 in fuzzer::Fuzzer::HandleMalloc(unsigned long) (/x/fuzz_token_file+0x61765)' \
  '    #7 0x5652b3d6e27d in malloc (/x/fuzz_token_file+0x10027d)' \
  '    #8 0x7fe25788d9c9 in H5C_protect (/lib/x86_64-linux-gnu/libhdf5_serial.so.103+0x8d9c9)' \
  '    #15 0x5652b3dc2b05 in gpt2::h5::open_read(std::string const&) /src/core/hdf5.cpp:59:13' > "$work/reports_oom/ubsan.302"
expect "not alone, a libhdf5 crash beside libFuzzer's out-of-memory print" \
  "libhdf5 (does not crash alone; every report of the run is inside libhdf5)" \
  "$(crash_owner true "$quiet" "" "$work/reports_oom")"
mkdir -p "$work/reports_only_oom"
cp "$work/reports_oom/ubsan.302" "$work/reports_only_oom/"
expect "not alone, only an out-of-memory print: nothing proves it libhdf5's" ours \
  "$(crash_owner true "$quiet" "" "$work/reports_only_oom")"

((fails == 0)) && echo "test_fuzz_owner: all passed" || { echo "test_fuzz_owner: $fails failed"; exit 1; }
