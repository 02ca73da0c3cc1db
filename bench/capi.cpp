// C ABI over the sm90 fp8 forward for ctypes callers (bench/bench_fwd.py).
// A plan owns the quantized operands of one problem size; callers pass device
// pointers (e.g. torch tensors' data_ptr) and a CUDA stream.
#include <cuda_runtime_api.h>

#include <cmath>
#include <exception>
#include <stdexcept>
#include <string>

#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/sm90/fwd/fwd.hpp"

namespace {

thread_local std::string g_last_error;

struct Plan {
  fp4attn::sm90::fwd::Fp8ForwardArgs args;
  fp4attn::cuda_quantize::Fp8Buffers bufs;
  fp4attn::cuda_quantize::Fp8Schedule schedule;
  bool smooth_k = true;
};

int fail(const std::exception& e) {
  g_last_error = e.what();
  return 1;
}

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) throw std::runtime_error("cudaMalloc of " + std::to_string(bytes) + " bytes failed");
  return p;
}

fp4attn::cuda_quantize::StridedInput input(const void* data, int dtype, long long B, long long S, long long H,
                                           long long D, const long long* strides) {
  return {data, static_cast<fp4attn::cuda_quantize::ElementType>(dtype), B, S, H, D, strides[0], strides[1], strides[2]};
}

}  // namespace

extern "C" {

const char* fp4attn_last_error() { return g_last_error.c_str(); }

// mask: 0 none, 1 causal bottom-right. Returns null on failure (see fp4attn_last_error).
void* fp4attn_plan_create(int B, int Hq, int Hkv, int Sq, int Sk, int D, int mask, int direct_p, int smooth_k,
                          float softmax_scale) {
  try {
    auto* p = new Plan();
    auto& a = p->args;
    a.B = B, a.Hq = Hq, a.Hkv = Hkv, a.Sq = Sq, a.Sk = Sk, a.D = D;
    a.softmax_scale = softmax_scale > 0.0f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(D));
    a.mask = mask ? fp4attn::MaskKind::causal : fp4attn::MaskKind::none;
    a.p_code = direct_p ? fp4attn::sm90::fwd::PCode::direct_p : fp4attn::sm90::fwd::PCode::exp2_cvt;
    p->smooth_k = smooth_k != 0;
    const long long tb = fp4attn::cuda_quantize::kTokenBlock;
    auto& b = p->bufs;
    b.vt_keys = fp4attn::cuda_quantize::padded_keys(Sk);
    b.q = static_cast<std::uint8_t*>(device_alloc(1ll * B * Sq * Hq * D));
    b.k = static_cast<std::uint8_t*>(device_alloc(1ll * B * Sk * Hkv * D));
    b.vt = static_cast<std::uint8_t*>(device_alloc(1ll * B * Hkv * D * b.vt_keys));
    b.q_scale = static_cast<float*>(device_alloc(sizeof(float) * B * Hq * ((Sq + tb - 1) / tb)));
    b.k_scale = static_cast<float*>(device_alloc(sizeof(float) * B * Hkv * ((Sk + tb - 1) / tb)));
    b.v_scale = static_cast<float*>(device_alloc(sizeof(float) * B * Hkv * D));
    b.k_mean = static_cast<float*>(device_alloc(sizeof(float) * B * Hkv * D));
    b.lse_shift = static_cast<float*>(device_alloc(sizeof(float) * B * Hq * Sq));
    b.nonfinite = static_cast<int*>(device_alloc(3 * sizeof(int)));
    b.workspace = device_alloc(fp4attn::cuda_quantize::fp8_workspace_bytes(B, Hkv, Sk, D));
    cudaMemset(b.nonfinite, 0, 3 * sizeof(int));
    a.q = b.q, a.k = b.k, a.vt = b.vt, a.vt_keys = b.vt_keys;
    a.q_stride_b = 1ll * Sq * Hq * D, a.q_stride_s = 1ll * Hq * D, a.q_stride_h = D;
    a.k_stride_b = 1ll * Sk * Hkv * D, a.k_stride_s = 1ll * Hkv * D, a.k_stride_h = D;
    a.q_scale = b.q_scale, a.k_scale = b.k_scale, a.v_scale = b.v_scale;
    a.lse_shift = p->smooth_k ? b.lse_shift : nullptr;
    return p;
  } catch (const std::exception& e) {
    fail(e);
    return nullptr;
  }
}

void fp4attn_plan_destroy(void* plan) {
  auto* p = static_cast<Plan*>(plan);
  if (p == nullptr) return;
  for (void* ptr : {static_cast<void*>(p->bufs.q), static_cast<void*>(p->bufs.k), static_cast<void*>(p->bufs.vt),
                    static_cast<void*>(p->bufs.q_scale), static_cast<void*>(p->bufs.k_scale),
                    static_cast<void*>(p->bufs.v_scale), static_cast<void*>(p->bufs.k_mean),
                    static_cast<void*>(p->bufs.lse_shift), static_cast<void*>(p->bufs.nonfinite),
                    p->bufs.workspace})
    cudaFree(ptr);
  delete p;
}

void fp4attn_plan_set_direct_p(void* plan, int direct_p) {
  static_cast<Plan*>(plan)->args.p_code =
      direct_p ? fp4attn::sm90::fwd::PCode::direct_p : fp4attn::sm90::fwd::PCode::exp2_cvt;
}

// Work order of the quantizer (bench/bench_quantize.py sweeps it): lag_chunks < 0
// and ctas_per_sm = 0 pick the defaults.
void fp4attn_plan_set_quantize_schedule(void* plan, int lag_chunks, int ctas_per_sm) {
  static_cast<Plan*>(plan)->schedule = {lag_chunks, ctas_per_sm};
}

// dtype: 0 fp32, 1 fp16, 2 bf16; strides: (b, s, h) in elements for each of q, k, v.
int fp4attn_quantize(void* plan, const void* q, const void* k, const void* v, int dtype, const long long* q_strides,
                     const long long* k_strides, const long long* v_strides, void* stream) {
  try {
    auto* p = static_cast<Plan*>(plan);
    const auto& a = p->args;
    fp4attn::cuda_quantize::quantize_fp8(input(q, dtype, a.B, a.Sq, a.Hq, a.D, q_strides),
                                         input(k, dtype, a.B, a.Sk, a.Hkv, a.D, k_strides),
                                         input(v, dtype, a.B, a.Sk, a.Hkv, a.D, v_strides), p->smooth_k,
                                         a.softmax_scale, p->bufs, static_cast<cudaStream_t>(stream), p->schedule);
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

// Synchronizes and reports non-finite input seen by earlier quantize calls.
int fp4attn_check_finite(void* plan, void* stream) {
  try {
    fp4attn::cuda_quantize::check_finite(static_cast<Plan*>(plan)->bufs, static_cast<cudaStream_t>(stream));
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
