# fp4attn: `make run` runs the main job, `make test` the CPU tests (GPU tests
# report skipped without a device), `make gpu-test` the GPU tests on a device.
BUILD ?= build
JOBS ?= 2
CUDA_HOME ?= /usr/local/cuda
export PATH := $(PATH):$(CUDA_HOME)/bin
CMAKE_FLAGS ?=

.PHONY: all deps configure build run test gpu-test bench clean

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

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 1500

gpu-test: build
	cd $(BUILD) && FP4ATTN_REQUIRE_GPU=1 ctest --output-on-failure -L gpu --timeout 1500 --no-tests=error

clean:
	rm -rf $(BUILD)
