#!/usr/bin/env bash
# pipetrain-healthcheck - the Docker image's HEALTHCHECK: exit 0 when this
# container's pipeserver answers, 1 otherwise. Needs only bash (the runtime
# image has no curl or wget); reads the same PIPETRAIN_* variables pipeserver
# does, so configure the container with variables, not flags.
#
#   server (PIPETRAIN_WORKER unset or false): GET /healthz on PIPETRAIN_HTTP
#     (HOST:PORT; 0.0.0.0 and :: are probed on loopback) must answer 200.
#   worker (PIPETRAIN_WORKER=true|1|yes): the first tcp:// URL of
#     PIPETRAIN_LISTEN must accept a connection (workers serve no HTTP).
# The first argument is the timeout in seconds (default 5).
set -u

timeout_s=${1:-5}

# probe_host maps a listen address to one this container can dial.
probe_host() {
	local h=${1#[}
	h=${h%]}
	case $h in
	"" | 0.0.0.0 | "*") echo 127.0.0.1 ;;
	::) echo ::1 ;;
	*) echo "$h" ;;
	esac
}

case ${PIPETRAIN_WORKER:-false} in
true | 1 | yes)
	url=${PIPETRAIN_LISTEN:-tcp://127.0.0.1:7600}
	url=${url%%,*}
	case $url in
	tcp://* | tcp4://* | tcp6://*) ;;
	*)
		echo "healthcheck: PIPETRAIN_LISTEN $url is not tcp://HOST:PORT" >&2
		exit 1
		;;
	esac
	hostport=${url#*://}
	host=$(probe_host "${hostport%:*}")
	port=${hostport##*:}
	# Opening the socket is the whole check: the worker's REP listener accepts.
	# shellcheck disable=SC2016 # expanded by the inner bash
	if timeout "$timeout_s" bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$host" "$port" 2>/dev/null; then
		exit 0
	fi
	echo "healthcheck: worker $host:$port does not accept connections" >&2
	exit 1
	;;
esac

addr=${PIPETRAIN_HTTP:-}
if [ -z "$addr" ]; then
	echo "healthcheck: PIPETRAIN_HTTP is not set (the HTTP endpoint is off)" >&2
	exit 1
fi
host=$(probe_host "${addr%:*}")
port=${addr##*:}
# HTTP/1.0 GET: the server answers and closes; the status line is enough.
# shellcheck disable=SC2016 # expanded by the inner bash
status=$(timeout "$timeout_s" bash -c '
	exec 3<>"/dev/tcp/$1/$2" || exit 1
	printf "GET /healthz HTTP/1.0\r\nHost: %s\r\n\r\n" "$1" >&3
	IFS= read -r line <&3 && printf "%s" "$line"' _ "$host" "$port" 2>/dev/null)
case $status in
"HTTP/1."?" 200 "*)
	exit 0
	;;
esac
echo "healthcheck: GET http://$host:$port/healthz: ${status:-no answer}" >&2
exit 1
