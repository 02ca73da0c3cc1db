# fp4attn: `make run` runs the main job, `make test` the CPU tests (GPU tests
# report skipped without a device), `make gpu-test` the GPU tests on a device.
BUILD ?= build
JOBS ?= 2
CUDA_HOME ?= /usr/local/cuda
export PATH := $(PATH):$(CUDA_HOME)/bin
CMAKE_FLAGS ?=

.PHONY: all deps configure build run test python-test gpu-test bench clean

all: build

deps:
	@bash scripts/install_deps.sh

$(BUILD)/CMakeCache.txt:
	@$(MAKE) --no-print-directory deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: deps configure
	cmake --build $(BUILD) -j$(JOBS)

run: build
	$(BUILD)/fp4attn run

test: build python-test
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 1500

# The Python package: pip builds it from pyproject.toml into $(PY_PKG) (never
# into the user's site-packages; its CMake build folder is kept, so a rerun
# only recompiles what changed), then pytest runs its suite.
PYTHON ?= python3
PY_PKG = $(BUILD)/python-package
python-test: deps
	$(PYTHON) -m pip install --quiet --no-build-isolation --no-deps --upgrade --target $(PY_PKG)/site \
		-C build-dir=$(PY_PKG)/cmake .
	PYTHONPATH=$(abspath $(PY_PKG)/site) $(PYTHON) -m pytest -q python/tests

# The GPU suite runs its binary directly, so a build folder compiled on another
# machine (the GPU machine may have no network for `deps`) can be carried over:
# it builds first only when that binary is missing. A missing GPU fails here.
GPU_TESTS = $(BUILD)/tests/fp4attn_gpu_tests
gpu-test:
	@[ -x $(GPU_TESTS) ] || $(MAKE) --no-print-directory build
	FP4ATTN_REQUIRE_GPU=1 $(GPU_TESTS)

clean:
	rm -rf $(BUILD)
