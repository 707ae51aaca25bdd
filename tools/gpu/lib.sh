# lib.sh - shell functions the GPU scripts share (sourced, not run).

# start_server BUILD DATA LOG ARGS... starts BUILD's pipeserver on a free
# loopback port with ARGS, its data dir in DATA/d and stderr in LOG; sets
# $server (its pid) and $url (empty when it did not start within 30 s).
start_server() {
	local build=$1 data=$2 log=$3
	shift 3
	"$build/server/pipeserver" "$@" --listen tcp://127.0.0.1:0 --data-dir "$data/d" \
		>"$data/server.out" 2>"$log" &
	server=$!
	url=
	for _ in $(seq 300); do
		url=$(sed -n 's/^pipeserver listening on //p' "$data/server.out" | head -n 1)
		[ -n "$url" ] || ! kill -0 $server 2>/dev/null && break
		sleep 0.1
	done
}

# bf16_spec SRC DST writes job spec SRC at precision bf16 (name + "-bf16").
bf16_spec() {
	python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); s["precision"] = "bf16"
s["name"] += "-bf16"; json.dump(s, open(sys.argv[2], "w"))' "$1" "$2"
}
