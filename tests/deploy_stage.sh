#!/usr/bin/env bash
# deploy_stage.sh SOURCE_ROOT BUILD_ROOT - run deploy/stage.sh, the Docker
# build stage's last step, on CI's build and check what it leaves: the
# binaries, the health check, the examples, and a runtime package list whose
# every package is installed here. The Docker runtime stage installs that list.
set -euo pipefail

src=${1:?usage: deploy_stage.sh SOURCE_ROOT BUILD_ROOT}
build=${2:?usage: deploy_stage.sh SOURCE_ROOT BUILD_ROOT}
if ! command -v dpkg-query >/dev/null; then
	echo "SKIP: no dpkg-query (stage.sh lists Debian/Ubuntu packages)"
	exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pipetrain-stage.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

bash "$src/deploy/stage.sh" "$build" "$tmp/stage"
p=$tmp/stage/usr/local
fail=0
for f in bin/pipeserver bin/pipeclient bin/pipetrain-healthcheck \
	share/pipetrain/examples/digits.json share/pipetrain/examples/data/digits_x.npy \
	share/pipetrain/runtime-packages.txt; do
	[ -e "$p/$f" ] || { echo "FAIL: stage.sh left no $f" >&2; fail=1; }
done
[ -x "$p/bin/pipetrain-healthcheck" ] || { echo "FAIL: health check not executable" >&2; fail=1; }
"$p/bin/pipeserver" --help >/dev/null || { echo "FAIL: staged pipeserver --help" >&2; fail=1; }

list=$p/share/pipetrain/runtime-packages.txt
n=0
while read -r pkg; do
	n=$((n + 1))
	if [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" != "install ok installed" ]; then
		echo "FAIL: runtime package $pkg is not installed here" >&2
		fail=1
	fi
done <"$list"
# The libraries every build links: oneDNN, nng, libevent, lz4.
for lib in libdnnl libnng libevent liblz4; do
	grep -q "^$lib" "$list" || { echo "FAIL: no $lib* package in the runtime list" >&2; fail=1; }
done
[ "$fail" -eq 0 ] || exit 1
echo "deploy_stage: staged; runtime packages ($n): $(paste -sd' ' "$list")"
