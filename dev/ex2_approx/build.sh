#!/usr/bin/env bash
# dev/ex2_approx/build.sh [build-dir] [verify]
# Builds the scan of ex2.approx (it needs only headers) into a build folder of
# the project. With "verify", also links $BUILD/fp4attn_gpu_tests_ex2file: the
# GPU suites (objects of the folder's fp4attn_gpu_tests, built first) against
# an emulator whose ex2 table is read from FP4ATTN_EX2_TABLE at run time
# (table_from_file.cpp), so one device call can measure the table and check
# the kernels against it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-ex2}
HERE=$ROOT/dev/ex2_approx
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -cudart static \
  -I"$ROOT/include" -I"$ROOT/src" -o "$BUILD/ex2_scan" "$HERE/ex2_scan.cu"
if [[ "${2:-}" == verify ]]; then
  cmake --build "$BUILD" --target fp4attn_gpu_tests -j2
  DEV=$BUILD/ex2_dev
  mkdir -p "$DEV"
  cp "$BUILD/libfp4attn_core.a" "$DEV/libfp4attn_core.a"
  ar d "$DEV/libfp4attn_core.a" ex2_sm90_table.cpp.o
  c++ -std=c++20 -O2 -I"$ROOT/include" -I"$ROOT/src" -c "$HERE/table_from_file.cpp" -o "$DEV/table_from_file.o"
  # The suite's own link line, with the table object swapped.
  LINK=$(sed -e "s#\.\./libfp4attn_core\.a#$DEV/table_from_file.o $DEV/libfp4attn_core.a#" \
             -e "s#-o fp4attn_gpu_tests#-o $BUILD/fp4attn_gpu_tests_ex2file#" \
             "$BUILD/tests/CMakeFiles/fp4attn_gpu_tests.dir/link.txt")
  (cd "$BUILD/tests" && eval "$LINK")
fi
