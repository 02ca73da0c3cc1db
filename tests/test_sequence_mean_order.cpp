// The smooth_k mean's summation order, checked without a GPU: chunks of 128
// tokens summed on their own, then the chunk sums in order (the GPU
// quantizers reproduce it bit for bit).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "fp4attn/quantize.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn {
namespace {

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

}  // namespace
}  // namespace fp4attn
