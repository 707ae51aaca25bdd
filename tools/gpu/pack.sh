#!/usr/bin/env bash
# pack.sh [BUILD] [DEST] - the binaries tools/gpu/check.sh runs, with the
# shared libraries they need beyond glibc, libcrypto and CUDA (which the GPU machine
# has), in one archive (default .gpu/pack.tar.xz, git-ignored) to carry to a
# machine with a GPU that can install nothing. There:
#   mkdir -p /tmp/g && tar -xJf .gpu/pack.tar.xz -C /tmp/g
#   LD_LIBRARY_PATH=/tmp/g/lib bash tools/gpu/check.sh /tmp/g/build
# The binaries name the source root they were built in (PT_SOURCE_ROOT) for
# the shipped data: link the checkout there when it lies elsewhere.
set -euo pipefail
build=${1:-build}
dest=${2:-.gpu/pack.tar.xz}
bins=(tests/test_cuda tests/test_nccl server/pipeserver client/pipeclient bench/gpu_bench)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
for b in "${bins[@]}"; do
	mkdir -p "$stage/build/$(dirname "$b")"
	cp "$build/$b" "$stage/build/$b"
done
cp -L "$build"/client/libpipeclient.so.0 "$stage/build/client/"
ldd "${bins[@]/#/$build/}" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
	{ grep -vE '/(libcrypto|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so|/usr/local/cuda|pipeclient' || true; } |
	while read -r l; do cp -L "$l" "$stage/lib/"; done
mkdir -p "$(dirname "$dest")"
tar -cJf "$dest" -C "$stage" build lib
ls -la "$dest"
