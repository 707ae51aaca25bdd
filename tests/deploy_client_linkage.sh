#!/usr/bin/env bash
# deploy_client_linkage.sh SOURCE_ROOT BUILD_ROOT - the installed client
# carries no training code. `meson install --destdir` of the build, then:
#  1. readelf -d of the installed libpipeclient.so and pipeclient: no NEEDED
#     entry but libnng, libm, libc, libpthread and ld-linux (and, for the CLI,
#     libpipeclient itself): no oneDNN, OpenMP, CUDA or libstdc++.
#  2. The installed pipeclient runs with LD_LIBRARY_PATH unset and loads the
#     installed libpipeclient (its install rpath), `--version` and `info`
#     against a real pipeserver; `info`'s max RSS (/usr/bin/time) < 16 MiB.
#  3. pkg-config, pointed at the installed .pc files, knows `pipeclient` and
#     `libpipeclient`, and an outside C program builds and runs with
#     `pkg-config --cflags --libs libpipeclient`.
# Skips (exit 77) when readelf, pkg-config or /usr/bin/time is missing.
set -euo pipefail

: "${1:?usage: deploy_client_linkage.sh SOURCE_ROOT BUILD_ROOT}"
build=${2:?usage: deploy_client_linkage.sh SOURCE_ROOT BUILD_ROOT}
for tool in readelf pkg-config /usr/bin/time cc; do
	if ! command -v "$tool" >/dev/null; then
		echo "SKIP: $tool is not installed (Debian: binutils, pkgconf, time, gcc)"
		exit 77
	fi
done
rss_limit_kb=16384
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pipetrain-linkage.XXXXXX")
server_pid=
cleanup() {
	if [ -n "$server_pid" ]; then
		kill -TERM "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
unset LD_LIBRARY_PATH
fail=0
bad() {
	echo "FAIL: $*" >&2
	fail=1
}

dest=$tmp/dest
meson install -C "$build" --no-rebuild --quiet --destdir "$dest" >"$tmp/install.log" 2>&1 ||
	{ cat "$tmp/install.log" >&2; echo "FAIL: meson install" >&2; exit 1; }
lib=$(find "$dest" -name 'libpipeclient.so.*.*' -type f | head -n 1)
pc=$(find "$dest" -path '*/bin/pipeclient' -type f | head -n 1)
pcdir=$(find "$dest" -name pipeclient.pc -printf '%h\n' | head -n 1)
if [ -z "$lib" ] || [ -z "$pc" ] || [ -z "$pcdir" ]; then
	echo "FAIL: meson install left no libpipeclient.so.*, bin/pipeclient or pipeclient.pc" >&2
	exit 1
fi
libdir=$(dirname "$lib")

# 1. NEEDED entries: allowed is what the names say; anything else fails.
needed() { # needed FILE ALLOWED_EXTRA_REGEX
	local n
	while read -r n; do
		case $n in
		libnng.so* | libm.so* | libc.so* | libpthread.so* | ld-linux*) ;;
		*) [[ -n $2 && $n =~ $2 ]] || bad "${1#"$dest"} needs $n" ;;
		esac
	done < <(readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
	echo "deploy_client_linkage: ${1#"$dest"}: NEEDED $(readelf -d "$1" |
		sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | paste -sd' ')"
}
needed "$lib" ''
needed "$pc" '^libpipeclient\.so\.[0-9]+$'

# 2. The installed CLI alone: the libpipeclient it loads is the installed one.
resolved=$(ldd "$pc" | sed -n 's/^[[:space:]]*libpipeclient\.so\.[0-9]* => \(.*\)$/\1/p')
resolved=${resolved% (0x*}
[ "$(readlink -f "$resolved" 2>/dev/null)" = "$(readlink -f "$lib")" ] ||
	bad "installed pipeclient: libpipeclient.so => ${resolved:-(none)}, want $libdir (install rpath)"
out=$("$pc" --version 2>&1) || bad "installed pipeclient --version: $out"

url='' started_pid=''
# shellcheck source=tests/server_start.sh
. "$1/tests/server_start.sh"
start_pipeserver "$build/server/pipeserver" "$tmp/server.out" "$tmp/server.log" \
	--listen tcp://127.0.0.1:0 --data-dir "$tmp/data"
server_pid=$started_pid
if /usr/bin/time -f %M -o "$tmp/rss" "$pc" --server "$url" info >"$tmp/info.out" 2>&1; then
	rss=$(tail -n 1 "$tmp/rss")
	grep -q '^version' "$tmp/info.out" || bad "pipeclient info printed no version: $(cat "$tmp/info.out")"
	[ "$rss" -lt "$rss_limit_kb" ] || bad "pipeclient info max RSS $rss KB (limit $rss_limit_kb KB)"
	echo "deploy_client_linkage: installed pipeclient info: max RSS $rss KB"
else
	bad "installed pipeclient info: $(cat "$tmp/info.out")"
fi

# 3. pkg-config answers both names; its flags build an outside program
# (SYSROOT: the .pc files name the real prefix, the files are under $dest).
export PKG_CONFIG_PATH=$pcdir PKG_CONFIG_SYSROOT_DIR=$dest
unset PKG_CONFIG_LIBDIR
for name in pipeclient libpipeclient; do
	pkg-config --exists "$name" || bad "pkg-config --exists $name (PKG_CONFIG_PATH=${pcdir#"$dest"})"
done
cat >"$tmp/outside.c" <<'EOF'
#include <pipeclient.h>
#include <stdio.h>
int main(void)
{
	printf("%s %s\n", PIPECLIENT_VERSION, pipeclient_err_name(PIPECLIENT_OK));
	return 0;
}
EOF
# shellcheck disable=SC2046 # pkg-config's output is words
if cc -o "$tmp/outside" "$tmp/outside.c" $(pkg-config --cflags --libs libpipeclient) \
	-Wl,-rpath,"$libdir" 2>"$tmp/cc.log"; then
	"$tmp/outside" >/dev/null || bad "outside program built with pkg-config libpipeclient does not run"
else
	bad "cc \$(pkg-config --cflags --libs libpipeclient): $(cat "$tmp/cc.log")"
fi

[ "$fail" -eq 0 ] || exit 1
echo "deploy_client_linkage: ok"
