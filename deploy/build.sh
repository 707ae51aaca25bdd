#!/usr/bin/env bash
# build.sh BUILD_DIR [MESON_SETUP_OPTION...] - configure (once) and build
# pipetrain: the one build command that `make build`/`make test` (and so CI)
# and the Dockerfile share.
#
# BUILD_DIR is relative to the repository root. Without options the build is CI's: -Dwerror=true -Dbuildtype=release. Options
# given replace those defaults (the sanitizer build and the Docker image pass
# their own). `meson setup` runs only when BUILD_DIR has no build.ninja yet;
# an existing build folder keeps the options it was set up with.
# Environment: MESON, NINJA (programs), JOBS (ninja -j, default 2).
set -euo pipefail

build=${1:?usage: build.sh BUILD_DIR [MESON_SETUP_OPTION...]}
shift
meson=${MESON:-meson}
ninja=${NINJA:-ninja}
jobs=${JOBS:-2}
if [ $# -eq 0 ]; then
	set -- -Dwerror=true -Dbuildtype=release
fi

cd "$(dirname "$0")/.."
if [ ! -f "$build/build.ninja" ]; then
	"$meson" setup "$build" "$@"
fi
"$ninja" -C "$build" -j"$jobs"
