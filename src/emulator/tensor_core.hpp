// How Hopper's FP8 tensor core sums: a bit-exact model of one k32 step of
// `wgmma.mma_async … .f32.e4m3.e4m3` (measured on the H200, see
// docs/numerics.md "Accumulation" and dev/wgmma_accumulation/).
//
// One step computes d = c + Σ_{k<32} a_k·b_k as a single fused sum:
//   1. every product a_k·b_k is exact; its exponent is ea + eb, the sum of the
//      operands' exponents (e4m3_exponent), not the product's own binade;
//   2. emax = the largest of those exponents and of c's exponent;
//   3. every addend (the 32 products and c) is truncated toward zero to a
//      multiple of 2^(emax − 13), then they are added exactly;
//   4. the sum is truncated toward zero to 14 significant bits (the low 10
//      mantissa bits of the fp32 result are always zero).
// A zero operand never sets emax. Chained steps feed d back as the next c.
#pragma once

#include <cstdint>

#include "fp4attn/recipe.hpp"

namespace fp4attn::emulator {

inline constexpr int kFp8MmaK = 32;  // products per FP8 wgmma k-step

// Exponent by which the tensor core aligns a nonzero E4M3 operand:
// floor(log2|x|), but at least −6 (E4M3's subnormals share the smallest normal
// exponent). Zero gets a value far below any real product's, so it never sets
// the alignment of a step.
float e4m3_exponent(float x);

// Exponents of n E4M3 values.
void e4m3_exponents(const float* x, std::int64_t n, float* exponents);

// One FP8 k-step for `count` outputs that share the A row:
//   acc[n] ← step(acc[n], a[k]·b[k·b_stride + n] for k < terms)
// a, b: E4M3 values with their e4m3_exponent()s; terms ≤ 32 (missing terms
// are zeros, as a partial key group is). `scratch` holds 2·count floats.
// acc must be finite and, when nonzero, at least 2^-100 in magnitude.
void fp8_mma_step(const float* a, const float* a_exp, const float* b, const float* b_exp, std::int64_t b_stride,
                  int terms, std::int64_t count, float* acc, float* scratch);

// Whether the emulator applies this model: tensor-core accumulation asked for,
// target sm90, and a recipe whose products run on FP8 wgmma there (NVFP4 runs
// on BF16 wgmma, which is not modelled and stays fp32).
bool uses_fp8_mma_model(const AttentionOptions& opt);

}  // namespace fp4attn::emulator
