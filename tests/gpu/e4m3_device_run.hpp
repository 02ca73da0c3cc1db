// One zero-copy E4M3-input call of the GPU suites (test_fwd_e4m3_gpu.cu,
// test_fwd_e4m3_packed_gpu.cu): outputs poisoned first, O back as floats.
#pragma once

#include <cstdint>

#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn::gpu_test {

inline ForwardOutput run_e4m3_device(const dispatch::DeviceE4m3ForwardArgs& a, const AttentionOptions& opt,
                                     DeviceArray<std::uint16_t>& o, DeviceArray<float>& lse) {
  o.poison();
  lse.poison();
  dispatch::sm90_forward_device_e4m3(a, opt, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ForwardOutput out;
  for (std::uint16_t bits : o.download()) out.o.push_back(__builtin_bit_cast(float, std::uint32_t{bits} << 16));
  out.lse = lse.download();
  return out;
}

}  // namespace fp4attn::gpu_test
