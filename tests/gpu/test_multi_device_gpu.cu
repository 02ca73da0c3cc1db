// GPU suite for machines with two or more Hopper GPUs: the zero-copy forward
// and backward give the same bits on the second device as on the first, with
// calls alternating between them. What the library sets up once (kernels'
// shared-memory limits, grid sizes from the SM count) must follow the
// current device, not the first one it ran on. Skipped on one GPU.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "gpu/device_forward_args.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn {
namespace {

using gpu_test::DeviceArray;
using Bf16Bits = std::uint16_t;

struct DeviceCase {
  Recipe recipe;
  MaskKind mask;
  std::int64_t D;
  bool backward;
};

std::string name_of(const DeviceCase& c) {
  return std::string(c.backward ? "bwd_" : "fwd_") + std::string(to_string(c.recipe)) +
         (c.mask == MaskKind::causal ? "_causal" : "_full") + "_D" + std::to_string(c.D);
}
void PrintTo(const DeviceCase& c, std::ostream* os) { *os << name_of(c); }

// Two or more GPUs, all of compute capability 9.0 (else the test is skipped).
bool two_hopper_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) return false;
  for (int d = 0; d < 2; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess || prop.major != 9 || prop.minor != 0) return false;
  }
  return true;
}

std::vector<Bf16Bits> bf16_bits(const std::vector<float>& x) {
  std::vector<Bf16Bits> h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const __nv_bfloat16 b = __float2bfloat16_rn(x[i]);
    std::memcpy(&h[i], &b, sizeof(h[i]));
  }
  return h;
}

// Everything one call writes, downloaded: O and LSE, or dQ, dK and dV.
struct Outputs {
  std::vector<Bf16Bits> a, b, c;
  std::vector<float> lse;
};

// One forward (and, for `backward`, the backward on its outputs) of the given
// inputs on `device`; every buffer lives on that device.
Outputs run_on(int device, const DeviceCase& c, const AttentionShape& s, const std::vector<Bf16Bits>& q,
               const std::vector<Bf16Bits>& k, const std::vector<Bf16Bits>& v, const std::vector<Bf16Bits>& d_o) {
  EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  DeviceArray<Bf16Bits> dq_in(q.size()), dk_in(k.size()), dv_in(v.size()), o(q.size());
  DeviceArray<float> lse(static_cast<std::size_t>(s.lse_elems()));
  DeviceArray<unsigned char> workspace(dispatch::sm90_device_workspace_bytes(s, c.recipe));
  dq_in.upload(q);
  dk_in.upload(k);
  dv_in.upload(v);
  AttentionOptions opt;
  opt.recipe = c.recipe;
  opt.mask = c.mask;
  opt.smooth_k = true;

  const dispatch::DeviceForwardArgs f = gpu_test::dense_forward_args(s, dq_in.ptr, dk_in.ptr, dv_in.ptr, o.ptr, lse.ptr,
                                                                     workspace.ptr, workspace.bytes());
  o.poison();
  lse.poison();
  dispatch::sm90_forward_device(f, opt, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Outputs out;
  if (!c.backward) {
    out.a = o.download();
    out.lse = lse.download();
    return out;
  }

  DeviceArray<Bf16Bits> grad_o(d_o.size()), dq(q.size()), dk(k.size()), dv(v.size());
  DeviceArray<unsigned char> bwd_workspace(dispatch::sm90_device_backward_workspace_bytes(s, true, c.recipe));
  grad_o.upload(d_o);
  dispatch::DeviceBackwardArgs b;
  b.shape = s;
  b.q = f.q, b.k = f.k, b.v = f.v;
  b.o = gpu_test::bshd_view(o.ptr, s.Sq, s.Hq, s.D);
  b.d_o = gpu_test::bshd_view(grad_o.ptr, s.Sq, s.Hq, s.D);
  b.lse = lse.ptr;
  b.dq = dq.ptr, b.dq_stride_b = s.Sq * s.Hq * s.D, b.dq_stride_s = s.Hq * s.D, b.dq_stride_h = s.D;
  b.dk = dk.ptr, b.dk_stride_b = s.Sk * s.Hkv * s.D, b.dk_stride_s = s.Hkv * s.D, b.dk_stride_h = s.D;
  b.dv = dv.ptr, b.dv_stride_b = s.Sk * s.Hkv * s.D, b.dv_stride_s = s.Hkv * s.D, b.dv_stride_h = s.D;
  b.workspace = bwd_workspace.ptr;
  b.workspace_bytes = bwd_workspace.bytes();
  dq.poison();
  dk.poison();
  dv.poison();
  dispatch::sm90_backward_device(b, opt, true, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out.a = dq.download();
  out.b = dk.download();
  out.c = dv.download();
  return out;
}

bool is_nan(Bf16Bits x) { return (x & 0x7FFFu) > 0x7F80u; }

// Elements that differ bit for bit, or that hold NaN in `want` (outputs never written).
std::int64_t differing(const std::vector<Bf16Bits>& want, const std::vector<Bf16Bits>& got) {
  std::int64_t n = 0;
  for (std::size_t i = 0; i < want.size(); ++i) n += want[i] != got[i] || is_nan(want[i]) ? 1 : 0;
  return n;
}
std::int64_t differing(const std::vector<float>& want, const std::vector<float>& got) {
  std::int64_t n = 0;
  for (std::size_t i = 0; i < want.size(); ++i) n += std::memcmp(&want[i], &got[i], sizeof(float)) != 0 ? 1 : 0;
  return n;
}

class GpuMultiDevice : public ::testing::TestWithParam<DeviceCase> {};

TEST_P(GpuMultiDevice, SecondDeviceGivesTheFirstDevicesBits) {
  FP4ATTN_REQUIRE_HOPPER();
  if (!two_hopper_devices()) GTEST_SKIP() << "needs two compute-capability 9.0 GPUs";
  const DeviceCase c = GetParam();
  // Enough CTAs for several waves' worth of scheduling decisions, odd lengths, GQA.
  const AttentionShape s{3, 8, 2, 1500, 1700, c.D};
  std::mt19937 rng(gpu_test::fresh_seed());
  const auto q = bf16_bits(gpu_test::attention_input(s.q_elems(), s.D, 0.5f, rng));
  const auto k = bf16_bits(gpu_test::attention_input(s.kv_elems(), s.D, 3.0f, rng));
  const auto v = bf16_bits(gpu_test::attention_input(s.kv_elems(), s.D, 1.0f, rng));
  const auto d_o = bf16_bits(gpu_test::attention_input(s.q_elems(), s.D, 1.0f, rng));

  const Outputs first = run_on(0, c, s, q, k, v, d_o);
  // Device 1, then device 0 again: the second switch finds the library set up for device 1.
  for (const int device : {1, 0}) {
    SCOPED_TRACE("device " + std::to_string(device));
    const Outputs again = run_on(device, c, s, q, k, v, d_o);
    EXPECT_EQ(differing(first.a, again.a), 0) << (c.backward ? "dQ" : "O");
    EXPECT_EQ(differing(first.b, again.b), 0) << "dK";
    EXPECT_EQ(differing(first.c, again.c), 0) << "dV";
    EXPECT_EQ(differing(first.lse, again.lse), 0) << "LSE";
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(Recipes, GpuMultiDevice,
                         ::testing::Values(DeviceCase{Recipe::fp8, MaskKind::causal, 128, false},
                                           DeviceCase{Recipe::fp8, MaskKind::none, 64, false},
                                           DeviceCase{Recipe::mxfp4, MaskKind::none, 128, false},
                                           DeviceCase{Recipe::mxfp4_train, MaskKind::causal, 64, false},
                                           DeviceCase{Recipe::nvfp4, MaskKind::none, 128, false},
                                           DeviceCase{Recipe::fp8, MaskKind::causal, 128, true},
                                           DeviceCase{Recipe::mxfp4_train, MaskKind::none, 64, true}),
                         [](const ::testing::TestParamInfo<DeviceCase>& info) { return name_of(info.param); });

}  // namespace
}  // namespace fp4attn
