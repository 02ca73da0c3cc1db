// C ABI over the sm90 forward for recipe nvfp4, for ctypes callers
// (bench/bench_fwd_nvfp4.py). A plan owns one problem's NVFP4 operands and
// their BF16 expansion (cuda/sm90/fwd/nvfp4_operands.hpp); callers pass
// device pointers and a CUDA stream. Errors: fp4attn_nvfp4_last_error.
#include <cuda_runtime_api.h>

#include <cmath>
#include <exception>
#include <memory>
#include <string>

#include "cuda/sm90/fwd/nvfp4_fwd.hpp"
#include "cuda/sm90/fwd/nvfp4_operands.hpp"

namespace {

thread_local std::string g_nvfp4_last_error;

struct Nvfp4Plan {
  std::unique_ptr<fp4attn::sm90::fwd::Nvfp4Operands> operands;
  fp4attn::sm90::fwd::Nvfp4ForwardArgs args;
  bool smooth_k = true;
  float softmax_scale = 0.0f;
};

int fail(const std::exception& e) {
  g_nvfp4_last_error = e.what();
  return 1;
}

fp4attn::cuda_quantize::StridedInput input(const void* data, int dtype, long long B, long long S, long long H,
                                           long long D, const long long* strides) {
  return {data, static_cast<fp4attn::cuda_quantize::ElementType>(dtype), B, S, H, D, strides[0], strides[1], strides[2]};
}

}  // namespace

extern "C" {

const char* fp4attn_nvfp4_last_error() { return g_nvfp4_last_error.c_str(); }

// mask: 0 none, 1 causal bottom-right. Returns null on failure (see fp4attn_nvfp4_last_error).
void* fp4attn_nvfp4_plan_create(int B, int Hq, int Hkv, int Sq, int Sk, int D, int mask, int smooth_k,
                                float softmax_scale) {
  try {
    auto p = std::make_unique<Nvfp4Plan>();
    const fp4attn::AttentionShape shape{.B = B, .Hq = Hq, .Hkv = Hkv, .Sq = Sq, .Sk = Sk, .D = D};
    p->smooth_k = smooth_k != 0;
    p->softmax_scale = softmax_scale > 0.0f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(D));
    p->operands = std::make_unique<fp4attn::sm90::fwd::Nvfp4Operands>(shape);
    p->args = p->operands->forward_args(mask ? fp4attn::MaskKind::causal : fp4attn::MaskKind::none, true,
                                        p->softmax_scale, p->smooth_k);
    return p.release();
  } catch (const std::exception& e) {
    fail(e);
    return nullptr;
  }
}

void fp4attn_nvfp4_plan_destroy(void* plan) { delete static_cast<Nvfp4Plan*>(plan); }

// Bytes of BF16 operands the kernel reads per call (Q, K and Vᵀ).
long long fp4attn_nvfp4_kernel_operand_bytes(void* plan) {
  return static_cast<long long>(static_cast<Nvfp4Plan*>(plan)->operands->kernel_operand_bytes());
}

// NVFP4 quantization and the expansion to BF16. dtype: 0 fp32, 1 fp16, 2 bf16;
// strides (b, s, h) in elements for each of q, k, v.
int fp4attn_nvfp4_prepare(void* plan, const void* q, const void* k, const void* v, int dtype,
                          const long long* q_strides, const long long* k_strides, const long long* v_strides,
                          void* stream) {
  try {
    auto* p = static_cast<Nvfp4Plan*>(plan);
    const auto& a = p->args;
    p->operands->prepare(input(q, dtype, a.B, a.Sq, a.Hq, a.D, q_strides),
                         input(k, dtype, a.B, a.Sk, a.Hkv, a.D, k_strides),
                         input(v, dtype, a.B, a.Sk, a.Hkv, a.D, v_strides), p->smooth_k, p->softmax_scale,
                         static_cast<cudaStream_t>(stream));
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

int fp4attn_nvfp4_check_finite(void* plan, void* stream) {
  try {
    static_cast<Nvfp4Plan*>(plan)->operands->check_finite(static_cast<cudaStream_t>(stream));
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

// o: bf16 (B, Sq, Hq, D) with element strides o_strides (b, s, h); lse: fp32 (B, Hq, Sq).
int fp4attn_nvfp4_attend(void* plan, void* o, const long long* o_strides, float* lse, void* stream) {
  try {
    auto a = static_cast<Nvfp4Plan*>(plan)->args;
    a.o = o, a.o_stride_b = o_strides[0], a.o_stride_s = o_strides[1], a.o_stride_h = o_strides[2];
    a.lse = lse;
    fp4attn::sm90::fwd::forward_nvfp4(a, static_cast<cudaStream_t>(stream));
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

}  // extern "C"
