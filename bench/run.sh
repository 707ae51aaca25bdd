#!/usr/bin/env bash
# run.sh BUILD - every benchmark of the project, as `bench <name> <value>` lines.
# PyTorch comparisons run only where /usr/bin/python3 can import torch.
# pt-bench and the PyTorch reference run interleaved BENCH_REPEAT times
# (default 5), ours then theirs each round, so both see the same noise; each
# of their figures is the median of its runs (a `#` line lists the runs).
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
repeat=${BENCH_REPEAT:-5}

have_torch=false
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
	have_torch=true
	# PyTorch's best CPU settings here: OpenBLAS as libblas.so.3 (Debian's
	# libopenblas0-pthread) with its core type forced, since OpenBLAS 0.3.21
	# misdetects recent CPUs; passive OpenMP waiting as above.
	if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
		if grep -q avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
		else export OPENBLAS_CORETYPE=Haswell; fi
	fi
fi
runs_ours=''
runs_theirs=''
for _ in $(seq "$repeat"); do
	runs_ours+=$("$build/bench/pt-bench" | grep '^bench ')$'\n'
	if $have_torch; then
		runs_theirs+=$(/usr/bin/python3 "$here/torch_ref.py" | grep '^torch ')$'\n'
	fi
done
# medians PREFIX RUNS: "PREFIX name median" per name, in first-seen order,
# after a "# name: v1 v2 ..." line.
medians() {
	printf '%s' "$2" | awk -v p="$1" '$1 == p {
		if (!($2 in n)) order[++k] = $2
		v[$2, ++n[$2]] = $3
	} END {
		for (i = 1; i <= k; i++) {
			name = order[i]; m = n[name]; line = ""
			for (a = 1; a <= m; a++) { x[a] = v[name, a]; line = line " " x[a] }
			for (a = 2; a <= m; a++) for (b = a; b > 1 && x[b] + 0 < x[b - 1] + 0; b--) {
				t = x[b]; x[b] = x[b - 1]; x[b - 1] = t }
			med = m % 2 ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2
			printf "# %s %s:%s\n%s %s %s\n", p, name, line, p, name, med
		}
	}'
}
ours=$(medians bench "$runs_ours")
echo "$ours"

# The blocked causal attention kernel over the dense one it replaced (W2, W3).
[ -x "$build/bench/attn_bench" ] && "$build/bench/attn_bench"

# Communicator throughput: nng over tcp loopback against a plain TCP socket.
if [ -x "$build/bench/comm_bench" ]; then
	comm=$("$build/bench/comm_bench")
	echo "$comm"
fi

# Pipeline efficiency (2 stages, W2), bubble fraction vs the GPipe formula,
# 1F1B and ZB-H1 on sleep-based stages, ZB-H1 over 1F1B on W2.
"$build/bench/pipe-bench"

# The planner's predicted step times against measured ones (gpt, W2; p 1, 2,
# 4; m 4, 8; every schedule): plan_error_max, plan_auto_vs_best.
[ -x "$build/bench/plan_bench" ] && "$build/bench/plan_bench" | grep '^bench plan_\(error_max\|auto\)'

# pipeserver: GetJob rate and latency vs an nng echo server; 100 long-pollers.
if [ -x "$build/bench/api_bench" ]; then
	"$build/bench/api_bench"
fi

[ -x "$build/bench/exec_bench" ] && "$build/bench/exec_bench" # graph replay vs eager dispatch

# Compute/transfer overlap of stages over a shaped veth link (root only;
# otherwise it says "skipped" on stderr and prints nothing).
if [ -x "$build/bench/overlap_bench" ]; then
	"$build/bench/overlap_bench"
fi

# The shared service: three jobs on a pool of 6 sleep-based workers together vs
# one after another, placement of a 4-stage job, queue wait with a worker free.
[ -x "$build/bench/sched_bench" ] && "$build/bench/sched_bench"

# Workers (pipeserver --worker on loopback): submit to first step with 1 and
# 4 workers, and the 4-worker digits job's throughput next to one process.
if [ -x "$build/bench/dist_bench" ]; then
	"$build/bench/dist_bench"
fi

# pipeserver's HTTP endpoint: /metrics scrape time and the cost of scraping.
if [ -x "$build/bench/http_bench" ]; then
	"$build/bench/http_bench"
fi

# A real-scale job (GPT-2-small shape, ~4 minutes with its PyTorch reference):
# set-up before the first step, checkpoint stall, peak RSS, vs PyTorch.
[ -x "$build/bench/w3_bench" ] && "$build/bench/w3_bench" "$here/torch_w3_ref.py"

# What a checkpoint costs a running job (written in the background).
[ -x "$build/bench/ckpt_bench" ] && "$build/bench/ckpt_bench"

# The CUDA backend on GPT-2-small beside cuBLAS and PyTorch (prints
# "skip: ..." without a CUDA device).
[ -x "$build/bench/gpu_bench" ] && "$build/bench/gpu_bench" --torch "$here/torch_gpu_ref.py"

if $have_torch; then
	theirs=$(medians torch "$runs_theirs")
	echo "$theirs" | awk '{ print ($1 == "#" ? $0 : "# " $0) }'
	get() { echo "$1" | awk -v k="$2" '$1 != "#" && $2 == k { print $3 }'; }
	for w in w1_samples_per_s w2_tokens_per_s w2_bf16_tokens_per_s; do
		a=$(get "$ours" "$w")
		b=$(get "$theirs" "$w")
		if [ -z "$a" ] || [ -z "$b" ]; then
			echo "# ${w%_tokens_per_s} against PyTorch skipped (no figure from one side)"
			continue
		fi
		n=${w%_tokens_per_s}
		n=${n%_samples_per_s}
		if [ "$n" = w2_bf16 ]; then
			awk -v a="$a" -v b="$b" 'BEGIN { printf "bench w2_bf16_vs_torch_bf16 %.2f\n", a / b }'
		else
			awk -v a="$a" -v b="$b" -v n="$n" 'BEGIN { printf "bench %s_vs_torch %.2f\n", n, a / b }'
		fi
	done
else
	echo "# PyTorch not importable by /usr/bin/python3: w1_vs_torch and w2_vs_torch skipped"
fi
