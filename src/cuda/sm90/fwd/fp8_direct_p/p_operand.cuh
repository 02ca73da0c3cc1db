// One tile of scores into the A operand of the P·V product (DESIGN §3.3,
// §3.4): row maxima, then the P codes of each PCode. FP8 P by Direct-P
// (direct_p::fp8_codes_x4, with a share of the keys on MUFU ex2) or by the
// exp2 baseline; recipe mxfp4's FP4 P folded into E4M3. Every rule is the
// emulator's sm90 target, bit for bit.
#pragma once

#include <bit>
#include <cstdint>

#include "cuda/quantize/fold_table.hpp"
#include "cuda/quantize/fp4_codes.cuh"
#include "cuda/sm90/fwd/consumer_common.cuh"
#include "cuda/sm90/fwd/fwd.hpp"
#include "fp4attn/direct_p.hpp"

namespace fp4attn::sm90::fwd {

inline constexpr int kSm90FoldHeadroom = 6;  // the largest MX exponent R maps to 2^6 (DESIGN §3.4)
// FP4 P folds against R = −2, the largest exponent any block can have (u ≤ 0,
// E = ceil(u_max − log2 6)): values q·2^(E + 8), so FP4 P carries P's offset
// 2^8 like FP8 P and needs no per-tile row factor (emulator: kSm90PRowExponent).
inline constexpr int kPRowExponent = -2;

// FP4 P (PCode::mxfp4_direct_p) folds its E2M1 codes into E4M3 bytes by a
// table per block exponent E: the bytes of q·2^(E + 8) for the eight
// magnitudes q (cuda_quantize::fold_table against R = kPRowExponent, the
// emulator's fold_mx_to_e4m3), looked up by one byte permute per four codes.
// E runs from direct_p::kNoBlockExponent (a block of masked scores) to
// kPRowExponent. The table sits in static shared memory, in the kernels that
// touch it only (1 KB next to the dynamic shared memory; launch_head_dim.cuh
// checks the sum).
struct PFoldTable {
  static constexpr int kFirstExponent = direct_p::kNoBlockExponent;
  static constexpr int kEntries = kPRowExponent - kFirstExponent + 1;
  cuda_quantize::FoldTable e[kEntries];
};

FP4ATTN_DEVICE_INLINE PFoldTable& p_fold_table() {
  __shared__ PFoldTable table;
  return table;
}

// Fills the table; the caller's CTA barrier publishes it.
FP4ATTN_DEVICE_INLINE void fill_p_fold_table(int thread, int threads) {
  PFoldTable& table = p_fold_table();
  for (int i = thread; i < PFoldTable::kEntries; i += threads)
    table.e[i] = cuda_quantize::fold_table(PFoldTable::kFirstExponent + i, kPRowExponent);
}

// Row maxima as a tree: depth 5 per row instead of a chain of 17 dependent
// FMNMX. Nothing of this warpgroup is in flight while it runs, so the chain's
// latency was on the consumer's critical path (ncu, NOTES.md). The max is
// exact in any order; NaN never reaches it (non-finite input poisons O).
template <int N>
FP4ATTN_DEVICE_INLINE void row_max(const float (&s)[N], float (&mx)[2]) {
  static_assert(N % 8 == 0 && ((N / 8) & (N / 8 - 1)) == 0, "the tree halves a power of two");
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float v[N / 8];  // element 2r, 2r + 1 of two 8-column chunks each
#pragma unroll
    for (int j = 0; j < N / 8; ++j)
      v[j] = fmaxf(fmaxf(s[8 * j + 2 * r], s[8 * j + 2 * r + 1]), fmaxf(s[8 * j + 4 + 2 * r], s[8 * j + 5 + 2 * r]));
#pragma unroll
    for (int w = N / 16; w >= 1; w /= 2)
#pragma unroll
      for (int j = 0; j < w; ++j) v[j] = fmaxf(v[j], v[j + w]);
    const float m = fmaxf(v[0], __shfl_xor_sync(kFullWarp, v[0], 1));
    mx[r] = fmaxf(m, __shfl_xor_sync(kFullWarp, m, 2));
  }
}

// E4M3 codes of two scores by the exp2 baseline (Direct-P off), low byte
// first: one MUFU ex2 per score and one F2FP per pair.
FP4ATTN_DEVICE_INLINE std::uint32_t exp2_code_pair(float s0, float s1, float c, float m) {
  const float u0 = direct_p::log2_score(s0, c, m);
  const float u1 = direct_p::log2_score(s1, c, m);
  float p0, p1;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(p0) : "f"(u0 + direct_p::kFp8Offset));
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(p1) : "f"(u1 + direct_p::kFp8Offset));
  std::uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(p1), "f"(p0));  // first source → high byte
  return pair;
}

// E4M3 codes of two scores from ex2.approx of x = s·c − m8, m8 = m − 8: the
// MUFU share of Direct-P FP8 P (direct_p::sm90_fp8_key_on_mufu), the offset
// 2^8 folded into the row maximum so that x costs one FFMA.
FP4ATTN_DEVICE_INLINE std::uint32_t mufu_code_pair(float s0, float s1, float c, float m8) {
  float p0, p1;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(p0) : "f"(direct_p::log2_score(s0, c, m8)));
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(p1) : "f"(direct_p::log2_score(s1, c, m8)));
  std::uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(p1), "f"(p0));  // first source → high byte
  return pair;
}

// E4M3 codes of four scores of one row, s0 in the low byte. Direct-P is
// direct_p::fp8_codes_x4 (DESIGN §3.3), bit for bit the codes the CPU emulator
// computes: after u, three instructions per score and no MUFU.
template <PCode kPCode>
FP4ATTN_DEVICE_INLINE std::uint32_t p_code_word(float s0, float s1, float s2, float s3, float c, float m) {
  if constexpr (kPCode == PCode::direct_p) {
    return direct_p::fp8_codes_x4(direct_p::log2_score(s0, c, m), direct_p::log2_score(s1, c, m),
                                  direct_p::log2_score(s2, c, m), direct_p::log2_score(s3, c, m));
  } else {
    return exp2_code_pair(s0, s1, c, m) | (exp2_code_pair(s2, s3, c, m) << 16);
  }
}

// Turns the S accumulator into the A operand of the four k32 steps of O += P·V.
// The row sums of P come out of the same product (ones columns of PV).
//
// The A operand of k32 step t wants, in register 2h + r, the codes of row r at
// k = 16h + 4·(lane%4) + {0..3}; this thread's accumulator holds row r at
// columns 32t + 16h + 2·(lane%4) + {0, 1, 8, 9}. Packing those four codes
// means operand slot k carries key σ(k) = 16h + 2·(lane%4) + {0, 1, 8, 9}[k%4];
// the quantizer stores Vᵀ with its keys in the same order σ inside every group
// of 32, so P·V sums over matching keys and P never leaves its thread.
//
// Direct-P shares the tile's keys between the pipes: the words of step t
// and half h hold keys 32t + 16h .. 32t + 16h + 15 (in σ's order), and those
// at or past direct_p::kSm90Fp8MufuFirstKey take their codes from MUFU ex2.
template <PCode kPCode, int N>
FP4ATTN_DEVICE_INLINE void pack_p_operand(const float (&s)[N], const float (&c)[2], const float (&m)[2],
                                          std::uint32_t (&p)[N / 16][4]) {
  static_assert(2 * N == direct_p::kSm90Fp8Tile, "the MUFU share is defined on 128-key tiles");
  const float m8[2] = {m[0] - direct_p::kFp8Offset, m[1] - direct_p::kFp8Offset};
  // N accumulator registers hold 2N keys of two rows: 2N / 32 = N / 16 k32 steps.
#pragma unroll
  for (int t = 0; t < N / 16; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int j = 4 * t + 2 * h;  // first of the two 8-column chunks
        if (kPCode == PCode::direct_p && 32 * t + 16 * h >= direct_p::kSm90Fp8MufuFirstKey)
          p[t][2 * h + r] = mufu_code_pair(s[4 * j + 2 * r], s[4 * j + 2 * r + 1], c[r], m8[r]) |
                            (mufu_code_pair(s[4 * j + 4 + 2 * r], s[4 * j + 5 + 2 * r], c[r], m8[r]) << 16);
        else
          p[t][2 * h + r] = p_code_word<kPCode>(s[4 * j + 2 * r], s[4 * j + 2 * r + 1], s[4 * j + 4 + 2 * r],
                                                s[4 * j + 5 + 2 * r], c[r], m[r]);
      }
}

FP4ATTN_DEVICE_INLINE std::uint32_t e4m3_pair(float lo, float hi) {
  std::uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));  // first source → high byte
  return pair;
}

// Row maxima for FP4 P, by way of the 32-key block maxima that FP4 P needs:
// block t of row r is accumulator columns 32t .. 32t + 31, 8 of them in this
// thread and the rest in its quad. The row maximum is the max of the block
// maxima, so it costs no shuffles beyond theirs.
template <int N>
FP4ATTN_DEVICE_INLINE void block_max(const float (&s)[N], float (&bm)[2][N / 16], float (&mx)[2]) {
  constexpr int kSteps = N / 16;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int t = 0; t < kSteps; ++t) {
      const int j = 4 * t;
      const float a = fmaxf(fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]), fmaxf(s[4 * j + 4 + 2 * r], s[4 * j + 5 + 2 * r]));
      const float b = fmaxf(fmaxf(s[4 * j + 8 + 2 * r], s[4 * j + 9 + 2 * r]),
                            fmaxf(s[4 * j + 12 + 2 * r], s[4 * j + 13 + 2 * r]));
      const float v = fmaxf(a, b);
      const float w = fmaxf(v, __shfl_xor_sync(kFullWarp, v, 1));
      bm[r][t] = fmaxf(w, __shfl_xor_sync(kFullWarp, w, 2));
    }
    float m = bm[r][0];
#pragma unroll
    for (int t = 1; t < kSteps; ++t) m = fmaxf(m, bm[r][t]);
    mx[r] = m;
  }
}

// A 32-key block's exponent E = max(ceil(u_max − log2 6), kNoBlockExponent)
// (direct_p::mx_block_exponent) and the MUFU keys' shift m + (E + 14)
// (direct_p::mxfp4_mufu_shift), bit for bit in either of two ways:
//  * kByAdd = false: cvt.rpi (F2I.CEIL) and I2FP, on the XU pipe;
//  * kByAdd = true: an add rounded toward +inf onto the integer grid of
//    [2^23, 2^24) leaves kCeilMagic + ceil(t) in a float, whose bits are
//    clamped by one signed max (a negative float, t = −inf among them, has
//    negative bits), and E + 14 as a float is one exact FADD from there. All
//    on the FMA and ALU pipes.
// The XU pipe also runs MUFU's share of the codes, their F2FP and the
// curve's I2IP. Three consumers without turns load it from three softmax
// streams at once, and there the add measured +4.7 % (D = 64, S = 16k); with
// two consumers in turns it measured −0.3 to −1.4 % (docs/perf-log.md, mx9).
template <bool kByAdd>
struct MxBlockExponent;

template <>
struct MxBlockExponent<false> {
  int e;
  FP4ATTN_DEVICE_INLINE explicit MxBlockExponent(float u_max) : e(direct_p::mx_block_exponent(u_max)) {}
  FP4ATTN_DEVICE_INLINE int exponent() const { return e; }
  FP4ATTN_DEVICE_INLINE float mufu_shift(float m) const { return direct_p::mxfp4_mufu_shift(m, e); }
};

// Precondition u_max < 2^22 (u_max ≤ 0 up to a rounding: a block's maximum
// is at most its row's); tests/gpu/test_p_operand_gpu.cu checks every float
// below 2^21 against the other form and the host rule.
template <>
struct MxBlockExponent<true> {
  static constexpr float kCeilMagic = 0x1.8p23f;  // 1.5·2^23: ceil exact for |t| < 2^22, below that clamped
  static constexpr std::int32_t kMagicBits = 0x4B400000;
  std::int32_t bits;  // kMagicBits + E
  FP4ATTN_DEVICE_INLINE explicit MxBlockExponent(float u_max) {
    float r;
    asm("add.rp.f32 %0, %1, %2;" : "=f"(r) : "f"(u_max - direct_p::kLog2Of6), "f"(kCeilMagic));
    bits = max(__float_as_int(r), kMagicBits + direct_p::kNoBlockExponent);
  }
  FP4ATTN_DEVICE_INLINE int exponent() const { return bits - kMagicBits; }
  // (kCeilMagic + E) − (kCeilMagic − 14) is E + 14 exactly, then the same add of m.
  FP4ATTN_DEVICE_INLINE float mufu_shift(float m) const {
    return m + (__int_as_float(bits) - (kCeilMagic - direct_p::kMxfp4MufuExponentShift));
  }
};
static_assert(std::bit_cast<std::int32_t>(MxBlockExponent<true>::kCeilMagic) == MxBlockExponent<true>::kMagicBits);

// pack_p_operand for FP4 P (PCode::mxfp4_direct_p). k32 step t covers keys
// 32t .. 32t + 31: one MX block, whose maximum bm[r][t] gives E (u is
// monotone in s). Per pair of keys the E2M1 codes as fp16 patterns c·2^9
// (direct_p::device::mxfp4_pattern_pair, the emulator's mxfp4_code, or
// mxfp4_pattern_pair_mufu for the keys on MUFU, sm90_mxfp4_key_on_mufu);
// per four keys one byte permute through the block's fold table
// (p_fold_table: per E the E4M3 bytes of q·2^(E + 8), the emulator's
// fold_mx_to_e4m3 against R = kPRowExponent).
template <bool kExponentByAdd, int N>
FP4ATTN_DEVICE_INLINE void pack_p_operand_mx(const float (&s)[N], const float (&c)[2], const float (&m)[2],
                                             const float (&bm)[2][N / 16], std::uint32_t (&p)[N / 16][4]) {
  static_assert(2 * N == direct_p::kSm90Fp8Tile, "the MUFU share is defined on 128-key tiles");
  constexpr int kSteps = N / 16;
  const auto fold = static_cast<std::uint32_t>(__cvta_generic_to_shared(&p_fold_table()));
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int t = 0; t < kSteps; ++t) {
      const MxBlockExponent<kExponentByAdd> e(direct_p::log2_score(bm[r][t], c[r], m[r]));
      const int block_exp = e.exponent();
      const float offset = direct_p::mxfp4_fixed_offset(block_exp);
      cuda_quantize::FoldTable table;
      const auto entry = static_cast<std::uint32_t>(block_exp - PFoldTable::kFirstExponent);
      asm("ld.shared.v2.u32 {%0, %1}, [%2];"
          : "=r"(table.lo), "=r"(table.hi)
          : "r"(fold + entry * static_cast<std::uint32_t>(sizeof(cuda_quantize::FoldTable))));
      auto u = [&](int i) { return direct_p::log2_score(s[i], c[r], m[r]); };
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = 4 * t + 2 * h;
        std::uint32_t a, b;  // keys 4j + 2r (+1) and 4j + 4 + 2r (+1): codes of bytes 0, 1 and 2, 3
        if (32 * t + 16 * h >= direct_p::kSm90Mxfp4MufuFirstKey) {
          const float shift = e.mufu_shift(m[r]);
          auto x = [&](int i) { return direct_p::log2_score(s[i], c[r], shift); };
          a = direct_p::device::mxfp4_pattern_pair_mufu(x(4 * j + 2 * r), x(4 * j + 2 * r + 1));
          b = direct_p::device::mxfp4_pattern_pair_mufu(x(4 * j + 4 + 2 * r), x(4 * j + 5 + 2 * r));
        } else {
          a = direct_p::device::mxfp4_pattern_pair(u(4 * j + 2 * r), u(4 * j + 2 * r + 1), offset);
          b = direct_p::device::mxfp4_pattern_pair(u(4 * j + 4 + 2 * r), u(4 * j + 5 + 2 * r), offset);
        }
        p[t][2 * h + r] = direct_p::device::e4m3x4_of_e2m1_patterns(a, b, table.lo, table.hi);
      }
    }
  }
}

// pack_p_operand_mx for PCode::mxfp4_exp2, the emulator's non-Direct-P MX
// rule: P = 2^u by ex2.approx (the emulator's sm90 target models its result
// near every rounding boundary, src/emulator/ex2_sm90.hpp), then per 32-key
// block the MX quantizer's scale of the block maximum and the E2M1 code of
// P / 2^E. The P values overwrite the dead scores. An all-zero block has no
// exponent (direct_p::kNoBlockExponent).
template <int N>
FP4ATTN_DEVICE_INLINE void pack_p_operand_mx_exp2(float (&s)[N], const float (&c)[2], const float (&m)[2],
                                                  bool round_up, std::uint32_t (&p)[N / 16][4]) {
  constexpr int kSteps = N / 16;
  constexpr std::uint32_t kTwiceE2M1 = 0xC8643210u;  // 2 × the E2M1 value of code i, in nibble i
  constexpr float kIntMagic = 8388608.0f;            // 2^23: small integers to float in one FADD
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int block_exp[kSteps];
    float inv[kSteps];
#pragma unroll
    for (int t = 0; t < kSteps; ++t) {
      float mx = 0.0f;
#pragma unroll
      for (int j = 4 * t; j < 4 * t + 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[4 * j + 2 * r + e];
          asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(x) : "f"(direct_p::log2_score(x, c[r], m[r])));
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(kFullWarp, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(kFullWarp, mx, 2));
      const int scale_exp =
          static_cast<int>(cuda_quantize::fp4::mx_scale_code(__float_as_uint(mx), round_up)) - kE8M0Bias;
      block_exp[t] = mx > 0.0f ? scale_exp : direct_p::kNoBlockExponent;
      inv[t] = exp2i(-scale_exp);
    }
#pragma unroll
    for (int t = 0; t < kSteps; ++t) {
      const float half_fold = 0.5f * exp2i(block_exp[t] - kPRowExponent + kSm90FoldHeadroom);
      auto value = [&](int i) {
        const std::uint32_t code = cuda_quantize::fp4::e2m1_code(__fmul_rn(s[i], inv[t]));
        const float twice = __uint_as_float(__float_as_uint(kIntMagic) | ((kTwiceE2M1 >> (4 * code)) & 0xFu)) - kIntMagic;
        return twice * half_fold;
      };
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = 4 * t + 2 * h;
        p[t][2 * h + r] = e4m3_pair(value(4 * j + 2 * r), value(4 * j + 2 * r + 1)) |
                          (e4m3_pair(value(4 * j + 4 + 2 * r), value(4 * j + 5 + 2 * r)) << 16);
      }
    }
  }
}

}  // namespace fp4attn::sm90::fwd
