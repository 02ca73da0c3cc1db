#include "emulator/ex2_sm90.hpp"

#include <algorithm>
#include <cmath>

#include "fp4attn/direct_p.hpp"

namespace fp4attn::emulator {
namespace ex2 {

float sm90(float x) {
  const float y = exp2f(x);
  if (!(x <= kScanMax)) return y;  // NaN, or above every input the kernels feed
  // exp2f is within a few float steps of the hardware, so an x whose hardware
  // result lies in a recorded window has exp2f within kGuardUlps of the
  // boundary (or below the normal range); the rest needs no lookup.
  const std::uint32_t yb = float_bits(y);
  if (yb >= kMinNormalBits + kGuardUlps && !near_decision_boundary(yb, kGuardUlps)) return y;
  const std::span<const Run> table = sm90_table();
  const std::uint32_t key = order_key(float_bits(x));
  const auto it = std::upper_bound(table.begin(), table.end(), key,
                                   [](std::uint32_t k, const Run& r) { return k < order_key(r.x_first); });
  if (it == table.begin()) return y;
  const Run& r = *(it - 1);
  return key <= order_key(r.x_last) ? bits_float(r.result) : y;
}

}  // namespace ex2

float ex2_for_target(Target t, float x) { return t == Target::sm90 ? ex2::sm90(x) : exp2f(x); }

std::uint8_t fp8_code_exp2(Target t, float u) {
  return encode_rne_sat(ElemFormat::e4m3, ex2_for_target(t, u + direct_p::kFp8Offset));
}

}  // namespace fp4attn::emulator
