// dQ pass of the FP8 backward (recipe fp8, DESIGN §5): one CTA per 128-query
// tile of one (batch, query head), looping over the key tiles its rows see.
//
//   producer warpgroup (one thread): TMA Q, dO once; per key tile K, V, Kᵀ
//   consumer warpgroups 0, 1 (query rows 64c .. 64c + 63), per key tile:
//     S  = Q·Kᵀ, dP = dO·Vᵀ      wgmma m64n128k32, operands in SMEM
//     P  = E4M3 code of 2^(S·c − lse_log2 + 8) (Direct-P or exp2), −inf masked
//     dS = P·2^-8 ⊙ (dP·f − delta); scale = amax over the consumer's 64 × 128
//          half of the pair / 448 (its four warps, through SMEM and a named
//          barrier of its own: the consumers never wait for each other), also
//          written to ds_scales, where the dK/dV kernel takes the larger of
//          the two halves' as the pair's
//     dQ += (E4M3(dS / scale) · Kᵀ) · scale · k_scale   wgmma m64nDk32, dS the
//          register A operand, Kᵀ (tokens permuted) from SMEM, a fresh fp32
//          tile added to dQ in fp32 as the emulator does
//   epilogue: dQ · softmax_scale in the output's element type
#pragma once

#include "cuda/sm90/bwd/common.cuh"

namespace fp4attn::sm90::bwd {

// kLowerBound: the call has a window with a left edge; without it the masked
// tiles test the upper bound only (the forward's kernel.cuh says why).
template <int HeadDim, PCode kPCode, bool kLowerBound>
__global__ void __launch_bounds__(BwdConfig<HeadDim>::kThreads, 1)
    fp8_dq_kernel(const __grid_constant__ Fp8BackwardArgs args, const __grid_constant__ CUtensorMap tm_q,
                  const __grid_constant__ CUtensorMap tm_do, const __grid_constant__ CUtensorMap tm_k,
                  const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_kt) {
  using Cfg = BwdConfig<HeadDim>;
  static_assert(Cfg::kConsumers == kDsScalesPerPair, "ds_scales holds one scale per consumer");
  extern __shared__ std::uint8_t smem_raw[];
  auto& smem = aligned_dynamic_shared<DqShared<Cfg>, Cfg::kSwizzleAlign>(smem_raw);

  // Causal grids start with their longest CTAs (the last query tiles).
  const int q_tile = args.mask == MaskKind::none ? blockIdx.x : gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / (args.Hq / args.Hkv);
  const int q0 = q_tile * Cfg::kBlock;
  // This entry's lengths (packed sequences: its own; args.Sq, args.Sk are the longest, the grid's).
  const int seq_q = entry_tokens(args.cu_seqlens_q, batch, args.Sq);
  const int seq_k = entry_tokens(args.cu_seqlens_k, batch, args.Sk);
  if (q0 >= seq_q) return;  // a tile past a packed sequence's end: no rows, and no pair the dK/dV kernel reads
  const OperandPlace qp = operand_place(args.rows.q, args.rows.q_rows, batch, args.Sq);
  const OperandPlace kp = operand_place(args.rows.k, args.rows.k_rows, batch, args.Sk);
  // The key tiles this query tile's rows see: tile_begin .. tile_begin + k_tiles − 1.
  const int window_left = kLowerBound ? args.window_left : -1;
  const KeyBounds bounds = KeyBounds::of(args.mask, window_left, args.window_right, seq_q, seq_k);
  const int last_row = min(q0 + Cfg::kBlock, seq_q) - 1;
  const int last_key = bounds.last_key(last_row, seq_k);
  const int first_key = bounds.first_key(q0);
  const int tile_begin = first_key / Cfg::kBlock;
  const int k_tiles = last_key < first_key ? 0 : last_key / Cfg::kBlock + 1 - tile_begin;

  const int wg = threadIdx.x / kWarpgroupThreads;
  if (threadIdx.x == 0) {
    cuda::ptx::mbarrier_init(&smem.q_full, 1);
    for (int s = 0; s < Cfg::kStages; ++s) {
      cuda::ptx::mbarrier_init(&smem.full[s], 1);
      cuda::ptx::mbarrier_init(&smem.empty[s], Cfg::kConsumers * kWarpgroupThreads);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer
    set_max_registers_dec<Cfg::kProducerRegs>();
    if (threadIdx.x != 0 || k_tiles == 0) return;
    const std::int32_t q_coord[4] = {0, qp.row0 + q0, head, qp.batch};
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                         &smem.q_full, 2 * Cfg::kTileBytes);
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.q, &tm_q, q_coord,
                                    &smem.q_full);
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.d_o, &tm_do, q_coord,
                                    &smem.q_full);
    for (int n = 0; n < k_tiles; ++n) {
      const int stage = n % Cfg::kStages;
      wait_barrier(&smem.empty[stage], ((n / Cfg::kStages) & 1) ^ 1);
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                           &smem.full[stage], 3 * Cfg::kTileBytes);
      const int key0 = (tile_begin + n) * Cfg::kBlock;
      const std::int32_t k_coord[4] = {0, kp.row0 + key0, kv_head, kp.batch};
      const std::int32_t kt_coord[4] = {kp.row0 + key0, 0, kv_head, kp.batch};
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.k[stage], &tm_k,
                                      k_coord, &smem.full[stage]);
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.v[stage], &tm_v,
                                      k_coord, &smem.full[stage]);
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem.kt[stage], &tm_kt,
                                      kt_coord, &smem.full[stage]);
    }
    return;
  }

  // ---- consumers
  set_max_registers_inc<Cfg::kConsumerRegs>();
  const int consumer = wg - 1;
  const int consumer_thread = threadIdx.x - kWarpgroupThreads;
  const Fragment frag(threadIdx.x % kWarpgroupThreads);
  const int first_row = q0 + consumer * Cfg::kRowsPerConsumer;
  const int row_abs[2] = {first_row + frag.row[0], first_row + frag.row[1]};
  // The query tile and the key tiles in the operands' layout (packed: from the entry's first rows).
  const std::int64_t q_head = static_cast<std::int64_t>(qp.batch) * args.Hq + head;
  const std::int64_t q_block = q_head * qp.tiles + qp.row0 / Cfg::kBlock + q_tile;
  const std::int64_t k_block0 = (static_cast<std::int64_t>(kp.batch) * args.Hkv + kv_head) * kp.tiles +
                                kp.row0 / Cfg::kBlock;
  const float q_scale = args.q_scale[q_block];
  const float do_scale = args.do_scale[q_block];
  const float scale_log2 = args.softmax_scale * direct_p::kLog2e;
  // Row statistics are padded to whole tiles: rows past the entry's end read +inf and 0.
  const std::int64_t stat_base = q_head * (static_cast<std::int64_t>(qp.tiles) * Cfg::kBlock) + qp.row0;
  const float row_lse[2] = {args.lse_log2[stat_base + row_abs[0]], args.lse_log2[stat_base + row_abs[1]]};
  const float row_delta[2] = {args.delta[stat_base + row_abs[0]], args.delta[stat_base + row_abs[1]]};
  const auto lse = [&](int r, int) { return row_lse[r]; };
  const auto delta = [&](int r, int) { return row_delta[r]; };

  // This consumer's dS scale of every pair of the CTA's query tile, a pair
  // apart: (query tile of the layout, key tile of the longest sequence).
  const int ds_key_tiles = (args.Sk + Cfg::kBlock - 1) / Cfg::kBlock;
  float* const pair_scales = args.ds_scales + q_block * ds_key_tiles * kDsScalesPerPair + consumer;

  float dq[Cfg::kGradRegs];
#pragma unroll
  for (int i = 0; i < Cfg::kGradRegs; ++i) dq[i] = 0.0f;

  // The key tiles this consumer masks: n < masked.below or n ≥ masked.above
  // (keys past Sk, the diagonal, a window's edges), every tile of a query
  // tile with rows past Sq. The loop tests n against these two numbers only
  // (the window's bounds are found again where a tile is masked; kernel.cuh
  // of the forward says why).
  MaskedTiles masked = bounds.masked_key_tiles(first_row, Cfg::kRowsPerConsumer, Cfg::kBlock, seq_k);
  if (q0 + Cfg::kBlock > seq_q) masked = {1 << 30, 0};

  if (k_tiles > 0) {
    const std::uint8_t* q_rows = smem.q + consumer * Cfg::kConsumerBytes;
    const std::uint8_t* do_rows = smem.d_o + consumer * Cfg::kConsumerBytes;
    wait_barrier(&smem.q_full, 0);
    for (int i = 0; i < k_tiles; ++i) {
      const int stage = i % Cfg::kStages;
      const int n = tile_begin + i;  // the key tile
      const int key0 = n * Cfg::kBlock;
      const float k_scale = args.k_scale[k_block0 + n];
      const float v_scale = args.v_scale[k_block0 + n];
      wait_barrier(&smem.full[stage], (i / Cfg::kStages) & 1);

      float s[Cfg::kSRegs], dp[Cfg::kSRegs];
      wgmma_fence();
      issue_scores<Cfg>(s, q_rows, smem.k[stage]);
      wgmma_commit();
      issue_scores<Cfg>(dp, do_rows, smem.v[stage]);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(s);
      fence_registers(dp);

      // −inf outside the mask: keys ≥ seq_k, rows ≥ seq_q, keys outside the row's bounds.
      if (n < masked.below || n >= masked.above) {
        const KeyBounds b = KeyBounds::in_loop(args.mask, window_left, args.window_right, seq_q, seq_k);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int limit = row_abs[r] >= seq_q ? -1 : min(seq_k - 1, row_abs[r] + b.upper);
          const int start = row_abs[r] + b.lower;
#pragma unroll
          for (int j = 0; j < Cfg::kSRegs / 4; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = key0 + 8 * j + frag.col + e;
              if (key > limit || (kLowerBound && key < start)) s[4 * j + 2 * r + e] = neg_inf();
            }
        }
      }
      std::uint32_t p[Cfg::kTokenSteps][4];
      const float c = log2_multiplier(q_scale, k_scale, scale_log2);
      p_operand<kPCode>(s, c, lse, p);
      const float amax = ds_in_place(dp, do_scale * v_scale, delta, p);
      const float half_scale = consumer_ds_scale(amax, &smem.amax[n & 1][Cfg::kConsumerWarps / Cfg::kConsumers * consumer],
                                                 consumer, consumer_thread);
      if (consumer_thread % kWarpgroupThreads == 0) pair_scales[n * kDsScalesPerPair] = half_scale;
      const float ds_scale = half_scale > 0.0f ? half_scale : 1.0f;
      std::uint32_t a[Cfg::kTokenSteps][4];
      ds_operand(dp, ds_scale, a);

      float part[Cfg::kGradRegs];
      fence_operand(a);
      wgmma_fence();
      issue_grad<Cfg>(part, a, smem.kt[stage]);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(part);
      fence_operand(a);
      cuda::ptx::mbarrier_arrive(&smem.empty[stage]);
      // K's scale is one per key tile: it factors out of the tile's sum.
      const float factor = ds_scale * k_scale;
#pragma unroll
      for (int i = 0; i < Cfg::kGradRegs; ++i) dq[i] = fmaf(part[i], factor, dq[i]);
    }
  }
  // Staged in this consumer's halves of Q and dO, which no product reads any more.
  store_rows_staged<HeadDim>(dq, args.softmax_scale, frag, first_row, seq_q, args.out_type, args.dq,
                             entry_offset(args.dq, args.cu_seqlens_q, batch), head,
                             smem.q + consumer * Cfg::kConsumerBytes, smem.d_o + consumer * Cfg::kConsumerBytes,
                             consumer, threadIdx.x % kWarpgroupThreads);
}

}  // namespace fp4attn::sm90::bwd
