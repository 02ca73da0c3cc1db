// NVFP4 attention forward with Direct-P on BF16 wgmma for sm_90a (recipe
// nvfp4, DESIGN §3.4, §4). Q, K and Vᵀ arrive as BF16 values E2M1 · s_b
// (expand.hpp: exact, without the fp32 tensor scales), so both products are
// those of the NVFP4 values, and P's NVFP4 values q · s_b are BF16 too.
//
// One CTA computes 128 query rows of one (batch, query head):
//
//   producer warpgroup (one thread issues, the rest idle at 24 registers)
//     TMA Q[128 × D] once (D / 64 boxes of 64 bf16 columns)      → q_full
//     for each 128-key tile n: wait kv_empty[stage],
//       TMA K[128 × D] and Vᵀ[D × 128] into the stage              → kv_full[stage]
//   consumer warpgroups 0 and 1 (rows 64c .. 64c + 63, 240 registers)
//     turn 0: S₀ = Q·K₀ᵀ, then softmax(S₀) → P₀, O = 0
//     turn n = 1 .. N − 1, when the other consumer has issued its products:
//       O += Pₙ₋₁·Vₙ₋₁      wgmma m64nDk16 × 8, P the A operand from registers,
//                           accumulating into O itself (fp32)
//       Sₙ = Q·Kₙᵀ          wgmma m64n128k16 × D/16, both operands in SMEM
//       pass the turn; wait for both; arrive kv_empty of tile n − 1
//       Sₙ = Sₙ / (S_q·S_k), then −inf outside the mask (the emulator's order)
//       per row and 16-key block b: the block max gives u_max and the UE4M3
//         block scale s_b (direct_p::nvfp4_block_scale's rule); the row max
//         m' = max(m, max_b block max · c), c = softmax scale · log2 e
//       Pₙ = q · s_b with q = direct_p::nvfp4_code(s·c − m', log2 s_b) (the
//         fixed point + fp16 curve, s_b in the FFMA's addend); the operand
//         is Pₙ·2^-8 in BF16, exactly; l = l·2^(m − m') + Σ Pₙ (fp32, per
//         thread until the end)
//       (Direct-P off, kDirectP = false: v = ex2.approx(u + 8), s_b and q by
//         the NVFP4 quantizer's rules on v; the rest as above)
//       O = O · 2^(m − m') before the next PV adds to it
//     turn N: O += P·V of the last tile
//   epilogue: l summed over the quad; O / l · 2^8 / S_v → bf16,
//     LSE = (m + log2 l − 8) · ln 2 (+ smooth_k shift)
//
// Ping-pong: consumer c issues its wgmmas only after the other consumer has
// issued its own (named turn barriers), so the tensor core runs one
// consumer's PV and QKᵀ back to back while the other consumer does softmax.
//
// P never leaves its thread: for 16-bit wgmma the fp32 accumulator holds, per
// thread, row g (and g + 8) at columns 8j + 2(lane % 4) + {0, 1}, exactly the
// pairs the A operand of a k16 step wants in one bf16x2 register, and a k16
// step of PV is one NVFP4 block of P.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda/ptx>

#include "cuda/quantize/fma_quotient.hpp"
#include "cuda/quantize/fp4_codes.cuh"
#include "cuda/sm90/fwd/nvfp4_bf16/config.h"
#include "cuda/sm90/fwd/nvfp4_bf16/wgmma_bf16.cuh"
#include "fp4attn/direct_p.hpp"
#include "fp4attn/formats.hpp"

namespace fp4attn::sm90::fwd::nvfp4 {

inline constexpr int kUe4m3Codes = 128;   // a UE4M3 code has 7 bits

// Maxima of every 16-key block (NVFP4 P's scale blocks) of both rows, and the
// row maxima as their max. Block t is accumulator columns 16t .. 16t + 15:
// elements 8t + {0, 1, 4, 5} + 2r of this thread, the rest in its quad.
template <int N>
FP4ATTN_DEVICE_INLINE void block_max(const float (&s)[N], float (&bm)[2][N / 8], float (&mx)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int t = 0; t < N / 8; ++t) {
      const int i = 8 * t + 2 * r;
      const float v = fmaxf(fmaxf(s[i], s[i + 1]), fmaxf(s[i + 4], s[i + 5]));
      const float w = fmaxf(v, __shfl_xor_sync(kFullWarp, v, 1));
      bm[r][t] = fmaxf(w, __shfl_xor_sync(kFullWarp, w, 2));
    }
    float m = bm[r][0];
#pragma unroll
    for (int t = 1; t < N / 8; ++t) m = fmaxf(m, bm[r][t]);
    mx[r] = m;
  }
}

// UE4M3 code of x ≥ 0 by the E4M3 conversion (one F2FP instead of
// encode_rne_sat's integer sequence): for x ≥ 0 the UE4M3 and E4M3 codes
// coincide (same exponent, mantissa, bias and saturation), and the H200's
// cvt.rn.satfinite.e4m3x2 equals encode_rne_sat for every float (DESIGN
// §3.1). The high byte is the code of 0.0, 0.
FP4ATTN_DEVICE_INLINE std::uint32_t ue4m3_code(float x) {
  std::uint32_t pair;
  asm("{\n .reg .b16 p;\n cvt.rn.satfinite.e4m3x2.f32 p, %1, %2;\n cvt.u32.u16 %0, p;\n}"
      : "=r"(pair)
      : "f"(0.0f), "f"(x));  // second source → low byte
  return pair;
}

// direct_p::nvfp4_block_scale through ue4m3_code. kInv6 is the shared
// function's constant. Branch- and select-free: exp2_poly clamps its argument
// at −12, so a block of masked scores (u_max = −inf) gets x = 2^-12 / 6 <
// 2^-10, which rounds to scale 0 as the shared function's early return does.
inline constexpr float kInv6 = 1.0f / 6.0f;
static_assert(direct_p::kMinExp2Arg <= -8.0f, "a masked block's x = 2^kMinExp2Arg / 6 must round to scale 0");
FP4ATTN_DEVICE_INLINE std::uint32_t nvfp4_block_scale(float u_max) {
  return ue4m3_code(direct_p::exp2_poly(u_max + direct_p::kNvfp4Offset) * kInv6);
}

// ---- the exp2 baseline (Direct-P off): P as the emulator's Target::sm90
// computes it (emulator/p_row.cpp, nvfp4_row). v = ex2.approx.ftz(fl(u + 8)),
// whose result the emulator's ex2::sm90 reproduces wherever a code depends
// on it; s_b = UE4M3(fl(v_max / 6)) and q = E2M1(fl(v / s_b)), the NVFP4
// quantizer's rules with tensor scale 1 (nvfp4_block_scale_code,
// encode_rne_sat). Both quotients are fma_quotient's IEEE quotient (v ≤ 2^8
// and v / s_b ≤ 449 keep it exact; with s_b = 0 and r = 0 it gives 0, the
// emulator's code for a zero scale). ex2.approx and fl(· + 8) never
// decrease, so the block's largest v is that of its largest u.
FP4ATTN_DEVICE_INLINE float exp2_p_value(float u) {
  float v;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(v) : "f"(__fadd_rn(u, direct_p::kNvfp4Offset)));
  return v;
}

FP4ATTN_DEVICE_INLINE std::uint32_t nvfp4_block_scale_exp2(float u_max) {
  return ue4m3_code(cuda_quantize::fma_quotient(exp2_p_value(u_max), kE2M1Max, kInv6));
}

// q·2^-14 of two elements as device::nvfp4_q_pair returns it (fp16 patterns
// c·2^9 in both halves); sb = s_b, r = RN(1 / s_b) (0 for s_b = 0).
FP4ATTN_DEVICE_INLINE std::uint32_t nvfp4_exp2_q_pair(float u0, float u1, float sb, float r) {
  const std::uint32_t c0 = cuda_quantize::fp4::e2m1_code(cuda_quantize::fma_quotient(exp2_p_value(u0), sb, r));
  const std::uint32_t c1 = cuda_quantize::fp4::e2m1_code(cuda_quantize::fma_quotient(exp2_p_value(u1), sb, r));
  return (c0 << direct_p::kE2M1CodeShift) | (c1 << (16 + direct_p::kE2M1CodeShift));
}

// P's per-block constants, one table entry per UE4M3 code of s_b (shared
// memory, filled in the prologue by the shared functions themselves):
// code_term = direct_p::nvfp4_fixed_offset(log2 s_b), the FFMA addend of the
// element code with Direct-P, RN(1 / s_b) for the exp2 baseline's quotients
// (0 for s_b = 0); scale = s_b · 2^118 (exact), whose upper 16 bits are the bf16
// multiplier of device::nvfp4_bf16_pair (P·V gets P·2^-8, taken back in the
// epilogue) and which, times 2^-104, weighs the row sum. Code 0 (a block of
// masked or underflowing scores) has code_term 0, so its codes are 0 for every
// u ≤ 0 on both paths, and scale 0.
struct PScaleEntry {
  float code_term, scale;
};
static_assert(kUe4m3Codes * sizeof(PScaleEntry) == kStaticSmemBytes, "config.h budgets the block-scale table");
inline constexpr float kRowSumFromTableScale = 0x1p-104f;  // the row sum adds q·2^-14 times s_b·2^14
inline constexpr float kScaleFromTable = 0x1p-118f;         // s_b from the table's s_b·2^118
static_assert(direct_p::kNvfp4Bf16ScaleExp - 14 == 104, "kRowSumFromTableScale follows the table's exponent");

template <bool kDirectP>
FP4ATTN_DEVICE_INLINE PScaleEntry p_scale_entry(int code) {
  const float sb = decode(ElemFormat::ue4m3, code);
  const float scale = sb * exp2i(direct_p::kNvfp4Bf16ScaleExp);
  if constexpr (kDirectP)
    return {direct_p::nvfp4_fixed_offset(direct_p::log2_of_ue4m3(static_cast<std::uint8_t>(code))), scale};
  else
    return {sb == 0.0f ? 0.0f : __frcp_rn(sb), scale};
}

// bf16x2 of s_b·2^118 in both halves: the table float's upper 16 bits (exact).
FP4ATTN_DEVICE_INLINE std::uint32_t bf16_multiplier(float scale) { return __byte_perm(__float_as_uint(scale), 0, 0x3232); }

// direct_p::nvfp4_code by the kernel's packed sequence (the GPU tests compare
// the two bit for bit): the low half of device::nvfp4_q_pair is c·2^9.
FP4ATTN_DEVICE_INLINE std::uint32_t nvfp4_code(float u, float log2_block_scale) {
  const std::uint32_t q = direct_p::device::nvfp4_q_pair(u, u, direct_p::nvfp4_fixed_offset(log2_block_scale));
  return log2_block_scale > -1e30f ? (q & 0xFFFFu) >> direct_p::kE2M1CodeShift : 0u;
}

// The BF16 bits of the operand q·s_b·2^-8 for E2M1 code `code` and UE4M3
// scale `scale_code` as the kernel builds them (device::nvfp4_bf16_pair on
// the pattern c·2^9).
FP4ATTN_DEVICE_INLINE std::uint32_t nvfp4_p_value_bits(std::uint32_t code, int scale_code) {
  const std::uint32_t q = code << direct_p::kE2M1CodeShift;
  return direct_p::device::nvfp4_bf16_pair(q, bf16_multiplier(p_scale_entry<true>(scale_code).scale)) & 0xFFFFu;
}

// Online softmax of one consumer's two rows per thread, in the log2 domain.
struct OnlineSoftmax {
  float m[2] = {neg_inf(), neg_inf()};  // running max of S·c
  float l[2] = {0.0f, 0.0f};            // this thread's share of the row sums of P

  // Folds one tile of scores in: P (NVFP4 values in BF16) into the A operand
  // of PV's k16 steps, and alpha = 2^(m_old − m_new), the rescale of O that
  // goes with it (l is rescaled here). A row with nothing visible yet keeps
  // m = −inf and subtracts 0 in its place, so that no −inf − (−inf) appears.
  // scale_table: P's per-block constants by UE4M3 code (PScaleEntry).
  template <bool kDirectP, int N>
  __device__ void step(const float (&s)[N], float c, const PScaleEntry* scale_table, std::uint32_t (&p)[N / 8][4],
                       float (&alpha)[2]) {
    constexpr int kBlocks = N / 8;
    float bm[2][kBlocks], mx[2], m_use[2];
    block_max(s, bm, mx);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], mx[r] * c);
      m_use[r] = m_new == neg_inf() ? 0.0f : m_new;
      alpha[r] = exp2f(m[r] - m_use[r]);
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int t = 0; t < kBlocks; ++t) {
        // u is monotone in s (c > 0), so the block's largest u is that of its largest score.
        const float u_max = direct_p::log2_score(bm[r][t], c, m_use[r]);
        const std::uint32_t scale = kDirectP ? nvfp4_block_scale(u_max) : nvfp4_block_scale_exp2(u_max);
        const PScaleEntry entry = scale_table[scale];
        const std::uint32_t multiplier = bf16_multiplier(entry.scale);
        auto u = [&](int i) { return direct_p::log2_score(s[i], c, m_use[r]); };
        std::uint32_t q[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int i = 8 * t + 4 * h + 2 * r;
          if constexpr (kDirectP)
            q[h] = direct_p::device::nvfp4_q_pair(u(i), u(i + 1), entry.code_term);
          else
            q[h] = nvfp4_exp2_q_pair(u(i), u(i + 1), entry.scale * kScaleFromTable, entry.code_term);
          p[t][2 * h + r] = direct_p::device::nvfp4_bf16_pair(q[h], multiplier);
        }
        // l adds what P·V uses: Σ q·2^-14 of the block's four elements here is
        // exact in fp16 (multiples of 2^-15 below 2^-10), then one FFMA with s_b·2^14.
        const __half2 pair_sum =
            __hadd2(*reinterpret_cast<const __half2*>(&q[0]), *reinterpret_cast<const __half2*>(&q[1]));
        const float q_sum = __half2float(__hadd(__low2half(pair_sum), __high2half(pair_sum)));
        l[r] = fmaf(q_sum, entry.scale * kRowSumFromTableScale, l[r]);
      }
  }
};

// Descriptor units (16 bytes) from a tile's first atom to k16 step t: atom
// t / kStepsPerAtom lies atom_bytes further, and each step inside an atom is
// 32 bytes (the hardware applies the swizzle to the full address).
template <class Cfg, int kAtomBytes>
constexpr std::uint32_t step_units(int t) {
  return static_cast<std::uint32_t>((t / Cfg::kStepsPerAtom) * (kAtomBytes / 16) +
                                    (t % Cfg::kStepsPerAtom) * kDescK16Step);
}

// S = Q·Kᵀ for one consumer's 64 rows and one K tile, into a fresh fp32 tile.
template <class Cfg>
FP4ATTN_DEVICE_INLINE void issue_qk(float (&s)[Cfg::kSRegs], std::uint64_t desc_q, const std::uint8_t* k_tile) {
  const std::uint64_t desc_k = make_kmajor_desc<Cfg::kSwizzle>(k_tile);
  wgmma_m64n128k16_ss_init(s, desc_q, desc_k);
#pragma unroll
  for (int t = 1; t < Cfg::kQkSteps; ++t)
    wgmma_m64n128k16_ss(s, desc_advance(desc_q, step_units<Cfg, Cfg::kQAtomBytes>(t)),
                        desc_advance(desc_k, step_units<Cfg, Cfg::kKAtomBytes>(t)));
}

// O += P·V for one tile, accumulating into O: BF16 wgmma sums in fp32 (unlike
// FP8's 14 bits), so no fresh per-tile accumulator is needed (NOTES.md).
template <class Cfg>
FP4ATTN_DEVICE_INLINE void issue_pv(float (&o)[Cfg::kORegs], const std::uint32_t (&p)[Cfg::kPvSteps][4],
                                    const std::uint8_t* v_tile) {
  const std::uint64_t desc_v = make_kmajor_desc<Cfg::kSwizzle>(v_tile);
#pragma unroll
  for (int t = 0; t < Cfg::kPvSteps; ++t) {
    const std::uint64_t d = desc_advance(desc_v, step_units<Cfg, Cfg::kVAtomBytes>(t));
    if constexpr (Cfg::kHeadDim == 128) wgmma_m64n128k16_rs(o, p[t], d);
    else wgmma_m64n64k16_rs(o, p[t], d);
  }
}

// kDirectP: P by Direct-P (the recipe's path) or by the exp2 baseline.
// kLowerBound: the call has a window with a left edge; without it the kernel
// ignores args.window_left and its masked tiles test the upper bound only
// (the E4M3 kernel's kernel.cuh says why).
template <int HeadDim, bool kDirectP, bool kLowerBound>
__global__ void __launch_bounds__(Config<HeadDim>::kThreads, 1)
    nvfp4_forward_kernel(const __grid_constant__ Nvfp4ForwardArgs args, const __grid_constant__ CUtensorMap tm_q,
                         const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_vt) {
  using Cfg = Config<HeadDim>;
  extern __shared__ std::uint8_t smem_raw[];
  auto& smem = *reinterpret_cast<SharedStorage<Cfg>*>(
      (reinterpret_cast<std::uintptr_t>(smem_raw) + Cfg::kSwizzleAlign - 1) & ~std::uintptr_t{Cfg::kSwizzleAlign - 1});

  // Causal grids run their longest CTAs (last query blocks) first.
  const int q_block = args.mask == MaskKind::none ? blockIdx.x : gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / (args.Hq / args.Hkv);
  const int q0 = q_block * Cfg::kBlockQ;
  // Bottom-right alignment: query i sees key j ≤ i + Sk − Sq (causal), and a
  // sliding window bounds the keys on either side of that diagonal.
  const int window_left = kLowerBound ? args.window_left : -1;
  const KeyBounds bounds = KeyBounds::of(args.mask, window_left, args.window_right, args.Sq, args.Sk);
  // Tiles outside the keys the CTA's rows see (causal, a window) are skipped,
  // never masked: key tiles tile_begin .. tile_begin + k_tiles − 1 run, the
  // loop's n counting them from 0 (stages and phases).
  const int last_row = min(q0 + Cfg::kBlockQ, args.Sq) - 1;
  const int last_key = bounds.last_key(last_row, args.Sk);
  const int first_key = bounds.first_key(q0);
  const int tile_begin = first_key / Cfg::kBlockK;
  const int k_tiles = last_key < first_key ? 0 : last_key / Cfg::kBlockK + 1 - tile_begin;

  const int wg = __shfl_sync(kFullWarp, static_cast<int>(threadIdx.x / kWarpgroupThreads), 0);
  if (threadIdx.x == 0) {
    cuda::ptx::mbarrier_init(&smem.q_full, 1);
    for (int s = 0; s < Cfg::kStages; ++s) {
      cuda::ptx::mbarrier_init(&smem.kv_full[s], 1);
      cuda::ptx::mbarrier_init(&smem.kv_empty[s], Cfg::kConsumers * kWarpgroupThreads);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  // P's per-block constants by UE4M3 code, from the shared functions
  // themselves, so that the offsets are the emulator's bit for bit. A static
  // shared array, so that lookups are one LDS.64 each, not generic loads.
  __shared__ PScaleEntry p_scale_table[kUe4m3Codes];
  for (int code = threadIdx.x; code < kUe4m3Codes; code += blockDim.x)
    p_scale_table[code] = p_scale_entry<kDirectP>(code);
  __syncthreads();

  if (wg == 0) {
    // ---- producer
    set_max_registers_dec<Cfg::kProducerRegs>();
    if (threadIdx.x != 0) return;
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                         &smem.q_full, Cfg::kQBytes);
    for (int a = 0; a < Cfg::kQkAtoms; ++a) {
      const std::int32_t q_coord[4] = {a * Cfg::kAtomBytes, q0, head, batch};
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.q + a * Cfg::kQAtomBytes,
                                      &tm_q, q_coord, &smem.q_full);
    }
    for (int n = 0; n < k_tiles; ++n) {
      const int stage = n % Cfg::kStages;
      wait_barrier(&smem.kv_empty[stage], ((n / Cfg::kStages) & 1) ^ 1);
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                           &smem.kv_full[stage], Cfg::kKBytes + Cfg::kVBytes);
      for (int a = 0; a < Cfg::kQkAtoms; ++a) {
        const std::int32_t k_coord[4] = {a * Cfg::kAtomBytes, (tile_begin + n) * Cfg::kBlockK, kv_head, batch};
        cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                        smem.k[stage] + a * Cfg::kKAtomBytes, &tm_k, k_coord, &smem.kv_full[stage]);
      }
      for (int a = 0; a < Cfg::kVAtoms; ++a) {
        const std::int32_t v_coord[4] = {((tile_begin + n) * Cfg::kBlockK + a * Cfg::kAtomElems) * kBf16Bytes, 0,
                                         kv_head, batch};
        cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                        smem.v[stage] + a * Cfg::kVAtomBytes, &tm_vt, v_coord, &smem.kv_full[stage]);
      }
    }
    return;
  }

  // ---- consumers
  set_max_registers_inc<Cfg::kConsumerRegs>();
  const int consumer = wg - 1;
  const Fragment frag(threadIdx.x % kWarpgroupThreads);
  const int first_row = q0 + consumer * Cfg::kRowsPerConsumer;
  const int row_abs[2] = {first_row + frag.row[0], first_row + frag.row[1]};
  const std::uint64_t desc_q = make_kmajor_desc<Cfg::kSwizzle>(smem.q + consumer * Cfg::kQConsumerBytes);
  // The emulator's factors in its order: S·(1/S_q · 1/S_k) rounded, then the
  // softmax scale in the log2 domain inside the FFMA of u, so that equal
  // products give equal u (folding both into one multiplier would round u
  // differently and move codes across their thresholds). Scores are scaled
  // before the mask, so an underflowed factor never meets −inf.
  const float qk_factor = (1.0f / *args.q_tensor_scale) * (1.0f / *args.k_tensor_scale);
  const float scale_log2 = args.softmax_scale * direct_p::kLog2e;
  const float c = scale_log2 == 0.0f ? __int_as_float(1) : scale_log2;
  auto scale_scores = [qk_factor](float (&s)[Cfg::kSRegs]) {
#pragma unroll
    for (int i = 0; i < Cfg::kSRegs; ++i) s[i] *= qk_factor;
  };

  // Only partial tiles and tiles that cross one of this consumer's bounds
  // need the mask: the CTA's tiles n < mask_below and n ≥ mask_above.
  const MaskedTiles masked = bounds.masked_key_tiles(first_row, Cfg::kRowsPerConsumer, Cfg::kBlockK, args.Sk);
  const int mask_below = masked.below - tile_begin, mask_above = masked.above - tile_begin;
  auto mask_tile = [&](float (&s)[Cfg::kSRegs], int n) {
    if (n < mask_below || n >= mask_above) {
      const KeyBounds b = KeyBounds::in_loop(args.mask, window_left, args.window_right, args.Sq, args.Sk);
      mask_scores<kLowerBound>(s, frag, (tile_begin + n) * Cfg::kBlockK, row_abs, args.Sk, b);
    }
  };
  // Once the running maxima settle, alpha is 1 for whole warps: skip the
  // multiplies then (a warp-uniform branch).
  auto rescale_o = [](float (&o)[Cfg::kORegs], const float (&alpha)[2]) {
    if (!__any_sync(kFullWarp, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
    for (int j = 0; j < Cfg::kORegs / 4; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) o[4 * j + 2 * r + e] *= alpha[r];
  };

  float o[Cfg::kORegs];
#pragma unroll
  for (int i = 0; i < Cfg::kORegs; ++i) o[i] = 0.0f;
  OnlineSoftmax softmax;

  // What the epilogue reads from global memory, loaded before the last PV so
  // that the loads' latency hides behind it.
  float v_factor = 0.0f;
  float lse_shift[2] = {0.0f, 0.0f};
  bool poisoned = false;
  auto load_epilogue_inputs = [&] {
    // P·V used P·2^-8 (direct_p::nvfp4_bf16_value_bits): 2^8 back with V's
    // factor, exactly, so O / l rounds as the emulator's.
    v_factor = (1.0f / *args.v_tensor_scale) * direct_p::kNvfp4OperandUnscale;
    poisoned = args.nonfinite != nullptr && (args.nonfinite[0] | args.nonfinite[1] | args.nonfinite[2]) != 0;
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (args.lse_shift != nullptr && frag.col == 0 && row_abs[r] < args.Sq)
        lse_shift[r] = args.lse_shift[(static_cast<std::int64_t>(batch) * args.Hq + head) * args.Sq + row_abs[r]];
  };

  if (k_tiles > 0) {
    const TurnOrder<Cfg::kConsumers> turn{consumer};
    float s[Cfg::kSRegs];
    std::uint32_t p[Cfg::kPvSteps][4];  // P of the tile whose PV is issued next
    float alpha[2];
    turn.open_first();
    wait_barrier(&smem.q_full, 0);

    // Turn 0: S of tile 0 alone, then its softmax (O is still 0: no rescale).
    wait_barrier(&smem.kv_full[0], 0);
    turn.wait();
    wgmma_fence();
    issue_qk<Cfg>(s, desc_q, smem.k[0]);
    wgmma_commit();
    turn.pass(false);
    wgmma_wait<0>();
    fence_registers(s);
    scale_scores(s);
    mask_tile(s, 0);
    softmax.step<kDirectP>(s, c, p_scale_table, p, alpha);

    for (int n = 1; n < k_tiles; ++n) {
      const unsigned tile = n;  // unsigned: % and / are a mask and a shift
      const int stage = tile % Cfg::kStages, prev = (tile - 1) % Cfg::kStages;
      wait_barrier(&smem.kv_full[stage], (tile / Cfg::kStages) & 1);
      turn.wait();
      fence_p(p);
      fence_registers(o);
      wgmma_fence();
      issue_pv<Cfg>(o, p, smem.v[prev]);
      issue_qk<Cfg>(s, desc_q, smem.k[stage]);
      wgmma_commit();
      turn.pass(false);
      wgmma_wait<0>();
      fence_registers(o);
      fence_registers(s);
      fence_p(p);
      cuda::ptx::mbarrier_arrive(&smem.kv_empty[prev]);
      scale_scores(s);
      mask_tile(s, n);
      softmax.step<kDirectP>(s, c, p_scale_table, p, alpha);
      rescale_o(o, alpha);
    }

    // Last turn: PV of the last tile.
    load_epilogue_inputs();
    turn.wait();
    fence_p(p);
    fence_registers(o);
    wgmma_fence();
    issue_pv<Cfg>(o, p, smem.v[(k_tiles - 1) % Cfg::kStages]);
    wgmma_commit();
    turn.pass(true);
    wgmma_wait<0>();
    fence_registers(o);
    fence_p(p);
  } else {
    load_epilogue_inputs();
  }

  // ---- epilogue: the quad's shares of l added; O / l / S_v in bf16; LSE in natural log
  float row_sum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float a = softmax.l[r] + __shfl_xor_sync(kFullWarp, softmax.l[r], 1);
    row_sum[r] = a + __shfl_xor_sync(kFullWarp, a, 2);
  }
  auto* out = static_cast<__nv_bfloat16*>(args.o) + batch * args.o_stride_b + head * args.o_stride_h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = poisoned ? __int_as_float(0x7FC00000) : row_sum[r];
    if (row_abs[r] >= args.Sq) continue;
    const bool empty = sum == 0.0f;  // fully masked row: O = 0, LSE = −inf
    const float inv_sum = empty ? 0.0f : 1.0f / sum;
    __nv_bfloat16* out_row = out + static_cast<std::int64_t>(row_abs[r]) * args.o_stride_s;
#pragma unroll
    for (int j = 0; j < HeadDim / 8; ++j) {
      // 1/l first, then V's factor: the emulator's order.
      const float o0 = o[4 * j + 2 * r] * inv_sum * v_factor;
      const float o1 = o[4 * j + 2 * r + 1] * inv_sum * v_factor;
      *reinterpret_cast<__nv_bfloat162*>(out_row + 8 * j + frag.col) = __floats2bfloat162_rn(o0, o1);
    }
    if (frag.col == 0) {
      const std::int64_t lse_index = (static_cast<std::int64_t>(batch) * args.Hq + head) * args.Sq + row_abs[r];
      args.lse[lse_index] =
          empty ? neg_inf() : (softmax.m[r] + log2f(sum) - direct_p::kNvfp4Offset) * kLn2 + lse_shift[r];
    }
  }
}

}  // namespace fp4attn::sm90::fwd::nvfp4
