// Tile sizes, pipeline depth and register split of the FP8 Direct-P forward
// kernel, with the shared-memory budget checked at compile time.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/sm90/fwd/consumer_common.cuh"
#include "cuda/sm90/fwd/fwd.hpp"
#include "cuda/sm90/ptx.cuh"

namespace fp4attn::sm90::fwd {

template <int HeadDim>
struct Fp8Config {
  static_assert(HeadDim == 64 || HeadDim == 128, "head dims 64 and 128 are implemented");
  static constexpr int kHeadDim = HeadDim;
  // Query rows per CTA and keys per tile; both equal the FP8 scale blocks of
  // the recipe (DESIGN §2), so each tile's Q and K scale is one scalar.
  static constexpr int kBlockQ = 128;
  static constexpr int kBlockK = 128;
  // One producer warpgroup (TMA) and two consumer warpgroups of 64 rows each:
  // 64 is the M of every wgmma, so a consumer's S tile is one m64n128 product.
  static constexpr int kConsumers = 2;
  static constexpr int kRowsPerConsumer = kBlockQ / kConsumers;
  static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
  static_assert(kRowsPerConsumer == 64, "a consumer warpgroup owns exactly one wgmma M block");

  // K-major rows of Q and K are HeadDim bytes: 128 B rows use the 128-byte
  // swizzle, 64 B rows the 64-byte one. Vᵀ rows are kBlockK = 128 keys = 128 B.
  static constexpr Swizzle kQkSwizzle = HeadDim == 128 ? Swizzle::b128 : Swizzle::b64;
  static constexpr Swizzle kVSwizzle = Swizzle::b128;
  static_assert(swizzle_row_bytes(kQkSwizzle) == HeadDim, "one Q/K row must be one swizzle atom");
  static_assert(swizzle_row_bytes(kVSwizzle) == kBlockK, "one Vᵀ row must be one swizzle atom");

  static constexpr int kQBytes = kBlockQ * HeadDim;
  static constexpr int kQConsumerBytes = kRowsPerConsumer * HeadDim;
  static constexpr int kKBytes = kBlockK * HeadDim;
  static constexpr int kVBytes = HeadDim * kBlockK;
  // Eight rows of E4M3 ones follow each Vᵀ tile: PV runs with N = D + 8 and
  // its last eight columns are the row sums of P, summed by the tensor core
  // (no decode of P on the CUDA cores). Written once; TMA never touches them.
  static constexpr int kOnesRows = 8;
  static constexpr int kOnesBytes = kOnesRows * kBlockK;
  static constexpr int kVStageBytes = kVBytes + kOnesBytes;
  static constexpr int kPvN = HeadDim + kOnesRows;
  // Stages of the K/V ring. Each tensor-core turn of a consumer reads two
  // tiles (V of tile n − 1 for PV, K of tile n for QKᵀ), so two more stages
  // keep loads landing about two tiles ahead of use.
  static constexpr int kStages = 4;
  static constexpr int kSwizzleAlign = 1024;  // the 128-byte swizzle repeats every 8 rows of 128 B
  static_assert(kQConsumerBytes % kSwizzleAlign == 0 && kKBytes % kSwizzleAlign == 0 &&
                    kVStageBytes % kSwizzleAlign == 0 && kOnesBytes == kSwizzleAlign,
                "every tile must start on a swizzle-pattern boundary");

  // wgmma k32 steps: QKᵀ reduces over D, PV over the 128 keys of a tile.
  static constexpr int kQkSteps = HeadDim / 32;
  static constexpr int kPvSteps = kBlockK / 32;
  // fp32 accumulator registers per thread: 64 rows × N columns over 128 threads.
  static constexpr int kSRegs = kRowsPerConsumer * kBlockK / kWarpgroupThreads;
  static constexpr int kORegs = kRowsPerConsumer * HeadDim / kWarpgroupThreads;
  static constexpr int kPvRegs = kRowsPerConsumer * kPvN / kWarpgroupThreads;  // O's columns, then the row sums

  // 8-column groups of O updated after S = Q·Kᵀ is complete rather than
  // while it runs: they interleave with the row max (see the consumer loop).
  // 6 of 16 at D = 128 measured +2 % over none (v8b, docs/perf-log.md);
  // since the shorter issue block of v11, 4 of 16 (2 of 8 at D = 64)
  // measured best of 2, 4, 6 and 10.
  static constexpr int kOGroupsAfterS = HeadDim / 8 * 2 / 8;

  // setmaxnreg split: the producer only issues TMA; a consumer holds, at its
  // peak, O, the PV tile in flight, S and P: at D = 128 that is 64 + 68 + 64
  // + 16 registers before addresses and softmax state (see NOTES.md for why
  // this keeps softmax from overlapping the consumer's own products).
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  // setmaxnreg moves registers only within what the CTA got at launch: the
  // per-thread count ptxas allocates under __launch_bounds__(kThreads, 1),
  // the register file over kThreads rounded down to 8 (168), for every warp.
  static constexpr int kLaunchRegs = kRegisterFile / kThreads / 8 * 8;
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (1 + kConsumers) * kLaunchRegs,
                "register split exceeds the CTA's registers");
  // With MXFP4 operands in memory the whole producer warpgroup expands them
  // (fp4_expand.cuh); it needs 40 registers to run without spills, which the
  // consumers give up (232 each: no spills either, by ptxas -v).
  static constexpr int kExpandingProducerRegs = 40;
  static constexpr int kExpandingConsumerRegs = 232;
  static_assert(kExpandingProducerRegs + kConsumers * kExpandingConsumerRegs <= (1 + kConsumers) * kLaunchRegs,
                "register split exceeds the CTA's registers");
};

// MXFP4 codes staged for the expansion into E4M3 (fp4_expand.cuh): Q once,
// and a ring of K and Vᵀ tiles that TMA fills ahead of the producer.
template <class Cfg>
struct Fp4Staging {
  static constexpr int kStages = 3;
  static constexpr int kQBytes = Cfg::kBlockQ * Cfg::kHeadDim / 2;
  static constexpr int kKBytes = Cfg::kBlockK * Cfg::kHeadDim / 2;
  static constexpr int kVBytes = Cfg::kHeadDim * Cfg::kBlockK / 2;  // D rows of 64 bytes (128 keys)
  alignas(128) std::uint8_t q[kQBytes];
  alignas(128) std::uint8_t k[kStages][kKBytes];
  alignas(128) std::uint8_t v[kStages][kVBytes];
  std::uint64_t q_full;
  std::uint64_t full[kStages];
};
struct NoFp4Staging {};

static_assert(kBarrierConsumerTurn + Fp8Config<128>::kConsumers <= 16, "named barrier ids run out at 16");

// Shared memory of one CTA. Tiles first (1024-byte aligned), then the FP4
// staging when the kernel expands MXFP4 itself, barriers last.
template <class Cfg, bool kFp4In>
struct alignas(Cfg::kSwizzleAlign) SharedStorage {
  std::uint8_t q[Cfg::kQBytes];
  std::uint8_t k[Cfg::kStages][Cfg::kKBytes];
  std::uint8_t v[Cfg::kStages][Cfg::kVStageBytes];  // Vᵀ tile, then kOnesRows rows of ones
  [[no_unique_address]] std::conditional_t<kFp4In, Fp4Staging<Cfg>, NoFp4Staging> fp4;
  std::uint64_t q_full;
  std::uint64_t kv_full[Cfg::kStages];
  std::uint64_t kv_empty[Cfg::kStages];
};

// Dynamic shared memory is only guaranteed 16-byte aligned: ask for one
// alignment unit more and align the base by hand.
template <class Cfg, bool kFp4In>
constexpr int smem_bytes() {
  return static_cast<int>(sizeof(SharedStorage<Cfg, kFp4In>)) + Cfg::kSwizzleAlign;
}
static_assert(smem_bytes<Fp8Config<128>, false>() <= kSmemPerBlockLimit, "D=128 shared memory over budget");
static_assert(smem_bytes<Fp8Config<64>, false>() <= kSmemPerBlockLimit, "D=64 shared memory over budget");
static_assert(smem_bytes<Fp8Config<128>, true>() <= kSmemPerBlockLimit, "D=128 FP4 staging over budget");
static_assert(smem_bytes<Fp8Config<64>, true>() <= kSmemPerBlockLimit, "D=64 FP4 staging over budget");

}  // namespace fp4attn::sm90::fwd
