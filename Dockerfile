# syntax=docker/dockerfile:1
# pipetrain image: pipeserver built with the CUDA backend on NVIDIA's CUDA
# development image, run on the matching runtime image (which has NCCL).
# Build steps are the scripts CI runs (deploy/install-deps.sh, deploy/build.sh)
# plus deploy/stage.sh, which CI runs too (tests/deploy_stage.sh).
# Ubuntu 24.04, not Debian: NVIDIA publishes no Debian CUDA images, and the
# packages install-deps.sh names have the same names in Ubuntu 24.04 (newer
# versions: oneDNN 3.1, of which we use only dnnl_sgemm, and nng 1.7.2). Our
# machines reach no Ubuntu archive; a missing name would stop the build at
# install-deps.sh with apt's message.
#
#   docker build -t pipetrain:0.1.0 .
#   docker run --gpus all -e PIPETRAIN_DEVICES=all --stop-timeout 300 \
#     -v pipetrain-data:/var/lib/pipetrain \
#     -v "$PWD/token:/run/secrets/pipetrain-token:ro" -p 7600:7600 -p 8080:8080 pipetrain:0.1.0
# (PIPETRAIN_DEVICES=all: jobs run on the GPUs, not the image's default cpu;
# --stop-timeout: SIGTERM's drain writes checkpoints, Docker's 10 s would cut it.)
# A worker: the same image with PIPETRAIN_WORKER=true PIPETRAIN_LISTEN=tcp://0.0.0.0:7700.
# deploy/README.md says more.
ARG CUDA_VERSION=13.0.1
ARG DISTRO=ubuntu24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-${DISTRO} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# Dependencies first, so a source change does not reinstall them.
COPY deploy/install-deps.sh deploy/
RUN bash deploy/install-deps.sh
COPY . .
# CI's options (deploy/build.sh's defaults) but -Dcuda=enabled, and warnings
# not fatal: -Werror is CI's policy for Debian's gcc 12; this stage has
# Ubuntu's gcc 13, whose new warnings should not stop an image build.
RUN bash deploy/build.sh build -Dwerror=false -Dbuildtype=release -Dcuda=enabled \
	&& bash deploy/stage.sh build /stage

FROM nvidia/cuda:${CUDA_VERSION}-runtime-${DISTRO}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=build /stage/ /
# runtime-packages.txt: the packages that own the libraries the binaries link
# (oneDNN, nng, libevent, lz4, libcrypto from libssl3, ...), listed by stage.sh
# on the build stage.
# Versions follow the distribution release the CUDA tag pins.
# hadolint ignore=DL3008
RUN apt-get update \
	&& xargs -r -a /usr/local/share/pipetrain/runtime-packages.txt \
		apt-get install -y --no-install-recommends \
	&& rm -rf /var/lib/apt/lists/* \
	&& ldconfig \
	&& if ldd /usr/local/bin/pipeserver /usr/local/bin/pipeclient | grep -F 'not found'; then exit 1; fi \
	&& pipeserver --help >/dev/null \
	&& groupadd --system --gid 10001 pipetrain \
	&& useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/pipetrain \
		--shell /usr/sbin/nologin pipetrain \
	&& install -d -o pipetrain -g pipetrain -m 0750 /var/lib/pipetrain

# Every option is a PIPETRAIN_* variable (server/config.c). Listening beyond
# loopback needs the token: mount it at PIPETRAIN_AUTH_TOKEN_FILE (a Docker
# or Compose secret lands there); without it pipeserver exits with an error.
# Relative data paths in job files resolve against PIPETRAIN_FILES_ROOT, where
# the shipped examples are (examples/digits.json runs as it is).
# DL3064 flags the word TOKEN: the value is a path, the token stays in the file.
# hadolint ignore=DL3064
ENV PIPETRAIN_LISTEN=tcp://0.0.0.0:7600 \
	PIPETRAIN_HTTP=0.0.0.0:8080 \
	PIPETRAIN_DATA_DIR=/var/lib/pipetrain \
	PIPETRAIN_AUTH_TOKEN_FILE=/run/secrets/pipetrain-token \
	PIPETRAIN_FILES_ROOT=/usr/local/share/pipetrain \
	OMP_WAIT_POLICY=PASSIVE
VOLUME ["/var/lib/pipetrain"]
# 7600: job API (nng); 8080: HTTP (/healthz, /readyz, /metrics, dashboard);
# 7700: the control port the examples give workers. Stage data between
# processes uses ports the kernel picks (tcp://HOST:0).
EXPOSE 7600 8080 7700
USER 10001:10001
WORKDIR /var/lib/pipetrain
# /healthz on PIPETRAIN_HTTP for a server; a TCP connect to PIPETRAIN_LISTEN
# for a worker (deploy/healthcheck.sh; bash only, no curl in the image).
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 \
	CMD ["pipetrain-healthcheck", "5"]
ENTRYPOINT ["pipeserver"]
