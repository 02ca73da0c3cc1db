#!/usr/bin/env bash
# One call on the GPU machine: GPU tests, compute-sanitizer on small cases, the
# Python suite on the GPU, then the benchmarks. Logs and results go to $OUT; a
# short table last.
#   usage: scripts/device_check.sh [build-dir]   (default build)
#   env:   STAGES picks stages (default "tests sanitize python bench");
#          bench-bwd, bench-quant, bench-quant-fp4, bench-mx, bench-nvfp4,
#          bench-shapes (model-shaped problems), bench-torch (inference
#          forward through the torch layer; needs the python stage's
#          package), bench-bar (off-grid
#          shapes for the 1.5x bar, three interleaved rounds), bench-clock
#          (sustained load: SM clock, power, TFLOP/s), bench-sustained (the
#          bar and model shapes, 3 s of back-to-back calls each) and accuracy-gpu
#          (the H200 columns of examples/accuracy; needs the python stage's
#          package) and bench-window (sliding-window attention through the
#          torch layer beside FlexAttention and SDPA; needs the package) and fuzz (random problems, GPU against the emulator;
#          needs the python stage's package; FUZZ_CASES, FUZZ_SEED,
#          FUZZ_SECONDS) and fuzz-varlen (random packed batches against
#          per-sequence calls; the same FUZZ_* variables) and large (problems past 2^31 elements against
#          slices of them; needs the python stage's package) are further stages;
#          BENCH_ARGS adds options to bench/bench_fwd.py, TORCH_BENCH_ARGS to
#          bench/bench_torch_fwd.py; bench-varlen (packed batches through
#          flash_attn_varlen_func; VARLEN_BENCH_ARGS) needs the package too; PYTEST=0 makes the
#          python stage install the package only; COMMIT names the
#          library's commit where the copy has no git
set -uo pipefail
BUILD=${1:-build}
OUT=${OUT:-/tmp/fp4attn-device}
STAGES=${STAGES:-tests sanitize python bench}
mkdir -p "$OUT"
status=0
summary=()
has_stage() { [[ " $STAGES " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"

if has_stage tests; then
  FP4ATTN_REQUIRE_GPU=1 timeout 400 "$BUILD/tests/fp4attn_gpu_tests" 2>&1 | tee "$OUT/gpu-tests.log" >/dev/null
  rc=${PIPESTATUS[0]}
  grep -E "^\[  (FAILED|SKIPPED) |Failure|rel L2|LSE|differ" "$OUT/gpu-tests.log" | head -40
  summary+=("gpu tests: rc=$rc ($(grep -c '^\[       OK' "$OUT/gpu-tests.log") ok, $(grep -c '^\[  FAILED  \] [A-Z]' "$OUT/gpu-tests.log") failed)")
  [[ $rc -eq 0 ]] || status=1
fi

if has_stage sanitize; then
  # One small case of each kernel: forward (causal GQA, exp2 path, three
  # consumers), backward (noncausal and causal GQA; mxfp4_train causal GQA),
  # the zero-copy forward of every GPU recipe, both quantizers, recipe
  # mxfp4's two expansions and recipe nvfp4's exp2 baseline.
  small='Shapes/GpuForwardGrid.MatchesEmulator/B2_Hq4_Hkv2_Sq200_Sk333_D64_causal_directp_smoothk'
  small+=':Shapes/GpuForwardGrid.MatchesEmulator/B1_Hq2_Hkv1_Sq300_Sk150_D128_causal_exp2'
  # three consumer warpgroups (192-row CTAs, D = 64), the last CTA with one valid row
  small+=':Shapes/GpuForwardGrid.MatchesEmulator/B2_Hq2_Hkv2_Sq513_Sk1000_D64_full_directp_smoothk_3consumers'
  # one consumer warpgroup, two CTAs an SM (64-row CTAs, D = 64), Direct-P and exp2 P
  small+=':Shapes/GpuForwardGrid.MatchesEmulator/B2_Hq4_Hkv2_Sq200_Sk333_D64_causal_directp_smoothk_1consumers'
  small+=':Shapes/GpuForwardGrid.MatchesEmulator/B2_Hq4_Hkv2_Sq200_Sk333_D64_causal_exp2_smoothk_1consumers'
  # one consumer at D = 128 (two K/V stages), the launcher's choice for exp2 P there
  small+=':Shapes/GpuForwardGrid.MatchesEmulator/B2_Hq4_Hkv2_Sq200_Sk333_D128_causal_exp2_smoothk_1consumers'
  small+=':*GpuBackwardGrid.MatchesEmulatorAndReference/B1_Hq2_Hkv2_Sq128_Sk128_D128_full_directp_smoothk_f32'
  small+=':*GpuBackwardGrid.MatchesEmulatorAndReference/B2_Hq4_Hkv2_Sq200_Sk333_D64_causal_directp_smoothk_f32'
  small+=':*GpuForwardDevice*:GpuQuantizeFp8.MatchesCpuQuantizerBitForBit:GpuQuantizeFp4.QAndKMatchCpuBitForBit'
  small+=':MxShapes/GpuBackwardGrid.MatchesEmulatorAndReference/B2_Hq4_Hkv2_Sq200_Sk333_D64_causal_directp_smoothk_f32_mxfp4train'
  # recipe mxfp4 through the fold pass and through the in-kernel MXFP4 expansion
  small+=':Shapes/GpuForwardMxGrid.MatchesEmulator/mxfp4_B2_Hq4_Hkv2_Sq200_Sk333_D64_causal_directp_smoothk'
  small+=':Shapes/GpuForwardMxGrid.MatchesEmulator/mxfp4_B2_Hq4_Hkv2_Sq200_Sk333_D256_causal_directp_smoothk'
  # recipe mxfp4's exp2 FP4 P on one consumer (D = 128, two CTAs an SM)
  small+=':Shapes/GpuForwardMxGrid.MatchesEmulator/mxfp4_B1_Hq2_Hkv1_Sq300_Sk150_D128_causal_exp2_smoothk_1consumers'
  small+=':Shapes/GpuForwardMxGrid.MatchesEmulator/mxfp4_B1_Hq2_Hkv1_Sq600_Sk300_D128_causal_exp2_smoothk_blockoutliers_window130_0'
  # recipe nvfp4's exp2 baseline; a two-sided window on its kernel
  small+=':Shapes/GpuForwardNvfp4Grid.MatchesEmulator/B2_Hq4_Hkv2_Sq200_Sk333_D64_causal_smoothk_exp2'
  small+=':Windows/GpuForwardNvfp4Grid.MatchesEmulator/B2_Hq4_Hkv2_Sq700_Sk900_D64_full_smoothk_outliers_window100_37'
  # caller-quantized E4M3 inputs: the descale and Vᵀ pass, Q and K read in place (strided too), the NaN flags
  small+=':Shapes/GpuForwardE4m3Grid.MatchesEmulator/B1_Hq4_Hkv2_Sq300_Sk333_D48_causal_directp'
  small+=':GpuForwardE4m3.StridedViewsGiveTheDenseBits:GpuForwardE4m3.BadValuesMakeEveryOutputNaN'
  # E4M3 inputs packed: the copy into the tile-aligned layout, sequences without queries or keys
  small+=':Packed/GpuForwardE4m3Packed.EachSequenceIsItsOwnCall/Hq6_Hkv3_D64_causal_directp:GpuForwardE4m3PackedCheck.BadInputGivesNaNEverywhere'
  # a head dim the kernels lack: the FP8 quantizer's padded lanes and the kernel's zero channels by TMA
  small+=':Shapes/GpuForwardGrid.MatchesEmulator/B1_Hq4_Hkv2_Sq300_Sk333_D80_causal_directp_smoothk'
  # D = 256: two CTAs per query block (each half of O), Q and K in two panels;
  # D = 160 on that kernel with zero channels
  small+=':Shapes/GpuForwardGrid.MatchesEmulator/B2_Hq4_Hkv2_Sq200_Sk333_D256_causal_directp_smoothk'
  small+=':Shapes/GpuForwardGrid.MatchesEmulator/B1_Hq4_Hkv2_Sq300_Sk333_D160_causal_directp_smoothk'
  # an odd multiple of 8 read in place: Q's and K's code rows at a 16-byte pitch
  small+=':GpuQuantizeFp8.CodeRowsAtAWiderPitch'
  # packed sequences (cu_seqlens): each sequence's rows found by its offsets
  small+=':Packed/GpuForwardPacked.EachSequenceIsItsOwnCall/D64_causal_smoothk_directp'
  small+=':Packed/GpuBackwardPacked.EachSequenceIsItsOwnCall/D64_causal_smoothk_directp'
  small+=':Packed/GpuBackwardPacked.EachSequenceIsItsOwnCall/D64_causal_smoothk_directp_onepass'
  # the packed backward on the forward's kept operands, in the workspace sized for them
  small+=':Packed/GpuBackwardPacked.EachSequenceIsItsOwnCall/D64_full_exp2_kept'
  # cu_seqlens that do not fit the call: checked on the device, nothing touched outside the tensors
  small+=':GpuForwardPackedCheck.*:GpuBackwardPackedCheck.*'
  # the backward's preparation: transposed codes and the row dot from the FP8
  # quantizer, transposed folded codes from the MX fold
  small+=':GpuQuantizeFp8.TransposedCodesAreTheCodesTransposed:GpuQuantizeFp8.RowDotIsTheSumOfProductsInItsOrder'
  small+=':GpuFoldMx.QkAndVMatchEmulatorOperands'
  # the one-pass backward (dQ by bulk reductions) and the forward's kept operands (both recipes)
  small+=':GpuBackwardFp8.OnePassMatchesEmulator:GpuBackwardFp8.SavedOperandsGiveTheSameGradients'
  # sliding windows: the forward's first tile past 0 and both edges masked (two and three
  # consumers, D = 256's split CTAs), the backward's key and query tile ranges
  small+=':Windows/GpuForwardGrid.MatchesEmulator/B2_Hq4_Hkv2_Sq700_Sk900_D128_causal_directp_smoothk_window5_inf'
  small+=':Windows/GpuForwardGrid.MatchesEmulator/B1_Hq4_Hkv4_Sq1024_Sk1024_D64_full_exp2_smoothk_3consumers_window300_300'
  small+=':Windows/GpuForwardGrid.MatchesEmulator/B2_Hq2_Hkv2_Sq513_Sk1000_D256_causal_directp_smoothk_window150_inf'
  small+=':Windows/GpuBackwardGrid.MatchesEmulatorAndReference/B2_Hq4_Hkv2_Sq700_Sk900_D64_causal_directp_smoothk_f32_window5_inf'
  small+=':Windows/GpuBackwardGrid.MatchesEmulatorAndReference/B2_Hq4_Hkv2_Sq700_Sk900_D128_full_exp2_smoothk_f32_window100_37'
  for tool in memcheck racecheck; do
    FP4ATTN_REQUIRE_GPU=1 timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 7 \
      "$BUILD/tests/fp4attn_gpu_tests" --gtest_filter="$small" >"$OUT/sanitize-$tool.log" 2>&1
    rc=$?
    tail -3 "$OUT/sanitize-$tool.log"
    summary+=("compute-sanitizer $tool: rc=$rc ($(grep -c '^\[       OK' "$OUT/sanitize-$tool.log") tests; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$tool.log" | tail -1))")
    [[ $rc -eq 0 ]] || status=1
  done
fi

if has_stage python; then
  # The device has no network: build against the packages already installed.
  # --upgrade: on a machine still warm from an earlier call, replace the package there.
  timeout 400 python3 -m pip install -q --no-build-isolation --no-deps --upgrade --target /tmp/fp4attn-site \
    -C build-dir=/tmp/fp4attn-pybuild -C cmake.define.CMAKE_BUILD_PARALLEL_LEVEL=16 . >"$OUT/pip.log" 2>&1
  rc=$?
  if [[ $rc -eq 0 && ${PYTEST:-1} == 0 ]]; then
    echo "package installed; PYTEST=0: its tests not run" >"$OUT/pytest.log"
  elif [[ $rc -eq 0 ]]; then
    (cd /tmp && PYTHONPATH=/tmp/fp4attn-site timeout 400 python3 -m pytest -q -p no:cacheprovider \
      "$OLDPWD/python/tests") >"$OUT/pytest.log" 2>&1
    rc=$?
    tail -3 "$OUT/pytest.log"
  fi
  summary+=("python tests: rc=$rc ($(tail -1 "$OUT/pytest.log" 2>/dev/null))")
  [[ $rc -eq 0 ]] || status=1
fi

if has_stage fuzz; then
  # Random problems, the GPU against the CPU emulator (python/tests/fuzz_device.py);
  # the python stage installed the package into /tmp/fp4attn-site. A forward
  # that disagrees leaves its inputs and both outputs in $OUT/fuzz-dumps.
  (cd python/tests && PYTHONPATH=/tmp/fp4attn-site PYTHONUNBUFFERED=1 timeout 500 python3 fuzz_device.py \
    --cases ${FUZZ_CASES:-400} --seed ${FUZZ_SEED:-1} --seconds ${FUZZ_SECONDS:-300} ${COMMIT:+--commit "$COMMIT"} \
    --dump "$OUT/fuzz-dumps" --out "$OUT/fuzz.json") \
    >"$OUT/fuzz.log" 2>&1
  rc=$?
  grep -E "FAILED|Error" "$OUT/fuzz.log" | head -10
  summary+=("fuzz: rc=$rc ($(tail -1 "$OUT/fuzz.log"))")
  [[ $rc -eq 0 ]] || status=1
fi

if has_stage fuzz-varlen; then
  # Random packed batches, each sequence against a call on it alone, bit for bit
  # (python/tests/fuzz_varlen_device.py); needs the python stage's package.
  (cd python/tests && PYTHONPATH=/tmp/fp4attn-site PYTHONUNBUFFERED=1 timeout 500 python3 fuzz_varlen_device.py \
    --cases ${FUZZ_CASES:-100} --seed ${FUZZ_SEED:-1} --seconds ${FUZZ_SECONDS:-300} ${COMMIT:+--commit "$COMMIT"} \
    --out "$OUT/fuzz-varlen.json") >"$OUT/fuzz-varlen.log" 2>&1
  rc=$?
  grep -E "FAILED|Error" "$OUT/fuzz-varlen.log" | head -10
  summary+=("fuzz-varlen: rc=$rc ($(tail -1 "$OUT/fuzz-varlen.log"))")
  [[ $rc -eq 0 ]] || status=1
fi

if has_stage large; then
  # Problems past 2^31 elements (python/tests/large_device.py): each big call against a slice
  # of it run alone, bit for bit; needs the python stage's package and ≈ 70 GB of GPU memory.
  (cd python/tests && PYTHONPATH=/tmp/fp4attn-site PYTHONUNBUFFERED=1 timeout 500 python3 large_device.py \
    ${COMMIT:+--commit "$COMMIT"} --out "$OUT/large.json") >"$OUT/large.log" 2>&1
  rc=$?
  grep -E '"ok": false|Error' "$OUT/large.log" | head -10
  summary+=("large: rc=$rc ($(tail -1 "$OUT/large.log"))")
  [[ $rc -eq 0 ]] || status=1
fi

if has_stage bench; then
  PYTHONUNBUFFERED=1 timeout 500 python3 bench/bench_fwd.py --lib "$BUILD/libfp4attn_capi.so" --out "$OUT" \
    --rounds 3 --reps 10 ${COMMIT:+--commit "$COMMIT"} ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench-stdout.log" | grep -v "^$" | tail -25
  summary+=("bench fwd: rc=${PIPESTATUS[0]}")
fi

if has_stage bench-shapes; then
  PYTHONUNBUFFERED=1 timeout 200 python3 bench/bench_fwd_shapes.py --lib "$BUILD/libfp4attn_capi.so" --out "$OUT" \
    ${COMMIT:+--commit "$COMMIT"} 2>&1 | tee "$OUT/bench-shapes-stdout.log" | grep -v "^$" | tail -8
  summary+=("bench shapes: rc=${PIPESTATUS[0]}")
fi

if has_stage bench-bar; then
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/bench_fwd_shapes.py --set bar --rounds 3 --reps 8 --lib "$BUILD/libfp4attn_capi.so" \
    --out "$OUT" ${COMMIT:+--commit "$COMMIT"} 2>&1 | tee "$OUT/bench-bar-stdout.log" | grep -v "^$" | tail -16
  summary+=("bench bar: rc=${PIPESTATUS[0]}")
fi

if has_stage bench-clock; then
  # Seconds of back-to-back calls per row: the SM clock and power the card
  # settles at under sustained load (it sits at its power limit), beside cuDNN.
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/clock_under_load.py --lib "$BUILD/libfp4attn_capi.so" --out "$OUT" \
    --seconds 5 --cases 128:16384:0,128:4096:0,128:4096:1,64:16384:0 ${COMMIT:+--commit "$COMMIT"} 2>&1 \
    | tee "$OUT/bench-clock-stdout.log" | grep -v "^$" | tail -12
  summary+=("bench clock: rc=${PIPESTATUS[0]}")
fi

if has_stage bench-sustained; then
  # The off-grid shapes with each implementation at the card's power limit.
  for set in bar models; do
    PYTHONUNBUFFERED=1 timeout 400 python3 bench/bench_fwd_shapes.py --set "$set" --seconds 3 \
      --lib "$BUILD/libfp4attn_capi.so" --out "$OUT" ${COMMIT:+--commit "$COMMIT"} 2>&1 \
      | tee "$OUT/bench-sustained-$set-stdout.log" | grep -v "^$" | tail -16
    summary+=("bench sustained $set: rc=${PIPESTATUS[0]}")
  done
fi

if has_stage bench-bwd; then
  PYTHONUNBUFFERED=1 timeout 400 python3 bench/bench_bwd.py --lib "$BUILD/libfp4attn_capi.so" --out "$OUT" \
    ${COMMIT:+--commit "$COMMIT"} 2>&1 | tee "$OUT/bench-bwd-stdout.log" | grep -v "^$" | tail -20
  summary+=("bench bwd: rc=${PIPESTATUS[0]}")
fi

if has_stage bench-quant; then
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/bench_quantize.py --lib "$BUILD/libfp4attn_capi.so" --out "$OUT" \
    ${COMMIT:+--commit "$COMMIT"} 2>&1 | tee "$OUT/bench-quant-stdout.log" | grep -v "^$" | tail -5
  summary+=("bench quantize fp8: rc=${PIPESTATUS[0]}")
fi

if has_stage bench-quant-fp4; then
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/bench_quantize_fp4.py --lib "$BUILD/libfp4attn_capi.so" --out "$OUT" \
    ${COMMIT:+--commit "$COMMIT"} 2>&1 | tee "$OUT/bench-quant-fp4-stdout.log" | grep -v "^$" | tail -15
  summary+=("bench quantize fp4: rc=${PIPESTATUS[0]}")
fi

if has_stage bench-mx; then
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/bench_fwd_mx.py --lib "$BUILD/libfp4attn_capi.so" --out "$OUT" \
    --seqs 4096,16384 ${COMMIT:+--commit "$COMMIT"} 2>&1 | tee "$OUT/bench-mx-stdout.log" | grep -v "^$" | tail -4
  summary+=("bench mx: rc=${PIPESTATUS[0]}")
  # A 256-query chunk against long keys: where the in-kernel expansion of
  # MXFP4 repeats least (two query tiles per head) and the fold pass weighs most.
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/bench_fwd_mx.py --lib "$BUILD/libfp4attn_capi.so" \
    --out "$OUT/chunk" --sq 256 --batch 8 --seqs 16384,65536 --variants fp8,mxfp4,mxfp4_in_kernel \
    ${COMMIT:+--commit "$COMMIT"} 2>&1 | tee "$OUT/bench-mx-chunk-stdout.log" | grep -v "^$" | tail -2
  summary+=("bench mx chunk: rc=${PIPESTATUS[0]}")
fi

if has_stage bench-nvfp4; then
  PYTHONUNBUFFERED=1 timeout 300 python3 bench/bench_fwd_nvfp4.py --lib "$BUILD/libfp4attn_capi.so" --out "$OUT" \
    --seqs 4096,16384 --dims 128,64 ${COMMIT:+--commit "$COMMIT"} 2>&1 | tee "$OUT/bench-nvfp4-stdout.log" | grep -v "^$" | tail -6
  summary+=("bench nvfp4: rc=${PIPESTATUS[0]}")
fi

if has_stage bench-torch; then
  # Inference forward through the torch layer (fp4attn.sdpa from bf16, everything a call does timed);
  # the python stage installed the package into /tmp/fp4attn-site.
  PYTHONPATH=/tmp/fp4attn-site PYTHONUNBUFFERED=1 timeout 400 python3 bench/bench_torch_fwd.py --out "$OUT" \
    ${COMMIT:+--commit "$COMMIT"} ${TORCH_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench-torch-stdout.log" | grep -v "^$" | tail -12
  summary+=("bench torch fwd: rc=${PIPESTATUS[0]}")
fi

if has_stage bench-varlen; then
  # Packed varlen batches through flash_attn_varlen_func (bf16 in, and FP8 inputs with descales)
  # beside cuDNN and FA2 per sequence; needs the python stage's package.
  PYTHONPATH=/tmp/fp4attn-site PYTHONUNBUFFERED=1 timeout 400 python3 bench/bench_varlen.py \
    --out "$OUT/bench-varlen.json" ${COMMIT:+--commit "$COMMIT"} ${VARLEN_BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/bench-varlen-stdout.log" | grep -v "^$" | tail -10
  summary+=("bench varlen: rc=${PIPESTATUS[0]}")
fi

if has_stage bench-window; then
  # Sliding-window causal attention through the torch layer, FlexAttention and SDPA beside it.
  PYTHONPATH=/tmp/fp4attn-site PYTHONUNBUFFERED=1 timeout 500 python3 bench/bench_window.py \
    --out "$OUT/bench-window.json" ${COMMIT:+--commit "$COMMIT"} ${WINDOW_CASES:+--cases "$WINDOW_CASES"} \
    2>&1 | tee "$OUT/bench-window-stdout.log" | grep -v "^$" | tail -16
  summary+=("bench window: rc=${PIPESTATUS[0]}")
fi

if has_stage accuracy-gpu; then
  # The python stage installed the CUDA package into /tmp/fp4attn-site.
  PYTHONPATH=/tmp/fp4attn-site timeout 300 python3 examples/accuracy/gpu_columns.py \
    --out "$OUT/gpu-columns.json" ${COMMIT:+--commit "$COMMIT"} >"$OUT/accuracy-gpu.log" 2>&1
  rc=$?
  tail -5 "$OUT/accuracy-gpu.log"
  summary+=("accuracy gpu columns: rc=$rc")
  [[ $rc -eq 0 ]] || status=1
fi

echo "==== summary"
printf '%s\n' "${summary[@]}"
exit $status
