#!/usr/bin/env bash
# demo.sh [BUILD] - the README's demo (`make demo`): start pipeserver on
# loopback with a temporary data directory, submit the shipped digits job
# (4 pipeline stages, sync mode) with pipeclient, show the loss falling, fetch
# the final checkpoint and print its held-out accuracy, then stop the server.
#
# The accuracy printed is the job's final evaluation as the server reports it
# (`pipeclient status --json`, last.eval_accuracy): the held-out split of the
# data, evaluated on the weights of the last step, which are the weights the
# fetched checkpoint holds. The checkpoint is left in BUILD/demo/.
set -euo pipefail

build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
server_bin=$build/server/pipeserver
pc=$build/client/pipeclient
for b in "$server_bin" "$pc"; do
	[ -x "$b" ] || { echo "demo: $b is not built (run make build)" >&2; exit 1; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/pipetrain-demo.XXXXXX")
server_pid=
stop_server() {
	if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
		kill -TERM "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
		echo "demo: pipeserver stopped"
	fi
	server_pid=
}
cleanup() {
	stop_server
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Spinning OpenMP threads fight on small machines; the server's stages share cores.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# The job names its data relative to the checkout (examples/data/...): the
# checkout is the server's files root, so the job reads nothing outside it.
"$server_bin" --listen tcp://127.0.0.1:0 --http 127.0.0.1:0 --data-dir "$tmp/data" \
	--files-root "$root" >"$tmp/server.out" 2>"$tmp/server.log" &
server_pid=$!

url=
for _ in $(seq 600); do
	url=$(sed -n 's/^pipeserver listening on //p' "$tmp/server.out" | head -n 1)
	[ -n "$url" ] && break
	if ! kill -0 "$server_pid" 2>/dev/null; then
		echo "demo: pipeserver exited:" >&2
		cat "$tmp/server.log" >&2
		server_pid=
		exit 1
	fi
	sleep 0.1
done
[ -n "$url" ] || { echo "demo: pipeserver did not start" >&2; cat "$tmp/server.log" >&2; exit 1; }
export PIPETRAIN_SERVER=$url
echo "demo: pipeserver listening on $url (data in $tmp/data)"
# The HTTP line follows the API one: dashboard, /metrics, /healthz, /readyz.
for _ in $(seq 50); do
	http=$(sed -n 's/^pipeserver http on //p' "$tmp/server.out" | head -n 1)
	[ -n "$http" ] && break
	sleep 0.1
done
[ -n "${http:-}" ] && echo "demo: dashboard at $http/ (metrics at $http/metrics)"
"$pc" info
echo

echo "demo: $pc submit examples/digits.json --follow"
set +e
"$pc" submit examples/digits.json --follow
rc=$?
set -e
# The server is fresh: the job just submitted is its only one.
job=$("$pc" list | awk 'NR > 1 { id = $1 } END { print id }')
if [ "$rc" -ne 0 ] || [ -z "$job" ]; then
	echo "demo: the job did not succeed (exit $rc); server log:" >&2
	cat "$tmp/server.log" >&2
	exit 1
fi
echo

mkdir -p "$build/demo"
ckpt=$build/demo/digits-final.safetensors
rm -f "$ckpt"
"$pc" checkpoint "$job" -o "$ckpt"
status=$("$pc" status "$job" --json)
acc=$(printf '%s\n' "$status" | sed -n 's/.*"eval_accuracy":\([-0-9.eE+]*\).*/\1/p')
step=$(printf '%s\n' "$status" | sed -n 's/.*"last":{"step":\([0-9]*\).*/\1/p')
if [ -n "$acc" ]; then
	awk -v a="$acc" -v s="$step" -v f="$ckpt" \
		'BEGIN { printf "demo: held-out accuracy %.2f %% after step %s (checkpoint %s)\n", 100 * a, s, f }'
else
	echo "demo: the job reported no held-out accuracy" >&2
	exit 1
fi
stop_server
