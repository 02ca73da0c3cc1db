// Tile sizes, pipeline depth and register split of the FP8 Direct-P forward
// kernel, with the shared-memory budget checked at compile time.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/sm90/fwd/consumer_common.cuh"
#include "cuda/sm90/fwd/fwd.hpp"
#include "cuda/sm90/ptx.cuh"

namespace fp4attn::sm90::fwd {

// One producer warpgroup (TMA) and Consumers warpgroups of 64 query rows
// that take turns at the tensor core. Two at D = 128; at D = 64 also three:
// a D = 64 tile has half the tensor work of D = 128 but not a shorter
// softmax, so with two consumers the tensor core idles 64 % of the time
// (NOTES.md, "D = 64") and a third softmax stream fills part of it.
//
// D = 256 (E4M3 in memory: recipe fp8, and the MX recipes' fold): a
// consumer's fp32 O at 256 columns (128 registers) beside the fresh PV tile
// that DESIGN §3.4 adds to it (132) exceeds the 240 registers, so O is split
// by columns: two CTAs per query block, each computing the whole S = Q·Kᵀ
// over 256 channels and its own 128 columns of O (kOSplits). The second
// Q·Kᵀ is the price: 1.5 times the tensor work of the useful product, at
// D = 128's registers.
//
// UsedDim 96 on the 128-wide layout (head dims 72 … 96, read with zero
// channels): Q·Kᵀ takes the first three of the four k32 steps (the fourth
// multiplies zeros, which add nothing to any sum) and PV has N = 96 + 8, so
// a quarter of the tensor work and of O's registers and updates go; the
// tiles, their TMA boxes and swizzles are the 128-wide kernel's.
template <int HeadDim, int Consumers = 2, int UsedDim = HeadDim>
struct Fp8Config {
  static_assert(HeadDim == 64 || HeadDim == 128 || HeadDim == 256, "head dims 64, 128 and 256 are implemented");
  static_assert(Consumers == 2 || ((Consumers == 1 || Consumers == 3) && HeadDim == 64) ||
                    (Consumers == 1 && HeadDim == 128),
                "three consumers fit the registers at D = 64 only; one runs at D = 64 and (exp2 P) 128");
  static_assert(UsedDim == HeadDim || (HeadDim == 128 && UsedDim == 96 && Consumers == 2),
                "of the layouts, only the 128-wide one runs narrower (96 channels)");
  static constexpr int kHeadDim = HeadDim;  // the tiles' channels (Q·Kᵀ's reduction at most)
  static constexpr int kUsedDim = UsedDim;  // channels the products reduce over and compute
  static constexpr int kConsumers = Consumers;
  // O's columns one CTA computes, and the CTAs that share a query block.
  static constexpr int kOColumns = UsedDim < 128 ? UsedDim : 128;
  static constexpr int kOSplits = UsedDim / kOColumns;
  // A consumer warpgroup owns 64 query rows (the M of every wgmma), so a
  // consumer's S tile is one m64n128 product. The keys of a tile are the FP8
  // recipe's K scale block (DESIGN §2): each tile's K scale is one scalar.
  // Q's scale is looked up per row (q_scale_rows), so kBlockQ may span blocks.
  static constexpr int kRowsPerConsumer = 64;
  static constexpr int kBlockQ = kRowsPerConsumer * kConsumers;
  static constexpr int kBlockK = 128;
  static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
  // CTAs resident on an SM. With one consumer (D = 64; D = 128 with exp2 P), two: a CTA's start
  // (set-up, Q's and the first tiles' latency) and end (the last PV, the
  // epilogue) run beside the other CTA's tiles instead of leaving the SM's
  // tensor core idle. With two or three consumers one (the registers: 384
  // threads at up to 240 a thread). Where CTAs see few key tiles (short
  // sequences) those ≈ 7 400 cycles a CTA are most of its time (perf log
  // sc1). At D = 128 the same pair of CTAs (perf log v17) streams twice the
  // K and V from L2 for the same work, and under sustained load the card's
  // power limit takes more clock than the overlap saves with Direct-P (sc2);
  // exp2 P's longer softmax leaves the tensor core idle between two
  // consumers' turns, which the other CTA fills (perf log sc3).
  static constexpr int kCtasPerSm = kConsumers == 1 ? 2 : 1;
  // Two consumers take turns at the tensor core (ping-pong). Three issue
  // whenever they are ready: at D = 64 the tensor core is busy about 40 % of
  // the time, and a fixed order only made ready consumers wait (v13g: +1–2 %).
  // One consumer shares the tensor core with the other CTA's, in no fixed order.
  static constexpr bool kConsumerTurns = kConsumers == 2;
  // Recipe mxfp4's block exponents by an add on the FMA pipe instead of
  // F2I on the XU pipe, which three softmax streams at once keep busy
  // (p_operand.cuh, MxBlockExponent).
  static constexpr bool kMxExponentByAdd = kConsumers == 3;

  // K-major rows of Q and K are HeadDim bytes: 128 B rows use the 128-byte
  // swizzle, 64 B rows the 64-byte one. Vᵀ rows are kBlockK = 128 keys = 128 B.
  // A swizzle atom is at most 128 B wide, so at D = 256 Q and K lie in two
  // panels of 128 channels, each a tile of 128-byte rows (kQkPanels).
  static constexpr int kQkPanelBytes = HeadDim < 128 ? HeadDim : 128;
  static constexpr int kQkPanels = HeadDim / kQkPanelBytes;
  static constexpr Swizzle kQkSwizzle = kQkPanelBytes == 128 ? Swizzle::b128 : Swizzle::b64;
  static constexpr Swizzle kVSwizzle = Swizzle::b128;
  static_assert(swizzle_row_bytes(kQkSwizzle) == kQkPanelBytes, "one Q/K panel row must be one swizzle atom");
  static_assert(swizzle_row_bytes(kVSwizzle) == kBlockK, "one Vᵀ row must be one swizzle atom");

  static constexpr int kQBytes = kBlockQ * HeadDim;
  static constexpr int kQPanelBytes = kBlockQ * kQkPanelBytes;
  static constexpr int kQConsumerBytes = kRowsPerConsumer * kQkPanelBytes;  // a consumer's rows in each panel
  static constexpr int kKBytes = kBlockK * HeadDim;
  static constexpr int kKPanelBytes = kBlockK * kQkPanelBytes;
  static constexpr int kVBytes = kOColumns * kBlockK;  // the Vᵀ rows of this CTA's O columns
  // Eight rows of E4M3 ones follow each Vᵀ tile: PV runs with N = D + 8 and
  // its last eight columns are the row sums of P, summed by the tensor core
  // (no decode of P on the CUDA cores). Written once; TMA never touches them.
  static constexpr int kOnesRows = 8;
  static constexpr int kOnesBytes = kOnesRows * kBlockK;
  static constexpr int kVStageBytes = kVBytes + kOnesBytes;
  static constexpr int kPvN = kOColumns + kOnesRows;
  // Stages of the K/V ring. Each tensor-core turn of a consumer reads two
  // tiles (V of tile n − 1 for PV, K of tile n for QKᵀ), so two more stages
  // keep loads landing about two tiles ahead of use. At D = 256 (49 KB of K
  // and Vᵀ a stage beside 64 KB of Q and O's staging) three fit; its turns
  // are longer.
  // With one consumer at D = 128 (two CTAs an SM: each within half the
  // shared memory) two: 33 KB of K and Vᵀ a stage beside Q's 8 KB and O's 16 KB.
  static constexpr int kStages = HeadDim == 256 ? 3 : (HeadDim == 128 && kConsumers == 1) ? 2 : 4;
  static constexpr int kSwizzleAlign = 1024;  // the 128-byte swizzle repeats every 8 rows of 128 B
  static_assert(kQConsumerBytes % kSwizzleAlign == 0 && kKBytes % kSwizzleAlign == 0 &&
                    kVStageBytes % kSwizzleAlign == 0 && kOnesBytes == kSwizzleAlign,
                "every tile must start on a swizzle-pattern boundary");

  // wgmma k32 steps: QKᵀ reduces over D, PV over the 128 keys of a tile.
  static constexpr int kQkSteps = UsedDim / 32;
  static constexpr int kQkStepsPerPanel = kQkPanelBytes / 32;
  static constexpr int kPvSteps = kBlockK / 32;
  // fp32 accumulator registers per thread: 64 rows × N columns over 128 threads.
  static constexpr int kSRegs = kRowsPerConsumer * kBlockK / kWarpgroupThreads;
  static constexpr int kORegs = kRowsPerConsumer * kOColumns / kWarpgroupThreads;
  static constexpr int kPvRegs = kRowsPerConsumer * kPvN / kWarpgroupThreads;  // O's columns, then the row sums

  // 8-column groups of O updated after S = Q·Kᵀ is complete rather than
  // while it runs: they interleave with the row max (see the consumer loop).
  // 6 of 16 at D = 128 measured +2 % over none (v8b, docs/perf-log.md);
  // since the shorter issue block of v11, 4 of 16 (2 of 8 at D = 64)
  // measured best of 2, 4, 6 and 10. With three consumers 4 of 8 beat 2 and
  // 8 by 3–4 % (v13b), and ptxas spills half as much (32 against 68 bytes).
  static constexpr int kOGroupsAfterS = kConsumers == 3 ? 4 : kOColumns / 8 * 2 / 8;

  // setmaxnreg split: the producer only issues TMA; a consumer holds, at its
  // peak, O, the PV tile in flight, S and P: at D = 128 that is 64 + 68 + 64
  // + 16 registers before addresses and softmax state (see NOTES.md for why
  // this keeps softmax from overlapping the consumer's own products). With
  // three consumers the CTA's 4 × 128 registers a thread leave each consumer
  // 160 beside a 24-register producer; D = 64 needs 32 + 36 + 64 + 16 of them
  // at the turn, and ptxas spills 8 to 10 words of loop state (ptxas -v).
  // One consumer: its CTA's 2 × 128 registers a thread leave it 232.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kConsumers == 1 ? 232 : kConsumers == 2 ? 240 : 160;
  // setmaxnreg moves registers only within what the CTA got at launch: the
  // per-thread count ptxas allocates under __launch_bounds__(kThreads,
  // kCtasPerSm), the register file over the SM's threads rounded down to 8
  // (168 with two consumers, 128 with three or one), for every warp.
  static constexpr int kLaunchRegs = kRegisterFile / (kThreads * kCtasPerSm) / 8 * 8;
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (1 + kConsumers) * kLaunchRegs,
                "register split exceeds the CTA's registers");
  // With MXFP4 operands in memory the whole producer warpgroup expands them
  // (fp4_expand.cuh, two consumers only); it needs 40 registers to run
  // without spills, which the consumers give up (232 each: no spills either,
  // by ptxas -v).
  static constexpr int kExpandingProducerRegs = 40;
  static constexpr int kExpandingConsumerRegs = 232;
  static_assert(kConsumers != 2 ||
                    kExpandingProducerRegs + kConsumers * kExpandingConsumerRegs <= (1 + kConsumers) * kLaunchRegs,
                "register split exceeds the CTA's registers");
};

// MXFP4 codes staged for the expansion into E4M3 (fp4_expand.cuh): Q once,
// and a ring of K and Vᵀ tiles that TMA fills ahead of the producer.
template <class Cfg>
struct Fp4Staging {
  static constexpr int kStages = 3;
  static constexpr int kQBytes = Cfg::kBlockQ * Cfg::kHeadDim / 2;
  static_assert(Cfg::kOSplits == 1, "the expansion fills whole Q and K rows of one panel");
  static constexpr int kKBytes = Cfg::kBlockK * Cfg::kHeadDim / 2;
  static constexpr int kVBytes = Cfg::kHeadDim * Cfg::kBlockK / 2;  // D rows of 64 bytes (128 keys)
  alignas(128) std::uint8_t q[kQBytes];
  alignas(128) std::uint8_t k[kStages][kKBytes];
  alignas(128) std::uint8_t v[kStages][kVBytes];
  std::uint64_t q_full;
  std::uint64_t full[kStages];
};
struct NoFp4Staging {};

// O in bf16 on its way out: each consumer writes its 64 rows here and one of
// its threads stores them with TMA, in boxes of 64 rows × 128 bytes (64
// columns) laid out with the 128-byte swizzle. Stores from the accumulator
// layout (4 bytes a lane, 8 rows per warp instruction) kept a CTA's threads
// ≈ 3 400 cycles at the end (perf log, "Timeline of a CTA").
template <class Cfg>
struct OStaging {
  static constexpr int kBoxRowBytes = 128;
  static constexpr int kBoxes = (Cfg::kOColumns * 2 + kBoxRowBytes - 1) / kBoxRowBytes;  // 96 columns: 1.5
  static constexpr int kBoxBytes = Cfg::kRowsPerConsumer * kBoxRowBytes;
  alignas(1024) std::uint8_t rows[Cfg::kConsumers][kBoxes * kBoxBytes];
};

static_assert(kBarrierConsumerTurn + Fp8Config<64, 3>::kConsumers <= kBarrierFp4Staging,
              "the turn barriers' ids run into the FP4 staging barrier's");

// Shared memory of one CTA. Tiles first (1024-byte aligned), then the FP4
// staging when the kernel expands MXFP4 itself, barriers last.
template <class Cfg, bool kFp4In>
struct alignas(Cfg::kSwizzleAlign) SharedStorage {
  std::uint8_t q[Cfg::kQBytes];
  std::uint8_t k[Cfg::kStages][Cfg::kKBytes];
  std::uint8_t v[Cfg::kStages][Cfg::kVStageBytes];  // Vᵀ tile, then kOnesRows rows of ones
  [[no_unique_address]] std::conditional_t<kFp4In, Fp4Staging<Cfg>, NoFp4Staging> fp4;
  // The expanding kernel's FP4 staging leaves no room for it: it stores O directly.
  [[no_unique_address]] std::conditional_t<kFp4In, NoFp4Staging, OStaging<Cfg>> o_stage;
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
static_assert(smem_bytes<Fp8Config<64, 3>, false>() <= kSmemPerBlockLimit, "D=64, 3 consumers: over budget");
// Two CTAs an SM: each within half of the SM's 228 KB, less the 1 KB the
// system reserves per CTA.
inline constexpr int kSmemPerSm = 228 * 1024, kSmemReservedPerCta = 1024;
static_assert(smem_bytes<Fp8Config<64, 1>, false>() <= kSmemPerSm / 2 - kSmemReservedPerCta,
              "D=64, one consumer: two CTAs an SM do not fit");
static_assert(smem_bytes<Fp8Config<128, 1>, false>() <= kSmemPerSm / 2 - kSmemReservedPerCta,
              "D=128, one consumer: two CTAs an SM do not fit");
static_assert(smem_bytes<Fp8Config<256>, false>() <= kSmemPerBlockLimit, "D=256 shared memory over budget");
static_assert(smem_bytes<Fp8Config<128, 2, 96>, false>() <= kSmemPerBlockLimit, "D=96 shared memory over budget");

}  // namespace fp4attn::sm90::fwd
