#!/usr/bin/env bash
# deploy_probe.sh SOURCE_ROOT BUILD_ROOT - the deploy files against the real
# binaries, on loopback (no Docker here):
#  1. deploy/healthcheck.sh (the image's HEALTHCHECK) with the variables the
#     image sets: 0 for a running server (GET /healthz) and worker (TCP
#     connect), 1 once they are gone and for a server without PIPETRAIN_HTTP.
#  2. The shipped multi-worker job files (deploy/digits-compose.json,
#     deploy/k8s/digits-job.json), as shipped, train to completion on a
#     server whose --pool is four `pipeserver --worker` processes and which
#     has no local devices, as the deploy files configure it (data resolved
#     against the source root).
set -euo pipefail

src=${1:?usage: deploy_probe.sh SOURCE_ROOT BUILD_ROOT}
build=${2:?usage: deploy_probe.sh SOURCE_ROOT BUILD_ROOT}
server_bin=$build/server/pipeserver
pc=$build/client/pipeclient
check=$src/deploy/healthcheck.sh
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pipetrain-probe.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT
export OMP_WAIT_POLICY=PASSIVE
fail=0

# shellcheck source=tests/server_start.sh
. "$src/tests/server_start.sh"

# start NAME ARGS... starts pipeserver (its pid joins pids, and goes to
# $tmp/NAME.pid) and waits for its first announced URL, left in $url.
start() {
	local name=$1
	shift
	start_pipeserver "$server_bin" "$tmp/$name.out" "$tmp/$name.log" "$@"
	pids+=("$started_pid")
	echo "$started_pid" >"$tmp/$name.pid"
}

workers=()
for i in 1 2 3 4; do
	start "worker$i" --worker --listen tcp://127.0.0.1:0
	workers+=("$url")
done
pool=$(IFS=,; echo "${workers[*]}")
start server --listen tcp://127.0.0.1:0 --http 127.0.0.1:0 --data-dir "$tmp/data" \
	--files-root "$src" --pool "$pool" --devices none
server_url=$url
http=
for _ in $(seq 100); do
	http=$(sed -n 's|^pipeserver http on http://||p' "$tmp/server.out" | head -n 1)
	[ -n "$http" ] && break
	sleep 0.05
done
[ -n "$http" ] || { echo "FAIL: no HTTP line" >&2; exit 1; }

expect() { # expect RC DESCRIPTION COMMAND...
	local want=$1 what=$2 got=0
	shift 2
	"$@" 2>"$tmp/hc.err" || got=$?
	if [ "$got" -ne "$want" ]; then
		echo "FAIL: healthcheck $what: exit $got, want $want ($(cat "$tmp/hc.err"))" >&2
		fail=1
	fi
}
# The image sets PIPETRAIN_HTTP=0.0.0.0:PORT; the check probes loopback.
expect 0 "server" env PIPETRAIN_HTTP="0.0.0.0:${http##*:}" bash "$check" 5
expect 0 "worker" env PIPETRAIN_WORKER=true PIPETRAIN_LISTEN="${workers[0]}" bash "$check" 5
expect 1 "server without PIPETRAIN_HTTP" env -u PIPETRAIN_HTTP bash "$check" 5
expect 1 "wrong HTTP port (a worker's)" env PIPETRAIN_HTTP="127.0.0.1:${workers[0]##*:}" \
	bash "$check" 2

# The job files as shipped: the server places them on its pool.
run_job() { # run_job FILE
	local file=$1
	if ! "$pc" --server "$server_url" submit "$file" --follow >"$tmp/job.out" 2>&1; then
		echo "FAIL: $file on the pool:" >&2
		tail -n 20 "$tmp/job.out" >&2
		tail -n 20 "$tmp/server.log" >&2
		fail=1
		return
	fi
	echo "deploy_probe: $(basename "$file") trained on the pool: $(tail -n 1 "$tmp/job.out")"
}
run_job "$src/deploy/digits-compose.json"
run_job "$src/deploy/k8s/digits-job.json"

# Stopped processes fail the check.
kill -TERM "$(cat "$tmp/server.pid")" "$(cat "$tmp/worker1.pid")"
wait "$(cat "$tmp/server.pid")" "$(cat "$tmp/worker1.pid")" || true
expect 1 "stopped server" env PIPETRAIN_HTTP="127.0.0.1:${http##*:}" bash "$check" 2
expect 1 "stopped worker" env PIPETRAIN_WORKER=true PIPETRAIN_LISTEN="${workers[0]}" \
	bash "$check" 2

[ "$fail" -eq 0 ] || exit 1
echo "deploy_probe: ok"
