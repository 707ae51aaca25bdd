#!/usr/bin/env bash
# hang_report.sh TEST_PROGRAM - the watchdog of tests/pt_test.c: a test
# program given too little time (PT_TEST_TIMEOUT_S=2) must abort naming the
# test it was in and listing its threads (gdb's stacks, or the threads' names
# from /proc where gdb is missing), not run on silently.
set -u
prog=${1:?test program}
out=$(PT_TEST_TIMEOUT_S=2 OMP_WAIT_POLICY=PASSIVE ASAN_OPTIONS=abort_on_error=1:detect_leaks=0 \
	timeout 120 "$prog" 2>&1)
rc=$?
fail() { printf 'hang_report: %s\n--- output ---\n%s\n' "$1" "$out" | tail -n 40; exit 1; }
[ "$rc" -ne 124 ] || fail "the program ran its whole course: no watchdog"
[ "$rc" -ne 0 ] || fail "the program exited 0: no watchdog"
grep -Eq 'test program hung: still running after [0-9]+ s, in test_[a-z0-9_]+; its threads' <<<"$out" ||
	fail "no 'test program hung ... in <test>' line"
name=$(basename "$prog")
name=${name:0:15}
grep -Eq "^    \"$name\": .*main|/comm:$name\$" <<<"$out" ||
	fail "no line for the main thread ($name)"
echo "hang_report: $(grep -Eo 'still running after [0-9]+ s, in test_[a-z0-9_]+' <<<"$out"), $(grep -Ec '^    "|/comm:' <<<"$out") thread lines"
