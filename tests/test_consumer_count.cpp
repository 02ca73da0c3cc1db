// The FP8 forward's choice of three consumer warpgroups at D = 64, and of
// one where a CTA's keys are few
// (src/cuda/sm90/fwd/fp8_direct_p/consumer_count.hpp), on the shapes whose
// timings set them, for an H200's 132 SMs.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/sm90/fwd/fp8_direct_p/consumer_count.hpp"

namespace fp4attn {
namespace {

using sm90::fwd::one_consumer_pays_off;
using sm90::fwd::three_consumers_pay_off;
constexpr std::int64_t kH200Sms = 132;

// bench/bench_fwd.py's D = 64 grid: B·S = 32k tokens, 32 heads.
bool grid(std::int64_t S, bool causal) { return three_consumers_pay_off(32768 / S, 32, S, causal, kH200Sms); }

TEST(ThreeConsumers, NoncausalGridFrom2k) {
  EXPECT_FALSE(grid(1024, false));  // 47 waves of 192 rows against 63 of 128: 1.07x the time
  for (const std::int64_t S : {2048, 4096, 8192, 16384}) EXPECT_TRUE(grid(S, false)) << S;
}

TEST(ThreeConsumers, CausalGridFrom8k) {
  // Measured: −1 % at 2k and 4k, +4 % at 8k, +7 % at 16k (perf log v13c).
  for (const std::int64_t S : {1024, 2048, 4096}) EXPECT_FALSE(grid(S, true)) << S;
  for (const std::int64_t S : {8192, 16384}) EXPECT_TRUE(grid(S, true)) << S;
}

TEST(ThreeConsumers, ShortOrFewSequencesKeepTwo) {
  EXPECT_FALSE(three_consumers_pay_off(64, 16, 577, false, kH200Sms));  // ViT-L/14 at 336 px
  EXPECT_FALSE(three_consumers_pay_off(2, 2, 513, false, kH200Sms));    // one wave either way
  EXPECT_FALSE(three_consumers_pay_off(1, 1, 1, false, kH200Sms));
}

TEST(ThreeConsumers, NeverWhenTwoConsumersFitOneWave) {
  for (std::int64_t heads = 1; heads <= 64; ++heads)
    for (std::int64_t S = 1; S <= 8192; S += 37) {
      if (heads * ((S + 127) / 128) > kH200Sms) continue;
      EXPECT_FALSE(three_consumers_pay_off(1, heads, S, false, kH200Sms)) << heads << " heads, S = " << S;
    }
}

// One consumer (two CTAs an SM) at D = 64 up to 1024 keys: +7 to +10 % over
// two in bursts, +6 / +9 % under sustained load at S = 1k; causal up to 2048
// keys +3 % sustained; at D = 128 up to −4 % under sustained load with
// Direct-P (perf log sc1, sc2, sc3). With exp2 P one wherever three consumers
// do not pay off (the launcher asks three_consumers_pay_off first): +4 to
// +6 % at D = 128, +17 / +18 % at D = 64 causal 2k / 4k, sustained (sc3).
TEST(OneConsumer, AtD64UpTo1024KeysAnd2048Causal) {
  for (const bool causal : {false, true}) {
    for (const std::int64_t Sk : {1, 127, 384, 577, 1024})
      EXPECT_TRUE(one_consumer_pays_off(Sk, 64, causal, false)) << Sk;
    for (const std::int64_t Sk : {2049, 4096, 32768}) EXPECT_FALSE(one_consumer_pays_off(Sk, 64, causal, false)) << Sk;
  }
  for (const std::int64_t Sk : {1025, 1536, 2048}) {
    EXPECT_FALSE(one_consumer_pays_off(Sk, 64, false, false)) << Sk;
    EXPECT_TRUE(one_consumer_pays_off(Sk, 64, true, false)) << Sk;
  }
}

TEST(OneConsumer, WithExp2PAtD64AndD128AtEveryLength) {
  for (const bool causal : {false, true})
    for (const std::int64_t Sk : {1, 1024, 4096, 16384, 131072}) {
      EXPECT_TRUE(one_consumer_pays_off(Sk, 64, causal, true)) << Sk;
      EXPECT_TRUE(one_consumer_pays_off(Sk, 128, causal, true)) << Sk;
      EXPECT_FALSE(one_consumer_pays_off(Sk, 128, causal, false)) << Sk;
    }
}

TEST(OneConsumer, NotAtOtherHeadDims) {
  for (const bool exp2_p : {false, true})
    for (const std::int64_t D : {16, 32, 48, 80, 96, 112, 256})
      EXPECT_FALSE(one_consumer_pays_off(128, D, true, exp2_p)) << D;
}

}  // namespace
}  // namespace fp4attn
