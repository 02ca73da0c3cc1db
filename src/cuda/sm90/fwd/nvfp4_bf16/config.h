// Tile sizes, pipeline depth and register split of the NVFP4 forward on BF16
// wgmma, with the shared-memory budget checked at compile time.
#pragma once

#include <cstdint>

#include "cuda/sm90/fwd/consumer_common.cuh"
#include "cuda/sm90/fwd/nvfp4_fwd.hpp"
#include "cuda/sm90/ptx.cuh"

namespace fp4attn::sm90::fwd::nvfp4 {

inline constexpr int kBf16Bytes = 2;

template <int HeadDim>
struct Config {
  static_assert(HeadDim == 64 || HeadDim == 128, "head dims 64 and 128 are implemented");
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kBlockQ = 128;
  static constexpr int kBlockK = 128;
  // One producer warpgroup (TMA) and two consumer warpgroups of 64 rows each:
  // 64 is the M of every wgmma, so a consumer's S tile is one m64n128 product.
  static constexpr int kConsumers = 2;
  static constexpr int kRowsPerConsumer = kBlockQ / kConsumers;
  static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
  static_assert(kRowsPerConsumer == 64, "a consumer warpgroup owns exactly one wgmma M block");

  // Every K-major tile is stored as column atoms of 64 bf16 = 128 bytes (the
  // 128-byte swizzle's row): Q and K have HeadDim / 64 atoms of 128 (or 64)
  // rows, Vᵀ has kBlockK / 64 atoms of HeadDim rows. One TMA box per atom.
  static constexpr Swizzle kSwizzle = Swizzle::b128;
  static constexpr int kAtomBytes = 128;
  static constexpr int kAtomElems = kAtomBytes / kBf16Bytes;
  static_assert(swizzle_row_bytes(kSwizzle) == kAtomBytes, "an atom row must be one swizzle row");
  static constexpr int kQkAtoms = HeadDim / kAtomElems;
  static constexpr int kVAtoms = kBlockK / kAtomElems;
  static constexpr int kQAtomBytes = kBlockQ * kAtomBytes;
  static constexpr int kQConsumerBytes = kRowsPerConsumer * kAtomBytes;  // a consumer's rows inside a Q atom
  static constexpr int kKAtomBytes = kBlockK * kAtomBytes;
  static constexpr int kVAtomBytes = HeadDim * kAtomBytes;
  static constexpr int kQBytes = kQAtomBytes * kQkAtoms;
  static constexpr int kKBytes = kKAtomBytes * kQkAtoms;
  static constexpr int kVBytes = kVAtomBytes * kVAtoms;
  // K/V ring. Each tensor-core turn of a consumer reads V of tile n − 1 and K
  // of tile n, so with two stages the load of tile n + 1 could only start
  // once both consumers' products of turn n were done; a third stage lets it
  // start one turn earlier. At D = 128 three stages leave about 1 KB.
  static constexpr int kStages = HeadDim == 128 ? 3 : 4;
  static constexpr int kSwizzleAlign = 1024;  // the 128-byte swizzle repeats every 8 rows of 128 B
  static_assert(kQConsumerBytes % kSwizzleAlign == 0 && kKAtomBytes % kSwizzleAlign == 0 &&
                    kVAtomBytes % kSwizzleAlign == 0,
                "every atom must start on a swizzle-pattern boundary");

  // wgmma k16 steps: QKᵀ reduces over D, PV over the 128 keys of a tile; one
  // k16 step of PV is one NVFP4 block of P (16 keys).
  static constexpr int kQkSteps = HeadDim / 16;
  static constexpr int kPvSteps = kBlockK / 16;
  static constexpr int kStepsPerAtom = kAtomElems / 16;
  // fp32 accumulator registers per thread: 64 rows × N columns over 128 threads.
  static constexpr int kSRegs = kRowsPerConsumer * kBlockK / kWarpgroupThreads;
  static constexpr int kORegs = kRowsPerConsumer * HeadDim / kWarpgroupThreads;

  // setmaxnreg split: the producer only issues TMA; a consumer holds O (the
  // PV accumulator), S and P (32 registers of bf16 pairs) at once.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(kWarpgroupThreads * (kProducerRegs + kConsumers * kConsumerRegs) <= kRegisterFile,
                "register split exceeds the register file");
};


// Shared memory of one CTA. Tiles first (1024-byte aligned), barriers last.
template <class Cfg>
struct alignas(Cfg::kSwizzleAlign) SharedStorage {
  std::uint8_t q[Cfg::kQBytes];
  std::uint8_t k[Cfg::kStages][Cfg::kKBytes];
  std::uint8_t v[Cfg::kStages][Cfg::kVBytes];  // Vᵀ tile: kVAtoms atoms of HeadDim rows
  std::uint64_t q_full;
  std::uint64_t kv_full[Cfg::kStages];
  std::uint64_t kv_empty[Cfg::kStages];
};

// Dynamic shared memory is only guaranteed 16-byte aligned: ask for one
// alignment unit more and align the base by hand.
template <class Cfg>
constexpr int smem_bytes() {
  return static_cast<int>(sizeof(SharedStorage<Cfg>)) + Cfg::kSwizzleAlign;
}
// The kernel's static shared memory: P's block-scale table (kernel.cuh).
inline constexpr int kStaticSmemBytes = 128 * 2 * sizeof(float);
static_assert(smem_bytes<Config<128>>() + kStaticSmemBytes <= kSmemPerBlockLimit, "D=128 shared memory over budget");
static_assert(smem_bytes<Config<64>>() + kStaticSmemBytes <= kSmemPerBlockLimit, "D=64 shared memory over budget");

}  // namespace fp4attn::sm90::fwd::nvfp4
