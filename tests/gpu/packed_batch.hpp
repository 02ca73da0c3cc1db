// The packed batch of the packed-sequence GPU suites (test_fwd_packed_gpu.cu,
// test_bwd_packed_gpu.cu; test_fwd_e4m3_packed_gpu.cu with lengths of its
// own) and the helpers they share: lengths on and off the 128-token tiles, a
// sequence whose queries outnumber its keys (causal rows that see no key),
// the longest last, with its cu_seqlens and sizes.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/sm90_executor.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/tensor.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn::gpu_test {

struct PackedBatch {
  std::vector<std::int64_t> lens_q, lens_k;
  std::vector<int> cu_q = {0}, cu_k = {0};
  std::int64_t n = 0, max_q = 0, max_k = 0, total_q = 0, total_k = 0;

  PackedBatch() : PackedBatch({5, 300, 129, 128, 700}, {9, 300, 3, 200, 700}) {}
  PackedBatch(std::vector<std::int64_t> q_lengths, std::vector<std::int64_t> k_lengths)
      : lens_q(std::move(q_lengths)), lens_k(std::move(k_lengths)) {
    n = static_cast<std::int64_t>(lens_q.size());
    for (std::int64_t b = 0; b < n; ++b) {
      cu_q.push_back(cu_q.back() + static_cast<int>(lens_q[b]));
      cu_k.push_back(cu_k.back() + static_cast<int>(lens_k[b]));
      max_q = std::max(max_q, lens_q[b]), max_k = std::max(max_k, lens_k[b]);
    }
    total_q = cu_q.back(), total_k = cu_k.back();
  }

  // The packed call's shape: one entry per sequence, the longest lengths.
  AttentionShape shape(std::int64_t Hq, std::int64_t Hkv, std::int64_t D) const {
    return {n, Hq, Hkv, max_q, max_k, D};
  }
  // The tokens in all, which size the packed call's workspace and saved block.
  dispatch::PackedTokens tokens() const { return {total_q, total_k}; }
};

inline std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& x) {
  std::vector<__nv_bfloat16> h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) h[i] = __float2bfloat16_rn(x[i]);
  return h;
}

// Random bf16 q (total_q, Hq, D), k and v (total_k, Hkv, D) of the suites' scales.
struct PackedInputs {
  std::vector<__nv_bfloat16> q, k, v;
};
inline PackedInputs packed_inputs(const PackedBatch& batch, std::int64_t Hq, std::int64_t Hkv, std::int64_t D,
                                  std::mt19937& rng) {
  const auto q_elems = static_cast<std::size_t>(batch.total_q * Hq * D);
  const auto kv_elems = static_cast<std::size_t>(batch.total_k * Hkv * D);
  PackedInputs in;
  in.q = to_bf16(attention_input(q_elems, D, 0.5f, rng));
  in.k = to_bf16(attention_input(kv_elems, D, 3.0f, rng));
  in.v = to_bf16(attention_input(kv_elems, D, 1.0f, rng));
  return in;
}

inline std::uint16_t bits(__nv_bfloat16 x) {
  std::uint16_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

inline std::uint32_t bits(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// The packed forward's arguments: bf16 q (total_q, Hq, D), k and v
// (total_k, Hkv, D), O like q and the (Hq, total_q) LSE, the sequences'
// rows from the device cu_seqlens (batch strides unused), the workspace
// sized for batch.tokens().
inline dispatch::DeviceForwardArgs packed_forward_args(const PackedBatch& batch, const AttentionShape& s,
                                                       const void* q, const void* k, const void* v, void* o,
                                                       float* lse, void* workspace, std::size_t workspace_bytes,
                                                       const int* cu_q, const int* cu_k) {
  dispatch::DeviceForwardArgs a;
  a.shape = s;
  a.element = dispatch::DeviceElement::bf16;
  a.q = {q, 0, s.Hq * s.D, s.D};
  a.k = {k, 0, s.Hkv * s.D, s.D};
  a.v = {v, 0, s.Hkv * s.D, s.D};
  a.o = o;
  a.o_stride_b = 0, a.o_stride_s = s.Hq * s.D, a.o_stride_h = s.D;
  a.lse = lse;
  a.workspace = workspace, a.workspace_bytes = workspace_bytes;
  a.cu_seqlens_q = cu_q, a.cu_seqlens_k = cu_k, a.lse_pitch = batch.total_q, a.k_tokens = batch.total_k;
  return a;
}

// The argument an fp4attn::Error from `call` names ("" when nothing is thrown).
inline std::string named_argument(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.argument();
  }
  return "";
}

}  // namespace fp4attn::gpu_test
