// Helpers shared by the GPU suites: device gating, device buffers, random data.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fp4attn/recipe.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn::gpu_test {

inline bool gpu_required() {
  const char* v = std::getenv("FP4ATTN_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

inline bool hopper_present() {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return prop.major == 9 && prop.minor == 0;
}

// Skips the test without a Hopper GPU, or fails it when FP4ATTN_REQUIRE_GPU=1.
#define FP4ATTN_REQUIRE_HOPPER()                                                           \
  do {                                                                                     \
    if (!::fp4attn::gpu_test::hopper_present()) {                                          \
      if (::fp4attn::gpu_test::gpu_required()) FAIL() << "FP4ATTN_REQUIRE_GPU=1 but no compute-capability 9.0 GPU"; \
      GTEST_SKIP() << "no compute-capability 9.0 GPU";                                     \
    }                                                                                      \
  } while (0)

#define FP4ATTN_CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << cudaGetErrorString(cudaGetLastError())

template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  std::size_t count = 0;
  explicit DeviceArray(std::size_t n) : count(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(T)) != cudaSuccess) ptr = nullptr;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(ptr); }
  std::size_t bytes() const { return count * sizeof(T); }
  std::vector<T> download() const {
    std::vector<T> h(count);
    cudaMemcpy(h.data(), ptr, bytes(), cudaMemcpyDeviceToHost);
    return h;
  }
  void upload(const std::vector<T>& h) { cudaMemcpy(ptr, h.data(), bytes(), cudaMemcpyHostToDevice); }
  // NaN bytes everywhere (0xFF is NaN in fp32, bf16 and E4M3): unwritten output stays NaN.
  void poison() { cudaMemset(ptr, 0xFF, bytes()); }
};

// Fresh randomness per run; the seed goes into failure messages.
// "B2_Hq4_Hkv2_Sq200_Sk333_D64_causal": the shape and mask part of the
// parameterized suites' case names, so that CTest lists each case by what
// it covers (the suites append their own flags).
inline std::string shape_mask_name(const AttentionShape& s, MaskKind mask) {
  static constexpr const char* kMaskNames[] = {"full", "causal", "causaltopleft"};
  return "B" + std::to_string(s.B) + "_Hq" + std::to_string(s.Hq) + "_Hkv" + std::to_string(s.Hkv) + "_Sq" +
         std::to_string(s.Sq) + "_Sk" + std::to_string(s.Sk) + "_D" + std::to_string(s.D) + "_" +
         kMaskNames[static_cast<int>(mask)];
}

// A fresh random seed for each case (every test prints the seeds it used),
// or FP4ATTN_TEST_SEED for every case, to run a printed failure again.
inline std::uint32_t fresh_seed() {
  if (const char* fixed = std::getenv("FP4ATTN_TEST_SEED"); fixed != nullptr && *fixed != '\0')
    return static_cast<std::uint32_t>(std::strtoul(fixed, nullptr, 10));
  return std::random_device{}();
}

// Captures `enqueue(stream)` into a CUDA graph on a stream of its own, then
// launches the graph once and waits for it: what a caller that replays
// graphs does (programmatic dependent launches become graph edges).
template <class Enqueue>
void run_as_graph(Enqueue&& enqueue) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  enqueue(stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

inline constexpr float kOutlierRate = 0.001f;

inline float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// Gaussian values with a per-channel offset (the activations smooth_k exists
// for) and, when outlier > 1, one element in a thousand scaled by it; rounded
// to bf16 so host and device see the same numbers.
inline std::vector<float> attention_input(std::size_t n, std::int64_t D, float offset_scale, std::mt19937& rng,
                                          float outlier = 1.0f) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> channel_offset(static_cast<std::size_t>(D));
  for (float& c : channel_offset) c = offset_scale * normal(rng);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float factor = unit(rng) < kOutlierRate ? outlier : 1.0f;
    x[i] = round_bf16(normal(rng) * factor + channel_offset[i % D]);
  }
  return x;
}

}  // namespace fp4attn::gpu_test
