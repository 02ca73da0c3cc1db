// dK/dV pass of the FP8 backward (recipe fp8, DESIGN §5): one CTA per
// 128-key tile of one (batch, KV head), looping over every query tile of
// every query head of its GQA group that sees the tile. Working on the
// transposed problem puts Pᵀ and dSᵀ in the accumulator layout, so both are
// register A operands of the gradient products:
//
//   producer warpgroup (one thread): TMA K, V once; per query tile Q, dO,
//     Qᵀ, dOᵀ and the tile's lse_log2 and delta (bulk copies)
//   consumer warpgroups 0, 1 (keys 64c .. 64c + 63), per query tile:
//     Sᵀ = K·Qᵀ                 → Pᵀ codes (−inf masked), as the dQ pass
//     dV += (Pᵀ·dOᵀ) · 2^-8 · do_scale
//     dPᵀ = V·dOᵀ               → dSᵀ, E4M3 codes with the pair's scale (two
//                                 passes: the dQ kernel's; one pass: the amax
//                                 over both consumers)
//     dK += (dSᵀ·Qᵀ) · scale · q_scale
//   The products run one after another: dK, dV (fp32) and one 64 × 128 tile
//   in flight fill the consumer's registers.
//   DqMode::one_pass, per query tile as well: the dSᵀ codes go to shared
//     memory as a (query, key slot) tile; once both consumers' halves are
//     there, dQ part = dS·Kᵀ-tile for 64 queries, times scale · k_scale, is
//     added to fp32 sums (finalize_dq scales them afterwards) by bulk
//     reductions from shared memory: at D = 64 from a stage of its own, at
//     D = 128 from ring tiles the pair has finished with
//   epilogue: dK · softmax_scale and dV in the output's element type
#pragma once

#include "cuda/sm90/bwd/common.cuh"

namespace fp4attn::sm90::bwd {

// kLowerBound as in dq_kernel.cuh.
template <int HeadDim, PCode kPCode, DqMode kDqMode, bool kLowerBound>
__global__ void __launch_bounds__(BwdConfig<HeadDim>::kThreads, 1)
    fp8_dkv_kernel(const __grid_constant__ Fp8BackwardArgs args, const __grid_constant__ CUtensorMap tm_q,
                   const __grid_constant__ CUtensorMap tm_do, const __grid_constant__ CUtensorMap tm_qt,
                   const __grid_constant__ CUtensorMap tm_dot, const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_kt) {
  constexpr bool kOnePass = kDqMode == DqMode::one_pass;
  using Cfg = BwdConfig<HeadDim>;
  // Two products in flight per consumer: dPᵀ beside Sᵀ, and in the one pass
  // dQ's beside dK's. At D = 64 the registers allow it (dK, dV take 64, not 128).
  constexpr bool kOverlap = Cfg::kProductPairs;
  // One pass at D = 128: no room for a stage of its own, so dQ's part goes to
  // this pair's Q, dO and dOᵀ tiles (no product reads them after the pair's dS
  // barrier) and the other dS buffer. The ring slot is then free once every
  // consumer thread is done with it (its arrival, as in the other modes) and
  // the reduction has read it (one more arrival per consumer, by its issuer).
  constexpr bool kDqInRing = kOnePass && !Cfg::kDqStaged;
  constexpr int kEmptyArrivals = Cfg::kConsumers * kWarpgroupThreads + (kDqInRing ? Cfg::kConsumers : 0);
  extern __shared__ std::uint8_t smem_raw[];
  auto& smem = aligned_dynamic_shared<DkvShared<Cfg>, Cfg::kSwizzleAlign>(smem_raw);

  const int k_tile = blockIdx.x;  // causal: the first key tiles see the most queries and start first
  const int kv_head = blockIdx.y, batch = blockIdx.z;
  const int group = args.Hq / args.Hkv;
  const int k0 = k_tile * Cfg::kBlock;
  // This entry's lengths (packed sequences: its own; args.Sq, args.Sk are the longest, the grid's).
  const int seq_q = entry_tokens(args.cu_seqlens_q, batch, args.Sq);
  const int seq_k = entry_tokens(args.cu_seqlens_k, batch, args.Sk);
  if (k0 >= seq_k) return;  // a tile past a packed sequence's end: no keys
  const OperandPlace qp = operand_place(args.rows.q, args.rows.q_rows, batch, args.Sq);
  const OperandPlace kp = operand_place(args.rows.k, args.rows.k_rows, batch, args.Sk);
  const int window_left = kLowerBound ? args.window_left : -1;
  const KeyBounds bounds = KeyBounds::of(args.mask, window_left, args.window_right, seq_q, seq_k);
  // Query tiles of this entry (the layout's are qp.tiles, from qp.row0 / 128 on).
  const int entry_q_blocks = (seq_q + Cfg::kBlock - 1) / Cfg::kBlock;
  // Query i sees key j iff i + lower ≤ j ≤ i + upper: the first query that
  // sees key k0 and the last that sees the tile's last key.
  const int first_query = bounds.bounded_above ? max(0, k0 - bounds.upper) : 0;
  const int last_query =
      bounds.bounded_below ? min(seq_q - 1, min(k0 + Cfg::kBlock, seq_k) - 1 - bounds.lower) : seq_q - 1;
  const int first_q_tile = first_query >= seq_q ? entry_q_blocks : first_query / Cfg::kBlock;
  const int q_tiles = last_query < first_query ? 0 : last_query / Cfg::kBlock + 1 - first_q_tile;
  const int iterations = q_tiles * group;

  const int wg = threadIdx.x / kWarpgroupThreads;
  if (threadIdx.x == 0) {
    cuda::ptx::mbarrier_init(&smem.kv_full, 1);
    for (int s = 0; s < Cfg::kStages; ++s) {
      cuda::ptx::mbarrier_init(&smem.full[s], 1);
      cuda::ptx::mbarrier_init(&smem.empty[s], kEmptyArrivals);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  __syncthreads();

  const std::int64_t stat_row = static_cast<std::int64_t>(qp.tiles) * Cfg::kBlock;  // the layout's padded rows
  if (wg == 0) {
    // ---- producer
    set_max_registers_dec<Cfg::kProducerRegs>();
    if (threadIdx.x != 0 || iterations == 0) return;
    const std::int32_t k_coord[4] = {0, kp.row0 + k0, kv_head, kp.batch};
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                         &smem.kv_full, (kOnePass ? 3 : 2) * Cfg::kTileBytes);
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.k, &tm_k, k_coord,
                                    &smem.kv_full);
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.v, &tm_v, k_coord,
                                    &smem.kv_full);
    if constexpr (kOnePass) {
      const std::int32_t kt_coord[4] = {kp.row0 + k0, 0, kv_head, kp.batch};
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.kt, &tm_kt, kt_coord,
                                      &smem.kv_full);
    }
    for (int n = 0; n < iterations; ++n) {
      const int stage = n % Cfg::kStages;
      const int head = kv_head * group + n / q_tiles;
      const int qt = first_q_tile + n % q_tiles;
      wait_barrier(&smem.empty[stage], ((n / Cfg::kStages) & 1) ^ 1);
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                           &smem.full[stage], 4 * Cfg::kTileBytes + 2 * Cfg::kRowStatBytes);
      const std::int32_t q_coord[4] = {0, qp.row0 + qt * Cfg::kBlock, head, qp.batch};
      const std::int32_t t_coord[4] = {qp.row0 + qt * Cfg::kBlock, 0, head, qp.batch};
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.q[stage], &tm_q,
                                      q_coord, &smem.full[stage]);
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.d_o[stage], &tm_do,
                                      q_coord, &smem.full[stage]);
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.qt[stage], &tm_qt,
                                      t_coord, &smem.full[stage]);
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.d_ot[stage], &tm_dot,
                                      t_coord, &smem.full[stage]);
      const std::int64_t stats =
          (static_cast<std::int64_t>(qp.batch) * args.Hq + head) * stat_row + qp.row0 + qt * Cfg::kBlock;
      cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.lse_log2[stage],
                               args.lse_log2 + stats, Cfg::kRowStatBytes, &smem.full[stage]);
      cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.delta[stage],
                               args.delta + stats, Cfg::kRowStatBytes, &smem.full[stage]);
    }
    return;
  }

  // ---- consumers
  set_max_registers_inc<Cfg::kConsumerRegs>();
  const int consumer = wg - 1;
  const int consumer_thread = threadIdx.x - kWarpgroupThreads;
  const Fragment frag(threadIdx.x % kWarpgroupThreads);
  // Issues this consumer's bulk reductions of dQ (DqMode::one_pass).
  const bool dq_issuer = threadIdx.x % kWarpgroupThreads == 0;
  const int first_key = k0 + consumer * Cfg::kRowsPerConsumer;
  const int key_abs[2] = {first_key + frag.row[0], first_key + frag.row[1]};
  // The key tile in the operands' layout; the dS scales' key tiles are the longest sequence's.
  const std::int64_t k_block = (static_cast<std::int64_t>(kp.batch) * args.Hkv + kv_head) * kp.tiles +
                               kp.row0 / Cfg::kBlock + k_tile;
  const float k_scale = args.k_scale[k_block];
  const float v_scale = args.v_scale[k_block];
  const int ds_key_tiles = (args.Sk + Cfg::kBlock - 1) / Cfg::kBlock;
  const int q_tile0 = qp.row0 / Cfg::kBlock;  // the entry's first query tile in the layout
  const float scale_log2 = args.softmax_scale * direct_p::kLog2e;

  float dk[Cfg::kGradRegs], dv[Cfg::kGradRegs];
#pragma unroll
  for (int i = 0; i < Cfg::kGradRegs; ++i) dk[i] = dv[i] = 0.0f;

  // The query tiles this consumer masks: qt < masked.below or qt ≥
  // masked.above (rows past Sq, the diagonal, a window's edges), every one
  // of a key tile with keys past Sk. The loop tests qt against these two
  // numbers only (the window's bounds are found again where a tile is
  // masked; the forward's kernel.cuh says why).
  MaskedTiles masked = bounds.masked_query_tiles(first_key, Cfg::kRowsPerConsumer, Cfg::kBlock, seq_q);
  if (k0 + Cfg::kBlock > seq_k) masked = {1 << 30, 0};

  if (iterations > 0) {
    const std::uint8_t* k_rows = smem.k + consumer * Cfg::kConsumerBytes;
    const std::uint8_t* v_rows = smem.v + consumer * Cfg::kConsumerBytes;
    wait_barrier(&smem.kv_full, 0);
    for (int n = 0; n < iterations; ++n) {
      const int stage = n % Cfg::kStages;
      const int head = kv_head * group + n / q_tiles;
      const int qt = first_q_tile + n % q_tiles;
      const int q0 = qt * Cfg::kBlock;
      const std::int64_t q_head = static_cast<std::int64_t>(qp.batch) * args.Hq + head;
      const std::int64_t q_block = q_head * qp.tiles + q_tile0 + qt;
      const float q_scale = args.q_scale[q_block];
      const float do_scale = args.do_scale[q_block];
      // Two passes: the pair's dS scale from the dQ kernel's two halves (the
      // same dS values, so the larger half's is the pair's amax / 448; 1 when
      // both are 0), loaded early so that S hides the load. They are combined
      // where dS needs them: combined here, the warp waited for the load
      // before it issued S.
      static_assert(Cfg::kConsumers == kDsScalesPerPair, "one scale per consumer of the dQ kernel");
      const float2 halves = kOnePass ? float2{} : *reinterpret_cast<const float2*>(
          args.ds_scales + (q_block * ds_key_tiles + k_tile) * kDsScalesPerPair);
      wait_barrier(&smem.full[stage], (n / Cfg::kStages) & 1);
      const float* lse_tile = smem.lse_log2[stage];
      const float* delta_tile = smem.delta[stage];
      // Columns are queries: element e of this thread is query 8(e/4) + col + e%2.
      const auto column = [&](int e) { return 8 * (e / 4) + frag.col + (e & 1); };
      const auto lse = [&](int, int e) { return lse_tile[column(e)]; };
      const auto delta = [&](int, int e) { return delta_tile[column(e)]; };

      std::uint32_t p[Cfg::kTokenSteps][4];
      float dp[Cfg::kSRegs];
      {
        float s[Cfg::kSRegs];
        wgmma_fence();
        issue_scores<Cfg>(s, k_rows, smem.q[stage]);
        wgmma_commit();
        if constexpr (kDqInRing) {
          // While S runs: the previous pair's reduction has read its slot, which may be refilled.
          if (n > 0 && dq_issuer) {
            cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
            cuda::ptx::mbarrier_arrive(&smem.empty[(n - 1) % Cfg::kStages]);
          }
        }
        if constexpr (kOverlap) {
          // dPᵀ = V·dOᵀ runs while this consumer turns S into P.
          issue_scores<Cfg>(dp, v_rows, smem.d_o[stage]);
          wgmma_commit();
          wgmma_wait<1>();
        } else {
          wgmma_wait<0>();
        }
        fence_registers(s);
        if (qt < masked.below || qt >= masked.above) {
          const KeyBounds b = KeyBounds::in_loop(args.mask, window_left, args.window_right, seq_q, seq_k);
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int j = 0; j < Cfg::kSRegs / 4; ++j)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int query = q0 + 8 * j + frag.col + e;
                const bool hidden = key_abs[r] >= seq_k || query >= seq_q || key_abs[r] > query + b.upper ||
                                    (kLowerBound && key_abs[r] < query + b.lower);
                if (hidden) s[4 * j + 2 * r + e] = neg_inf();
              }
        }
        p_operand<kPCode>(s, log2_multiplier(q_scale, k_scale, scale_log2), lse, p);
      }
      std::uint32_t a[Cfg::kTokenSteps][4];
      float ds_scale;
      // dS codes from dP (and P): the pair's scale, then the A operand.
      const auto ds_codes = [&] {
        fence_registers(dp);
        if constexpr (kOnePass) {
          const float amax = ds_in_place(dp, do_scale * v_scale, delta, p);
          ds_scale = pair_ds_scale(amax, smem.amax[n & 1], consumer_thread);
        } else {
          ds_in_place<false>(dp, do_scale * v_scale, delta, p);
          const float larger = fmaxf(halves.x, halves.y);
          ds_scale = larger > 0.0f ? larger : 1.0f;
        }
        ds_operand(dp, ds_scale, a);
      };
      {
        float part[Cfg::kGradRegs];
        fence_operand(p);
        wgmma_fence();
        issue_grad<Cfg>(part, p, smem.d_ot[stage]);
        wgmma_commit();
        if constexpr (kOverlap) {
          wgmma_wait<1>();  // dP is done; dV's product runs while dS is formed
          ds_codes();
        }
        wgmma_wait<0>();
        fence_registers(part);
        fence_operand(p);
        // dO's scale is one per query tile: it factors out of the tile's sum.
        const float factor = kPUnscale * do_scale;
#pragma unroll
        for (int i = 0; i < Cfg::kGradRegs; ++i) dv[i] = fmaf(part[i], factor, dv[i]);
      }
      if constexpr (!kOverlap) {
        wgmma_fence();
        issue_scores<Cfg>(dp, v_rows, smem.d_o[stage]);
        wgmma_commit();
        wgmma_wait<0>();
        ds_codes();
      }
      if constexpr (kOnePass) {
        // dS as the A tile of dQ = dS·K: row = query, byte = key slot (the Kᵀ tile's order).
        store_ds_tile(a, smem.ds[n & 1], consumer * Cfg::kRowsPerConsumer, frag);
        // Generic-proxy writes, read by the tensor core: fence, then both halves.
        cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
        // The stage is written again after this barrier: the previous pair's
        // reduction (a pair ago, long done) must have read it.
        if constexpr (Cfg::kDqStaged)
          if (dq_issuer) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
        named_barrier_sync(kBarrierDsTile, kPairThreads);
      }
      // One pass with two products in flight: dQ's product runs while dK's part is added.
      constexpr bool kDkWithDq = kOnePass && kOverlap;
      float dq_part[Cfg::kGradRegs];
      {
        float part[Cfg::kGradRegs];
        fence_operand(a);
        wgmma_fence();
        issue_grad<Cfg>(part, a, smem.qt[stage]);
        wgmma_commit();
        if constexpr (kDkWithDq) {
          issue_dq<Cfg>(dq_part, smem.ds[n & 1] + consumer * Cfg::kRowsPerConsumer * Cfg::kBlock, smem.kt);
          wgmma_commit();
          wgmma_wait<1>();
        } else {
          wgmma_wait<0>();
        }
        fence_registers(part);
        fence_operand(a);
        cuda::ptx::mbarrier_arrive(&smem.empty[stage]);
        const float factor = ds_scale * q_scale;
#pragma unroll
        for (int i = 0; i < Cfg::kGradRegs; ++i) dk[i] = fmaf(part[i], factor, dk[i]);
      }
      if constexpr (kOnePass) {
        float (&part)[Cfg::kGradRegs] = dq_part;
        if constexpr (!kDkWithDq) {
          wgmma_fence();
          issue_dq<Cfg>(part, smem.ds[n & 1] + consumer * Cfg::kRowsPerConsumer * Cfg::kBlock, smem.kt);
          wgmma_commit();
        }
        wgmma_wait<0>();
        fence_registers(part);
        // K's scale is one per key tile, the dS scale one per pair.
        const float factor = ds_scale * k_scale;
        const int first_row = q0 + consumer * Cfg::kRowsPerConsumer;  // a multiple of 8
        float* sums = args.dq_accum + (q_head * stat_row + qp.row0 + first_row) * HeadDim;
        if constexpr (Cfg::kDqStaged) {
          float* stage = smem.dq_stage.rows[consumer];
          stage_dq_part<HeadDim>(part, factor, frag, stage, Cfg::kRowsPerConsumer);
          // Generic-proxy writes, read by the bulk copy: fence, then all of this consumer's rows.
          cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
          named_barrier_sync(kBarrierDqStage + consumer, kWarpgroupThreads);
          if (dq_issuer) {
            cuda::ptx::cp_reduce_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add, sums,
                                            stage, Cfg::kRowsPerConsumer * HeadDim * sizeof(float));
            cuda::ptx::cp_async_bulk_commit_group();
          }
        } else {
          // Rows 0–31 (warps 0, 1) and 32–63 (warps 2, 3) of this consumer's part, 16 KB each.
          constexpr int kHalfRows = Cfg::kRowsPerConsumer / 2;
          static_assert(kHalfRows * HeadDim * sizeof(float) == Cfg::kTileBytes, "a half fills one tile");
          std::uint8_t* halves[2] = {consumer == 0 ? smem.q[stage] : smem.d_ot[stage],
                                     consumer == 0 ? smem.d_o[stage] : smem.ds[(n + 1) & 1]};
          const int half = frag.row[0] / kHalfRows;
          stage_dq_part<HeadDim>(part, factor, frag, reinterpret_cast<float*>(half == 0 ? halves[0] : halves[1]),
                                 kHalfRows);
          cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
          named_barrier_sync(kBarrierDqStage + consumer, kWarpgroupThreads);
          if (dq_issuer) {
#pragma unroll
            for (int h = 0; h < 2; ++h)
              cuda::ptx::cp_reduce_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add,
                                              sums + h * kHalfRows * HeadDim,
                                              reinterpret_cast<const float*>(halves[h]), Cfg::kTileBytes);
            cuda::ptx::cp_async_bulk_commit_group();
          }
        }
      }
    }
  }
  // The last reduction must have read the stage before the CTA ends.
  if constexpr (kOnePass)
    if (dq_issuer) cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
  // Staged in this consumer's halves of K and V, which no product reads any more.
  std::uint8_t* piece0 = smem.k + consumer * Cfg::kConsumerBytes;
  std::uint8_t* piece1 = smem.v + consumer * Cfg::kConsumerBytes;
  const int thread_in_wg = threadIdx.x % kWarpgroupThreads;
  store_rows_staged<HeadDim>(dk, args.softmax_scale, frag, first_key, seq_k, args.out_type, args.dk,
                             entry_offset(args.dk, args.cu_seqlens_k, batch), kv_head, piece0, piece1, consumer,
                             thread_in_wg);
  store_rows_staged<HeadDim>(dv, 1.0f, frag, first_key, seq_k, args.out_type, args.dv,
                             entry_offset(args.dv, args.cu_seqlens_k, batch), kv_head, piece0, piece1, consumer,
                             thread_in_wg);
}

}  // namespace fp4attn::sm90::bwd
