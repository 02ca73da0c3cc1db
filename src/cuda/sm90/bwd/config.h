// Tile sizes, pipeline depth, register split and shared memory of the two
// FP8 backward kernels, with the budget checked at compile time.
#pragma once

#include <cstdint>

#include "cuda/sm90/bwd/bwd.hpp"
#include "cuda/sm90/ptx.cuh"

namespace fp4attn::sm90::bwd {

inline constexpr int kWarpSize = 32;
inline constexpr int kWarpgroupThreads = 128;
inline constexpr int kSmemPerBlockLimit = 227 * 1024;
inline constexpr int kRegisterFile = 64 * 1024;

template <int HeadDim>
struct BwdConfig {
  static_assert(HeadDim == 64 || HeadDim == 128, "head dims 64 and 128 are implemented");
  static constexpr int kHeadDim = HeadDim;
  // Both tiles are the recipe's FP8 scale blocks: one Q, K, dO, V scale per
  // tile, and one dS scale per (query tile, key tile) pair.
  static constexpr int kBlock = kTile;
  // One producer warpgroup (TMA) and two consumer warpgroups of 64 rows:
  // the M of every wgmma.
  static constexpr int kConsumers = 2;
  static constexpr int kRowsPerConsumer = kBlock / kConsumers;
  static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
  static constexpr int kConsumerWarps = kConsumers * kWarpgroupThreads / kWarpSize;

  // Token-major tiles (rows of HeadDim bytes) and transposed tiles (rows of
  // 128 tokens = 128 bytes), each one swizzle atom wide.
  static constexpr Swizzle kRowSwizzle = HeadDim == 128 ? Swizzle::b128 : Swizzle::b64;
  static constexpr Swizzle kColSwizzle = Swizzle::b128;
  static_assert(swizzle_row_bytes(kRowSwizzle) == HeadDim, "one token row must be one swizzle atom");
  static_assert(swizzle_row_bytes(kColSwizzle) == kBlock, "one transposed row must be one swizzle atom");
  static constexpr int kTileBytes = kBlock * HeadDim;      // either orientation
  static constexpr int kConsumerBytes = kRowsPerConsumer * HeadDim;
  static constexpr int kRowStatBytes = kBlock * 4;         // 128 fp32 (lse_log2 or delta)
  static constexpr int kSwizzleAlign = 1024;
  static_assert(kTileBytes % kSwizzleAlign == 0 && kConsumerBytes % 512 == 0, "tiles start on swizzle boundaries");
  static_assert(kConsumerBytes == 32 * 2 * HeadDim, "half a 16-bit gradient tile fits a consumer's rows of a tile");

  static constexpr int kStages = 2;
  // wgmma k32 steps: over D for S and dP, over the 128 tokens of a tile for the gradients.
  static constexpr int kDSteps = HeadDim / 32;
  static constexpr int kTokenSteps = kBlock / 32;
  static constexpr int kSRegs = kRowsPerConsumer * kBlock / kWarpgroupThreads;    // 64
  static constexpr int kGradRegs = kRowsPerConsumer * HeadDim / kWarpgroupThreads;  // 64 or 32

  // DqMode::one_pass: each consumer stages its fp32 dQ part (64 rows × D) in
  // shared memory and adds it to the global sums by bulk reductions, instead
  // of 16 · D / 32 float2 atomics per thread. A stage of its own (32 KB at
  // D = 64) fits beside the mode's tiles only at D = 64; at D = 128 (64 KB,
  // 16 KB left) the part goes to ring tiles the pair no longer reads
  // (dkv_kernel.cuh, kDqInRing).
  static constexpr bool kDqStaged = HeadDim == 64;
  // The dK/dV kernel keeps two products in flight (dPᵀ issued with Sᵀ; in
  // the one pass dQ's with dK's): at D = 64 the extra 64 × 128 tile fits
  // beside dK and dV (64 registers); at D = 128 (128 for dK, dV) it does not.
  static constexpr bool kProductPairs = HeadDim == 64;

  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(kWarpgroupThreads * (kProducerRegs + kConsumers * kConsumerRegs) <= kRegisterFile,
                "register split exceeds the register file");
};

// Named barriers (0 is __syncthreads).
enum BarrierId : int {
  kBarrierSyncThreads = 0,
  kBarrierPairAmax = 1,  // both consumers: the dS scale of a pair (DqMode::one_pass)
  kBarrierDsTile = 2,    // both consumers: the pair's dS tile is in shared memory (DqMode::one_pass)
  kBarrierStaging = 3,   // 3, 4: one consumer's gradient tile staged in its shared memory (store_rows_staged)
  kBarrierDqStage = 5,   // 5, 6: one consumer's fp32 dQ part staged for its bulk reduction (DqMode::one_pass)
  kBarrierConsumerAmax = 7,  // 7, 8: one consumer's dS scale (the dQ kernel)
};
inline constexpr int kPairThreads = 2 * kWarpgroupThreads;

// dQ kernel: Q and dO of the CTA's query tile once; K, V and Kᵀ per key tile.
template <class Cfg>
struct alignas(Cfg::kSwizzleAlign) DqShared {
  std::uint8_t q[Cfg::kTileBytes];
  std::uint8_t d_o[Cfg::kTileBytes];
  std::uint8_t k[Cfg::kStages][Cfg::kTileBytes];
  std::uint8_t v[Cfg::kStages][Cfg::kTileBytes];
  std::uint8_t kt[Cfg::kStages][Cfg::kTileBytes];
  float amax[2][Cfg::kConsumerWarps];  // by pair parity: no WAR race between consecutive pairs
  std::uint64_t q_full;
  std::uint64_t full[Cfg::kStages];
  std::uint64_t empty[Cfg::kStages];
};

// DqMode::one_pass with BwdConfig::kDqStaged: each consumer's fp32 dQ part,
// rows of D floats with dq_accum_column's permutation (bulk copies need
// 16-byte alignment, which the byte tiles before it keep).
template <class Cfg, bool kStaged = Cfg::kDqStaged>
struct alignas(16) DqStage {
  float rows[Cfg::kConsumers][Cfg::kRowsPerConsumer * Cfg::kHeadDim];
};
template <class Cfg>
struct DqStage<Cfg, false> {};

// dK/dV kernel: K and V of the CTA's key tile once; Q, dO, Qᵀ, dOᵀ and the
// row statistics per query tile.
template <class Cfg>
struct alignas(Cfg::kSwizzleAlign) DkvShared {
  std::uint8_t k[Cfg::kTileBytes];
  std::uint8_t v[Cfg::kTileBytes];
  std::uint8_t q[Cfg::kStages][Cfg::kTileBytes];
  std::uint8_t d_o[Cfg::kStages][Cfg::kTileBytes];
  std::uint8_t qt[Cfg::kStages][Cfg::kTileBytes];
  std::uint8_t d_ot[Cfg::kStages][Cfg::kTileBytes];
  // DqMode::one_pass: Kᵀ of the CTA's key tile (B of dQ = dS·K) and the pair's
  // dS codes as a (query, key slot) K-major A tile, by pair parity.
  std::uint8_t kt[Cfg::kTileBytes];
  std::uint8_t ds[2][Cfg::kBlock * Cfg::kBlock];
  DqStage<Cfg> dq_stage;
  // Bulk-copy destinations: 16-byte aligned whatever dq_stage takes.
  alignas(16) float lse_log2[Cfg::kStages][Cfg::kBlock];
  alignas(16) float delta[Cfg::kStages][Cfg::kBlock];
  float amax[2][Cfg::kConsumerWarps];
  std::uint64_t kv_full;
  std::uint64_t full[Cfg::kStages];
  std::uint64_t empty[Cfg::kStages];
};

template <class Shared>
constexpr int shared_bytes() {
  return static_cast<int>(sizeof(Shared)) + 1024;  // + alignment of the dynamic base by hand
}
static_assert(shared_bytes<DqShared<BwdConfig<128>>>() <= kSmemPerBlockLimit, "dQ shared memory over budget");
static_assert(shared_bytes<DkvShared<BwdConfig<128>>>() <= kSmemPerBlockLimit, "dK/dV shared memory over budget");
static_assert(shared_bytes<DkvShared<BwdConfig<64>>>() <= kSmemPerBlockLimit, "dK/dV shared memory over budget");

}  // namespace fp4attn::sm90::bwd
