// The two orders the GPU FP8 quantizer relies on, checked without a GPU:
// the smooth_k mean's summation order (chunks of 128 tokens, which the device
// reproduces bit for bit), and the fused kernel's work order (every unit
// exactly once, each quantize unit after all statistics of its slice).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/quantize/work_order.hpp"
#include "fp4attn/quantize.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn {
namespace {

using cuda_quantize::Unit;
using cuda_quantize::UnitKind;
using cuda_quantize::WorkOrder;

// K = 2^60 at token 0, 2 at tokens 128..255, -2^60 at token 256: the chunk
// sums 2^60, 256 and -2^60 keep the 256 (mean 256 / 257), while one running
// sum loses every 2 against 2^60 (mean 0).
TEST(SequenceMeanOrder, SumsEachChunkOnItsOwn) {
  const std::int64_t B = 1, S = 2 * kSequenceMeanChunk + 1, H = 2, D = 3;
  std::vector<float> k(static_cast<std::size_t>(B * S * H * D));
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(k.size()); ++i) {
    const std::int64_t token = i / (H * D);
    k[i] = token == 0 ? 0x1p60f : token == S - 1 ? -0x1p60f : token >= kSequenceMeanChunk ? 2.0f : 0.0f;
  }
  for (float m : sequence_mean(k, B, S, H, D)) EXPECT_EQ(m, static_cast<float>(256.0 / 257.0));
}

TEST(SequenceMeanOrder, MatchesTheDocumentedOrder) {
  const std::int64_t B = 2, S = 1000, H = 3, D = 8;
  std::mt19937 rng(std::random_device{}());
  std::lognormal_distribution<float> wide(0.0f, 6.0f);  // magnitudes over many binades: the order shows
  std::vector<float> k(static_cast<std::size_t>(B * S * H * D));
  for (float& x : k) x = (rng() & 1u ? 1.0f : -1.0f) * wide(rng);
  const std::vector<float> mean = sequence_mean(k, B, S, H, D);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t d = 0; d < D; ++d) {
        double total = 0.0;
        for (std::int64_t s0 = 0; s0 < S; s0 += kSequenceMeanChunk) {
          double chunk = 0.0;
          for (std::int64_t s = s0; s < std::min(S, s0 + kSequenceMeanChunk); ++s)
            chunk += k[bshd_index(S, H, D, b, s, h, d)];
          total += chunk;
        }
        ASSERT_EQ(mean[(b * H + h) * D + d], static_cast<float>(total / static_cast<double>(S)))
            << "b=" << b << " h=" << h << " d=" << d;
      }
}

struct OrderCase {
  std::int64_t B, Hq, Hkv, Sq, Sk;
};

// Token blocks of a sequence: the quantizer's chunks are the mean's chunks.
std::int64_t blocks_of(std::int64_t S) { return (S + kSequenceMeanChunk - 1) / kSequenceMeanChunk; }

TEST(QuantizeWorkOrder, EveryUnitOnceAndAfterItsSlicesStatistics) {
  const OrderCase cases[] = {{1, 1, 1, 1, 1}, {2, 4, 2, 300, 257}, {1, 8, 2, 640, 1500}, {3, 2, 2, 129, 4096}};
  for (const OrderCase& c : cases) {
    const std::int64_t chunks_per_slice = blocks_of(c.Sk), slices = c.B * c.Hkv;
    const std::int64_t q_blocks = blocks_of(c.Sq);
    for (bool smooth_k : {true, false})
      for (std::int64_t lag : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, slices * chunks_per_slice}) {
        WorkOrder order;
        order.kv_chunks = slices * chunks_per_slice;
        order.q_chunks = c.B * c.Hq * q_blocks;
        order.lead = std::min(order.kv_chunks, chunks_per_slice + lag);
        order.smooth_k = smooth_k;
        const std::string where = "B=" + std::to_string(c.B) + " Hq=" + std::to_string(c.Hq) +
                                  " Sk=" + std::to_string(c.Sk) + " smooth_k=" + std::to_string(smooth_k) +
                                  " lag=" + std::to_string(lag);

        // Per kind, the ticket of each chunk's unit (-1: not seen).
        constexpr int kKinds = static_cast<int>(UnitKind::q_quantize) + 1;
        std::vector<std::int64_t> ticket_of[kKinds];
        for (auto& t : ticket_of) t.assign(static_cast<std::size_t>(std::max(order.kv_chunks, order.q_chunks)), -1);
        for (std::int64_t t = 0; t < order.tickets(); ++t) {
          const Unit u = order.unit(t);
          const bool q_unit = u.kind == UnitKind::q_quantize;
          ASSERT_GE(u.chunk, 0) << where;
          ASSERT_LT(u.chunk, q_unit ? order.q_chunks : order.kv_chunks) << where;
          std::int64_t& seen = ticket_of[static_cast<int>(u.kind)][u.chunk];
          ASSERT_EQ(seen, -1) << "unit handed out twice " << where;
          seen = t;
        }
        // Ticket of the last statistics unit of each slice.
        std::vector<std::int64_t> slice_done(static_cast<std::size_t>(slices), -1);
        for (std::int64_t x = 0; x < order.kv_chunks; ++x)
          for (UnitKind kind : {UnitKind::k_stats, UnitKind::v_stats}) {
            const std::int64_t t = ticket_of[static_cast<int>(kind)][x];
            ASSERT_GE(t, 0) << "statistics unit missing " << where;
            slice_done[x / chunks_per_slice] = std::max(slice_done[x / chunks_per_slice], t);
          }
        for (std::int64_t x = 0; x < order.kv_chunks; ++x) {
          const std::int64_t v = ticket_of[static_cast<int>(UnitKind::v_quantize)][x];
          const std::int64_t k = ticket_of[static_cast<int>(UnitKind::k_quantize)][x];
          EXPECT_GT(v, slice_done[x / chunks_per_slice]) << "v_quantize " << x << " " << where;
          if (smooth_k) EXPECT_GT(k, slice_done[x / chunks_per_slice]) << "k_quantize " << x << " " << where;
          else EXPECT_EQ(k, -1) << "k_quantize without smooth_k " << where;
        }
        for (std::int64_t x = 0; x < order.q_chunks; ++x) {
          const std::int64_t bh = x / q_blocks, b = bh / c.Hq, h = bh % c.Hq;
          const std::int64_t slice = b * c.Hkv + h / (c.Hq / c.Hkv);
          EXPECT_GT(ticket_of[static_cast<int>(UnitKind::q_quantize)][x], slice_done[slice])
              << "q_quantize " << x << " " << where;
        }
      }
  }
}

}  // namespace
}  // namespace fp4attn
