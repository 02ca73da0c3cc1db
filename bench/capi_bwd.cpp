// C ABI over the device forward and backward entry points for ctypes callers
// (bench/bench_bwd.py): device pointers (e.g. torch tensors' data_ptr), element
// strides (b, s, h), a caller-owned workspace and a CUDA stream.
#include <exception>
#include <string>

#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/error.hpp"

namespace {

thread_local std::string g_last_error;

int fail(const std::exception& e) {
  g_last_error = e.what();
  return 1;
}

// shape: (B, Sq, Sk, Hq, Hkv, D)
fp4attn::AttentionShape shape_of(const long long* s) {
  return {.B = s[0], .Hq = s[3], .Hkv = s[4], .Sq = s[1], .Sk = s[2], .D = s[5]};
}

// recipe: fp4attn::Recipe's value (0 fp8, 3 mxfp4_train); mask: 0 none, 1 causal bottom-right, 2 causal top-left.
fp4attn::Recipe recipe_of(int recipe) {
  if (recipe != static_cast<int>(fp4attn::Recipe::fp8) && recipe != static_cast<int>(fp4attn::Recipe::mxfp4_train))
    throw fp4attn::Error("recipe", "must be 0 (fp8) or 3 (mxfp4_train), got " + std::to_string(recipe));
  return static_cast<fp4attn::Recipe>(recipe);
}

fp4attn::AttentionOptions options_of(int recipe, int mask, int direct_p) {
  fp4attn::AttentionOptions opt;
  opt.recipe = recipe_of(recipe);
  opt.mask = mask == 1 ? fp4attn::MaskKind::causal : mask == 2 ? fp4attn::MaskKind::causal_top_left
                                                               : fp4attn::MaskKind::none;
  opt.direct_p = direct_p != 0;
  return opt;
}

fp4attn::dispatch::DeviceTensorView view(const void* p, const long long* st) { return {p, st[0], st[1], st[2]}; }

}  // namespace

extern "C" {

const char* fp4attn_bwd_last_error() { return g_last_error.c_str(); }

// Workspace bytes of the device forward and backward; −1 on failure.
long long fp4attn_bwd_forward_workspace_bytes(const long long* shape, int recipe) {
  try {
    return static_cast<long long>(
        fp4attn::dispatch::sm90_device_workspace_bytes(shape_of(shape), recipe_of(recipe)));
  } catch (const std::exception& e) {
    fail(e);
    return -1;
  }
}

long long fp4attn_bwd_workspace_bytes(const long long* shape, int recipe) {
  try {
    return static_cast<long long>(
        fp4attn::dispatch::sm90_device_backward_workspace_bytes(shape_of(shape), false, recipe_of(recipe)));
  } catch (const std::exception& e) {
    fail(e);
    return -1;
  }
}

// Bytes of the block where a recipe-fp8 forward keeps Q's and K's operands
// for the backward (0 for mxfp4_train, which keeps none); −1 on failure.
long long fp4attn_bwd_saved_bytes(const long long* shape, int recipe) {
  try {
    return static_cast<long long>(fp4attn::dispatch::sm90_device_saved_bytes(shape_of(shape), recipe_of(recipe)));
  } catch (const std::exception& e) {
    fail(e);
    return -1;
  }
}

// The forward and backward below with `saved` (null: none): the forward
// fills it, the backward reads it instead of quantizing q and k again.
int fp4attn_bwd_forward_saved(const long long* shape, int recipe, int mask, int direct_p, int dtype, const void* q,
                              const long long* qs, const void* k, const long long* ks, const void* v,
                              const long long* vs, void* o, const long long* os, float* lse, void* workspace,
                              long long workspace_bytes, void* saved, long long saved_bytes, void* stream) {
  try {
    fp4attn::dispatch::DeviceForwardArgs a;
    a.shape = shape_of(shape);
    a.element = static_cast<fp4attn::dispatch::DeviceElement>(dtype);
    a.q = view(q, qs), a.k = view(k, ks), a.v = view(v, vs);
    a.o = o, a.o_stride_b = os[0], a.o_stride_s = os[1], a.o_stride_h = os[2];
    a.lse = lse;
    a.workspace = workspace, a.workspace_bytes = static_cast<std::size_t>(workspace_bytes);
    a.saved = saved, a.saved_bytes = static_cast<std::size_t>(saved_bytes);
    fp4attn::dispatch::sm90_forward_device(a, options_of(recipe, mask, direct_p), stream);
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

int fp4attn_bwd_backward_saved(const long long* shape, int recipe, int mask, int direct_p, int dtype, const void* q,
                               const long long* qs, const void* k, const long long* ks, const void* v,
                               const long long* vs, const void* o, const long long* os, const void* d_o,
                               const long long* dos, const float* lse, void* dq, const long long* dqs, void* dk,
                               const long long* dks, void* dv, const long long* dvs, void* workspace,
                               long long workspace_bytes, int deterministic, const void* saved,
                               long long saved_bytes, void* stream) {
  try {
    fp4attn::dispatch::DeviceBackwardArgs a;
    a.shape = shape_of(shape);
    a.element = static_cast<fp4attn::dispatch::DeviceElement>(dtype);
    a.q = view(q, qs), a.k = view(k, ks), a.v = view(v, vs), a.o = view(o, os), a.d_o = view(d_o, dos);
    a.lse = lse;
    a.dq = dq, a.dq_stride_b = dqs[0], a.dq_stride_s = dqs[1], a.dq_stride_h = dqs[2];
    a.dk = dk, a.dk_stride_b = dks[0], a.dk_stride_s = dks[1], a.dk_stride_h = dks[2];
    a.dv = dv, a.dv_stride_b = dvs[0], a.dv_stride_s = dvs[1], a.dv_stride_h = dvs[2];
    a.workspace = workspace, a.workspace_bytes = static_cast<std::size_t>(workspace_bytes);
    a.saved = saved, a.saved_bytes = static_cast<std::size_t>(saved_bytes);
    fp4attn::dispatch::sm90_backward_device(a, options_of(recipe, mask, direct_p), deterministic != 0, stream);
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

// dtype: 0 fp32, 1 fp16, 2 bf16 (q, k, v); o is bf16, lse fp32 (B, Hq, Sq).
int fp4attn_bwd_forward(const long long* shape, int recipe, int mask, int direct_p, int dtype, const void* q,
                        const long long* qs, const void* k, const long long* ks, const void* v, const long long* vs,
                        void* o, const long long* os, float* lse, void* workspace, long long workspace_bytes,
                        void* stream) {
  return fp4attn_bwd_forward_saved(shape, recipe, mask, direct_p, dtype, q, qs, k, ks, v, vs, o, os, lse, workspace,
                                   workspace_bytes, nullptr, 0, stream);
}

// All tensors of `dtype`; lse fp32 (B, Hq, Sq) natural log.
int fp4attn_bwd_backward(const long long* shape, int recipe, int mask, int direct_p, int dtype, const void* q,
                         const long long* qs, const void* k, const long long* ks, const void* v, const long long* vs,
                         const void* o, const long long* os, const void* d_o, const long long* dos, const float* lse,
                         void* dq, const long long* dqs, void* dk, const long long* dks, void* dv,
                         const long long* dvs, void* workspace, long long workspace_bytes, int deterministic,
                         void* stream) {
  return fp4attn_bwd_backward_saved(shape, recipe, mask, direct_p, dtype, q, qs, k, ks, v, vs, o, os, d_o, dos, lse,
                                    dq, dqs, dk, dks, dv, dvs, workspace, workspace_bytes, deterministic, nullptr, 0,
                                    stream);
}

}  // extern "C"
