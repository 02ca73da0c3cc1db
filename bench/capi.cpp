// C ABI over the sm90 fp8 forward for ctypes callers (bench/bench_fwd.py).
// A plan owns the quantized operands of one problem size; callers pass device
// pointers (e.g. torch tensors' data_ptr) and a CUDA stream.
#include <cuda_runtime_api.h>

#include <exception>
#include <memory>
#include <string>

#include "capi_plan.hpp"
#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/sm90/fwd/fp8_operands.hpp"
#include "cuda/sm90/fwd/fwd.hpp"

namespace {

thread_local std::string g_last_error;

struct Plan {
  std::unique_ptr<fp4attn::sm90::fwd::Fp8Operands> operands;
  fp4attn::sm90::fwd::Fp8ForwardArgs args;
  bool smooth_k = true;
  const fp4attn::cuda_quantize::Fp8Buffers& bufs() const { return operands->buffers(); }
};

int fail(const std::exception& e) {
  g_last_error = e.what();
  return 1;
}

using fp4attn::capi::strided_input;

}  // namespace

extern "C" {

const char* fp4attn_last_error() { return g_last_error.c_str(); }

// mask: 0 none, 1 causal bottom-right. Returns null on failure (see fp4attn_last_error).
void* fp4attn_plan_create(int B, int Hq, int Hkv, int Sq, int Sk, int D, int mask, int direct_p, int smooth_k,
                          float softmax_scale) {
  try {
    auto p = std::make_unique<Plan>();
    const fp4attn::AttentionShape shape{.B = B, .Hq = Hq, .Hkv = Hkv, .Sq = Sq, .Sk = Sk, .D = D};
    p->smooth_k = smooth_k != 0;
    p->operands = std::make_unique<fp4attn::sm90::fwd::Fp8Operands>(shape);
    p->args = p->operands->forward_args(
        mask ? fp4attn::MaskKind::causal : fp4attn::MaskKind::none,
        direct_p ? fp4attn::sm90::fwd::PCode::direct_p : fp4attn::sm90::fwd::PCode::exp2_cvt,
        fp4attn::capi::softmax_scale_or_default(softmax_scale, D), p->smooth_k);
    return p.release();
  } catch (const std::exception& e) {
    fail(e);
    return nullptr;
  }
}

void fp4attn_plan_destroy(void* plan) { delete static_cast<Plan*>(plan); }

void fp4attn_plan_set_direct_p(void* plan, int direct_p) {
  static_cast<Plan*>(plan)->args.p_code =
      direct_p ? fp4attn::sm90::fwd::PCode::direct_p : fp4attn::sm90::fwd::PCode::exp2_cvt;
}

// dtype: 0 fp32, 1 fp16, 2 bf16; strides: (b, s, h) in elements for each of q, k, v.
int fp4attn_quantize(void* plan, const void* q, const void* k, const void* v, int dtype, const long long* q_strides,
                     const long long* k_strides, const long long* v_strides, void* stream) {
  try {
    auto* p = static_cast<Plan*>(plan);
    const auto& a = p->args;
    fp4attn::cuda_quantize::quantize_fp8(strided_input(q, dtype, a.B, a.Sq, a.Hq, a.D, q_strides),
                                         strided_input(k, dtype, a.B, a.Sk, a.Hkv, a.D, k_strides),
                                         strided_input(v, dtype, a.B, a.Sk, a.Hkv, a.D, v_strides), p->smooth_k,
                                         a.softmax_scale, p->bufs(), static_cast<cudaStream_t>(stream));
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

// Synchronizes and reports non-finite input seen by earlier quantize calls.
int fp4attn_check_finite(void* plan, void* stream) {
  try {
    fp4attn::cuda_quantize::check_finite(static_cast<Plan*>(plan)->bufs(), static_cast<cudaStream_t>(stream));
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

// o: bf16 (B, Sq, Hq, D) with element strides o_strides (b, s, h); lse: fp32 (B, Hq, Sq).
int fp4attn_attend(void* plan, void* o, const long long* o_strides, float* lse, void* stream) {
  try {
    auto a = static_cast<Plan*>(plan)->args;
    a.o = o, a.o_stride_b = o_strides[0], a.o_stride_s = o_strides[1], a.o_stride_h = o_strides[2];
    a.lse = lse;
    fp4attn::sm90::fwd::forward_fp8(a, static_cast<cudaStream_t>(stream));
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

}  // extern "C"
