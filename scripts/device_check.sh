#!/usr/bin/env bash
# One call on the GPU machine: GPU tests, compute-sanitizer on small cases,
# then the forward benchmark. Logs and results go to $OUT; a short table last.
#   usage: scripts/device_check.sh [build-dir]   (default build-gpu)
#   env:   STAGES="tests sanitize bench" picks stages; BENCH_ARGS adds bench options
set -uo pipefail
BUILD=${1:-build-gpu}
OUT=${OUT:-/tmp/fp4attn-device}
STAGES=${STAGES:-tests sanitize bench}
mkdir -p "$OUT"
status=0
summary=()

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"

if [[ " $STAGES " == *" tests "* ]]; then
  FP4ATTN_REQUIRE_GPU=1 timeout 300 "$BUILD/tests/fp4attn_gpu_tests" 2>&1 | tee "$OUT/gpu-tests.log" >/dev/null
  rc=${PIPESTATUS[0]}
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|rel L2|LSE|differ" "$OUT/gpu-tests.log" | head -40
  summary+=("gpu tests: rc=$rc ($(grep -c '^\[       OK' "$OUT/gpu-tests.log") ok, $(grep -c '^\[  FAILED  \] [A-Z]' "$OUT/gpu-tests.log") failed)")
  [[ $rc -eq 0 ]] || status=1
fi

if [[ " $STAGES " == *" sanitize "* ]]; then
  small='Shapes/GpuForwardGrid.MatchesEmulator/B2_Hq4_Hkv2_Sq200_Sk333_D64_causal_directp_smoothk:Shapes/GpuForwardGrid.MatchesEmulator/B1_Hq2_Hkv1_Sq300_Sk150_D128_causal_exp2:GpuQuantizeFp8.MatchesCpuQuantizerBitForBit'
  for tool in memcheck racecheck; do
    FP4ATTN_REQUIRE_GPU=1 timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 7 \
      "$BUILD/tests/fp4attn_gpu_tests" --gtest_filter="$small" >"$OUT/sanitize-$tool.log" 2>&1
    rc=$?
    tail -3 "$OUT/sanitize-$tool.log"
    summary+=("compute-sanitizer $tool: rc=$rc ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$tool.log" | tail -1))")
    [[ $rc -eq 0 ]] || status=1
  done
fi

if [[ " $STAGES " == *" bench "* ]]; then
  PYTHONUNBUFFERED=1 timeout 400 python3 bench/bench_fwd.py --lib "$BUILD/libfp4attn_capi.so" --out "$OUT" \
    ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench-stdout.log" | grep -v "^$" | tail -25
  summary+=("bench: rc=${PIPESTATUS[0]}")
fi

echo "==== summary"
printf '%s\n' "${summary[@]}"
exit $status
