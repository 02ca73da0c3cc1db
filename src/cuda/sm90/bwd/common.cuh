// Device pieces shared by the two FP8 backward kernels: accumulator
// fragments, P and dS codes in the FP8 wgmma A-operand layout, the pair's dS
// scale and the stores of the gradients.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda/ptx>

#include "cuda/sm90/bwd/config.h"
#include "cuda/sm90/bwd/wgmma_ss64.cuh"
#include "cuda/sm90/key_bounds.cuh"
#include "fp4attn/direct_p.hpp"
#include "fp4attn/formats.hpp"

namespace fp4attn::sm90::bwd {

inline constexpr std::uint32_t kFullWarp = 0xFFFFFFFFu;
inline constexpr int kThreadsPerRow = 4;
// P = E4M3(2^(u + 8)) · 2^-8: the code carries 2^(u+8), the 2^-8 stays outside.
inline constexpr float kPUnscale = 0x1p-8f;

FP4ATTN_DEVICE_INLINE float neg_inf() { return __int_as_float(0xFF800000); }

// Batch entry b's number of tokens: `longest` (the layout's), or for packed
// sequences its own.
FP4ATTN_DEVICE_INLINE int entry_tokens(const int* cu_seqlens, int b, int longest) {
  return cu_seqlens != nullptr ? cu_seqlens[b + 1] - cu_seqlens[b] : longest;
}

// Where batch entry b's tokens sit in the operands (codes, transposed
// copies, block scales) and row statistics: dense, entry b of a `longest`
// token layout; packed sequences, rows row0 .. of the one-entry
// tile-aligned layout of `layout_rows` rows (Fp8BackwardArgs::rows).
struct OperandPlace {
  int batch;  // the operands' batch coordinate
  int row0;   // first token row, a multiple of kTile
  int tiles;  // token tiles per batch entry of the scales and statistics
};
FP4ATTN_DEVICE_INLINE OperandPlace operand_place(const int* rows, int layout_rows, int b, int longest) {
  return rows != nullptr ? OperandPlace{0, rows[b], layout_rows / kTile}
                         : OperandPlace{b, 0, (longest + kTile - 1) / kTile};
}

// Element offset of batch entry b in a (B, S, H, D) gradient: b · stride_b,
// or for packed sequences its first token row times stride_s.
FP4ATTN_DEVICE_INLINE std::int64_t entry_offset(const TensorRef& out, const int* cu_seqlens, int b) {
  return cu_seqlens != nullptr ? cu_seqlens[b] * out.stride_s : b * out.stride_b;
}

FP4ATTN_DEVICE_INLINE void wait_barrier(std::uint64_t* bar, std::uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

// Element 4j + 2r + e of an m64nN fp32 accumulator is row 16·warp + lane/4 + 8r,
// column 8j + 2·(lane % 4) + e (rows within the warpgroup's 64).
struct Fragment {
  int row[2];
  int col;
  __device__ explicit Fragment(int thread_in_wg) {
    const int warp = thread_in_wg / kWarpSize, lane = thread_in_wg % kWarpSize;
    row[0] = 16 * warp + lane / kThreadsPerRow;
    row[1] = row[0] + 8;
    col = 2 * (lane % kThreadsPerRow);
  }
};

// The A operand of k32 step t holds, in register 2h + r, the codes of row r
// at accumulator columns 32t + 16h + 2·(lane%4) + {0, 1, 8, 9}: accumulator
// elements 4j + 2r + {0, 1, 4, 5} with j = 4t + 2h. The B operands that meet
// such an A store their tokens permuted the same way (vt_key_of_slot), so the
// product sums over matching tokens without a register shuffle.
FP4ATTN_DEVICE_INLINE int a_element(int t, int h, int r, int i) {
  const int j = 4 * t + 2 * h;
  return 4 * j + 2 * r + (i & 1) + 4 * (i >> 1);
}

// E4M3 codes of P = 2^(u + 8) for four log2-domain scores, u0 in the low byte.
template <PCode kPCode>
FP4ATTN_DEVICE_INLINE std::uint32_t p_codes_x4(float u0, float u1, float u2, float u3) {
  if constexpr (kPCode == PCode::direct_p) {
    return direct_p::fp8_codes_x4(u0, u1, u2, u3);
  } else {
    float p[4] = {u0, u1, u2, u3};
#pragma unroll
    for (int i = 0; i < 4; ++i) asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(p[i]) : "f"(p[i] + direct_p::kFp8Offset));
    std::uint16_t lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(p[1]), "f"(p[0]));  // first source → high byte
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(p[3]), "f"(p[2]));
    return static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
  }
}

// Round-to-nearest-even E4M3 codes of four values (saturating), x0 in the low byte.
FP4ATTN_DEVICE_INLINE std::uint32_t e4m3_codes_x4(float x0, float x1, float x2, float x3) {
  std::uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x3), "f"(x2));
  return static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
}

// The four P values packed in a word, byte 0 first, times 2^-120: an E4M3
// code's bits moved to fp32 bits 20..26 read as a float are its value · 2^-120,
// for normal and subnormal codes alike (P ≥ 0: no sign bit). Four integer
// operations instead of conversions; the 2^120 goes into a later multiply.
inline constexpr float kPBitsUnscale = 0x1p112f;  // 2^120 · kPUnscale
FP4ATTN_DEVICE_INLINE void p_bits_x4(std::uint32_t codes, float (&v)[4]) {
  constexpr std::uint32_t kField = 0x07F00000u;
  v[0] = __uint_as_float((codes << 20) & kField);
  v[1] = __uint_as_float((codes << 12) & kField);
  v[2] = __uint_as_float((codes << 4) & kField);
  v[3] = __uint_as_float((codes >> 4) & kField);
}

// The multiplier that takes a tile's scores into the log2 domain. A product
// that underflows to 0 (all-zero Q and K tiles: MXFP4 fold factors of 2^-133
// each, or two tiny FP8 block scales) would turn masked scores into
// −inf·0 = NaN and P into garbage; the smallest subnormal keeps them −inf and
// every visible s·c at (almost) 0, as the forward kernel does.
FP4ATTN_DEVICE_INLINE float log2_multiplier(float q_scale, float k_scale, float scale_log2) {
  const float product = q_scale * k_scale * scale_log2;
  return product == 0.0f ? __int_as_float(1) : product;
}

// P codes of one consumer's tile from its scores s (−inf where masked) and
// the log2-domain LSE of each element's query row (lse(row, col) gives it).
template <PCode kPCode, int N, class Lse>
FP4ATTN_DEVICE_INLINE void p_operand(const float (&s)[N], float c, const Lse& lse, std::uint32_t (&p)[N / 16][4]) {
#pragma unroll
  for (int t = 0; t < N / 16; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float u[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int e = a_element(t, h, r, i);
          u[i] = direct_p::log2_score(s[e], c, lse(r, e));
        }
        p[t][2 * h + r] = p_codes_x4<kPCode>(u[0], u[1], u[2], u[3]);
      }
}

// dS = P·2^-8 ⊙ (dP·f − delta) in place of dP, and the largest |dS| of this
// thread (kAmax; 0 without: the dK/dV kernel of the two passes reads the
// pair's scale from the dQ kernel). p: P codes in A layout. dP·f − delta is
// one FFMA where the emulator rounds twice: dP itself already differs from
// the emulator's fp32 sum by the tensor core's accumulation, far more than
// this one rounding.
template <bool kAmax = true, int N, class Delta>
FP4ATTN_DEVICE_INLINE float ds_in_place(float (&dp)[N], float dp_factor, const Delta& delta,
                                        const std::uint32_t (&p)[N / 16][4]) {
  float amax = 0.0f;
#pragma unroll
  for (int t = 0; t < N / 16; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float pv[4];
        p_bits_x4(p[t][2 * h + r], pv);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int e = a_element(t, h, r, i);
          dp[e] = __fmul_rn(__fmul_rn(pv[i], kPBitsUnscale), fmaf(dp[e], dp_factor, -delta(r, e)));
          if constexpr (kAmax) amax = fmaxf(amax, fabsf(dp[e]));
        }
      }
  return amax;
}

// The pair's dS scale: the largest |dS| of both consumers (the whole
// 128 × 128 pair) over E4M3's maximum, 1 when the pair is all zero. `slot`
// alternates per pair so that a consumer one pair ahead never overwrites
// values the other still reads.
template <int kWarps>
FP4ATTN_DEVICE_INLINE float pair_ds_scale(float amax, float (&slot)[kWarps], int consumer_thread) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFullWarp, amax, o));
  if (consumer_thread % kWarpSize == 0) slot[consumer_thread / kWarpSize] = amax;
  named_barrier_sync(kBarrierPairAmax, kPairThreads);
  float m = slot[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, slot[w]);
  const float scale = __fdiv_rn(m, kE4M3Max);
  return scale > 0.0f ? scale : 1.0f;
}

// One consumer's share of a pair's dS scale: the largest |dS| of its 64 × 128
// half over E4M3's maximum, 0 when that half is all zero (the caller maps 0
// to 1). The consumer's four warps meet at a barrier of their own, so the
// two consumers never wait for each other. `slot` holds the consumer's four
// warp maxima and alternates per pair, as in pair_ds_scale.
FP4ATTN_DEVICE_INLINE float consumer_ds_scale(float amax, float* slot, int consumer, int consumer_thread) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFullWarp, amax, o));
  const int warp = consumer_thread / kWarpSize % (kWarpgroupThreads / kWarpSize);
  if (consumer_thread % kWarpSize == 0) slot[warp] = amax;
  named_barrier_sync(kBarrierConsumerAmax + consumer, kWarpgroupThreads);
  return __fdiv_rn(fmaxf(fmaxf(slot[0], slot[1]), fmaxf(slot[2], slot[3])), kE4M3Max);
}

// dS codes in A layout: dS · (1 / scale) rounded to E4M3. The emulator
// divides; the product differs from the quotient by at most an ulp of fp32,
// which moves a code only when dS / scale lies within that ulp of an E4M3
// rounding boundary (NOTES.md), and saves an IEEE division per element.
template <int N>
FP4ATTN_DEVICE_INLINE void ds_operand(const float (&ds)[N], float scale, std::uint32_t (&a)[N / 16][4]) {
  const float inv = __frcp_rn(scale);
#pragma unroll
  for (int t = 0; t < N / 16; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        a[t][2 * h + r] = e4m3_codes_x4(__fmul_rn(ds[a_element(t, h, r, 0)], inv),
                                        __fmul_rn(ds[a_element(t, h, r, 1)], inv),
                                        __fmul_rn(ds[a_element(t, h, r, 2)], inv),
                                        __fmul_rn(ds[a_element(t, h, r, 3)], inv));
}

template <int T>
FP4ATTN_DEVICE_INLINE void fence_operand(std::uint32_t (&a)[T][4]) {
#pragma unroll
  for (int t = 0; t < T; ++t) fence_registers(a[t]);
}

// tmp = A·B for a 64 × HeadDim gradient tile: A from registers (the 128
// tokens of a tile in four k32 steps), B a transposed tile (rows d, tokens
// along K) in shared memory.
template <class Cfg>
FP4ATTN_DEVICE_INLINE void issue_grad(float (&d)[Cfg::kGradRegs], const std::uint32_t (&a)[Cfg::kTokenSteps][4],
                                      const std::uint8_t* b_tile) {
  const std::uint64_t desc = make_kmajor_desc<Cfg::kColSwizzle>(b_tile);
  if constexpr (Cfg::kHeadDim == 128) {
    wgmma_m64n128k32_rs_init(d, a[0], desc);
#pragma unroll
    for (int t = 1; t < Cfg::kTokenSteps; ++t) wgmma_m64n128k32_rs(d, a[t], desc + t * kDescK32Step);
  } else {
    wgmma_m64n64k32_rs_init(d, a[0], desc);
#pragma unroll
    for (int t = 1; t < Cfg::kTokenSteps; ++t) wgmma_m64n64k32_rs(d, a[t], desc + t * kDescK32Step);
  }
}

// acc = A·Bᵀ over D for a 64 × 128 tile, both token-major in shared memory.
template <class Cfg>
FP4ATTN_DEVICE_INLINE void issue_scores(float (&d)[Cfg::kSRegs], const std::uint8_t* a_tile, const std::uint8_t* b_tile) {
  const std::uint64_t da = make_kmajor_desc<Cfg::kRowSwizzle>(a_tile);
  const std::uint64_t db = make_kmajor_desc<Cfg::kRowSwizzle>(b_tile);
  wgmma_m64n128k32_ss_init(d, da, db);
#pragma unroll
  for (int t = 1; t < Cfg::kDSteps; ++t) wgmma_m64n128k32_ss(d, da + t * kDescK32Step, db + t * kDescK32Step);
}

// dQ part = dS·K for 64 queries (DqMode::one_pass): A the dS tile rows (128
// key slots, K-major), B the Kᵀ tile (rows d, the same key slots).
template <class Cfg>
FP4ATTN_DEVICE_INLINE void issue_dq(float (&d)[Cfg::kGradRegs], const std::uint8_t* ds_rows, const std::uint8_t* kt) {
  const std::uint64_t da = make_kmajor_desc<Cfg::kColSwizzle>(ds_rows);
  const std::uint64_t db = make_kmajor_desc<Cfg::kColSwizzle>(kt);
  if constexpr (Cfg::kHeadDim == 128) {
    wgmma_m64n128k32_ss_init(d, da, db);
#pragma unroll
    for (int t = 1; t < Cfg::kTokenSteps; ++t) wgmma_m64n128k32_ss(d, da + t * kDescK32Step, db + t * kDescK32Step);
  } else {
    wgmma_m64n64k32_ss_init(d, da, db);
#pragma unroll
    for (int t = 1; t < Cfg::kTokenSteps; ++t) wgmma_m64n64k32_ss(d, da + t * kDescK32Step, db + t * kDescK32Step);
  }
}

// Slot of key `key` (0..127 in its tile) in the A-operand order of a 32-key
// group: the inverse of cuda_quantize::vt_key_of_slot.
FP4ATTN_DEVICE_INLINE int slot_of_key(int key) {
  const int m = key % 16;
  return (key / 16) * 16 + 4 * ((m % 8) / 2) + 2 * (m / 8) + m % 2;
}

// Byte offset of (row, byte) in a tile of 128-byte rows with the 128-byte
// swizzle (16-byte chunk index XOR row % 8), the layout TMA writes and the
// wgmma descriptor reads.
FP4ATTN_DEVICE_INLINE int swizzled_offset(int row, int byte) {
  return row * 128 + ((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15));
}

// One consumer's dSᵀ codes of a pair (A-operand registers a[t][2h + r]: key
// row r of this thread, queries 8j + col + {0, 1, 8, 9} in bytes 0 .. 3,
// j = 4t + 2h) stored as the A tile of dQ = dS·K: row = query, byte = key
// slot (slot_of_key), in the 128-byte swizzle. `first_key` is the first key
// of the consumer's rows within the tile. The four slots 4p .. 4p + 3 of a
// 16-key group hold keys 2p, 2p + 1, 2p + 8, 2p + 9: rows r = 0, 1 of the
// lanes with g = lane / 4 = 2p and 2p + 1 (lane and lane ^ 4), for the same
// queries. So the two lanes swap one word and each stores two whole words:
// the even lane queries q and q + 1, the odd lane q + 8 and q + 9 (q = 8j +
// col). Per 16 bytes 4 PRMT, 1 SHFL and 2 word stores, where byte stores
// took 16 stores.
template <int T>
FP4ATTN_DEVICE_INLINE void store_ds_tile(const std::uint32_t (&a)[T][4], std::uint8_t* tile, int first_key,
                                         const Fragment& f) {
  const int g = f.row[0] % 16;
  const bool even = g % 2 == 0;
  // keep: this lane's bytes of its own queries (rows 0, 1); send: the other lane's.
  const std::uint32_t keep_sel = even ? 0x5410u : 0x7632u, send_sel = even ? 0x7632u : 0x5410u;
  // Slot order: even row 0, odd row 0, even row 1, odd row 1.
  const std::uint32_t first_sel = even ? 0x6240u : 0x2604u, second_sel = even ? 0x7351u : 0x3715u;
  const int slot = slot_of_key(first_key + f.row[0]) & ~3;  // the word's first slot
  const int first_query = f.col + (even ? 0 : 8);
  const auto base = static_cast<std::uint32_t>(__cvta_generic_to_shared(tile));
#pragma unroll
  for (int t = 0; t < T; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const std::uint32_t row0 = a[t][2 * h], row1 = a[t][2 * h + 1];
      const std::uint32_t keep = __byte_perm(row0, row1, keep_sel), send = __byte_perm(row0, row1, send_sel);
      const std::uint32_t other = __shfl_xor_sync(kFullWarp, send, kThreadsPerRow);
      const int query = 8 * (4 * t + 2 * h) + first_query;
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(base + swizzled_offset(query, slot)),
                   "r"(__byte_perm(keep, other, first_sel))
                   : "memory");
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(base + swizzled_offset(query + 1, slot)),
                   "r"(__byte_perm(keep, other, second_sel))
                   : "memory");
    }
}

// This thread's elements of a consumer's fp32 dQ part, times `factor`, into
// shared memory for a bulk reduction (DqMode::one_pass): `rows` holds a block
// of `block_rows` rows of HeadDim floats (the thread's two rows, 8 apart, fall
// in one block), each row's columns permuted by dq_accum_column as in the
// global sums, which keeps the pair stores of a warp free of bank conflicts.
template <int HeadDim, int N>
FP4ATTN_DEVICE_INLINE void stage_dq_part(const float (&part)[N], float factor, const Fragment& f, float* rows,
                                         int block_rows) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      const int at = (f.row[r] % block_rows) * HeadDim + dq_accum_column(f.row[r], 8 * j + f.col);
      const auto address = static_cast<std::uint32_t>(__cvta_generic_to_shared(rows + at));
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(address), "f"(part[4 * j + 2 * r] * factor),
                   "f"(part[4 * j + 2 * r + 1] * factor)
                   : "memory");
    }
}

template <class T>
FP4ATTN_DEVICE_INLINE T to_element(float x);
template <>
FP4ATTN_DEVICE_INLINE float to_element<float>(float x) { return x; }
template <>
FP4ATTN_DEVICE_INLINE __half to_element<__half>(float x) { return __float2half_rn(x); }
template <>
FP4ATTN_DEVICE_INLINE __nv_bfloat16 to_element<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Two neighbouring elements of T as one store: float2, __half2, __nv_bfloat162.
template <class T>
struct ElementPair;
template <>
struct ElementPair<float> {
  FP4ATTN_DEVICE_INLINE static float2 of(float a, float b) { return make_float2(a, b); }
};
template <>
struct ElementPair<__half> {
  FP4ATTN_DEVICE_INLINE static __half2 of(float a, float b) { return __floats2half2_rn(a, b); }
};
template <>
struct ElementPair<__nv_bfloat16> {
  FP4ATTN_DEVICE_INLINE static __nv_bfloat162 of(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

// The two elements of a 16-bit pair as the 32-bit word they fill.
template <class T>
FP4ATTN_DEVICE_INLINE std::uint32_t pair_bits(float a, float b) {
  const auto v = ElementPair<T>::of(a, b);
  static_assert(sizeof(v) == sizeof(std::uint32_t), "16-bit elements");
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

// Stores a 64 × HeadDim gradient tile times `scale` (rows from `first_row`,
// those ≥ rows skipped) into a (B, S, H, D) tensor of `type`, whose batch
// entry starts `entry` elements in (b · stride_b, or for packed sequences
// the entry's first token row times stride_s). A thread's columns come in
// neighbouring pairs (col, col + 1 with col even): where the tensor's layout
// keeps such a pair aligned (the usual one does), each pair is one store of
// two elements, converted together; otherwise one by one.
template <int N>
FP4ATTN_DEVICE_INLINE void store_rows(const float (&acc)[N], float scale, const Fragment& f, int first_row, int rows,
                                      ElementType type, const TensorRef& out, std::int64_t entry, int head) {
  const auto store = [&](auto* base) {
    using T = std::remove_pointer_t<decltype(base)>;
    using Pair = decltype(ElementPair<T>::of(0.0f, 0.0f));
    base += entry + head * out.stride_h;
    const bool pairs = reinterpret_cast<std::uintptr_t>(base) % sizeof(Pair) == 0 && out.stride_s % 2 == 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = first_row + f.row[r];
      if (row >= rows) continue;
      T* dst = base + static_cast<std::int64_t>(row) * out.stride_s;
#pragma unroll
      for (int j = 0; j < N / 4; ++j) {
        const float a = __fmul_rn(scale, acc[4 * j + 2 * r]), b = __fmul_rn(scale, acc[4 * j + 2 * r + 1]);
        if (pairs) {
          *reinterpret_cast<Pair*>(dst + 8 * j + f.col) = ElementPair<T>::of(a, b);
        } else {
          dst[8 * j + f.col] = to_element<T>(a);
          dst[8 * j + f.col + 1] = to_element<T>(b);
        }
      }
    }
  };
  switch (type) {
    case ElementType::f32: store(static_cast<float*>(out.data)); break;
    case ElementType::f16: store(static_cast<__half*>(out.data)); break;
    case ElementType::bf16: store(static_cast<__nv_bfloat16*>(out.data)); break;
  }
}

// store_rows for 16-bit outputs through this consumer's own shared memory:
// the 64-row tile goes into two pieces (rows 0–31 and 32–63, 32 rows of
// HeadDim elements each) with its 16-byte chunks swizzled by row, so that
// both the pair writes and the 16-byte reads are free of bank conflicts;
// then out with 16-byte stores, a row's elements by consecutive threads.
// The pieces must be shared memory that only this consumer reads now; they
// are free again on return. f32 outputs, and 16-bit ones whose rows are not
// 16-byte aligned, go through store_rows.
template <int HeadDim, int N>
FP4ATTN_DEVICE_INLINE void store_rows_staged(const float (&acc)[N], float scale, const Fragment& f, int first_row,
                                             int rows, ElementType type, const TensorRef& out, std::int64_t entry,
                                             int head, std::uint8_t* piece0, std::uint8_t* piece1, int consumer,
                                             int thread_in_wg) {
  constexpr int kRowBytes = HeadDim * 2, kChunks = kRowBytes / 16, kPieceRows = 32;
  static_assert(N == HeadDim / 2, "a 64 × HeadDim tile over 128 threads");
  auto* base = static_cast<std::uint8_t*>(out.data) + 2 * (entry + head * out.stride_h);
  if (type == ElementType::f32 || reinterpret_cast<std::uintptr_t>(base) % 16 != 0 || (out.stride_s * 2) % 16 != 0) {
    store_rows(acc, scale, f, first_row, rows, type, out, entry, head);
    return;
  }
  const auto at = [&](int row, int chunk) {
    std::uint8_t* piece = row < kPieceRows ? piece0 : piece1;
    const int r = row % kPieceRows;
    return static_cast<std::uint32_t>(__cvta_generic_to_shared(piece + r * kRowBytes + (chunk ^ (r & 7)) * 16));
  };
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      const float a = __fmul_rn(scale, acc[4 * j + 2 * r]), b = __fmul_rn(scale, acc[4 * j + 2 * r + 1]);
      const std::uint32_t bits = type == ElementType::bf16 ? pair_bits<__nv_bfloat16>(a, b) : pair_bits<__half>(a, b);
      // Chunk j holds elements 8j .. 8j + 7; this thread's pair starts at element col.
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(at(f.row[r], j) + 2 * f.col), "r"(bits) : "memory");
    }
  named_barrier_sync(kBarrierStaging + consumer, kWarpgroupThreads);
  for (int i = thread_in_wg; i < 2 * kPieceRows * kChunks; i += kWarpgroupThreads) {
    const int row = i / kChunks, chunk = i % kChunks;
    if (first_row + row >= rows) continue;
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(at(row, chunk))
                 : "memory");
    *reinterpret_cast<uint4*>(base + static_cast<std::int64_t>(first_row + row) * out.stride_s * 2 + chunk * 16) = v;
  }
  named_barrier_sync(kBarrierStaging + consumer, kWarpgroupThreads);  // the pieces may be written again
}

}  // namespace fp4attn::sm90::bwd
