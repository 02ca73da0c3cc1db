// C ABI over the sm90 forward for recipes mxfp4 and mxfp4_train, for ctypes
// callers (bench/bench_fwd_mx.py). A plan owns one problem's MXFP4 operands
// and their E4M3 folds (cuda/sm90/fwd/mx_operands.hpp); callers pass device
// pointers and a CUDA stream. Errors: fp4attn_mx_last_error.
#include <memory>
#include <string>

#include "capi_plan.hpp"
#include "cuda/sm90/fwd/fwd.hpp"
#include "cuda/sm90/fwd/mx_operands.hpp"

namespace {

namespace capi = fp4attn::capi;

// The last error of an mx call; fp4attn_mx_last_error returns it.
thread_local std::string g_mx_last_error;

using MxPlan = capi::OperandsPlan<fp4attn::sm90::fwd::MxOperands, fp4attn::sm90::fwd::Fp8ForwardArgs>;

MxPlan& plan_of(void* plan) { return *static_cast<MxPlan*>(plan); }

}  // namespace

extern "C" {

const char* fp4attn_mx_last_error() { return g_mx_last_error.c_str(); }

// recipe: 1 mxfp4, 3 mxfp4_train (fp4attn::Recipe); mask: 0 none, 1 causal
// bottom-right; expand_in_kernel: 1 has the kernel read MXFP4 and expand it
// (recipe mxfp4), 0 folds to E4M3 in a pass before it. Returns null on
// failure (see fp4attn_mx_last_error).
void* fp4attn_mx_plan_create(int B, int Hq, int Hkv, int Sq, int Sk, int D, int recipe, int mask, int direct_p,
                             int smooth_k, float softmax_scale, int expand_in_kernel) {
  std::unique_ptr<MxPlan> p;
  const int rc = capi::guarded(g_mx_last_error, [&] {
    p = std::make_unique<MxPlan>();
    const fp4attn::AttentionShape shape{.B = B, .Hq = Hq, .Hkv = Hkv, .Sq = Sq, .Sk = Sk, .D = D};
    p->smooth_k = smooth_k != 0;
    p->softmax_scale = capi::softmax_scale_or_default(softmax_scale, D);
    const auto expansion = expand_in_kernel != 0 ? fp4attn::sm90::fwd::Fp4Expansion::in_kernel
                                                 : fp4attn::sm90::fwd::Fp4Expansion::fold_pass;
    p->operands = std::make_unique<fp4attn::sm90::fwd::MxOperands>(shape, static_cast<fp4attn::Recipe>(recipe),
                                                                   fp4attn::MxScaleRule::round_up, expansion);
    p->args = p->operands->forward_args(mask ? fp4attn::MaskKind::causal : fp4attn::MaskKind::none, direct_p != 0,
                                        p->softmax_scale, p->smooth_k);
  });
  return rc == 0 ? p.release() : nullptr;
}

void fp4attn_mx_plan_destroy(void* plan) { delete static_cast<MxPlan*>(plan); }

// Bytes of operand codes the kernel reads per call (folded E4M3 Q, K and Vᵀ,
// or MXFP4 codes and scales when the kernel expands them).
long long fp4attn_mx_kernel_code_bytes(void* plan) {
  return static_cast<long long>(plan_of(plan).operands->kernel_code_bytes());
}

// MXFP4 quantization and the fold into E4M3. dtype: 0 fp32, 1 fp16, 2 bf16;
// strides (b, s, h) in elements for each of q, k, v.
int fp4attn_mx_prepare(void* plan, const void* q, const void* k, const void* v, int dtype, const long long* q_strides,
                       const long long* k_strides, const long long* v_strides, void* stream) {
  return capi::guarded(g_mx_last_error,
                       [&] { plan_of(plan).prepare(q, k, v, dtype, q_strides, k_strides, v_strides, stream); });
}

// The fold step alone (the fold factors alone when the kernel expands MXFP4):
// what runs per call when the MXFP4 operands are kept, e.g. as a cache.
int fp4attn_mx_fold(void* plan, void* stream) {
  return capi::guarded(g_mx_last_error, [&] {
    MxPlan& p = plan_of(plan);
    p.operands->fold(p.smooth_k, p.softmax_scale, static_cast<cudaStream_t>(stream));
  });
}

int fp4attn_mx_check_finite(void* plan, void* stream) {
  return capi::guarded(g_mx_last_error,
                       [&] { plan_of(plan).operands->check_finite(static_cast<cudaStream_t>(stream)); });
}

// o: bf16 (B, Sq, Hq, D) with element strides o_strides (b, s, h); lse: fp32 (B, Hq, Sq).
int fp4attn_mx_attend(void* plan, void* o, const long long* o_strides, float* lse, void* stream) {
  return capi::guarded(g_mx_last_error, [&] {
    plan_of(plan).attend(o, o_strides, lse, stream, fp4attn::sm90::fwd::forward_fp8);
  });
}

}  // extern "C"
