// FP8 attention forward with Direct-P for sm_90a (recipe fp8, DESIGN §4).
//
// One CTA computes 128 query rows of one (batch, query head) (192 with three
// consumers, D = 64; launch_head_dim.cuh picks); at D = 256 half of their O
// columns, beside the CTA that computes the other half (Fp8Config::kOSplits):
//
//   producer warpgroup (one thread issues, the rest idle at 24 registers)
//     TMA Q[128 × D] once                                    → q_full
//     for each 128-key tile n: wait kv_empty[stage],
//       TMA K[128 × D] and Vᵀ[D × 128] into the stage        → kv_full[stage]
//   consumer warpgroups 0 and 1 (rows 64c .. 64c + 63, 240 registers; or
//   0, 1 and 2 at 160 registers: Fp8Config)
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
//              (keys 80 .. 127 of the tile by MUFU ex2; p_operand.cuh)
//     turn N: PV of the last tile, added to O the same way
//   epilogue: O·v_scale / l → bf16 into shared memory, stored by TMA (or by
//     the threads where O's rows are not 16-byte aligned);
//     LSE = (m + log2 l − 8)·ln 2 (+ smooth_k shift)
//
// kFp4In (recipe mxfp4 with MXFP4 in memory): the producer warpgroup loads
// FP4 codes instead and expands them into the same E4M3 tiles, all 128
// threads of it (fp4_expand.cuh); the consumers do not change.
//
// Ping-pong: consumer c issues its wgmmas only after the other consumer has
// issued its own (named turn barriers), so the tensor core runs one
// consumer's PV and QKᵀ back to back while the other consumer does softmax.
// Three consumers (D = 64) issue without turns (Fp8Config::kConsumerTurns).
//
// P goes from the accumulator layout to the A-operand layout with byte packing
// only: the quantizer stores V's keys in the matching order (see
// pack_p_operand), so no shuffle is needed.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cuda/ptx>

#include "cuda/sm90/fwd/fp8_direct_p/config.h"
#include "cuda/sm90/fwd/fp8_direct_p/fp4_expand.cuh"
#include "cuda/sm90/fwd/fp8_direct_p/p_operand.cuh"
#include "cuda/sm90/fwd/fp8_direct_p/timeline.cuh"
#include "fp4attn/direct_p.hpp"

namespace fp4attn::sm90::fwd {

// Descriptors of stage 0's K and Vᵀ tiles, built once; the tiles of stage s
// lie s stage strides further, so their descriptors are one add away
// (desc_advance: the address field cannot carry). Rebuilding each descriptor
// from its address in every turn cost ≈ 20 uniform-datapath instructions per
// tile (ncu of v10, docs/perf-log.md v11).
template <class Cfg>
struct StageDescriptors {
  std::uint64_t k0, v0;
  static constexpr std::uint32_t kKStride = Cfg::kKBytes / 16, kVStride = Cfg::kVStageBytes / 16;
  FP4ATTN_DEVICE_INLINE std::uint64_t k(unsigned stage) const { return desc_advance(k0, stage * kKStride); }
  FP4ATTN_DEVICE_INLINE std::uint64_t v(unsigned stage) const { return desc_advance(v0, stage * kVStride); }
};

// Descriptor offset (16-byte units) of Q·Kᵀ's k32 step t in a tile of
// `panel_bytes` per panel: 32 bytes along the row inside a panel, then the
// next panel (D = 256).
template <class Cfg>
FP4ATTN_DEVICE_INLINE constexpr std::uint32_t qk_step_offset(int t, int panel_bytes) {
  return t / Cfg::kQkStepsPerPanel * (panel_bytes / 16) + t % Cfg::kQkStepsPerPanel * kDescK32Step;
}

// S = Q·Kᵀ for one consumer's 64 rows and one K tile, into a fresh fp32 tile.
template <class Cfg>
FP4ATTN_DEVICE_INLINE void issue_qk(float (&s)[Cfg::kSRegs], std::uint64_t desc_q, std::uint64_t desc_k) {
  wgmma_m64n128k32_ss_init(s, desc_q, desc_k);
#pragma unroll
  for (int t = 1; t < Cfg::kQkSteps; ++t)
    wgmma_m64n128k32_ss(s, desc_advance(desc_q, qk_step_offset<Cfg>(t, Cfg::kQPanelBytes)),
                        desc_advance(desc_k, qk_step_offset<Cfg>(t, Cfg::kKPanelBytes)));
}

// PV = P·[V | 1] for one tile: B has the D rows of Vᵀ and, right after them
// (the next 8-row group of the descriptor), kOnesRows rows of ones, so
// columns D .. D + 7 of the result are the row sums of P as the tensor core
// adds them (the emulator models l the same way). The FP8 tensor core keeps
// only about 14 significant bits while accumulating, so each tile's product
// starts from zero and is added to O and l in fp32 by accumulate_o (DESIGN §3.4).
template <class Cfg>
FP4ATTN_DEVICE_INLINE void issue_pv(float (&pv)[Cfg::kPvRegs], const std::uint32_t (&p)[Cfg::kPvSteps][4],
                                    std::uint64_t desc_v) {
  if constexpr (Cfg::kOColumns == 128) {
    wgmma_m64n136k32_rs_init(pv, p[0], desc_v);
#pragma unroll
    for (int t = 1; t < Cfg::kPvSteps; ++t) wgmma_m64n136k32_rs(pv, p[t], desc_advance(desc_v, t * kDescK32Step));
  } else if constexpr (Cfg::kOColumns == 96) {
    wgmma_m64n104k32_rs_init(pv, p[0], desc_v);
#pragma unroll
    for (int t = 1; t < Cfg::kPvSteps; ++t) wgmma_m64n104k32_rs(pv, p[t], desc_advance(desc_v, t * kDescK32Step));
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
  // that no −inf − (−inf) appears. (One FMNMX against −FLT_MAX instead of the
  // compare and select measured 2–3 % slower at D = 128: v11 in the perf log.)
  // c is per row (Q's factor may differ per row).
  // P may overwrite s (mxfp4_exp2): the scores are dead once P is packed.
  template <PCode kPCode, bool kMxExponentByAdd, int N>
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
    if constexpr (kPCode == PCode::mxfp4_direct_p) pack_p_operand_mx<kMxExponentByAdd>(s, c, m_use, bm, p);
    else if constexpr (kPCode == PCode::mxfp4_exp2) pack_p_operand_mx_exp2(s, c, m_use, mx_round_up, p);
    else pack_p_operand<kPCode>(s, c, m_use, p);
  }
};

// kNarrowD: args.D is narrower than the kernel (a multiple of 8). TMA fills the
// missing channels of Q and K, and Vᵀ's missing rows, with zeros
// (launch_head_dim.cuh), so they add exact zeros to every score; their O
// columns are not stored (the TMA store's map is args.D wide, the threads'
// store skips them). A separate instance, so that the kernels' own head dims
// keep their code. kUsedDim 96 (with kNarrowD, on the 128-wide tiles): the
// products over the first 96 channels only (Fp8Config). kLowerBound: the call
// has a window with a left edge (args.window_left ≥ 0); without it the kernel
// ignores args.window_left and its masked tiles test the upper bound only.
template <int HeadDim, int kConsumers, PCode kPCode, bool kFp4In, bool kNarrowD, int kUsedDim, bool kLowerBound>
__global__ void __launch_bounds__(Fp8Config<HeadDim, kConsumers, kUsedDim>::kThreads,
                                  Fp8Config<HeadDim, kConsumers, kUsedDim>::kCtasPerSm)
    fp8_forward_kernel(const __grid_constant__ Fp8ForwardArgs args, const __grid_constant__ CUtensorMap tm_q,
                       const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_vt,
                       const __grid_constant__ CUtensorMap tm_o, bool o_by_tma) {
  using Cfg = Fp8Config<HeadDim, kConsumers, kUsedDim>;
  static_assert(kUsedDim == HeadDim || (kNarrowD && !kFp4In), "a narrower product is for narrower E4M3 operands");
  static_assert(!kFp4In || kConsumers == 2, "the MXFP4 expansion fills 128 query rows, one per producer thread");
  static_assert(!kFp4In || Cfg::kOSplits == 1, "the MXFP4 expansion fills one panel of Q and K");
  constexpr int kOGroupsBeforeS = Cfg::kORegs / 4 - Cfg::kOGroupsAfterS;
  // log2 of the factor P's codes carry: 2^8, for E4M3 P (2^(u + 8)) and FP4
  // P (q·2^(E + 8), kPRowExponent) alike.
  constexpr float kPOffset = direct_p::kFp8Offset;
  extern __shared__ std::uint8_t smem_raw[];
  auto& smem = *reinterpret_cast<SharedStorage<Cfg, kFp4In>*>(
      (reinterpret_cast<std::uintptr_t>(smem_raw) + Cfg::kSwizzleAlign - 1) & ~std::uintptr_t{Cfg::kSwizzleAlign - 1});

  // Causal grids run their longest CTAs (last query blocks) first. At D = 256
  // the kOSplits CTAs of a query block are neighbours (the same Q and K tiles).
  const int q_tile = args.mask == MaskKind::none ? blockIdx.x : gridDim.x - 1 - blockIdx.x;
  const int q_block = q_tile / Cfg::kOSplits;
  const int o_split = q_tile % Cfg::kOSplits;  // which kOColumns of O (and rows of Vᵀ) this CTA takes
  const int head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / (args.Hq / args.Hkv);
  const int q0 = q_block * Cfg::kBlockQ;
  // Packed sequences: this batch entry's own lengths, args.Sq and args.Sk
  // being the longest (the operands' layout). A query block past the
  // entry's end has nothing to do.
  const bool packed = args.cu_seqlens_q != nullptr;
  const int seq_q = packed ? args.cu_seqlens_q[batch + 1] - args.cu_seqlens_q[batch] : args.Sq;
  const int seq_k = packed ? args.cu_seqlens_k[batch + 1] - args.cu_seqlens_k[batch] : args.Sk;
  if (q0 >= seq_q) return;
  // Where the entry's operands sit: packed, rows q_row0 (k_row0) on of the
  // one-entry tile-aligned layout; otherwise entry `batch` from row 0.
  const int op_batch = packed ? 0 : batch;
  const int q_row0 = packed ? args.rows_q[batch] : 0, k_row0 = packed ? args.rows_k[batch] : 0;
  // The rows of Q's and K's codes: the layout's, or the caller's packed rows (qk_in_place).
  const bool in_place = packed && args.qk_in_place;
  const int q_code_row0 = in_place ? args.cu_seqlens_q[batch] : q_row0;
  const int k_code_row0 = in_place ? args.cu_seqlens_k[batch] : k_row0;
  const int k_layout_rows = packed ? static_cast<int>(args.k_rows) : args.Sk;
  // Bottom-right alignment: query i sees key j ≤ i + Sk − Sq (causal), and a
  // sliding window bounds the keys on either side of that diagonal.
  const int window_left = kLowerBound ? args.window_left : -1;
  const KeyBounds bounds = KeyBounds::of(args.mask, window_left, args.window_right, seq_q, seq_k);
  const int num_k_tiles = (k_layout_rows + Cfg::kBlockK - 1) / Cfg::kBlockK;  // k_scale's pitch
  // Tiles outside the keys the CTA's rows see (causal, a window) are skipped,
  // never masked: tiles tile_begin .. tile_begin + k_tiles − 1 run.
  const int last_row = min(q0 + Cfg::kBlockQ, seq_q) - 1;
  const int last_key = bounds.last_key(last_row, seq_k);
  const int first_key = bounds.first_key(q0);
  const int tile_begin = first_key / Cfg::kBlockK;
  const int k_tiles = last_key < first_key ? 0 : last_key / Cfg::kBlockK + 1 - tile_begin;
  // Consumers that own at least one row below Sq; the others leave at once
  // (the last CTA of a sequence that does not fill it: with three consumers
  // at D = 64, S = 4096 ends on a CTA of 64 rows).
  const int active = min(Cfg::kConsumers, (seq_q - q0 + Cfg::kRowsPerConsumer - 1) / Cfg::kRowsPerConsumer);

  // Warp-uniform by construction (lane 0's value), so that the compiler can
  // keep the warpgroup index and what derives from it (the turn barrier ids,
  // Q's descriptor) in uniform registers instead of recomputing them from
  // threadIdx in every iteration.
  const int wg = __shfl_sync(kFullWarp, static_cast<int>(threadIdx.x / kWarpgroupThreads), 0);
  timeline::mark(timeline::kProducer, timeline::kEntry);
  timeline::mark(timeline::kProducer, timeline::kEntryNs);
  timeline::mark(timeline::kProducer, timeline::kSm);
  if (threadIdx.x == 0) {
    // Filled by TMA (one arrival with the byte count) or, expanding FP4, by
    // the producer warpgroup's 128 threads.
    constexpr unsigned kFillers = kFp4In ? kWarpgroupThreads : 1;
    cuda::ptx::mbarrier_init(&smem.q_full, kFillers);
    for (int s = 0; s < Cfg::kStages; ++s) {
      cuda::ptx::mbarrier_init(&smem.kv_full[s], kFillers);
      cuda::ptx::mbarrier_init(&smem.kv_empty[s], active * kWarpgroupThreads);
    }
    if constexpr (kFp4In) {
      cuda::ptx::mbarrier_init(&smem.fp4.q_full, 1);
      for (int s = 0; s < Fp4Staging<Cfg>::kStages; ++s) cuda::ptx::mbarrier_init(&smem.fp4.full[s], 1);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  // The ones rows after every Vᵀ stage (E4M3 1.0 = 0x38), made visible to
  // the tensor core's async proxy before any wgmma reads them.
  constexpr int kOnesWords = Cfg::kOnesBytes / 4;
  for (int i = threadIdx.x; i < Cfg::kStages * kOnesWords; i += Cfg::kThreads)
    reinterpret_cast<std::uint32_t*>(smem.v[i / kOnesWords] + Cfg::kVBytes)[i % kOnesWords] = 0x38383838u;
  if constexpr (kPCode == PCode::mxfp4_direct_p) fill_p_fold_table(threadIdx.x, Cfg::kThreads);
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
  __syncthreads();

  if (wg == 0) {
    // ---- producer
    if constexpr (kFp4In) {
      set_max_registers_dec<Cfg::kExpandingProducerRegs>();
      produce_expanded<Cfg>(smem, args, &tm_vt, q0, head, kv_head, batch, tile_begin, k_tiles);
      return;
    }
    set_max_registers_dec<Cfg::kProducerRegs>();
    if (threadIdx.x != 0) return;
    timeline::mark(timeline::kProducer, timeline::kProducerStart);
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                         &smem.q_full, Cfg::kQBytes);
#pragma unroll
    for (int panel = 0; panel < Cfg::kQkPanels; ++panel) {
      const std::int32_t q_coord[4] = {panel * Cfg::kQkPanelBytes, q_code_row0 + q0, head, op_batch};
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                      smem.q + panel * Cfg::kQPanelBytes, &tm_q, q_coord, &smem.q_full);
    }
    for (int n = 0; n < k_tiles; ++n) {
      const int stage = n % Cfg::kStages;
      wait_barrier(&smem.kv_empty[stage], ((n / Cfg::kStages) & 1) ^ 1);
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                           &smem.kv_full[stage], Cfg::kKBytes + Cfg::kVBytes);
#pragma unroll
      for (int panel = 0; panel < Cfg::kQkPanels; ++panel) {
        const std::int32_t k_coord[4] = {panel * Cfg::kQkPanelBytes, k_code_row0 + (tile_begin + n) * Cfg::kBlockK,
                                         kv_head, op_batch};
        cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                        smem.k[stage] + panel * Cfg::kKPanelBytes, &tm_k, k_coord,
                                        &smem.kv_full[stage]);
      }
      const std::int32_t v_coord[4] = {k_row0 + (tile_begin + n) * Cfg::kBlockK, o_split * Cfg::kOColumns, kv_head,
                                       op_batch};
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.v[stage], &tm_vt,
                                      v_coord, &smem.kv_full[stage]);
    }
    return;
  }

  // ---- consumers
  const int consumer = wg - 1;
  if (consumer >= active) return;
  set_max_registers_inc<kFp4In ? Cfg::kExpandingConsumerRegs : Cfg::kConsumerRegs>();
  const Fragment frag(threadIdx.x % kWarpgroupThreads);
  const int first_row = q0 + consumer * Cfg::kRowsPerConsumer;
  const int row_abs[2] = {first_row + frag.row[0], first_row + frag.row[1]};
  const std::uint64_t desc_q = make_kmajor_desc<Cfg::kQkSwizzle>(smem.q + consumer * Cfg::kQConsumerBytes);
  const StageDescriptors<Cfg> stages{make_kmajor_desc<Cfg::kQkSwizzle>(smem.k[0]),
                                     make_kmajor_desc<Cfg::kVSwizzle>(smem.v[0])};
  const int q_layout_rows = packed ? static_cast<int>(args.q_rows) : args.Sq;
  const int q_groups = (q_layout_rows + args.q_scale_rows - 1) / args.q_scale_rows;
  const float* q_scale_head =
      args.q_scale + (static_cast<std::int64_t>(op_batch) * args.Hq + head) * q_groups + q_row0 / args.q_scale_rows;
  float q_scale[2];  // rows past Sq read the last row's scale and are never stored
#pragma unroll
  for (int r = 0; r < 2; ++r) q_scale[r] = q_scale_head[min(row_abs[r], seq_q - 1) / args.q_scale_rows];
  // From the CTA's first tile on: index n below is the CTA's n-th tile.
  const float* k_scale = args.k_scale + (static_cast<std::int64_t>(op_batch) * args.Hkv + kv_head) * num_k_tiles +
                         k_row0 / Cfg::kBlockK + tile_begin;
  // This (entry, head)'s LSE shifts, row 0 on (read by the epilogue when smooth_k).
  const float* lse_shift_rows =
      args.lse_shift + (static_cast<std::int64_t>(op_batch) * args.Hq + head) * q_layout_rows + q_row0;
  const float scale_log2 = args.softmax_scale * direct_p::kLog2e;
  const bool mx_round_up = args.mx_scale_rule == MxScaleRule::round_up;

  // Runs `use(frag, row_abs)`. Three consumers run at 160 registers, and
  // their tile loop spills: for them the fragment and its rows are rebuilt
  // from a fresh read of threadIdx where the mask and the epilogue need them,
  // which keeps them out of the loop's registers (two fewer local-memory
  // accesses per tile, +1 %). With two consumers (240 registers) rebuilding
  // measured −2 to −3 % (docs/perf-log.md v22); they use the prologue's.
  auto with_fragment = [&](auto&& use) {
    if constexpr (kConsumers == 3) {
      const Fragment f(thread_index_reread() % kWarpgroupThreads);
      const int rows[2] = {first_row + f.row[0], first_row + f.row[1]};
      use(f, rows);
    } else {
      use(frag, row_abs);
    }
  };

  // Only partial tiles and tiles that cross one of this consumer's bounds
  // (the causal diagonal, a window's edges) need the mask: the CTA's tiles
  // n < mask_below and n ≥ mask_above. The others are visible in full, and
  // the loop tests n against these two numbers only: a window's bounds are
  // found again where a tile is masked, so that they hold no register
  // through the loop (a per-tile test on them measured −2 to −6 % on calls
  // without a window, perf log sw1).
  const MaskedTiles masked = bounds.masked_key_tiles(first_row, Cfg::kRowsPerConsumer, Cfg::kBlockK, seq_k);
  const int mask_below = masked.below - tile_begin, mask_above = masked.above - tile_begin;
  auto mask_tile = [&](float (&s)[Cfg::kSRegs], int n) {
    if (n < mask_below || n >= mask_above)
      with_fragment([&](const Fragment& f, const int (&rows)[2]) {
        const KeyBounds b = KeyBounds::in_loop(args.mask, window_left, args.window_right, seq_q, seq_k);
        mask_scores<kLowerBound>(s, f, (tile_begin + n) * Cfg::kBlockK, rows, seq_k, b);
      });
  };

  float o[Cfg::kORegs];
#pragma unroll
  for (int i = 0; i < Cfg::kORegs; ++i) o[i] = 0.0f;
  OnlineSoftmax softmax;

  // What the epilogue reads from global memory, loaded before the last PV so
  // that the loads' latency hides behind it (ncu of v8b: the LSE and the
  // non-finite check waited for these loads at the end of every CTA).
  // V's channel factors of this head; with three consumers found only when
  // loaded, so that the pointer is not held through the loop either.
  // (At D = 256 the factors of this CTA's columns, o_split · kOColumns on.)
  auto v_scale_of_head = [&] {
    if constexpr (kNarrowD) return args.v_scale + (static_cast<std::int64_t>(batch) * args.Hkv + kv_head) * args.D;
    else return args.v_scale + (static_cast<std::int64_t>(batch) * args.Hkv + kv_head) * HeadDim;
  };
  const float* v_scale_early = kConsumers == 3 ? nullptr : v_scale_of_head();
  const int first_column = o_split * Cfg::kOColumns;
  float2 vs[Cfg::kOColumns / 8];  // this thread's columns first_column + 8j + col, + 1
  float lse_shift[2] = {0.0f, 0.0f};
  bool poisoned = false;
  auto load_epilogue_inputs = [&] {
    with_fragment([&](const Fragment& frag, const int (&row_abs)[2]) {
      const float* v_scale = kConsumers == 3 ? v_scale_of_head() : v_scale_early;
#pragma unroll
      for (int j = 0; j < Cfg::kOColumns / 8; ++j) {
        if constexpr (kNarrowD)  // the missing channels take channel D − 2's factor
          vs[j] = *reinterpret_cast<const float2*>(v_scale + min(first_column + 8 * j + frag.col, args.D - 2));
        else
          vs[j] = *reinterpret_cast<const float2*>(v_scale + first_column + 8 * j + frag.col);
      }
      // Non-finite input (flagged by the quantizer, which ran earlier on the
      // stream) turns every output into NaN rather than numbers made from it.
      poisoned = args.nonfinite != nullptr && (args.nonfinite[0] | args.nonfinite[1] | args.nonfinite[2]) != 0;
#pragma unroll
      for (int r = 0; r < 2; ++r)
        if (args.lse_shift != nullptr && frag.col == 0 && row_abs[r] < seq_q)
          lse_shift[r] = lse_shift_rows[row_abs[r]];
    });
  };

  if (k_tiles > 0) {
    const TurnOrder<Cfg::kConsumers, Cfg::kConsumerTurns> turn{consumer, active};
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
    timeline::mark(timeline::kConsumer, timeline::kQReady);

    // Turn 0: S of tile 0 alone, then its softmax.
    set_c(0);
    wait_barrier(&smem.kv_full[0], 0);
    timeline::mark(timeline::kConsumer, timeline::kKv0Ready);
    turn.wait();
    wgmma_fence();
    issue_qk<Cfg>(s, desc_q, stages.k(0));
    wgmma_commit();
    turn.pass(false);
    wgmma_wait<0>();
    fence_registers(s);
    timeline::mark(timeline::kConsumer, timeline::kS0Done);
    mask_tile(s, 0);
    softmax.step<kPCode, Cfg::kMxExponentByAdd>(s, c, mx_round_up, p, alpha);
    timeline::mark(timeline::kConsumer, timeline::kSoftmax0Done);

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
      issue_pv<Cfg>(pv, p, stages.v(prev));
      wgmma_commit();
      issue_qk<Cfg>(s, desc_q, stages.k(stage));
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
      softmax.step<kPCode, Cfg::kMxExponentByAdd>(s, c, mx_round_up, p, alpha);
    }

    // Last turn: PV of the last tile.
    timeline::mark(timeline::kConsumer, timeline::kLoopEnd);
    timeline::mark(timeline::kOther, timeline::kOtherLoopEnd);
    load_epilogue_inputs();
    turn.wait();
    timeline::mark(timeline::kConsumer, timeline::kLastTurn);
    fence_p(p);
    wgmma_fence();
    issue_pv<Cfg>(pv, p, stages.v((k_tiles - 1) % Cfg::kStages));
    wgmma_commit();
    turn.pass(true);
    wait_pv<0, Cfg>(pv, p);
    timeline::mark(timeline::kConsumer, timeline::kLastPvDone);
    accumulate_o<0, Cfg::kORegs / 4, true>(o, softmax.l, alpha, pv);
  } else {
    load_epilogue_inputs();
  }

  // ---- epilogue: O = O·v_scale / l in bf16; LSE in natural log
  with_fragment([&](const Fragment& frag, const int (&row_abs)[2]) {
    float row_sum[2], inv_sum[2];
    bool empty[2];  // fully masked row: O = 0, LSE = −inf
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_sum[r] = poisoned ? __int_as_float(0x7FC00000) : softmax.l[r];
      empty[r] = row_sum[r] == 0.0f;
      inv_sum[r] = empty[r] ? 0.0f : 1.0f / row_sum[r];
    }
    // 1/l first, then V's channel factor: the emulator's order, so O rounds
    // the same also when v_scale is not a power of two.
    auto o_pair = [&](int j, int r) {
      return __floats2bfloat162_rn(o[4 * j + 2 * r] * inv_sum[r] * vs[j].x,
                                   o[4 * j + 2 * r + 1] * inv_sum[r] * vs[j].y);
    };
    auto store_lse = [&] {  // by the first of a query block's kOSplits CTAs
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (frag.col == 0 && row_abs[r] < seq_q && o_split == 0) {
          // Packed: (Hq, total query tokens); else (B, Hq, Sq).
          const std::int64_t lse_index =
              packed ? head * args.lse_pitch + args.cu_seqlens_q[batch] + row_abs[r]
                     : (static_cast<std::int64_t>(batch) * args.Hq + head) * args.Sq + row_abs[r];
          args.lse[lse_index] =
              empty[r] ? neg_inf() : (softmax.m[r] + log2f(row_sum[r]) - kPOffset) * kLn2 + lse_shift[r];
        }
      }
    };
    bool stored = false;
    if constexpr (!kFp4In) {
      // Packed sequences: TMA for a consumer whose 64 rows all lie in its
      // entry (the map spans every entry's rows, so it would not clip at
      // the entry's end); the entry's last rows go by the threads below.
      if (o_by_tma && (!packed || first_row + Cfg::kRowsPerConsumer <= seq_q)) {
        // Row ρ's 16-byte chunk c of a box sits at chunk c ^ (ρ mod 8): the
        // 128-byte swizzle, which also spreads each warp store (8 rows, one
        // chunk each) over all banks. Rows past Sq are clipped by TMA. A
        // thread's two rows are 8 apart, so they share ρ mod 8: per chunk
        // one address, and the boxes and the second row are immediate
        // offsets of shared-space stores.
        using Stage = OStaging<Cfg>;
        std::uint8_t* stage = smem.o_stage.rows[consumer];
        const auto row0 = static_cast<std::uint32_t>(__cvta_generic_to_shared(stage)) +
                          frag.row[0] * Stage::kBoxRowBytes + 2 * frag.col;
        const int swizzle = frag.row[0] & 7;
#pragma unroll
        for (int chunk = 0; chunk < 8; ++chunk) {
          const std::uint32_t at = row0 + 16 * (chunk ^ swizzle);
#pragma unroll
          for (int box = 0; box < Stage::kBoxes; ++box)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              // 96 columns: the second box's last four chunks hold nothing (the O map, D ≤ 96 wide, clips them).
              if (8 * box + chunk >= Cfg::kOColumns / 8) continue;
              const __nv_bfloat162 v = o_pair(8 * box + chunk, r);
              asm volatile("st.shared.b32 [%0], %1;" ::"r"(at + box * Stage::kBoxBytes + r * 8 * Stage::kBoxRowBytes),
                           "r"(*reinterpret_cast<const std::uint32_t*>(&v))
                           : "memory");
            }
        }
        cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
        named_barrier_sync(kBarrierOStaged + consumer, kWarpgroupThreads);
        const bool issuer = threadIdx.x % kWarpgroupThreads == 0;
        if (issuer) {
#pragma unroll
          for (int box = 0; box < Stage::kBoxes; ++box) {
            // Packed: one map over all entries' rows (token row cu_seqlens_q[batch] + first_row).
            const std::int32_t coord[4] = {2 * first_column + box * Stage::kBoxRowBytes,
                                           packed ? args.cu_seqlens_q[batch] + first_row : first_row, head,
                                           packed ? 0 : batch};
            cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, &tm_o, coord,
                                            stage + box * Stage::kBoxBytes);
          }
          cuda::ptx::cp_async_bulk_commit_group();
        }
        // The LSE while the copy engine reads the staged rows.
        store_lse();
        // Shared memory must outlive the copies' reads; their writes finish on their own.
        if (issuer) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
        stored = true;
      }
    }
    if (!stored) {
      // Packed: the entry's rows start at token row cu_seqlens_q[batch].
      const std::int64_t entry = packed ? args.cu_seqlens_q[batch] * args.o_stride_s : batch * args.o_stride_b;
      auto* out = static_cast<__nv_bfloat16*>(args.o) + entry + head * args.o_stride_h + first_column;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (row_abs[r] >= seq_q) continue;
        __nv_bfloat16* out_row = out + static_cast<std::int64_t>(row_abs[r]) * args.o_stride_s;
#pragma unroll
        for (int j = 0; j < Cfg::kOColumns / 8; ++j)
          if constexpr (kNarrowD) {
            if (first_column + 8 * j + frag.col < args.D)
              *reinterpret_cast<__nv_bfloat162*>(out_row + 8 * j + frag.col) = o_pair(j, r);
          } else {
            *reinterpret_cast<__nv_bfloat162*>(out_row + 8 * j + frag.col) = o_pair(j, r);
          }
      }
      store_lse();
    }
  });
  timeline::mark(timeline::kConsumer, timeline::kEnd);
  timeline::mark(timeline::kOther, timeline::kOtherEnd);
  timeline::mark(timeline::kOther, timeline::kOtherEndNs);
}

}  // namespace fp4attn::sm90::fwd
