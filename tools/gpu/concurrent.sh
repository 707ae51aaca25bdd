#!/usr/bin/env bash
# concurrent.sh [BUILD] [OUT] [DEVICE] - jobs side by side on one device:
# `pipeserver --device DEVICE --max-jobs 3` (default cuda:0) runs
# examples/digits.json, examples/gpt.json and gpt.json at precision bf16 one
# at a time, then all three at once, then gpt at fp32 and at bf16 at once
# twice more. Every job's held-out loss and accuracy in the runs side by side
# must equal its run alone, digit for digit: the jobs share the device (its
# stream, memory pool and cuBLAS handle) and each stage thread sets its own
# job's precision, so one job's math must never reach another's.
# Summary in OUT/concurrent.txt; exit 0 when every job matched.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
build=${1:-build}
out=${2:-/tmp/gpu-out}
device=${3:-cuda:0}
pc=$build/client/pipeclient
mkdir -p "$out"
sum=$out/concurrent.txt
: >"$sum"
data=$(mktemp -d /tmp/pt-conc.XXXXXX)
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$data"' EXIT
for ex in digits gpt; do
	cp "examples/$ex.json" "$data/$ex.json"
	bf16_spec "examples/$ex.json" "$data/${ex}_bf16.json"
done
start_server "$build" "$data" "$out/concurrent_server.log" --device "$device" --max-jobs 3 \
	--files-root "$(pwd)"
[ -n "$url" ] || { echo "pipeserver did not start" | tee -a "$sum"; exit 1; }
export PIPETRAIN_SERVER=$url

# run NAME... submits each spec at once, waits for all, and prints
# "NAME eval_loss eval_accuracy state started finished" per job.
run() {
	local ids=() n
	for n in "$@"; do
		ids+=("$("$pc" submit "$data/$n.json" | awk '{ print $NF }')")
	done
	for i in "${!ids[@]}"; do
		for ((k = 0; ; k++)); do
			st=$("$pc" status "${ids[$i]}" --json 2>/dev/null)
			python3 -c 'import json, sys; s = json.loads(sys.argv[1])
sys.exit(0 if s["state"] in ("Succeeded", "Failed", "Cancelled") else 1)' "$st" 2>/dev/null && break
			if [ $k -ge 600 ] || ! kill -0 $server 2>/dev/null; then
				echo "job ${ids[$i]} did not end (server $(kill -0 $server 2>/dev/null && echo up || echo gone))" >&2
				exit 1
			fi
			sleep 0.2
		done
		python3 -c 'import json, sys; s = json.loads(sys.argv[1]); l = s.get("last", {})
print(sys.argv[2], repr(l.get("eval_loss")), repr(l.get("eval_accuracy")), s["state"],
      s["started_unix"], s["finished_unix"])' \
			"$st" "${@:i+1:1}"
	done
}
fail=0
declare -A alone
for n in digits gpt gpt_bf16; do
	line=$(run "$n" | cut -d' ' -f1-4)
	echo "alone:        $line" | tee -a "$sum"
	alone[$n]=$line
	[ "${line##* }" = Succeeded ] || fail=1 # a job failing both ways is no match
done
check() { # check LABEL NAME...
	local label=$1 full line n lo=0 hi=1e18 got=0
	shift
	while read -r full; do
		line=$(cut -d' ' -f1-4 <<<"$full")
		read -r _ _ _ _ t0 t1 <<<"$full"
		lo=$(awk -v a="$lo" -v b="$t0" 'BEGIN { print (b > a ? b : a) }')
		hi=$(awk -v a="$hi" -v b="$t1" 'BEGIN { print (b < a ? b : a) }')
		n=${line%% *}
		got=$((got + 1))
		if [ "$line" = "${alone[$n]}" ]; then
			echo "$label $line: equal" | tee -a "$sum"
		else
			echo "$label $line: DIFFERS from alone (${alone[$n]})" | tee -a "$sum"
			fail=1
		fi
	done < <(run "$@")
	if [ "$got" -ne $# ]; then
		echo "$label $got of $# jobs ended" | tee -a "$sum"
		fail=1
	fi
	echo "$label all ran together for $(awk -v a="$lo" -v b="$hi" 'BEGIN { printf "%.1f", b - a }') s" |
		tee -a "$sum"
}
check "three at once:" digits gpt gpt_bf16
check "fp32 + bf16:  " gpt gpt_bf16
check "bf16 + fp32:  " gpt_bf16 gpt
echo "# pipeserver log: $(grep -ciE 'error|fail' "$out/concurrent_server.log") lines with error/fail" | tee -a "$sum"
exit $fail
