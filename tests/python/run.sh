#!/usr/bin/env bash
# run.sh SRC BUILD - installs client/python from the checkout into a temporary
# folder (pip, offline: its dependencies come from the venv that
# deploy/install-deps.sh makes) and runs tests/python with pytest twice:
# with PyPI's flatbuffers and with Debian's python3-flatbuffers (2.0.8); then
# test_torch.py with /usr/bin/python3, whose PyTorch the venv does not have.
set -euo pipefail
src=$1 build=$2
venv=${PT_PY_VENV:-/opt/pipetrain-py}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import pynng, flatbuffers, pytest' 2>/dev/null; then
	echo "skip: no Python venv with pynng, flatbuffers and pytest at $venv (deploy/install-deps.sh makes it)"
	exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# From a copy: setuptools writes build/ and *.egg-info next to the sources.
cp -r "$src/client/python" "$tmp/pkg"
"$venv/bin/python" -m pip install -q --no-deps --no-build-isolation --no-index \
	--target "$tmp/site" "$tmp/pkg"
export PIPESERVER=$build/server/pipeserver PIPECLIENT=$build/client/pipeclient
cd "$tmp"  # import pipetrain from the installed copy, not the checkout
echo "== with PyPI flatbuffers"
PYTHONPATH=$tmp/site "$venv/bin/python" -m pytest -q -p no:cacheprovider "$src/tests/python"
deb=/usr/lib/python3/dist-packages/flatbuffers
if [ -d "$deb" ]; then
	mkdir "$tmp/debian"
	ln -s "$deb" "$tmp/debian/flatbuffers"
	echo "== with Debian's python3-flatbuffers"
	PT_EXPECT_FLATBUFFERS=$deb PYTHONPATH=$tmp/site:$tmp/debian "$venv/bin/python" -m pytest \
		-q -p no:cacheprovider "$src/tests/python" -k 'not generated_code'
fi
# pipetrain.torch needs PyTorch, which the venv lacks: Debian's python3-torch
# belongs to /usr/bin/python3, so test_torch.py runs there too, with pynng,
# PyPI's flatbuffers and pytest from the venv (same Python version).
sys_py=/usr/bin/python3
venv_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if ! "$sys_py" -c 'import torch' 2>/dev/null; then
	echo "skip: tests/python/test_torch.py: no PyTorch for $sys_py (Debian: python3-torch, which deploy/install-deps.sh installs)"
elif [ "$("$sys_py" -c 'import sys; print(sys.version_info[:2])')" != \
	"$("$venv/bin/python" -c 'import sys; print(sys.version_info[:2])')" ]; then
	echo "skip: tests/python/test_torch.py: $sys_py and the venv's Python differ in version"
else
	echo "== pipetrain.torch with $sys_py and its PyTorch"
	PYTHONPATH=$tmp/site:$venv_site "$sys_py" -m pytest -q -p no:cacheprovider -rs \
		"$src/tests/python/test_torch.py"
fi
