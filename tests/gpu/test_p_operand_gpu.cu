// Recipe mxfp4's block exponent in the forward kernel's two forms
// (sm90/fwd/fp8_direct_p/p_operand.cuh, MxBlockExponent): the three-consumer
// kernels take E by an add rounded toward +inf and a max on its bits, the
// others by cvt.rpi; both must give direct_p::mx_block_exponent's E and
// direct_p::mxfp4_mufu_shift's shift for every float u_max below 2^21 (a
// block's u_max is at most a rounding above 0: its maximum is at most the
// row's). The forward suites compare whole outputs against the emulator, but
// their scores rarely reach the far ends (u_max below −2^22, subnormals, −0,
// −inf), where the add's magic leaves its exact range.
#include <cmath>
#include <cstdint>

#include "cuda/sm90/fwd/fp8_direct_p/p_operand.cuh"
#include "fp4attn/direct_p.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn {
namespace {

using gpu_test::DeviceArray;

struct Mismatches {
  unsigned long long count;
  unsigned long long visited;
  std::uint32_t first_bits;
};

// The host rule of direct_p::mx_block_exponent, evaluated on the device.
__device__ int host_rule_exponent(float u_max) {
  const float e = ceilf(u_max - direct_p::kLog2Of6);
  return e > static_cast<float>(direct_p::kNoBlockExponent) ? static_cast<int>(e) : direct_p::kNoBlockExponent;
}

// Every float below 2^21 but NaNs (scores are never NaN), against both the
// host rule and the cvt.rpi form; the MUFU shift for row maxima of several
// magnitudes.
__global__ void block_exponent_all_floats(Mismatches* out) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  constexpr float kRowMaxima[] = {0.0f, 1.5f, -3.25f, 100.125f, -7.0e5f};
  unsigned long long visited = 0;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (1ull << 32);
       i += stride) {
    const auto bits = static_cast<std::uint32_t>(i);
    const float u_max = __uint_as_float(bits);
    if (!(u_max < 0x1p21f)) continue;  // NaN, or above the domain
    ++visited;
    const sm90::fwd::MxBlockExponent<true> by_add(u_max);
    const sm90::fwd::MxBlockExponent<false> by_cvt(u_max);
    bool same = by_add.exponent() == host_rule_exponent(u_max) && by_add.exponent() == by_cvt.exponent();
    for (float m : kRowMaxima)
      same = same && __float_as_uint(by_add.mufu_shift(m)) == __float_as_uint(by_cvt.mufu_shift(m));
    if (!same && atomicAdd(&out->count, 1ull) == 0) out->first_bits = bits;
  }
  atomicAdd(&out->visited, visited);
}

TEST(GpuPOperand, MxBlockExponentByAddMatchesTheRuleOnEveryFloat) {
  FP4ATTN_REQUIRE_HOPPER();
  DeviceArray<Mismatches> out(1);
  FP4ATTN_CUDA_OK(cudaMemset(out.ptr, 0, sizeof(Mismatches)));
  block_exponent_all_floats<<<1024, 256>>>(out.ptr);
  FP4ATTN_CUDA_OK(cudaDeviceSynchronize());
  const Mismatches m = out.download()[0];
  // Every negative pattern but the NaNs (−0 and −inf included), and the
  // non-negative ones below 2^21 (biased exponents 0 .. 147).
  constexpr unsigned long long kVisited = (1ull << 31) - ((1ull << 23) - 1) + 148ull * (1ull << 23);
  EXPECT_EQ(m.visited, kVisited);
  EXPECT_EQ(m.count, 0u) << "first differing u_max bits 0x" << std::hex << m.first_bits;
}

}  // namespace
}  // namespace fp4attn
