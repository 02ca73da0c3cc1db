// The zero-copy forward's arguments for dense bf16 (B, S, H, D) tensors,
// shared by the GPU suites that call dispatch::sm90_forward_device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/tensor.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn::gpu_test {

// Element strides of a dense (B, S, H, D) tensor.
inline dispatch::DeviceTensorView bshd_view(const void* data, std::int64_t S, std::int64_t H, std::int64_t D) {
  return {data, S * H * D, H * D, D};
}

inline dispatch::DeviceForwardArgs dense_forward_args(const AttentionShape& s, const void* q, const void* k,
                                                      const void* v, void* o, float* lse, void* workspace,
                                                      std::size_t workspace_bytes) {
  dispatch::DeviceForwardArgs a;
  a.shape = s;
  a.element = dispatch::DeviceElement::bf16;
  a.q = bshd_view(q, s.Sq, s.Hq, s.D);
  a.k = bshd_view(k, s.Sk, s.Hkv, s.D);
  a.v = bshd_view(v, s.Sk, s.Hkv, s.D);
  a.o = o;
  a.o_stride_b = s.Sq * s.Hq * s.D, a.o_stride_s = s.Hq * s.D, a.o_stride_h = s.D;
  a.lse = lse;
  a.workspace = workspace;
  a.workspace_bytes = workspace_bytes;
  return a;
}

// One device call on dense bf16 tensors (elements of type T: __nv_bfloat16
// or their raw bits): inputs, poisoned outputs and the recipe's workspace.
template <class T>
struct DenseForwardCall {
  AttentionShape shape;
  DeviceArray<T> q, k, v, o;
  DeviceArray<float> lse;
  DeviceArray<unsigned char> workspace;

  DenseForwardCall(const AttentionShape& s, Recipe recipe)
      : shape(s),
        q(static_cast<std::size_t>(s.q_elems())),
        k(static_cast<std::size_t>(s.kv_elems())),
        v(static_cast<std::size_t>(s.kv_elems())),
        o(static_cast<std::size_t>(s.q_elems())),
        lse(static_cast<std::size_t>(s.lse_elems())),
        workspace(dispatch::sm90_device_workspace_bytes(s, recipe)) {}

  bool allocated() const {
    return q.ptr != nullptr && k.ptr != nullptr && v.ptr != nullptr && o.ptr != nullptr && lse.ptr != nullptr &&
           workspace.ptr != nullptr;
  }

  void run(const AttentionOptions& opt) {
    const dispatch::DeviceForwardArgs a =
        dense_forward_args(shape, q.ptr, k.ptr, v.ptr, o.ptr, lse.ptr, workspace.ptr, workspace.bytes());
    o.poison();
    lse.poison();
    dispatch::sm90_forward_device(a, opt, nullptr);
  }
};

}  // namespace fp4attn::gpu_test
