# shellcheck shell=bash
# server_start.sh - sourced by the shell tests.
#
# start_pipeserver BIN OUT LOG ARGS... starts BIN ARGS in the background
# (stdout to OUT, stderr to LOG), leaves its pid in started_pid and waits up to
# 15 s for its first "pipeserver listening on URL" line, whose URL it leaves
# in url; when none comes it prints LOG and exits the test with 1.
start_pipeserver() {
	local bin=$1 out=$2 log=$3
	shift 3
	url=
	: >"$out" # there before the first sed below
	"$bin" "$@" >"$out" 2>"$log" &
	started_pid=$!
	for _ in $(seq 300); do
		url=$(sed -n 's/^pipeserver listening on //p' "$out" | head -n 1)
		[ -n "$url" ] && break
		sleep 0.05
	done
	if [ -z "$url" ]; then
		kill "$started_pid" 2>/dev/null || true
		echo "FAIL: $bin $* did not start:" >&2
		cat "$log" >&2
		exit 1
	fi
}
