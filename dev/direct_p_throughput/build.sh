#!/usr/bin/env bash
# Builds the study into a build folder of the project (header-only: it needs no
# library): dev/direct_p_throughput/build.sh [build-dir]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-directp}
HERE=$ROOT/dev/direct_p_throughput
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p "$BUILD"
nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Xptxas -v \
  -I"$ROOT/include" -o "$BUILD/direct_p_throughput" "$HERE/throughput.cu"
