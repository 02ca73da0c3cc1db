// The GPU FP4 quantizer's per-element rules (cuda/quantize/fp4_codes.cuh)
// against the CPU rules they replace: the E2M1 encoder over every float bit
// pattern, and the MX scale code over a dense sample of every finite amax,
// both rules, the packed encoder on f16 pairs rounded to odd (the fp32
// paths of the pipelined kernels) over every float below 256, and NVFP4's
// block scale code and divisor over every value they take. The
// quantizer's bit-exactness tests sample real tensors; these cover the inputs
// such tensors rarely hit (subnormals, saturation, every tie).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/quantize/e2m1_pairs.cuh"
#include "cuda/quantize/fp4_codes.cuh"
#include "fp4attn/formats.hpp"
#include "fp4attn/quantize.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn {
namespace {

using gpu_test::DeviceArray;

struct Mismatches {
  unsigned long long count;
  unsigned long long visited;  // floats compared: every pattern but the NaNs
  std::uint32_t first_bits;
};

// Every 32-bit pattern but NaNs (the quantizer reports those before encoding).
__global__ void e2m1_all_floats(Mismatches* out) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long visited = 0;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (1ull << 32);
       i += stride) {
    const auto bits = static_cast<std::uint32_t>(i);
    const float x = __uint_as_float(bits);
    if (isnan(x)) continue;
    ++visited;
    if (cuda_quantize::fp4::e2m1_code(x) != encode_rne_sat(ElemFormat::e2m1, x)) {
      if (atomicAdd(&out->count, 1ull) == 0) out->first_bits = bits;
    }
  }
  atomicAdd(&out->visited, visited);
}

// Every float with |x| < 256 (f16x2_round_to_odd's domain), NaNs excluded:
// e2m1_codes_x8_fp32 with x in all eight places (rounded to odd in both
// halves of four pairs, coded without a scale) against the CPU's code.
__global__ void rto_pairs_all_floats(Mismatches* out) {
  namespace fp4 = cuda_quantize::fp4;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long visited = 0;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (1ull << 32);
       i += stride) {
    const auto bits = static_cast<std::uint32_t>(i);
    const float x = __uint_as_float(bits);
    if (!(fabsf(x) < 256.0f)) continue;
    ++visited;
    const std::uint32_t word = fp4::e2m1_codes_x8_fp32([&](int) { return x; });
    const std::uint32_t want = encode_rne_sat(ElemFormat::e2m1, x) * 0x11111111u;  // every nibble
    if (word != want) {
      if (atomicAdd(&out->count, 1ull) == 0) out->first_bits = bits;
    }
  }
  atomicAdd(&out->visited, visited);
}

// Every float m in [0, 449 · 6] (fl(amax · S_enc) is at most 2688): NVFP4's
// block scale code of m against the CPU's encode_rne_sat(ue4m3, fl(m / 6)).
__global__ void nv_scale_code_all_products(Mismatches* out, std::uint32_t last_bits) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long visited = 0;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i <= last_bits;
       i += stride) {
    const auto bits = static_cast<std::uint32_t>(i);
    const float m = __uint_as_float(bits);
    ++visited;
    if (cuda_quantize::fp4::nv_scale_code(m, 1.0f) != encode_rne_sat(ElemFormat::ue4m3, __fdiv_rn(m, kE2M1Max))) {
      if (atomicAdd(&out->count, 1ull) == 0) out->first_bits = bits;
    }
  }
  atomicAdd(&out->visited, visited);
}

__global__ void nv_divisor_table(float2* out) {
  __shared__ cuda_quantize::fp4::NvDivisorTable table;
  table.fill(static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
  __syncthreads();
  for (int c = threadIdx.x; c < cuda_quantize::fp4::kUe4m3Codes; c += blockDim.x) {
    const cuda_quantize::fp4::NvDivisor d = table[static_cast<std::uint32_t>(c)];
    out[c] = make_float2(d.r_hi, d.r_lo);
  }
}

__global__ void mx_scale_codes(const std::uint32_t* amax_bits, int n, bool round_up, std::uint8_t* codes) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    codes[i] = static_cast<std::uint8_t>(cuda_quantize::fp4::mx_scale_code(amax_bits[i], round_up));
}

TEST(GpuFp4Codes, E2M1EncoderMatchesTheCpuOnEveryFloat) {
  FP4ATTN_REQUIRE_HOPPER();
  DeviceArray<Mismatches> out(1);
  FP4ATTN_CUDA_OK(cudaMemset(out.ptr, 0, sizeof(Mismatches)));
  e2m1_all_floats<<<1024, 256>>>(out.ptr);
  FP4ATTN_CUDA_OK(cudaDeviceSynchronize());
  const Mismatches m = out.download()[0];
  constexpr unsigned long long kNaNs = 2 * ((1ull << 23) - 1);  // exponent all ones, mantissa not zero, both signs
  EXPECT_EQ(m.visited, (1ull << 32) - kNaNs);
  EXPECT_EQ(m.count, 0u) << "first differing float bits 0x" << std::hex << m.first_bits;
}

TEST(GpuFp4Codes, RoundToOddPairsGiveTheCpuCodesBelow256) {
  FP4ATTN_REQUIRE_HOPPER();
  DeviceArray<Mismatches> out(1);
  FP4ATTN_CUDA_OK(cudaMemset(out.ptr, 0, sizeof(Mismatches)));
  rto_pairs_all_floats<<<1024, 256>>>(out.ptr);
  FP4ATTN_CUDA_OK(cudaDeviceSynchronize());
  const Mismatches m = out.download()[0];
  // |x| < 256: biased exponents 0 .. 134, every mantissa, both signs.
  EXPECT_EQ(m.visited, 2ull * 135 * (1ull << 23));
  EXPECT_EQ(m.count, 0u) << "first differing float bits 0x" << std::hex << m.first_bits;
}

TEST(GpuFp4Codes, NvScaleCodeMatchesTheCpuOnEveryProduct) {
  FP4ATTN_REQUIRE_HOPPER();
  const float last = 449.0f * kE2M1Max;
  std::uint32_t last_bits;
  std::memcpy(&last_bits, &last, sizeof last);
  DeviceArray<Mismatches> out(1);
  FP4ATTN_CUDA_OK(cudaMemset(out.ptr, 0, sizeof(Mismatches)));
  nv_scale_code_all_products<<<1024, 256>>>(out.ptr, last_bits);
  FP4ATTN_CUDA_OK(cudaDeviceSynchronize());
  const Mismatches m = out.download()[0];
  EXPECT_EQ(m.visited, std::uint64_t{last_bits} + 1);
  EXPECT_EQ(m.count, 0u) << "first differing product bits 0x" << std::hex << m.first_bits;
}

// The divisor table holds each UE4M3 code's reciprocal split as
// split_reciprocal_quotient takes it, from the CPU's decoded scale.
TEST(GpuFp4Codes, NvDivisorTableMatchesTheCpu) {
  FP4ATTN_REQUIRE_HOPPER();
  DeviceArray<float2> out(cuda_quantize::fp4::kUe4m3Codes);
  nv_divisor_table<<<1, 96>>>(out.ptr);  // fewer threads than codes: the fill's stride loop
  FP4ATTN_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float2> got = out.download();
  for (std::uint32_t c = 0; c <= spec_of(ElemFormat::ue4m3).max_code; ++c) {  // every finite code
    const float sb = decode(ElemFormat::ue4m3, c);
    // RD(1 / sb): the float nearest below, unless 1 / sb is a float
    float r_hi = sb == 0.0f ? 0.0f : 1.0f / sb;
    if (sb != 0.0f && static_cast<double>(r_hi) > 1.0 / static_cast<double>(sb)) r_hi = std::nextafter(r_hi, 0.0f);
    EXPECT_EQ(got[c].x, r_hi) << "code " << c;
    EXPECT_EQ(got[c].y, sb == 0.0f ? 0.0f : cuda_quantize::reciprocal_tail(sb, r_hi)) << "code " << c;
  }
}

TEST(GpuFp4Codes, MxScaleCodeMatchesTheCpuOnEveryFiniteAmaxSampled) {
  FP4ATTN_REQUIRE_HOPPER();
  // Every 61st positive finite pattern (61 is prime: all residues of the
  // mantissa appear), plus every power of two and its neighbours.
  std::vector<std::uint32_t> bits;
  for (std::uint32_t b = 0; b < 0x7F800000u; b += 61) bits.push_back(b);
  for (std::uint32_t e = 0; e < 255; ++e)
    for (std::uint32_t d : {0u, 1u, 0x3FFFFFu, 0x400000u, 0x400001u, 0x7FFFFFu})
      if ((e << 23 | d) < 0x7F800000u) bits.push_back(e << 23 | d);
  DeviceArray<std::uint32_t> d_bits(bits.size());
  DeviceArray<std::uint8_t> d_codes(bits.size());
  d_bits.upload(bits);
  for (MxScaleRule rule : {MxScaleRule::round_up, MxScaleRule::ocp_floor}) {
    mx_scale_codes<<<1024, 256>>>(d_bits.ptr, static_cast<int>(bits.size()), rule == MxScaleRule::round_up,
                                   d_codes.ptr);
    FP4ATTN_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<std::uint8_t> got = d_codes.download();
    std::size_t wrong = 0, first = 0;
    for (std::size_t i = 0; i < bits.size(); ++i) {
      float amax;
      std::memcpy(&amax, &bits[i], sizeof amax);
      if (got[i] != mx_scale_code(amax, rule) && wrong++ == 0) first = i;
    }
    EXPECT_EQ(wrong, 0u) << "rule " << static_cast<int>(rule) << ", " << bits.size() << " amax values, first 0x"
                         << std::hex << bits[first];
  }
}

}  // namespace
}  // namespace fp4attn
