#!/usr/bin/env bash
# submit_watch_test.sh SOURCE_ROOT BUILD_ROOT - the shipped Python client
# flow against a real pipeserver: tests/client_py/gen.sh generates the code
# of schema/api.fbs with flatc, and submit_watch.py, run by /usr/bin/python3
# with Debian's python3-flatbuffers (2.0.8, whose builder shares vtables
# between tables of different sizes), submits examples/digits.json with an
# auth token, follows its metrics to the end and reads the final state.
# Passes when the job succeeds with all 400 steps, the metric lines are
# the points counted, and held-out accuracy is above 0.8.
set -euo pipefail

src=${1:?usage: submit_watch_test.sh SOURCE_ROOT BUILD_ROOT}
build=${2:?usage: submit_watch_test.sh SOURCE_ROOT BUILD_ROOT}
py=/usr/bin/python3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pipetrain-client-py.XXXXXX")
pid=
cleanup() {
	[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
export OMP_WAIT_POLICY=PASSIVE

fb=$("$py" -c 'import flatbuffers; print(flatbuffers.__file__)')
case $fb in
/usr/lib/python3/dist-packages/*) ;;
*) echo "FAIL: $py imports flatbuffers from $fb, not Debian's python3-flatbuffers" >&2; exit 1 ;;
esac

echo "s3cret-token" >"$tmp/token"
url='' started_pid=''
# shellcheck source=tests/server_start.sh
. "$src/tests/server_start.sh"
start_pipeserver "$build/server/pipeserver" "$tmp/server.out" "$tmp/server.log" \
	--listen tcp://127.0.0.1:0 --data-dir "$tmp/data" --files-root "$src" \
	--auth-token-file "$tmp/token"
pid=$started_pid

sh "$src/tests/client_py/gen.sh" "$tmp/gen"
rc=0
(cd "$src" && "$py" tests/client_py/submit_watch.py --gen "$tmp/gen" --server "$url" \
	--token s3cret-token examples/digits.json) >"$tmp/out.jsonl" 2>"$tmp/err" || rc=$?
if [ "$rc" -ne 0 ]; then
	echo "FAIL: submit_watch.py exited $rc: $(cat "$tmp/err")" >&2
	tail -n 20 "$tmp/server.log" >&2
	exit 1
fi
"$py" - "$tmp/out.jsonl" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
metrics = [l for l in lines if l["type"] == "metric"]
summary = lines[-1]
print("summary:", json.dumps(summary))
assert summary["type"] == "summary", summary
assert summary["state"] == "Succeeded", summary
assert summary["steps"] == 400, summary
assert summary["points"] == len(metrics) > 0, (summary, len(metrics))
assert [m["step"] for m in metrics] == sorted({m["step"] for m in metrics}), "steps out of order"
assert summary["eval_accuracy"] is not None and summary["eval_accuracy"] > 0.8, summary
assert summary["last_loss"] < summary["first_loss"], summary
EOF
