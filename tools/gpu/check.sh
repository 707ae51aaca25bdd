#!/usr/bin/env bash
# check.sh [BUILD] [OUT] [SECONDS] - the GPU checks, on a machine with an
# NVIDIA GPU, run from the checkout's root with a CUDA build in BUILD:
#   1. test_cuda (every op against the CPU, models and pipelines on cuda:0)
#      and test_nccl (the NCCL contract; needs 2 GPUs, says so otherwise);
#   2. pipeserver --device cuda:0 trains examples/digits.json and
#      examples/gpt.json through `pipeclient submit --follow`; each fetched
#      checkpoint is evaluated on the CPU with PyTorch (eval_checkpoint.py)
#      against the held-out loss and accuracy the server reported;
#   3. bench/gpu_bench (our matmul beside cuBLAS, GPT-2-small beside PyTorch);
#   4. compute-sanitizer memcheck and racecheck on test_cuda (the shapes
#      beyond 2^31 elements left out: they take minutes under the tools).
# Every step's output is OUT/<step>.log; OUT/summary.txt holds one line per
# step (exit code, seconds) and the lines that matter. The whole run stops
# starting steps after SECONDS (default 900); a step not started says so.
# CHECK_SKIP="racecheck gpu_bench" leaves the steps it names out.
set -uo pipefail
build=${1:-build}
out=${2:-/tmp/gpu-out}
budget=${3:-900}
root=$(pwd)
. "$(dirname "$0")/lib.sh"
mkdir -p "$out"
rm -f "$out"/*.log "$out"/status_*.json # nothing from an earlier run is read
summary=$out/summary.txt
t_start=$(date +%s)
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

# step NAME LIMIT CMD... runs CMD with its output in OUT/NAME.log, bounded by
# LIMIT seconds and by what is left of the budget.
step() {
	local name=$1 limit=$2 left rc t0
	shift 2
	if [[ " ${CHECK_SKIP:-} " == *" $name "* ]]; then
		say "== $name: skipped (CHECK_SKIP)"
		return 1
	fi
	left=$((budget - ($(date +%s) - t_start)))
	if [ "$left" -lt 20 ]; then
		say "== $name: not run (budget spent)"
		return 1
	fi
	[ "$limit" -gt "$left" ] && limit=$left
	t0=$(date +%s.%N)
	timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
	rc=$?
	say "== $name: exit $rc in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s (limit $limit s)"
	return $rc
}
# The lines of a CUnit run that say what happened.
cunit_lines() {
	grep -E '^(Run Summary|  *(suites|tests|asserts) )|FAILED|tolerance|skip:|CUDA device|^[0-9]+\. ' \
		"$out/$1.log" | head -n 60 >>"$summary"
}

say "# GPU checks, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
say "# $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 2)"
say "# nvcc: $(nvcc --version 2>/dev/null | tail -n 1); $(python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1 | tail -n 1)"
missing=$(ldd "$build/tests/test_cuda" "$build/server/pipeserver" 2>&1 | grep 'not found' | sort -u)
[ -n "$missing" ] && say "# missing libraries: $missing"

export OMP_WAIT_POLICY=PASSIVE
step test_cuda 150 "$build/tests/test_cuda"
cunit_lines test_cuda
step test_nccl 40 "$build/tests/test_nccl"
grep -E 'skip|Run Summary|  *(tests|asserts) |FAILED' "$out/test_nccl.log" | head -n 20 >>"$summary"

# pipeserver on cuda:0, the two shipped examples through pipeclient.
pc=$build/client/pipeclient
data=$(mktemp -d /tmp/pt-gpu.XXXXXX)
start_server "$build" "$data" "$out/server.log" --device cuda:0 --files-root "$root"
if [ -z "$url" ]; then
	say "== pipeserver --device cuda:0 did not start:"
	tail -n 20 "$out/server.log" >>"$summary"
else
	export PIPETRAIN_SERVER=$url
	"$pc" info >"$out/info.log" 2>&1
	grep -iE 'device|cuda|kernel' "$out/info.log" | head -n 8 >>"$summary"
	# The same two examples at precision bf16 (issue 13, item 2: the GPT's
	# held-out loss within 3 % of fp32's, 4-stage digits at >= 97 %).
	for ex in digits gpt; do
		bf16_spec "examples/$ex.json" "$data/${ex}_bf16.json"
	done
	for ex in digits gpt digits_bf16 gpt_bf16; do
		spec=examples/$ex.json
		[ "${ex%_bf16}" != "$ex" ] && spec=$data/$ex.json
		if step "submit_$ex" 90 "$pc" submit "$spec" --follow; then
			job=$("$pc" list | awk 'NR > 1 { id = $1 } END { print id }')
			"$pc" status "$job" --json >"$out/status_$ex.json" 2>&1
			"$pc" status "$job" >>"$out/submit_$ex.log" 2>&1
			tail -n 12 "$out/submit_$ex.log" >>"$summary"
			if [ "$spec" != "examples/$ex.json" ] && [ ! -s "$out/status_${ex%_bf16}.json" ]; then
				say "== $ex: no fp32 run to compare with"
			elif [ "$spec" != "examples/$ex.json" ]; then
				python3 -c 'import json, sys
b, f = (json.load(open(p))["last"] for p in sys.argv[1:3])
l, a = "eval_loss", "eval_accuracy"
print("%s bf16 vs fp32 on the GPU: held-out loss %.6f vs %.6f (rel %.4f), accuracy %.4f vs %.4f"
      % (sys.argv[3], b[l], f[l], abs(b[l] - f[l]) / f[l], b[a], f[a]))' \
					"$out/status_$ex.json" "$out/status_${ex%_bf16}.json" \
					"${ex%_bf16}" >>"$summary" 2>&1
			elif "$pc" checkpoint "$job" -o "$data/$ex.safetensors" >/dev/null 2>&1; then
				PYTHONPATH=$root/client/python step "eval_$ex" 120 python3 tools/gpu/eval_checkpoint.py \
					"examples/$ex.json" "$data/$ex.safetensors" "$out/status_$ex.json" "$root"
				tail -n 3 "$out/eval_$ex.log" >>"$summary"
			else
				say "== checkpoint of $ex: fetch failed"
			fi
		else
			tail -n 15 "$out/submit_$ex.log" >>"$summary"
		fi
	done
	kill -TERM $server 2>/dev/null
	wait $server 2>/dev/null
	say "# pipeserver log: $(grep -ciE 'error|fail' "$out/server.log") lines with error/fail"
fi
rm -rf "$data"

step gpu_bench 150 "$build/bench/gpu_bench" --torch bench/torch_gpu_ref.py
grep -vE '^#   ' "$out/gpu_bench.log" | head -n 30 >>"$summary"
grep -E '^#   ' "$out/gpu_bench.log" | head -n 12 >>"$summary"

PATH=$PATH:/usr/local/cuda/bin
if command -v compute-sanitizer >/dev/null; then
	san=(compute-sanitizer --error-exitcode 1 --target-processes application-only)
	# test_cuda_stale_error_not_reported provokes API errors on purpose.
	PT_TEST_SKIP=beyond_2g,large_shapes,stale_error step memcheck 150 "${san[@]}" --tool memcheck "$build/tests/test_cuda"
	grep -E '=========|Run Summary|  *tests ' "$out/memcheck.log" | head -n 20 >>"$summary"
	# Every kernel runs in the op tests; racecheck slows them ~100x, so the
	# pipelines (the same kernels, with 10 s stage timeouts) are left out.
	PT_TEST_ONLY=every_op,strided_copy,column_reductions step racecheck 150 \
		"${san[@]}" --tool racecheck "$build/tests/test_cuda"
	grep -E '=========|Run Summary|  *tests ' "$out/racecheck.log" | head -n 20 >>"$summary"
else
	say "== compute-sanitizer: not found"
fi
say "# total $(($(date +%s) - t_start)) s"
