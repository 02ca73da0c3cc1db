// C ABI over the GPU FP4 quantizer for ctypes callers
// (bench/bench_quantize_fp4.py). A plan owns the outputs of one operand of
// one shape; callers pass a device pointer (e.g. a torch tensor's data_ptr)
// with its element strides and a CUDA stream.
#include <cuda_runtime_api.h>

#include <exception>
#include <memory>
#include <string>

#include "cuda/quantize/quantize_fp4.hpp"
#include "fp4attn/error.hpp"

namespace {

namespace cq = fp4attn::cuda_quantize;

thread_local std::string g_last_error;

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw fp4attn::Error("cuda", std::string(what) + ": " + cudaGetErrorString(err));
}

class DeviceBytes {
 public:
  explicit DeviceBytes(std::size_t bytes) { check_cuda(cudaMalloc(&ptr_, bytes), "cudaMalloc"); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() { cudaFree(ptr_); }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

struct Fp4Plan {
  cq::Fp4Operand op;
  cq::Fp4Options options;
  long long B, S, H, D;
  std::unique_ptr<DeviceBytes> codes, scales, tensor_scale, k_mean, flags, workspace;
  cq::Fp4Buffers bufs;
};

int fail(const std::exception& e) {
  g_last_error = e.what();
  return 1;
}

}  // namespace

extern "C" {

const char* fp4attn_fp4_last_error() { return g_last_error.c_str(); }

// operand: 0 q, 1 k, 2 v; format: 1 mxfp4, 2 nvfp4 (fp4attn::TensorFormat);
// mx_rule: 0 round_up, 1 ocp_floor. Returns null on failure (see fp4attn_fp4_last_error).
void* fp4attn_fp4_plan_create(int operand, int format, int B, int S, int H, int D, int smooth_k, int v_transposed,
                              int mx_rule) {
  try {
    auto p = std::make_unique<Fp4Plan>();
    p->op = static_cast<cq::Fp4Operand>(operand);
    p->options.format = static_cast<fp4attn::TensorFormat>(format);
    p->options.mx_scale_rule = static_cast<fp4attn::MxScaleRule>(mx_rule);
    p->options.smooth_k = smooth_k != 0;
    p->options.v_transposed = v_transposed != 0;
    p->B = B, p->S = S, p->H = H, p->D = D;
    const cq::Fp4Sizes sizes = cq::fp4_sizes(p->op, p->options.format, B, S, H, D);
    p->codes = std::make_unique<DeviceBytes>(static_cast<std::size_t>(sizes.code_bytes));
    p->scales = std::make_unique<DeviceBytes>(static_cast<std::size_t>(sizes.scale_bytes));
    p->tensor_scale = std::make_unique<DeviceBytes>(sizeof(float));
    p->k_mean = std::make_unique<DeviceBytes>(sizeof(float) * static_cast<std::size_t>(B) * H * D);
    p->flags = std::make_unique<DeviceBytes>(3 * sizeof(int));
    p->workspace = std::make_unique<DeviceBytes>(cq::fp4_workspace_bytes(B, S, H, D));
    check_cuda(cudaMemset(p->flags->as<int>(), 0, 3 * sizeof(int)), "cudaMemset");
    const cq::Fp4Output out{p->codes->as<std::uint8_t>(), p->scales->as<std::uint8_t>(), p->tensor_scale->as<float>()};
    (p->op == cq::Fp4Operand::q ? p->bufs.q : p->op == cq::Fp4Operand::k ? p->bufs.k : p->bufs.v) = out;
    p->bufs.k_mean = p->k_mean->as<float>();
    p->bufs.nonfinite = p->flags->as<int>();
    p->bufs.workspace = p->workspace->as<void>();
    return p.release();
  } catch (const std::exception& e) {
    fail(e);
    return nullptr;
  }
}

void fp4attn_fp4_plan_destroy(void* plan) { delete static_cast<Fp4Plan*>(plan); }

// dtype: 0 fp32, 1 fp16, 2 bf16; strides: (b, s, h) in elements.
int fp4attn_fp4_quantize(void* plan, const void* x, int dtype, const long long* strides, void* stream) {
  try {
    auto* p = static_cast<Fp4Plan*>(plan);
    const cq::StridedInput in{x, static_cast<cq::ElementType>(dtype), p->B, p->S, p->H, p->D,
                              strides[0], strides[1], strides[2]};
    cq::quantize_fp4(in, p->op, p->options, p->bufs, static_cast<cudaStream_t>(stream));
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

// Synchronizes and reports non-finite input seen by earlier quantize calls.
int fp4attn_fp4_check_finite(void* plan, void* stream) {
  try {
    cq::check_finite(static_cast<Fp4Plan*>(plan)->bufs, static_cast<cudaStream_t>(stream));
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

}  // extern "C"
