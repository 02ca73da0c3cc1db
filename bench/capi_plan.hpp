// What the C ABIs over the sm90 forward share (capi.cpp, capi_mx.cpp,
// capi_nvfp4.cpp): inputs from ctypes arguments, the capture of an error for
// the caller's *_last_error, and a plan over an operand set that prepares its
// operands from (q, k, v) and runs the kernel on them.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <exception>
#include <memory>
#include <string>

#include "cuda/quantize/quantize_fp8.hpp"

namespace fp4attn::capi {

// dtype: 0 fp32, 1 fp16, 2 bf16; strides (b, s, h) in elements.
inline cuda_quantize::StridedInput strided_input(const void* data, int dtype, long long B, long long S, long long H,
                                                 long long D, const long long* strides) {
  return {data, static_cast<cuda_quantize::ElementType>(dtype), B, S, H, D, strides[0], strides[1], strides[2]};
}

// A positive scale as given, else 1/√D.
inline float softmax_scale_or_default(float scale, int D) {
  return scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(D));
}

// Runs f; returns 0, or 1 with the exception's text in last_error.
template <class F>
int guarded(std::string& last_error, F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

// One problem's operand set (sm90::fwd::MxOperands or Nvfp4Operands) and the
// kernel arguments that read it.
template <class Operands, class Args>
struct OperandsPlan {
  std::unique_ptr<Operands> operands;
  Args args;
  bool smooth_k = true;
  float softmax_scale = 0.0f;

  void prepare(const void* q, const void* k, const void* v, int dtype, const long long* q_strides,
               const long long* k_strides, const long long* v_strides, void* stream) {
    const Args& a = args;
    operands->prepare(strided_input(q, dtype, a.B, a.Sq, a.Hq, a.D, q_strides),
                      strided_input(k, dtype, a.B, a.Sk, a.Hkv, a.D, k_strides),
                      strided_input(v, dtype, a.B, a.Sk, a.Hkv, a.D, v_strides), smooth_k, softmax_scale,
                      static_cast<cudaStream_t>(stream));
  }

  // o: bf16 (B, Sq, Hq, D) with element strides o_strides (b, s, h); lse:
  // fp32 (B, Hq, Sq). forward: the kernel's launcher for Args.
  template <class Forward>
  void attend(void* o, const long long* o_strides, float* lse, void* stream, Forward forward) const {
    Args a = args;
    a.o = o, a.o_stride_b = o_strides[0], a.o_stride_s = o_strides[1], a.o_stride_h = o_strides[2];
    a.lse = lse;
    forward(a, static_cast<cudaStream_t>(stream));
  }
};

}  // namespace fp4attn::capi
