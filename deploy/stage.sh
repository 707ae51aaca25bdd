#!/usr/bin/env bash
# stage.sh BUILD_DIR DESTDIR - install a finished build into DESTDIR the way
# the Docker image gets it, and list the packages its binaries need at run time.
#
# Writes, under DESTDIR (prefix /usr/local, meson's default):
#   bin/pipeserver, bin/pipeclient, lib*/libpipeclient.so*, include/, pkgconfig
#                                     (meson install)
#   bin/pipetrain-healthcheck         (deploy/healthcheck.sh)
#   share/pipetrain/examples/         (the shipped job files and their data)
#   share/pipetrain/runtime-packages.txt
#       one package a line: the dpkg packages that own the shared libraries
#       `ldd` finds for the installed binaries, less the CUDA ones (cuda-*,
#       libcu*, libnccl*, libnv*: the CUDA runtime image has them) and less
#       libraries found in no package under /usr/local/cuda* (same reason).
#       The Docker runtime stage installs exactly this list, so the list is
#       made on the distribution that built the binaries.
# Fails when a library is not found or belongs to no package elsewhere.
# Runs on the build machine (CI: tests/deploy_stage.sh; Docker: the build stage).
set -euo pipefail

build=${1:?usage: stage.sh BUILD_DIR DESTDIR}
dest=${2:?usage: stage.sh BUILD_DIR DESTDIR}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
prefix=/usr/local
share=$dest$prefix/share/pipetrain

meson install -C "$build" --no-rebuild --quiet --destdir "$dest"
install -D -m 0755 deploy/healthcheck.sh "$dest$prefix/bin/pipetrain-healthcheck"
mkdir -p "$share/examples/data"
install -m 0644 examples/*.json "$share/examples/"
install -m 0644 examples/data/* "$share/examples/data/"

# owner_of prints the package that owns library file $1 (tried as given,
# resolved, and across the /lib -> /usr/lib merge), or nothing.
owner_of() {
	local f cand out
	for f in "$1" "$(readlink -f "$1")"; do
		for cand in "$f" "${f/#\/lib/\/usr\/lib}" "${f/#\/usr\/lib/\/lib}"; do
			if out=$(dpkg-query -S "$cand" 2>/dev/null); then
				printf '%s\n' "${out%%:*}"
				return 0
			fi
		done
	done
}

# Our own libpipeclient is in DESTDIR, not installed yet: let ldd find it there.
libdirs=$(find "$dest$prefix" -name 'libpipeclient.so*' -printf '%h\n' | sort -u | paste -sd:)
packages=()
status=0
for bin in "$dest$prefix/bin/pipeserver" "$dest$prefix/bin/pipeclient"; do
	while read -r line; do
		case $line in
		*"=> not found"*)
			echo "stage: $bin: ${line%% *} not found" >&2
			status=1
			continue
			;;
		*"=> /"*) lib=${line#*=> } ;;
		/*) lib=$line ;;
		*) continue ;; # linux-vdso
		esac
		lib=${lib%% (*}
		case $lib in "$dest"/*) continue ;; esac
		pkg=$(owner_of "$lib")
		if [ -z "$pkg" ]; then
			case $(readlink -f "$lib") in
			/usr/local/cuda*) continue ;;
			esac
			echo "stage: $bin: $lib belongs to no package" >&2
			status=1
			continue
		fi
		case $pkg in
		cuda-* | libcu* | libnccl* | libnv*) continue ;;
		esac
		packages+=("$pkg")
	done < <(LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ldd "$bin")
done
[ "$status" -eq 0 ] || exit 1
printf '%s\n' "${packages[@]}" | sort -u >"$share/runtime-packages.txt"
