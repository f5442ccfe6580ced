# pagoda: `make run` and `make test` do the whole set-up on a fresh machine
# (distribution packages, configure, build). Everything else is optional.

BUILD      ?= build
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc)
# Extra CMake settings, e.g. CMAKE_FLAGS="-DPAGODA_CUDA=OFF -DPAGODA_SANITIZE=address"
CMAKE_FLAGS ?=
# Extra server flags for `make run`, e.g. ARGS="--layers 4 --cache-dtype bf16"
ARGS ?=
# The install script's package groups `configure` needs (the image's build stage: compile)
DEPS_GROUPS ?= build

.PHONY: all deps check-deps fuzz-deps configure build run test unit-test check-deploy bench demo sanitize fuzz tsan image-test clean

all: build

deps:
	@bash scripts/install-deps.sh $(DEPS_GROUPS)

# promtool and a Prometheus server, yamllint, shellcheck: the deployment checks' tools.
check-deps:
	@bash scripts/install-deps.sh checks

# clang and its libFuzzer runtime: the sanitizer and fuzz builds' compiler.
fuzz-deps:
	@bash scripts/install-deps.sh fuzz

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

# The kernel benchmark, the CPU's best SIMD target and AVX2 side by side (not
# a test: it reports ratios): the reference shape (memory-bound) with 4 draft
# tokens and the fp8 caches beside it (their time over fp16's in the same run),
# then the compute-bound rows: GQA 8, head_dim 64, bf16. Each row names its
# bound and the fraction of it reached, and (--phases) where its tasks' time
# goes: scores, softmax, P.V, merge, and how near the peak the first and third run.
# Every row also goes to one Markdown table, printed at the end ($(BENCH_SUMMARY)).
BENCH_SUMMARY = $(BUILD)/bench-summary.md
BENCH_SHAPE = $(BUILD)/client/pagoda-bench kernel --batch 8 --context 4096 --q-heads 32 \
	  --threads 2 --no-naive --block-size 16 --phases --summary $(BENCH_SUMMARY)
BENCH_KERNEL = $(BENCH_SHAPE) --target best,avx2
# The bf16 rows: GQA 8, best (AMX tiles, else AVX512-BF16 dot products, where
# the CPU has them) against AVX-512 FMAs (avx3) where there is AVX-512;
BF16_TARGETS = $(shell grep -qw avx512bw /proc/cpuinfo && echo best,avx3,avx2 || echo best)
# GQA 4 in bf16: best (the FMAs under AMX) against the tiles forced where there
# is AMX, best (the dot products) against the FMAs where there is AVX512-BF16
# alone; then latent attention (32 heads over one 576-wide KV head) in bf16.
BF16_UNIT_TARGETS = $(shell grep -qw amx_bf16 /proc/cpuinfo && echo best,amx || \
	  { grep -qw avx512_bf16 /proc/cpuinfo && echo best,avx3 || echo best; })
bench: build
	@rm -f $(BENCH_SUMMARY)
	$(BENCH_KERNEL) --kv-heads 8 --head-dim 128 --dtype fp16,fp8_e4m3,fp8_e5m2 --q-len 1,4
	$(BENCH_KERNEL) --kv-heads 4 --head-dim 128 --dtype fp16 --q-len 1,4
	$(BENCH_KERNEL) --kv-heads 8 --head-dim 64 --dtype fp16
	$(BENCH_SHAPE) --kv-heads 4 --head-dim 128 --dtype bf16 --q-len 1,4 --target $(BF16_TARGETS)
	$(BENCH_SHAPE) --kv-heads 8 --head-dim 128 --dtype bf16 --q-len 1,4 --target $(BF16_UNIT_TARGETS)
	$(BENCH_SHAPE) --kv-heads 1 --head-dim 576 --v-head-dim 512 --dtype bf16 --target $(BF16_TARGETS)
	@printf '\nsummary (%s):\n' $(BENCH_SUMMARY) && cat $(BENCH_SUMMARY)

# The batching engine in one process, without the gRPC service.
demo: build
	$(BUILD)/tools/pagoda-demo

# The suite's unit, client and e2e labels and the fuzz smoke under
# AddressSanitizer + UndefinedBehaviorSanitizer: one clang build without CUDA,
# which also builds the libFuzzer targets (`make fuzz` runs them).
SAN_BUILD ?= build-san
SAN_FLAGS = -DPAGODA_CUDA=OFF -DPAGODA_SANITIZE=address,undefined -DPAGODA_FUZZ=ON -DPAGODA_RUNNABLE_SIMD_ONLY=ON
sanitize: deps fuzz-deps
	@CC=clang CXX=clang++ cmake -G Ninja -S . -B $(SAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(SAN_FLAGS) \
	  > $(SAN_BUILD).configure.log 2>&1 || { cat $(SAN_BUILD).configure.log; exit 1; }
	@cmake --build $(SAN_BUILD) -j $(JOBS)
	@ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(SAN_BUILD) --output-on-failure -j $(JOBS) -L 'unit|client|e2e|fuzz' -LE soak

# Coverage-guided fuzzing under ASan + UBSan: FUZZ_RUNS executions in all,
# split between the targets, each starting from a copy of its seed corpus
# (fuzz/corpus/). A crash stops the run and leaves its input in $(SAN_BUILD)/fuzz-out.
FUZZ_RUNS ?= 10000000
fuzz: deps fuzz-deps
	@CC=clang CXX=clang++ cmake -G Ninja -S . -B $(SAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(SAN_FLAGS) \
	  > $(SAN_BUILD).configure.log 2>&1 || { cat $(SAN_BUILD).configure.log; exit 1; }
	@cmake --build $(SAN_BUILD) -j $(JOBS) --target request_fuzzer stream_fuzzer
	@bash scripts/run-fuzzers.sh $(SAN_BUILD) $(FUZZ_RUNS)

# ThreadSanitizer on what crosses no uninstrumented library: the engine and
# the cache manager under many threads, over a fake backend, without gRPC.
TSAN_BUILD ?= build-tsan
tsan: deps
	@cmake -G Ninja -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPAGODA_CUDA=OFF \
	  -DPAGODA_SANITIZE=thread > $(TSAN_BUILD).configure.log 2>&1 || { cat $(TSAN_BUILD).configure.log; exit 1; }
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target pagoda_concurrency_tests
	@TSAN_OPTIONS=halt_on_error=1 $(TSAN_BUILD)/tests/pagoda_concurrency_tests

# The container image of the Dockerfile built for the CPU with podman from a
# locally bootstrapped Debian base, run non-root on a read-only root file
# system and checked from outside: health, demo, /metrics, SIGTERM, size, no compiler.
image-test: build
	@bash scripts/install-deps.sh image
	@bash scripts/image-test.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD).configure.log $(SAN_BUILD) $(SAN_BUILD).configure.log $(TSAN_BUILD) \
	  $(TSAN_BUILD).configure.log
