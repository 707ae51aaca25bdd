#!/usr/bin/env bash
# fuzz_one.sh MODE FUZZER NAME SOURCE_ROOT OUT_DIR - run one libFuzzer target
# of tests/fuzz (the meson tests of the -Dfuzz=enabled build call it).
#
#   regress  run every seed of tests/fuzz/corpus/NAME and every input kept in
#            tests/fuzz/crashes/NAME once; fails on the first crash
#   fuzz     fuzz for FUZZ_SECONDS (default 10) from the seeds and from what
#            earlier runs found (OUT_DIR/work/NAME, kept between runs); a
#            crash is saved as OUT_DIR/artifacts/NAME-crash-<sha1>
# The last lines printed say how many inputs ran (libFuzzer's "Done N runs").
# A crash exits 1: libFuzzer's default, 77, is what meson reads as a skip.
set -euo pipefail

mode=${1:?usage: fuzz_one.sh regress|fuzz FUZZER NAME SOURCE_ROOT OUT_DIR}
fuzzer=$2 name=$3 src=$4 out=$5
seeds=$src/tests/fuzz/corpus/$name
crashes=$src/tests/fuzz/crashes/$name
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

case $mode in
regress)
	inputs=("$seeds"/*)
	if [ -d "$crashes" ]; then
		inputs+=("$crashes"/*)
	fi
	"$fuzzer" -timeout=30 -error_exitcode=1 "${inputs[@]}"
	echo "fuzz_$name: ${#inputs[@]} inputs ran"
	;;
fuzz)
	secs=${FUZZ_SECONDS:-10}
	mkdir -p "$out/work/$name" "$out/artifacts"
	# New inputs go to the first folder (work); the seeds stay as they are.
	set +e
	"$fuzzer" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
		-error_exitcode=1 \
		-artifact_prefix="$out/artifacts/$name-" "$out/work/$name" "$seeds" 2>&1 |
		grep -v -E '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)'
	rc=${PIPESTATUS[0]}
	set -e
	exit "$rc"
	;;
*)
	echo "fuzz_one.sh: unknown mode '$mode'" >&2
	exit 2
	;;
esac
