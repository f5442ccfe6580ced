# pagoda: `make run` and `make test` do the whole set-up on a fresh machine
# (distribution packages, configure, build). Everything else is optional.

BUILD      ?= build
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc)
# Extra CMake settings, e.g. CMAKE_FLAGS="-DPAGODA_CUDA=OFF -DPAGODA_SANITIZE=address"
CMAKE_FLAGS ?=
# Extra server flags for `make run`, e.g. ARGS="--layers 4 --cache-dtype bf16"
ARGS ?=

.PHONY: all deps check-deps configure build run test unit-test check-deploy bench demo clean

all: build

deps:
	@bash scripts/install-deps.sh

# promtool and a Prometheus server, yamllint, shellcheck: the deployment checks' tools.
check-deps:
	@bash scripts/install-deps.sh checks

configure: deps
	@cmake -G Ninja -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 \
	  || { cat $(BUILD).configure.log; exit 1; }
	@grep -E "^-- pagoda" $(BUILD).configure.log || true

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# Starts pagoda-server on the embedded defaults (the CPU backend when no GPU).
run: build
	$(BUILD)/server/pagoda-server $(ARGS)

# The whole test suite: unit, kernel-vs-reference, end-to-end and deployment checks.
test: check-deps build
	@ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

unit-test: build
	@ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) -L unit

check-deploy: check-deps build
	@bash scripts/check-deploy.sh $(BUILD)/server/pagoda-server $(BUILD)/client/pagoda-cli

# The kernel benchmark on the reference shape, the CPU's best SIMD target and
# AVX2 side by side (not a test: it reports ratios).
bench: build
	$(BUILD)/client/pagoda-bench kernel --batch 8 --context 4096 --q-heads 32 --kv-heads 8 \
	  --head-dim 128 --dtype fp16 --threads 2 --target best,avx2

# The batching engine in one process, without the gRPC service.
demo: build
	$(BUILD)/tools/pagoda-demo

clean:
	rm -rf $(BUILD) $(BUILD).configure.log
