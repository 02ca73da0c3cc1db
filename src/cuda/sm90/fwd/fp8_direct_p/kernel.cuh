// FP8 attention forward with Direct-P for sm_90a (recipe fp8, DESIGN §4).
//
// One CTA computes 128 query rows of one (batch, query head):
//
//   producer warpgroup (one thread issues, the rest idle at 24 registers)
//     TMA Q[128 × D] once                                    → q_full
//     for each 128-key tile n: wait kv_empty[stage],
//       TMA K[128 × D] and Vᵀ[D × 128] into the stage        → kv_full[stage]
//   consumer warpgroups 0 and 1 (rows 64c .. 64c + 63, 240 registers)
//     turn 0: S₀ = Q·K₀ᵀ, then softmax(S₀) → P₀
//     turn n = 1 .. N − 1, when the other consumer has issued its products:
//       PVₙ₋₁ = Pₙ₋₁·[Vₙ₋₁ | 1]  wgmma m64n(D+8)k32 into a fresh fp32 tile, P the
//                            A operand from registers; the 8 columns of ones
//                            give Σ Pₙ₋₁ per row (the tensor core sums P)
//       Sₙ = Q·Kₙᵀ           wgmma m64n128k32, both operands in SMEM, fp32
//       pass the turn; once PVₙ₋₁ is done: arrive kv_empty, and while Sₙ is
//         still computed O = O·2^(mₙ₋₂ − mₙ₋₁) + PVₙ₋₁ in fp32 (one FFMA
//         per element) for most of O's columns
//       once Sₙ is done:
//         the rest of O and l = l·2^(mₙ₋₂ − mₙ₋₁) + ΣPₙ₋₁ (kOGroupsAfterS;
//         their FFMAs interleave with the row max below)
//         Sₙ = −inf outside the mask (partial tiles, causal diagonal)
//         m' = max(m, rowmax(Sₙ)·c)  c = q_scale·k_scale·softmax_scale·log2 e
//         Pₙ = E4M3 code of 2^(Sₙ·c − m' + 8), by Direct-P in registers
//     turn N: PV of the last tile, added to O the same way
//   epilogue: O·v_scale / l → bf16, LSE = (m + log2 l − 8)·ln 2 (+ smooth_k shift)
//
// Ping-pong: consumer c issues its wgmmas only after the other consumer has
// issued its own (named turn barriers), so the tensor core runs one
// consumer's PV and QKᵀ back to back while the other consumer does softmax.
//
// P goes from the accumulator layout to the A-operand layout with byte packing
// only: the quantizer stores V's keys in the matching order (see
// pack_p_operand), so no shuffle is needed.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cuda/ptx>

#include "cuda/quantize/fp4_codes.cuh"
#include "cuda/sm90/fwd/fp8_direct_p/config.h"
#include "fp4attn/direct_p.hpp"

namespace fp4attn::sm90::fwd {

inline constexpr int kSm90FoldHeadroom = 6;  // the largest MX exponent R maps to 2^6 (DESIGN §3.4)
// FP4 P folds against R = −2, the largest exponent any block can have (u ≤ 0,
// E = ceil(u_max − log2 6)): values q·2^(E + 8), so FP4 P carries P's offset
// 2^8 like FP8 P and needs no per-tile row factor (emulator: kSm90PRowExponent).
inline constexpr int kPRowExponent = -2;

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

// pack_p_operand for FP4 P (PCode::mxfp4_direct_p). k32 step t covers keys
// 32t .. 32t + 31: one MX block, whose maximum bm[r][t] gives E (u is
// monotone in s), then per four keys the folded codes of
// direct_p::device::mxfp4_folded_pair (the emulator's mxfp4_code and
// fold_mx_to_e4m3 against R = kPRowExponent).
template <int N>
FP4ATTN_DEVICE_INLINE void pack_p_operand_mx(const float (&s)[N], const float (&c)[2], const float (&m)[2],
                                             const float (&bm)[2][N / 16], std::uint32_t (&p)[N / 16][4]) {
  constexpr int kSteps = N / 16;
  constexpr int kFoldToF16 = 10;  // mxfp4_folded_pair's fixed 2^10; the rest, 2^(10 + E − R), is `fold`
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int t = 0; t < kSteps; ++t) {
      const int block_exp = direct_p::mx_block_exponent(direct_p::log2_score(bm[r][t], c[r], m[r]));
      const float offset = direct_p::mxfp4_fixed_offset(block_exp);
      // 2^k as float bits: k = 10 + E − R ≥ 10 − 127 + 2 is a normal
      // exponent, so exp2i's subnormal branch is not needed.
      const float fold_f32 = __uint_as_float(static_cast<std::uint32_t>(kFoldToF16 + block_exp - kPRowExponent + 127) << 23);
      std::uint32_t fold;
      asm("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(fold) : "f"(fold_f32));
      auto u = [&](int i) { return direct_p::log2_score(s[i], c[r], m[r]); };
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = 4 * t + 2 * h;
        p[t][2 * h + r] = direct_p::device::e4m3x4_of_f16x2(
            direct_p::device::mxfp4_folded_pair(u(4 * j + 2 * r), u(4 * j + 2 * r + 1), offset, fold),
            direct_p::device::mxfp4_folded_pair(u(4 * j + 4 + 2 * r), u(4 * j + 5 + 2 * r), offset, fold));
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

// S = Q·Kᵀ for one consumer's 64 rows and one K tile, into a fresh fp32 tile.
template <class Cfg>
FP4ATTN_DEVICE_INLINE void issue_qk(float (&s)[Cfg::kSRegs], std::uint64_t desc_q, const std::uint8_t* k_tile) {
  const std::uint64_t desc_k = make_kmajor_desc<Cfg::kQkSwizzle>(k_tile);
  wgmma_m64n128k32_ss_init(s, desc_q, desc_k);
#pragma unroll
  for (int t = 1; t < Cfg::kQkSteps; ++t)
    wgmma_m64n128k32_ss(s, desc_advance(desc_q, t * kDescK32Step), desc_advance(desc_k, t * kDescK32Step));
}

// PV = P·[V | 1] for one tile: B has the D rows of Vᵀ and, right after them
// (the next 8-row group of the descriptor), kOnesRows rows of ones, so
// columns D .. D + 7 of the result are the row sums of P as the tensor core
// adds them (the emulator models l the same way). The FP8 tensor core keeps
// only about 14 significant bits while accumulating, so each tile's product
// starts from zero and is added to O and l in fp32 by accumulate_o (DESIGN §3.4).
template <class Cfg>
FP4ATTN_DEVICE_INLINE void issue_pv(float (&pv)[Cfg::kPvRegs], const std::uint32_t (&p)[Cfg::kPvSteps][4],
                                    const std::uint8_t* v_tile) {
  const std::uint64_t desc_v = make_kmajor_desc<Cfg::kVSwizzle>(v_tile);
  if constexpr (Cfg::kHeadDim == 128) {
    wgmma_m64n136k32_rs_init(pv, p[0], desc_v);
#pragma unroll
    for (int t = 1; t < Cfg::kPvSteps; ++t) wgmma_m64n136k32_rs(pv, p[t], desc_advance(desc_v, t * kDescK32Step));
  } else {
    wgmma_m64n72k32_rs_init(pv, p[0], desc_v);
#pragma unroll
    for (int t = 1; t < Cfg::kPvSteps; ++t) wgmma_m64n72k32_rs(pv, p[t], desc_advance(desc_v, t * kDescK32Step));
  }
}

// Waits until at most kPending wgmma groups of this warpgroup are in flight
// (PV being the older group, it is then complete) and hands the registers PV
// read (P) and wrote to ordinary instructions again.
template <int kPending, class Cfg>
FP4ATTN_DEVICE_INLINE void wait_pv(float (&pv)[Cfg::kPvRegs], std::uint32_t (&p)[Cfg::kPvSteps][4]) {
  wgmma_wait<kPending>();
  fence_registers(pv);
  fence_p(p);
}

// O = O·alpha + PV and l = l·alpha + Σ P in fp32; the rescale by alpha rides
// on the adding FFMA. Element 2r of the first ones column (column N of PV)
// holds row r's sum over the whole tile in every lane of the quad, so l is
// the full row sum in each of them. (FP4 P's values carry 2^8 like FP8 P's,
// kPRowExponent: no factor per tile. The emulator's sm90 model multiplies PV
// and Σ by its row factor 2^-8 instead, which scales O and l alike.)
// Only the 8-column groups j0 .. j1 − 1 of O, and l if kRowSums.
template <int j0, int j1, bool kRowSums, int N, int NPv>
FP4ATTN_DEVICE_INLINE void accumulate_o(float (&o)[N], float (&l)[2], const float (&alpha)[2],
                                        const float (&pv)[NPv]) {
  static_assert(NPv == N + 4, "PV holds O's columns, then one 8-column group of row sums");
  static_assert(0 <= j0 && j0 <= j1 && j1 <= N / 4, "column groups of O");
#pragma unroll
  for (int j = j0; j < j1; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int e = 0; e < 2; ++e) o[4 * j + 2 * r + e] = fmaf(o[4 * j + 2 * r + e], alpha[r], pv[4 * j + 2 * r + e]);
  if constexpr (kRowSums) {
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = fmaf(l[r], alpha[r], pv[N + 2 * r]);
  }
}

// Pins O's and PV's registers from column group j0 on (and the row sums) at
// this point, so that their update is not hoisted above the wait for S.
template <int j0, int N, int NPv>
FP4ATTN_DEVICE_INLINE void fence_tail(float (&o)[N], float (&pv)[NPv]) {
#pragma unroll
  for (int i = 4 * j0; i < N; ++i) asm volatile("" : "+f"(o[i]), "+f"(pv[i])::"memory");
#pragma unroll
  for (int i = N; i < NPv; ++i) asm volatile("" : "+f"(pv[i])::"memory");
}

// Online softmax of one consumer's two rows per thread, in the log2 domain.
struct OnlineSoftmax {
  float m[2] = {neg_inf(), neg_inf()};  // running max of S·c
  float l[2] = {0.0f, 0.0f};            // row sums of P (whole rows; see accumulate_o)

  // Folds one tile of scores in: P into the A operand of PV, and alpha =
  // 2^(m_old − m_new), the rescale of O and l that goes with this tile's PV. A row
  // with nothing visible yet keeps m = −inf and subtracts 0 in its place, so
  // that no −inf − (−inf) appears.
  // c is per row (Q's factor may differ per row).
  // P may overwrite s (mxfp4_exp2): the scores are dead once P is packed.
  template <PCode kPCode, int N>
  __device__ void step(float (&s)[N], const float (&c)[2], bool mx_round_up, std::uint32_t (&p)[N / 16][4],
                       float (&alpha)[2]) {
    float mx[2];
    float bm[2][N / 16];  // FP4 P's block maxima (mxfp4_direct_p only)
    if constexpr (kPCode == PCode::mxfp4_direct_p) block_max(s, bm, mx);
    else row_max(s, mx);
    float m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], mx[r] * c[r]);
      m_use[r] = m_new == neg_inf() ? 0.0f : m_new;
      alpha[r] = exp2f(m[r] - m_use[r]);
      m[r] = m_new;
    }
    if constexpr (kPCode == PCode::mxfp4_direct_p) pack_p_operand_mx(s, c, m_use, bm, p);
    else if constexpr (kPCode == PCode::mxfp4_exp2) pack_p_operand_mx_exp2(s, c, m_use, mx_round_up, p);
    else pack_p_operand<kPCode>(s, c, m_use, p);
  }
};

template <int HeadDim, PCode kPCode>
__global__ void __launch_bounds__(Fp8Config<HeadDim>::kThreads, 1)
    fp8_forward_kernel(const __grid_constant__ Fp8ForwardArgs args, const __grid_constant__ CUtensorMap tm_q,
                       const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_vt) {
  using Cfg = Fp8Config<HeadDim>;
  constexpr int kOGroupsBeforeS = Cfg::kORegs / 4 - Cfg::kOGroupsAfterS;
  // log2 of the factor P's codes carry: 2^8, for E4M3 P (2^(u + 8)) and FP4
  // P (q·2^(E + 8), kPRowExponent) alike.
  constexpr float kPOffset = direct_p::kFp8Offset;
  extern __shared__ std::uint8_t smem_raw[];
  auto& smem = *reinterpret_cast<SharedStorage<Cfg>*>(
      (reinterpret_cast<std::uintptr_t>(smem_raw) + Cfg::kSwizzleAlign - 1) & ~std::uintptr_t{Cfg::kSwizzleAlign - 1});

  // Causal grids run their longest CTAs (last query blocks) first.
  const int q_block = args.mask == MaskKind::none ? blockIdx.x : gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / (args.Hq / args.Hkv);
  const int q0 = q_block * Cfg::kBlockQ;
  const bool causal = args.mask != MaskKind::none;
  // Bottom-right alignment: query i sees key j iff j ≤ i + Sk − Sq.
  const int diagonal = args.mask == MaskKind::causal ? args.Sk - args.Sq : 0;
  const int num_k_tiles = (args.Sk + Cfg::kBlockK - 1) / Cfg::kBlockK;
  // Tiles past the CTA's last visible key are skipped (causal), never masked.
  const int last_row = min(q0 + Cfg::kBlockQ, args.Sq) - 1;
  const int last_key = causal ? min(args.Sk - 1, last_row + diagonal) : args.Sk - 1;
  const int k_tiles = last_key < 0 ? 0 : last_key / Cfg::kBlockK + 1;

  // Warp-uniform by construction (lane 0's value), so that the compiler can
  // keep the warpgroup index and what derives from it (the turn barrier ids,
  // Q's descriptor) in uniform registers instead of recomputing them from
  // threadIdx in every iteration.
  const int wg = __shfl_sync(kFullWarp, static_cast<int>(threadIdx.x / kWarpgroupThreads), 0);
  if (threadIdx.x == 0) {
    cuda::ptx::mbarrier_init(&smem.q_full, 1);
    for (int s = 0; s < Cfg::kStages; ++s) {
      cuda::ptx::mbarrier_init(&smem.kv_full[s], 1);
      cuda::ptx::mbarrier_init(&smem.kv_empty[s], Cfg::kConsumers * kWarpgroupThreads);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  // The ones rows after every Vᵀ stage (E4M3 1.0 = 0x38), made visible to
  // the tensor core's async proxy before any wgmma reads them.
  constexpr int kOnesWords = Cfg::kOnesBytes / 4;
  for (int i = threadIdx.x; i < Cfg::kStages * kOnesWords; i += Cfg::kThreads)
    reinterpret_cast<std::uint32_t*>(smem.v[i / kOnesWords] + Cfg::kVBytes)[i % kOnesWords] = 0x38383838u;
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
  __syncthreads();

  if (wg == 0) {
    // ---- producer
    set_max_registers_dec<Cfg::kProducerRegs>();
    if (threadIdx.x != 0) return;
    const std::int32_t q_coord[4] = {0, q0, head, batch};
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                         &smem.q_full, Cfg::kQBytes);
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.q, &tm_q, q_coord,
                                    &smem.q_full);
    for (int n = 0; n < k_tiles; ++n) {
      const int stage = n % Cfg::kStages;
      wait_barrier(&smem.kv_empty[stage], ((n / Cfg::kStages) & 1) ^ 1);
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                           &smem.kv_full[stage], Cfg::kKBytes + Cfg::kVBytes);
      const std::int32_t k_coord[4] = {0, n * Cfg::kBlockK, kv_head, batch};
      const std::int32_t v_coord[4] = {n * Cfg::kBlockK, 0, kv_head, batch};
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.k[stage], &tm_k, k_coord,
                                      &smem.kv_full[stage]);
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.v[stage], &tm_vt,
                                      v_coord, &smem.kv_full[stage]);
    }
    return;
  }

  // ---- consumers
  set_max_registers_inc<Cfg::kConsumerRegs>();
  const int consumer = wg - 1;
  const Fragment frag(threadIdx.x % kWarpgroupThreads);
  const int first_row = q0 + consumer * Cfg::kRowsPerConsumer;
  const int row_abs[2] = {first_row + frag.row[0], first_row + frag.row[1]};
  const std::uint64_t desc_q = make_kmajor_desc<Cfg::kQkSwizzle>(smem.q + consumer * Cfg::kQConsumerBytes);
  const int q_groups = (args.Sq + args.q_scale_rows - 1) / args.q_scale_rows;
  const float* q_scale_head = args.q_scale + (static_cast<std::int64_t>(batch) * args.Hq + head) * q_groups;
  float q_scale[2];  // rows past Sq read the last row's scale and are never stored
#pragma unroll
  for (int r = 0; r < 2; ++r) q_scale[r] = q_scale_head[min(row_abs[r], args.Sq - 1) / args.q_scale_rows];
  const float* k_scale = args.k_scale + (static_cast<std::int64_t>(batch) * args.Hkv + kv_head) * num_k_tiles;
  const float scale_log2 = args.softmax_scale * direct_p::kLog2e;
  const bool mx_round_up = args.mx_scale_rule == MxScaleRule::round_up;

  // Only partial tiles and tiles that cross this consumer's causal diagonal
  // need the mask; the others are visible in full.
  auto mask_tile = [&](float (&s)[Cfg::kSRegs], int n) {
    const int first_key = n * Cfg::kBlockK;
    const bool partial = first_key + Cfg::kBlockK > args.Sk;
    const bool on_diagonal = causal && first_key + Cfg::kBlockK - 1 > first_row + diagonal;
    if (partial || on_diagonal) mask_scores(s, frag, first_key, row_abs, args.Sk, causal, diagonal);
  };

  float o[Cfg::kORegs];
#pragma unroll
  for (int i = 0; i < Cfg::kORegs; ++i) o[i] = 0.0f;
  OnlineSoftmax softmax;

  // What the epilogue reads from global memory, loaded before the last PV so
  // that the loads' latency hides behind it (ncu of v8b: the LSE and the
  // non-finite check waited for these loads at the end of every CTA).
  const float* v_scale = args.v_scale + (static_cast<std::int64_t>(batch) * args.Hkv + kv_head) * HeadDim;
  float2 vs[HeadDim / 8];  // this thread's columns 8j + col, + 1
  float lse_shift[2] = {0.0f, 0.0f};
  bool poisoned = false;
  auto load_epilogue_inputs = [&] {
#pragma unroll
    for (int j = 0; j < HeadDim / 8; ++j) vs[j] = *reinterpret_cast<const float2*>(v_scale + 8 * j + frag.col);
    // Non-finite input (flagged by the quantizer, which ran earlier on the
    // stream) turns every output into NaN rather than numbers made from it.
    poisoned = args.nonfinite != nullptr && (args.nonfinite[0] | args.nonfinite[1] | args.nonfinite[2]) != 0;
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (args.lse_shift != nullptr && frag.col == 0 && row_abs[r] < args.Sq)
        lse_shift[r] = args.lse_shift[(static_cast<std::int64_t>(batch) * args.Hq + head) * args.Sq + row_abs[r]];
  };

  if (k_tiles > 0) {
    const TurnOrder<Cfg::kConsumers> turn{consumer};
    float s[Cfg::kSRegs];
    float pv[Cfg::kPvRegs];
    std::uint32_t p[Cfg::kPvSteps][4];  // P of the tile whose PV is issued next
    float alpha[2];                     // the rescale of O that goes with that PV
    float c[2];                         // this tile's S → log2-domain multiplier, per row
    // A product that underflows to 0 (folded MX factors of an all-zero Q row
    // and K tile, each 2^-133) would make masked scores −inf·0 = NaN; the
    // smallest subnormal keeps them −inf and rounds every visible s·c as 0
    // would, up to terms far below what P and the LSE resolve.
    auto set_c = [&](int n) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float product = q_scale[r] * k_scale[n] * scale_log2;
        c[r] = product == 0.0f ? __int_as_float(1) : product;
      }
    };
    turn.open_first();
    wait_barrier(&smem.q_full, 0);

    // Turn 0: S of tile 0 alone, then its softmax.
    set_c(0);
    wait_barrier(&smem.kv_full[0], 0);
    turn.wait();
    wgmma_fence();
    issue_qk<Cfg>(s, desc_q, smem.k[0]);
    wgmma_commit();
    turn.pass(false);
    wgmma_wait<0>();
    fence_registers(s);
    mask_tile(s, 0);
    softmax.step<kPCode>(s, c, mx_round_up, p, alpha);

    // Turn n: PV of tile n − 1, then S of tile n. O takes in PV while S is
    // still computed; the softmax of tile n runs while the other consumer's
    // products occupy the tensor core. Nothing of this warpgroup is in flight
    // during softmax: with PV promoted to fp32 per tile, O, PV (with the row
    // sums), S and P already fill the 240 registers, and ptxas serializes all
    // wgmmas when registers of an in-flight product would be needed.
    for (int n = 1; n < k_tiles; ++n) {
      // n ≥ 1: unsigned, so that % and / are a mask and a shift.
      const unsigned tile = n;
      const int stage = tile % Cfg::kStages, prev = (tile - 1) % Cfg::kStages;
      set_c(n);
      wait_barrier(&smem.kv_full[stage], (tile / Cfg::kStages) & 1);
      turn.wait();
      fence_p(p);
      wgmma_fence();
      issue_pv<Cfg>(pv, p, smem.v[prev]);
      wgmma_commit();
      issue_qk<Cfg>(s, desc_q, smem.k[stage]);
      wgmma_commit();
      turn.pass(false);
      wait_pv<1, Cfg>(pv, p);  // PV is complete; S may still be running
      cuda::ptx::mbarrier_arrive(&smem.kv_empty[prev]);
      accumulate_o<0, kOGroupsBeforeS, false>(o, softmax.l, alpha, pv);
      wgmma_wait<0>();
      fence_registers(s);
      mask_tile(s, n);
      // The rest of O's update, after S: its FFMAs fill the row max's
      // dependency and shuffle latency (they share a basic block).
      fence_tail<kOGroupsBeforeS>(o, pv);
      accumulate_o<kOGroupsBeforeS, Cfg::kORegs / 4, true>(o, softmax.l, alpha, pv);
      softmax.step<kPCode>(s, c, mx_round_up, p, alpha);
    }

    // Last turn: PV of the last tile.
    load_epilogue_inputs();
    turn.wait();
    fence_p(p);
    wgmma_fence();
    issue_pv<Cfg>(pv, p, smem.v[(k_tiles - 1) % Cfg::kStages]);
    wgmma_commit();
    turn.pass(true);
    wait_pv<0, Cfg>(pv, p);
    accumulate_o<0, Cfg::kORegs / 4, true>(o, softmax.l, alpha, pv);
  } else {
    load_epilogue_inputs();
  }

  // ---- epilogue: O = O·v_scale / l in bf16; LSE in natural log
  auto* out = static_cast<__nv_bfloat16*>(args.o) + batch * args.o_stride_b + head * args.o_stride_h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float row_sum = poisoned ? __int_as_float(0x7FC00000) : softmax.l[r];
    if (row_abs[r] >= args.Sq) continue;
    const bool empty = row_sum == 0.0f;  // fully masked row: O = 0, LSE = −inf
    const float inv_sum = empty ? 0.0f : 1.0f / row_sum;
    __nv_bfloat16* out_row = out + static_cast<std::int64_t>(row_abs[r]) * args.o_stride_s;
#pragma unroll
    for (int j = 0; j < HeadDim / 8; ++j) {
      // 1/l first, then V's channel factor: the emulator's order, so O
      // rounds the same also when v_scale is not a power of two.
      const float o0 = o[4 * j + 2 * r] * inv_sum * vs[j].x;
      const float o1 = o[4 * j + 2 * r + 1] * inv_sum * vs[j].y;
      *reinterpret_cast<__nv_bfloat162*>(out_row + 8 * j + frag.col) = __floats2bfloat162_rn(o0, o1);
    }
    if (frag.col == 0) {
      const std::int64_t lse_index = (static_cast<std::int64_t>(batch) * args.Hq + head) * args.Sq + row_abs[r];
      args.lse[lse_index] =
          empty ? neg_inf() : (softmax.m[r] + log2f(row_sum) - kPOffset) * kLn2 + lse_shift[r];
    }
  }
}

}  // namespace fp4attn::sm90::fwd
