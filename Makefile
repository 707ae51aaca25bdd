# Thin entry points over meson. `make test` is what CI runs.
#   make demo   install deps, build, start pipeserver on loopback and train the
#               shipped digits example through pipeclient (tools/demo.sh)
#   make demo-local  the same example trained in-process (pt-train), no server
#   make test   install deps, build with -Werror, run every test, then the
#               unit tests again under AddressSanitizer + UBSan
#   make bench  build and print `bench <name> <value>` lines
#   make fuzz   build the libFuzzer targets (tests/fuzz, clang) and fuzz each
#               for FUZZ_SECONDS (default 60)
#   make soak   kill -9 soak of a real server and 2 workers under random client
#               load, then invariant checks (tests/soak/soak.py; not part of
#               `make test`). SOAK_SECONDS (default 600) bounds it, SOAK_SEED
#               reproduces a run.
BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
MESON      ?= meson
NINJA      ?= ninja
JOBS       ?= 2

.PHONY: all deps build demo demo-local test test-asan test-fuzz fuzz fuzz-build bench soak clean

all: build

deps:
	@bash deploy/install-deps.sh

# deploy/build.sh is the build command the Dockerfile runs too, so CI runs it.
BUILD_ENV  = MESON=$(MESON) NINJA=$(NINJA) JOBS=$(JOBS)

build: deps
	$(BUILD_ENV) bash deploy/build.sh $(BUILD)

demo: build
	bash tools/demo.sh $(BUILD)

demo-local: build
	OMP_WAIT_POLICY=PASSIVE $(BUILD)/tools/pt-train --example digits

test: build
	$(MESON) test -C $(BUILD) --print-errorlogs --num-processes 1 || \
		{ bash tools/test-failures.sh $(BUILD); exit 1; }
	$(MAKE) test-asan
	$(MAKE) test-fuzz

test-asan: deps
	$(BUILD_ENV) bash deploy/build.sh $(ASAN_BUILD) -Dwerror=true -Dbuildtype=debugoptimized \
		-Db_sanitize=address,undefined -Db_lundef=false
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		$(MESON) test -C $(ASAN_BUILD) --suite unit --print-errorlogs --num-processes 1 \
		--timeout-multiplier 4 || { bash tools/test-failures.sh $(ASAN_BUILD); exit 1; }

# The fuzz build: clang, ASan + UBSan, only the library and tests/fuzz.
fuzz-build: deps
	CC=clang $(BUILD_ENV) bash deploy/build.sh $(FUZZ_BUILD) -Dfuzz=enabled -Dcuda=disabled \
		-Dwerror=false -Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false

# Every seed and kept crash input once, then 10 s of fuzzing per target.
test-fuzz: fuzz-build
	$(MESON) test -C $(FUZZ_BUILD) --suite fuzz-regress --print-errorlogs --num-processes 1 || \
		{ bash tools/test-failures.sh $(FUZZ_BUILD); exit 1; }
	FUZZ_SECONDS=10 $(MESON) test -C $(FUZZ_BUILD) --suite fuzz --print-errorlogs \
		--num-processes 1 || { bash tools/test-failures.sh $(FUZZ_BUILD); exit 1; }

fuzz: fuzz-build
	FUZZ_SECONDS=$(FUZZ_SECONDS) $(MESON) test -C $(FUZZ_BUILD) --suite fuzz \
		--print-errorlogs --num-processes 1

bench: build
	@bash bench/run.sh $(BUILD)

SOAK_SECONDS ?= 600
soak: build
	SOAK_SECONDS=$(SOAK_SECONDS) timeout --kill-after=10 $$(($(SOAK_SECONDS) + 60)) \
		python3 tests/soak/soak.py --build $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
