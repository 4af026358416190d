# Thin wrapper over CMake. Plain `make` only builds (it changes nothing on the machine; `make deps`
# installs the Debian packages). `make test`, `make demo` and `make bench` install what they need
# first (idempotent), then build and run.
BUILD_DIR ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUFENCE_WERROR=ON

FUZZ_SECONDS ?= 60
# The most seconds ctest may take in `make test` (2 cores; measured 940 s: docs/testing.md).
TEST_BUDGET_SECONDS ?= 1200

.PHONY: all deps configure build check test demo bench format clean fuzz-build fuzz

all: build

deps:
	@bash scripts/install-deps.sh

configure:
	@cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) >/dev/null || \
	  { echo "configure failed: missing build dependencies? \`make deps\` installs them (Debian packages)"; exit 1; }

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# The inner loop: build, then the unit tier only (GoogleTest, no containerd, seconds).
check: build
	@cd $(BUILD_DIR) && ctest -L unit --output-on-failure -j $(JOBS)

# deps strictly first, also under make -j.
test:
	@$(MAKE) --no-print-directory deps
	@$(MAKE) --no-print-directory build fuzz-build
	@# The containerd lines the scenario tests run (2.2-2.4 built from the Go module proxy: a few
	@# minutes cold, nothing when cached), fetched once here and not inside one test's time limit;
	@# a line that cannot be fetched is named and its tests skip, saying why.
	@GPUFENCE_BUILD_DIR=$(abspath $(BUILD_DIR)) bash scripts/fetch-containerd.sh || true
	@# Kubernetes for the cluster tier, from the Go module proxy (~20 min cold on 2 cores, seconds
	@# when Go's build cache has it: docs/testing.md); without it the cluster tests skip, saying why.
	@GPUFENCE_BUILD_DIR=$(abspath $(BUILD_DIR)) bash scripts/fetch-kubernetes.sh >/dev/null || true
	@# The cluster tier's second DRA driver (tests/cluster/foreign-dra), Go from the module proxy:
	@# seconds once Kubernetes is built; without it that step of the DRA test skips, saying why.
	@GPUFENCE_BUILD_DIR=$(abspath $(BUILD_DIR)) bash tests/cluster/foreign-dra/build.sh >/dev/null || true
	@# promtool for the chart's alert tests, from the Go module proxy (~3 min cold on 2 cores, seconds
	@# when Go's caches have it); without it those tests skip, saying why.
	@GPUFENCE_BUILD_DIR=$(abspath $(BUILD_DIR)) bash scripts/fetch-promtool.sh >/dev/null || true
	@# The suite's test time has a budget (docs/testing.md, "The budget"): past it, `make test`
	@# fails even when every test passed, so a slow test is noticed when it lands.
	@cd $(BUILD_DIR) && start=$$(date +%s) && { ctest --output-on-failure -j $(JOBS) --timeout 600; rc=$$?; } && \
	  took=$$(( $$(date +%s) - start )) && \
	  echo "make test: ctest took $$took s; the budget is $(TEST_BUDGET_SECONDS) s (docs/testing.md)" && \
	  { [ $$rc = 0 ] || exit $$rc; } && \
	  { [ $$took -le $(TEST_BUDGET_SECONDS) ] || { echo "make test: FAILED: the tests took $$took s, past the budget of $(TEST_BUDGET_SECONDS) s: make the slow ones faster (ctest -O, docs/testing.md) or raise TEST_BUDGET_SECONDS with the reason"; exit 1; }; }

# The libFuzzer build (clang, build-fuzz/); without clang+libFuzzer it records why and the
# fuzz tests skip. `make fuzz` runs each target for FUZZ_SECONDS, one at a time (docs/fuzzing.md).
fuzz-build:
	@JOBS=$(JOBS) bash tests/fuzz/fuzz.sh build

fuzz: deps
	@$(MAKE) --no-print-directory fuzz-build
	@bash tests/fuzz/fuzz.sh all $(FUZZ_SECONDS)

demo: deps
	@$(MAKE) --no-print-directory build
	@bash scripts/demo.sh

bench: deps
	@$(MAKE) --no-print-directory build
	@bash bench/run.sh

format:
	@find src tools tests bench \( -name "*.cpp" -o -name "*.hpp" -o -name "*.c" \) | xargs clang-format -i

clean:
	@rm -rf $(BUILD_DIR) build-fuzz
