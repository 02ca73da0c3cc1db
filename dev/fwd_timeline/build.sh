#!/usr/bin/env bash
# dev/fwd_timeline/build.sh [build-dir]
# Links BUILD/fwd_timeline/libfp4attn_capi.so: the benchmark C API of a built
# project folder with the FP8 forward's launcher and kernels recompiled with
# FP4ATTN_FWD_TIMELINE (src/cuda/sm90/fwd/fp8_direct_p/timeline.cuh). The
# recompiled object comes first on the link line, so the archive's own copy
# of that translation unit is never pulled in.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p "$BUILD/fwd_timeline"
cd "$BUILD"
test -f CMakeFiles/fp4attn_capi.dir/link.txt || { echo "build the project (target fp4attn_capi) in $BUILD first" >&2; exit 1; }
cmake --build . --target fp4attn_capi -j2 >/dev/null
nvcc --options-file CMakeFiles/fp4attn_cuda.dir/includes_CUDA.rsp -O3 -DNDEBUG \
  --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] -Xcompiler=-fPIC --expt-relaxed-constexpr -std=c++20 \
  -DFP4ATTN_FWD_TIMELINE -x cu -c "$ROOT/src/cuda/sm90/fwd/fp8_direct_p/launch.cu" -o fwd_timeline/launch.o
g++ -fPIC -shared -o fwd_timeline/libfp4attn_capi.so fwd_timeline/launch.o @CMakeFiles/fp4attn_capi.dir/objects1 \
  @CMakeFiles/fp4attn_capi.dir/linkLibs.rsp -L/usr/local/cuda/targets/x86_64-linux/lib/stubs \
  -L/usr/local/cuda/targets/x86_64-linux/lib
echo "$BUILD/fwd_timeline/libfp4attn_capi.so"
