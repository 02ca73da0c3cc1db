// The MX fold's per-block table (src/cuda/quantize/fold_table.hpp), which the
// GPU fold kernels use, against the emulator's definition of the sm90 fold
// (emulator::fold_mx_to_e4m3) for every block exponent and group exponent:
// the fast path (one add on four bytes) where the shift allows it, the exact
// conversion below.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/quantize/fold_table.hpp"
#include "emulator/operands.hpp"
#include "fp4attn/formats.hpp"

namespace fp4attn {
namespace {

constexpr int kMinE8M0Exponent = -127, kMaxE8M0Exponent = 127;

std::uint32_t byte_of(const cuda_quantize::FoldTable& t, int i) {
  return ((i < 4 ? t.lo : t.hi) >> (8 * (i % 4))) & 0xFFu;
}

TEST(FoldTable, EqualsTheEmulatorsFoldForEveryExponentPair) {
  static_assert(cuda_quantize::kFoldHeadroom == emulator::kSm90FoldHeadroom, "one headroom for kernel and model");
  int pairs = 0, fast = 0;
  for (int r = kMinE8M0Exponent; r <= kMaxE8M0Exponent; ++r)
    for (int e = kMinE8M0Exponent; e <= r; ++e) {  // r is the largest exponent of its group
      const cuda_quantize::FoldTable t = cuda_quantize::fold_table(e, r);
      ++pairs;
      fast += e - r + cuda_quantize::kFoldHeadroom >= -5;
      for (int q = 0; q < 8; ++q) {
        const float value = emulator::fold_mx_to_e4m3(decode(ElemFormat::e2m1, static_cast<std::uint32_t>(q)), e, r);
        ASSERT_EQ(byte_of(t, q), encode_rne_sat(ElemFormat::e4m3, value)) << "e = " << e << ", r = " << r << ", q = " << q;
      }
    }
  EXPECT_EQ(pairs, 255 * 256 / 2);
  EXPECT_GT(fast, 0);           // both paths ran
  EXPECT_LT(fast, pairs);
}

}  // namespace
}  // namespace fp4attn
