// Recipe mxfp4 with MXFP4 operands in memory (DESIGN §3.4): the producer
// warpgroup of the FP8 forward kernel expands them into the E4M3 tiles the
// consumers' wgmmas read, so HBM carries 4.25 bits per element instead of 8.
//
//   thread 0: Q's codes (one bulk copy), then K's codes (bulk copy) and Vᵀ's
//             codes (TMA, D rows of 64 bytes) of each key tile into a ring of
//             Fp4Staging::kStages slots, refilled as slots are read out
//   all 128:  per 16-byte chunk (32 codes, one MX block) the E8M0 scale from
//             global memory (loaded a tile ahead), the block's fold table
//             (fold_table.hpp), then 32 E4M3 bytes as two 16-byte stores in
//             the tile's swizzled layout; fence to the async proxy and arrive
//             on the tile's full barrier, which therefore counts 128
//
// The bytes are those of the fold pre-pass (cuda/quantize/fold_mx.cu): the same
// table, against the same group exponent R, which the kernel reads back from
// the fold factors 2^(R − 6) that a factors-only fold writes. Q folds per row,
// K per 128-key tile, V per channel over the sequence. Rows past Sq or Sk and
// keys past the padded sequence become +0, as in the pre-pass's buffers.
//
// Work split (chunk = 16 bytes of codes = 32 codes = one MX block):
//   Q, K: thread t expands row t, its D / 32 chunks in the order i ^ swap(t),
//         and reads the row's scale codes as one word;
//   Vᵀ:   thread t expands key group t mod 4 of D / 32 channels
//         (t / 4)·(D / 32) + (i ^ (t / 4 mod 2)), and reads their scale codes
//         (adjacent in the (S_pad/32, D) layout) as one word.
// The orders are chosen so that the eight threads of every 16-byte load or
// store phase touch distinct banks (checked exhaustively for D = 128; the D =
// 64 K and Q stores are 2-way).
#pragma once

#include <cuda.h>

#include <cuda/ptx>

#include "cuda/quantize/fold_table.hpp"
#include "cuda/sm90/fwd/fp8_direct_p/config.h"

namespace fp4attn::sm90::fwd {

inline constexpr int kFp4ChunkBytes = 16;  // 32 E2M1 codes: one MX block
inline constexpr int kMxBlockKeys = 32;

// R of a fold group from its factor 2^(R − 6) (fold_mx.hpp), which may be
// subnormal (R down to −127).
FP4ATTN_DEVICE_INLINE int fold_group_exponent(float factor) {
  const unsigned bits = __float_as_uint(factor);
  const int biased = static_cast<int>(bits >> 23);
  const int e = biased != 0 ? biased - 127 : -118 - __clz(static_cast<int>(bits));  // 2^(31 − clz − 149)
  return e + cuda_quantize::kFoldHeadroom;
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of kRowBytes-wide
// rows under the matching TMA/wgmma swizzle (128 B: chunk ^ row mod 8; 64 B:
// chunk ^ (row / 2) mod 4).
template <int kRowBytes>
FP4ATTN_DEVICE_INLINE int swizzled_chunk(int row, int chunk) {
  static_assert(kRowBytes == 128 || kRowBytes == 64, "rows of one 128- or 64-byte swizzle atom");
  const int phase = kRowBytes == 128 ? (row & 7) : ((row >> 1) & 3);
  return row * kRowBytes + ((chunk ^ phase) * kFp4ChunkBytes);
}

// Shared-memory accesses by 32-bit shared addresses: through generic pointers
// the compiler emitted generic LD/ST with 64-bit address arithmetic. Volatile,
// so that no load moves across the barrier waits (the slots are refilled).
FP4ATTN_DEVICE_INLINE std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

FP4ATTN_DEVICE_INLINE uint4 load_chunk(std::uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}

FP4ATTN_DEVICE_INLINE void store_chunk(std::uint32_t a, uint2 lo, uint2 hi) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(lo.x), "r"(lo.y), "r"(hi.x), "r"(hi.y)
               : "memory");
}

// The chunk order of a Q or K row: at D = 128, i ^ (0, 2, 3, 1)[(t / 2) mod 4]; at D = 64, i ^ ((t / 4) mod 2).
template <int HeadDim>
FP4ATTN_DEVICE_INLINE int qk_chunk_swap(int t) {
  if constexpr (HeadDim == 128) return (0x1320 >> (4 * ((t >> 1) & 3))) & 3;
  else return (t >> 2) & 1;
}

// The scale codes of this thread's D / 32 chunks as one word (byte i: chunk i).
template <int HeadDim>
FP4ATTN_DEVICE_INLINE std::uint32_t load_scale_word(const std::uint8_t* p) {
  if constexpr (HeadDim == 128) return *reinterpret_cast<const std::uint32_t*>(p);
  else return *reinterpret_cast<const std::uint16_t*>(p);
}

FP4ATTN_DEVICE_INLINE int scale_exponent(std::uint32_t word, int i) {
  return static_cast<int>((word >> (8 * i)) & 0xFFu) - kE8M0Bias;
}

// Chunk `blk` of row `row` of a Q or K tile (staging rows of D/2 bytes) into
// the E4M3 tile; an invalid row (past Sq or Sk) becomes +0.
template <int HeadDim>
FP4ATTN_DEVICE_INLINE void expand_qk_chunk(std::uint32_t codes, std::uint32_t tile, int row, int blk, bool valid,
                                           cuda_quantize::FoldTable table) {
  uint2 f[4] = {};
  if (valid) {
    const uint4 w = load_chunk(codes + row * (HeadDim / 2) + kFp4ChunkBytes * blk);
    f[0] = cuda_quantize::fold_word(w.x, table);
    f[1] = cuda_quantize::fold_word(w.y, table);
    f[2] = cuda_quantize::fold_word(w.z, table);
    f[3] = cuda_quantize::fold_word(w.w, table);
  }
  store_chunk(tile + swizzled_chunk<HeadDim>(row, 2 * blk), f[0], f[1]);
  store_chunk(tile + swizzled_chunk<HeadDim>(row, 2 * blk + 1), f[2], f[3]);
}

// Key group `grp` (keys 32·grp ..) of channel d of a Vᵀ tile into the E4M3
// tile, keys permuted inside the group as vt_key_of_slot: slots 4c..4c+3 hold
// keys 2c, 2c+1, 2c+8, 2c+9, so one byte permute per 8 codes puts the nibbles
// in slot order before the fold. Keys past the padded sequence arrive as
// code 0 (TMA's fill) and take an all-zero table.
FP4ATTN_DEVICE_INLINE void expand_v_chunk(std::uint32_t codes, std::uint32_t tile, int d, int grp,
                                          cuda_quantize::FoldTable table) {
  constexpr int kKeyRowBytes = 128;  // a Vᵀ row holds the tile's 128 keys (64 bytes of codes)
  const uint4 w = load_chunk(codes + d * (kKeyRowBytes / 2) + kFp4ChunkBytes * grp);
  constexpr unsigned kLowPairs = 0x5140u, kHighPairs = 0x7362u;  // keys 0,1,8,9,2,3,10,11 | 4,5,12,13,6,7,14,15
  store_chunk(tile + swizzled_chunk<kKeyRowBytes>(d, 2 * grp),
              cuda_quantize::fold_word(__byte_perm(w.x, w.y, kLowPairs), table),
              cuda_quantize::fold_word(__byte_perm(w.x, w.y, kHighPairs), table));
  store_chunk(tile + swizzled_chunk<kKeyRowBytes>(d, 2 * grp + 1),
              cuda_quantize::fold_word(__byte_perm(w.z, w.w, kLowPairs), table),
              cuda_quantize::fold_word(__byte_perm(w.z, w.w, kHighPairs), table));
}

// The producer warpgroup's whole job when the kernel expands MXFP4 (all 128
// threads; thread 0 also issues the copies). Smem: SharedStorage<Cfg, true>.
template <class Cfg, class Smem>
__device__ void produce_expanded(Smem& smem, const Fp8ForwardArgs& args, const CUtensorMap* tm_vt_fp4, int q0,
                                 int head, int kv_head, int batch, int tile_begin, int k_tiles) {
  using Staging = Fp4Staging<Cfg>;
  constexpr int D = Cfg::kHeadDim;
  constexpr int kChunks = D / kMxBlockKeys;  // per thread and tile, for K and for Vᵀ alike; scales per Q/K row
  constexpr int kGroups = Cfg::kBlockK / kMxBlockKeys;  // key groups of a Vᵀ tile row
  static_assert(Cfg::kBlockK == kWarpgroupThreads && Cfg::kBlockQ == kWarpgroupThreads, "a row per thread");
  static_assert(kGroups * D == kChunks * kWarpgroupThreads, "Vᵀ chunks: kChunks channels per thread");
  const int t = threadIdx.x;  // the producer warpgroup is threads 0 .. 127
  auto& st = smem.fp4;
  const std::int64_t q_row0 = (static_cast<std::int64_t>(batch) * args.Hq + head) * args.Sq + q0;
  const std::int64_t kv_head_index = static_cast<std::int64_t>(batch) * args.Hkv + kv_head;
  const std::int64_t kv_row0 = kv_head_index * args.Sk;
  const int v_blocks = static_cast<int>(args.v_fp4_tokens / kMxBlockKeys);
  const std::uint8_t* v_scales = args.v_fp4_scales + kv_head_index * v_blocks * D;
  const int num_k_tiles = (args.Sk + Cfg::kBlockK - 1) / Cfg::kBlockK;
  const float* k_factor = args.k_scale + kv_head_index * num_k_tiles;
  // This thread's Vᵀ key group and channels d0 + (i ^ v_flip), from t.
  const auto v_group = [](int t) { return t % kGroups; };
  const auto v_flip = [](int t) { return (t / kGroups) & 1; };
  const auto v_d0 = [](int t) { return (t / kGroups) * kChunks; };

  // n counts the CTA's tiles from 0 (stages, slots, phases); key tile
  // tile_begin + n is the one it holds (a sliding window's first tile).
  auto issue_tile = [&](int n) {  // thread 0
    const int slot = n % Staging::kStages;
    n += tile_begin;
    const int rows = min(Cfg::kBlockK, args.Sk - n * Cfg::kBlockK);
    const std::uint32_t k_bytes = rows * D / 2;
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                         &st.full[slot], k_bytes + Staging::kVBytes);
    cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, st.k[slot],
                             args.k_fp4 + (kv_row0 + n * Cfg::kBlockK) * (D / 2), k_bytes, &st.full[slot]);
    const std::int32_t v_coord[4] = {n * Cfg::kBlockK / 2, 0, kv_head, batch};
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, st.v[slot], tm_vt_fp4,
                                    v_coord, &st.full[slot]);
  };
  if (t == 0) {
    const std::uint32_t q_bytes = min(Cfg::kBlockQ, args.Sq - q0) * D / 2;
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                         &st.q_full, q_bytes);
    cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, st.q, args.q_fp4 + q_row0 * (D / 2),
                             q_bytes, &st.q_full);
    for (int n = 0; n < min(Staging::kStages, k_tiles); ++n) issue_tile(n);
  }

  // Q: row t folds against its own R (q_scale holds one factor per row).
  {
    const bool valid = q0 + t < args.Sq;
    const std::uint32_t codes = valid ? load_scale_word<D>(args.q_fp4_scales + (q_row0 + t) * kChunks) : 0u;
    const int r = valid ? fold_group_exponent(args.q_scale[q_row0 + t]) : 0;
    const int swap = qk_chunk_swap<D>(t);
    wait_barrier(&st.q_full, 0);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int blk = i ^ swap;
      expand_qk_chunk<D>(smem_u32(st.q), smem_u32(smem.q), t, blk, valid,
                         cuda_quantize::fold_table(scale_exponent(codes, blk), r));
    }
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
    cuda::ptx::mbarrier_arrive(&smem.q_full);
  }

  // V's group exponent per channel is fixed for the CTA; v_r[i] belongs to
  // the i-th chunk in this thread's order, channel v_d0 + (i ^ v_flip).
  int v_r[kChunks];
#pragma unroll
  for (int i = 0; i < kChunks; ++i)
    v_r[i] = fold_group_exponent(args.v_scale[kv_head_index * D + v_d0(t) + (i ^ v_flip(t))]);

  // Scale codes of tile n, loaded a tile ahead; 0 (unused) for rows past Sk
  // and key groups past the padded sequence, which the expansion zeroes.
  std::uint32_t k_codes = 0, v_codes = 0;
  float k_fac = 1.0f;
  auto load_scales = [&](int n) {
    n += tile_begin;
    const int key = n * Cfg::kBlockK + t, blk = n * kGroups + v_group(t);
    k_codes = key < args.Sk ? load_scale_word<D>(args.k_fp4_scales + (kv_row0 + key) * kChunks) : 0u;
    v_codes = blk < v_blocks ? load_scale_word<D>(v_scales + blk * D + v_d0(t)) : 0u;
    k_fac = k_factor[n];
  };
  if (k_tiles > 0) load_scales(0);

  for (int n = 0; n < k_tiles; ++n) {
    const unsigned tile = n;
    const int stage = tile % Cfg::kStages, slot = tile % Staging::kStages;
    const std::uint32_t kc = k_codes, vc = v_codes;
    const int k_r = fold_group_exponent(k_fac);
    if (n + 1 < k_tiles) load_scales(n + 1);

    wait_barrier(&st.full[slot], (tile / Staging::kStages) & 1);
    wait_barrier(&smem.kv_empty[stage], ((tile / Cfg::kStages) & 1) ^ 1);
    // The chunk addresses derive from t afresh in every tile: hoisted out of
    // the loop they would hold about 24 of the producer's registers.
    const int me = opaque(t);
    const std::uint32_t k_codes_at = smem_u32(st.k[slot]), k_tile_at = smem_u32(smem.k[stage]);
    const std::uint32_t v_codes_at = smem_u32(st.v[slot]), v_tile_at = smem_u32(smem.v[stage]);
    const bool k_valid = (tile_begin + n) * Cfg::kBlockK + me < args.Sk;
    const int swap = qk_chunk_swap<D>(me);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int blk = i ^ swap;
      expand_qk_chunk<D>(k_codes_at, k_tile_at, me, blk, k_valid,
                         cuda_quantize::fold_table(scale_exponent(kc, blk), k_r));
    }
    const int grp = v_group(me);
    const bool v_valid = (tile_begin + n) * kGroups + grp < v_blocks;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = i ^ v_flip(me);  // this chunk's channel is v_d0 + c
      expand_v_chunk(v_codes_at, v_tile_at, v_d0(me) + c, grp,
                     v_valid ? cuda_quantize::fold_table(scale_exponent(vc, c), v_r[i])
                             : cuda_quantize::FoldTable{0u, 0u});
    }
    // The tile's bytes, written by ordinary stores, become visible to the
    // consumers' wgmmas (async proxy) through this fence and the barrier.
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
    cuda::ptx::mbarrier_arrive(&smem.kv_full[stage]);
    // Every thread has read the slot: thread 0 refills it.
    named_barrier_sync(kBarrierFp4Staging, kWarpgroupThreads);
    if (t == 0 && n + Staging::kStages < k_tiles) issue_tile(n + Staging::kStages);
  }
}

}  // namespace fp4attn::sm90::fwd
