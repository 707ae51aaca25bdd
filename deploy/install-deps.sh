#!/usr/bin/env bash
# install-deps.sh - install every build and test dependency of pipetrain from
# Debian 12 packages. Idempotent: when everything is present it changes nothing.
# Runs as root, or through sudo. The CUDA toolkit is not a Debian package: the
# CUDA backend is built only where nvcc already exists (/usr/local/cuda).
# The Dockerfile runs this same script on NVIDIA's Ubuntu 24.04 CUDA image:
# every name below is also an Ubuntu 24.04 package (main or universe), so
# keep new ones to names both distributions have.
set -euo pipefail

packages=(
	build-essential pkg-config meson ninja-build git ca-certificates
	libdnnl-dev            # oneDNN: CPU matrix products (see docs/ and NOTES)
	libcunit1-dev          # unit tests
	libnng-dev nng-utils   # transport; nngcat for scripted pokes
	libevent-dev           # HTTP endpoint
	liblz4-dev             # wire compression
	libssl-dev openssl     # libcrypto: MAC of every stage frame; openssl: test certificates
	flatbuffers-compiler libflatbuffers-dev  # flatc: lib/fb descriptors (build), interop tests
	python3 python3-flatbuffers python3-numpy  # descriptor generator, data tools, client tests
	python3-venv           # the venv of the Python client's tests (below)
	python3-yaml           # tests/deploy_check.py reads the deploy/ YAML files
	iproute2               # ip netns, veth and tc: tests/test_netns, bench/overlap_bench
	time shellcheck        # /usr/bin/time: deploy_client_linkage's RSS; shellcheck: deploy_lint
	gdb                    # thread stacks of a test's server that did not stop (tests/pt_test.c)
	clang libclang-rt-dev libomp-dev  # tests/fuzz: libFuzzer (libclang_rt.fuzzer), OpenMP for clang
)
# Debian only (Ubuntu's chromium is a snap, so the Docker image, built on
# Ubuntu, leaves them out): prometheus (promtool and a real scrape) and
# chromium (the dashboard test) for tests/test_http; ~1 GB, ~1m40s. Without
# them test_http skips those checks. PT_DEPS_NO_BROWSER=1 leaves them out too.
if grep -qx 'ID=debian' /etc/os-release 2>/dev/null && [ "${PT_DEPS_NO_BROWSER:-0}" != 1 ]; then
	packages+=(prometheus chromium)
fi
# Debian only (not in Ubuntu 24.04): python3-torch, PyTorch 1.13 for
# /usr/bin/python3, for tests/python/test_torch.py (pipetrain.torch); with its
# dependencies a few hundred MB. Without it that test skips. OpenBLAS
# (pthread) becomes its libblas.so.3: with the reference BLAS that Debian
# picks otherwise, PyTorch runs 10-60x slower and make bench's *_vs_torch
# figures would mean nothing.
if grep -qx 'ID=debian' /etc/os-release 2>/dev/null; then
	packages+=(python3-torch libopenblas0-pthread)
fi

# The Python client (client/python) depends on pynng and flatbuffers from PyPI;
# tests/python runs it from this venv (PT_PY_VENV), made once, with pytest.
venv=${PT_PY_VENV:-/opt/pipetrain-py}
py_packages=("pynng>=0.7,<1" "flatbuffers>=2.0" "pytest>=7" "setuptools>=61" wheel)

missing=()
for p in "${packages[@]}"; do
	# dpkg-query prints "install ok installed" for a fully installed package.
	if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
		missing+=("$p")
	fi
done

make_venv() {
	if [ -x "$venv/bin/python" ] &&
		"$venv/bin/python" -c 'import pynng, flatbuffers, pytest, setuptools' 2>/dev/null; then
		return 0
	fi
	echo "install-deps: making $venv (${py_packages[*]})" >&2
	# The system's trust store (ca-certificates), as apt uses, unless PIP_CERT
	# names another. Without PyPI the venv is left out and tests/python skips
	# with a message: the C build and its tests need none of it.
	if ! $sudo /usr/bin/python3 -m venv "$venv" ||
		! $sudo "$venv/bin/pip" install -q --disable-pip-version-check \
			--cert "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}" "${py_packages[@]}"; then
		echo "install-deps: warning: could not make $venv from PyPI; the Python client's tests will skip" >&2
		$sudo rm -rf "$venv"
	fi
	return 0
}

sudo=""
if [ "$(id -u)" -ne 0 ]; then
	sudo="sudo"
fi
if [ ${#missing[@]} -eq 0 ]; then
	make_venv
	exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
if [ -n "$sudo" ]; then
	command -v sudo >/dev/null || { echo "install-deps: need root or sudo" >&2; exit 1; }
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
make_venv
