#!/usr/bin/env bash
# test-failures.sh BUILD_DIR - after a failed `meson test`, repeat what failed
# at the end of the output (CI keeps only the tail): for each failed test of
# meson's log, its name and result, its CUnit assertion lines, sanitizer
# reports and the lines the tests print to explain a failure.
log="${1:?build dir}/meson-logs/testlog.txt"
[ -r "$log" ] || exit 0
pattern=$(
	cat <<'PAT'
^test: |^result: |^  Test: |did not stop in|^    "|last lines of|^    \| |had failures:|^ +[0-9]+\. .+:[0-9]+ +- |ERROR: AddressSanitizer|runtime error:|SUMMARY: |Assertion .* failed|lacks|expected +"|expected, |returned [0-9.]+ s after|still '|did not stop|job [A-Z0-9]* ?(failed|ended|waits|after the kill)|refused: |pooled |restart note
PAT
)
echo "=== what failed (from $log) ==="
# Sections start at a "==== k/n ====" line; keep those whose result is not
# success (exit status 0) or a skip (77).
awk '/^=+ [0-9]+\/[0-9]+ =+$/ { if (keep) printf "%s", sec; sec = ""; keep = 0 }
     { sec = sec $0 "\n" }
     /^result: / && $0 !~ /exit status (0|77)$/ && $0 !~ /skipped/ { keep = 1 }
     END { if (keep) printf "%s", sec }' "$log" | grep -a -E "$pattern" | tail -n 80
exit 0
