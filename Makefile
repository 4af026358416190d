# Thin wrapper over CMake. `make test` installs what it needs, builds and runs every test tier.
BUILD_DIR ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUFENCE_WERROR=ON

FUZZ_SECONDS ?= 60

.PHONY: all deps configure build test demo bench format clean fuzz-build fuzz

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build fuzz-build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600

# The libFuzzer build (clang, build-fuzz/); without clang+libFuzzer it records why and the
# fuzz tests skip. `make fuzz` runs each target for FUZZ_SECONDS, one at a time (docs/fuzzing.md).
fuzz-build: deps
	@JOBS=$(JOBS) bash tests/fuzz/fuzz.sh build

fuzz: fuzz-build
	@bash tests/fuzz/fuzz.sh all $(FUZZ_SECONDS)

demo: build
	@bash scripts/demo.sh

bench: build
	@bash bench/run.sh

format:
	@find src tools tests bench \( -name "*.cpp" -o -name "*.hpp" -o -name "*.c" \) | xargs clang-format -i

clean:
	@rm -rf $(BUILD_DIR) build-fuzz
