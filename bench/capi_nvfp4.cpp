// C ABI over the sm90 forward for recipe nvfp4, for ctypes callers
// (bench/bench_fwd_nvfp4.py). A plan owns one problem's NVFP4 operands and
// their BF16 expansion (cuda/sm90/fwd/nvfp4_operands.hpp); callers pass
// device pointers and a CUDA stream. Errors: fp4attn_nvfp4_last_error.
#include <memory>
#include <string>

#include "capi_plan.hpp"
#include "cuda/sm90/fwd/nvfp4_fwd.hpp"
#include "cuda/sm90/fwd/nvfp4_operands.hpp"

namespace {

namespace capi = fp4attn::capi;

thread_local std::string g_nvfp4_last_error;

using Nvfp4Plan = capi::OperandsPlan<fp4attn::sm90::fwd::Nvfp4Operands, fp4attn::sm90::fwd::Nvfp4ForwardArgs>;

Nvfp4Plan& plan_of(void* plan) { return *static_cast<Nvfp4Plan*>(plan); }

}  // namespace

extern "C" {

const char* fp4attn_nvfp4_last_error() { return g_nvfp4_last_error.c_str(); }

// mask: 0 none, 1 causal bottom-right. Returns null on failure (see fp4attn_nvfp4_last_error).
void* fp4attn_nvfp4_plan_create(int B, int Hq, int Hkv, int Sq, int Sk, int D, int mask, int smooth_k,
                                float softmax_scale) {
  std::unique_ptr<Nvfp4Plan> p;
  const int rc = capi::guarded(g_nvfp4_last_error, [&] {
    p = std::make_unique<Nvfp4Plan>();
    const fp4attn::AttentionShape shape{.B = B, .Hq = Hq, .Hkv = Hkv, .Sq = Sq, .Sk = Sk, .D = D};
    p->smooth_k = smooth_k != 0;
    p->softmax_scale = capi::softmax_scale_or_default(softmax_scale, D);
    p->operands = std::make_unique<fp4attn::sm90::fwd::Nvfp4Operands>(shape);
    p->args = p->operands->forward_args(mask ? fp4attn::MaskKind::causal : fp4attn::MaskKind::none, true,
                                        p->softmax_scale, p->smooth_k);
  });
  return rc == 0 ? p.release() : nullptr;
}

void fp4attn_nvfp4_plan_destroy(void* plan) { delete static_cast<Nvfp4Plan*>(plan); }

// P of the plan's later attend calls: 1 Direct-P (the default), 0 the exp2 baseline.
void fp4attn_nvfp4_plan_set_direct_p(void* plan, int direct_p) { plan_of(plan).args.direct_p = direct_p != 0; }

// Bytes of BF16 operands the kernel reads per call (Q, K and Vᵀ).
long long fp4attn_nvfp4_kernel_operand_bytes(void* plan) {
  return static_cast<long long>(plan_of(plan).operands->kernel_operand_bytes());
}

// NVFP4 quantization and the expansion to BF16. dtype: 0 fp32, 1 fp16, 2 bf16;
// strides (b, s, h) in elements for each of q, k, v.
int fp4attn_nvfp4_prepare(void* plan, const void* q, const void* k, const void* v, int dtype,
                          const long long* q_strides, const long long* k_strides, const long long* v_strides,
                          void* stream) {
  return capi::guarded(g_nvfp4_last_error,
                       [&] { plan_of(plan).prepare(q, k, v, dtype, q_strides, k_strides, v_strides, stream); });
}

int fp4attn_nvfp4_check_finite(void* plan, void* stream) {
  return capi::guarded(g_nvfp4_last_error,
                       [&] { plan_of(plan).operands->check_finite(static_cast<cudaStream_t>(stream)); });
}

// o: bf16 (B, Sq, Hq, D) with element strides o_strides (b, s, h); lse: fp32 (B, Hq, Sq).
int fp4attn_nvfp4_attend(void* plan, void* o, const long long* o_strides, float* lse, void* stream) {
  return capi::guarded(g_nvfp4_last_error, [&] {
    plan_of(plan).attend(o, o_strides, lse, stream, fp4attn::sm90::fwd::forward_nvfp4);
  });
}

}  // extern "C"
