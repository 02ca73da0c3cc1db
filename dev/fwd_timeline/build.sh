#!/usr/bin/env bash
# dev/fwd_timeline/build.sh [build-dir]
# Links BUILD/fwd_timeline/libfp4attn_capi.so: the benchmark C API of a built
# project folder with the FP8 forward's launcher and kernels recompiled with
# FP4ATTN_FWD_TIMELINE (src/cuda/sm90/fwd/fp8_direct_p/timeline.cuh). The
# recompiled objects come first on the link line, so the archive's own copies
# of those translation units are never pulled in.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p "$BUILD/fwd_timeline"
cd "$BUILD"
test -f CMakeFiles/fp4attn_capi.dir/link.txt || { echo "build the project (target fp4attn_capi) in $BUILD first" >&2; exit 1; }
cmake --build . --target fp4attn_capi -j2 >/dev/null
# The forward's translation units (the entry, one per head dimension and one
# for the three-consumer D = 64 kernels), each with its own compile command
# from the build, so that the per-file ptxas options of CMakeLists.txt stay as
# they are.
objs=()
for tu in launch launch_d64 launch_d64_three launch_d128; do
  cmd=$(python3 - "$ROOT/src/cuda/sm90/fwd/fp8_direct_p/$tu.cu" <<'PY'
import json, shlex, sys
for entry in json.load(open("compile_commands.json")):
    if entry["file"] == sys.argv[1]:
        args = shlex.split(entry["command"])
        out = args.index("-o")
        del args[out:out + 2]
        print(shlex.join(args))
        break
else:
    sys.exit(f"{sys.argv[1]} is not in compile_commands.json")
PY
)
  eval "$cmd -DFP4ATTN_FWD_TIMELINE -o fwd_timeline/$tu.o"
  objs+=("fwd_timeline/$tu.o")
done
g++ -fPIC -shared -o fwd_timeline/libfp4attn_capi.so "${objs[@]}" @CMakeFiles/fp4attn_capi.dir/objects1 \
  @CMakeFiles/fp4attn_capi.dir/linkLibs.rsp -L/usr/local/cuda/targets/x86_64-linux/lib/stubs \
  -L/usr/local/cuda/targets/x86_64-linux/lib
echo "$BUILD/fwd_timeline/libfp4attn_capi.so"
