#!/usr/bin/env bash
# Builds the probe (device program) and the fit tool against a configured
# build folder of the project: dev/wgmma_accumulation/build.sh [build-dir]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-wgmma}
HERE=$ROOT/dev/wgmma_accumulation
export PATH=$PATH:/usr/local/cuda/bin
cmake --build "$BUILD" --target fp4attn -j2
LIBS="$BUILD/libfp4attn.a $BUILD/libfp4attn_cuda.a $BUILD/libfp4attn_core.a"
nvcc -std=c++20 -O2 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Xptxas -v \
  -I"$ROOT/include" -I"$ROOT/src" -o "$BUILD/wgmma_probe" "$HERE/wgmma_probe.cu" $LIBS
g++ -std=c++20 -O2 -Wall -Wextra -I"$ROOT/include" -I"$ROOT/src" -o "$BUILD/fit_model" "$HERE/fit_model.cpp" \
  "$BUILD/libfp4attn_core.a" -lpthread
