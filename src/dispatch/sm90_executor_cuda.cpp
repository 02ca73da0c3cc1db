// The sm90 executor in a CUDA build: device check through the CUDA runtime,
// and the forward as upload → GPU quantizer → FP8 Direct-P kernel → download
// (recipes mxfp4 and mxfp4_train: MXFP4 quantizer, fold into E4M3, same kernel;
// recipe nvfp4: NVFP4 quantizer, expansion to BF16, the BF16 wgmma kernel).
#if defined(FP4ATTN_HAS_CUDA)

#include <cuda_runtime_api.h>

#include <cmath>
#include <memory>
#include <string>

#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/sm90/fwd/fp8_operands.hpp"
#include "cuda/sm90/fwd/fwd.hpp"
#include "cuda/sm90/fwd/mx_operands.hpp"
#include "cuda/sm90/fwd/nvfp4_fwd.hpp"
#include "cuda/sm90/fwd/nvfp4_operands.hpp"
#include "dispatch/sm90_executor.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::dispatch {
namespace {

constexpr int kHopperMajor = 9;
constexpr int kHopperMinor = 0;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error("cuda", std::string(what) + ": " + cudaGetErrorString(err));
}

// Device allocation freed on scope exit.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t count) : count_(count) {
    check(cudaMalloc(reinterpret_cast<void**>(&ptr_), count * sizeof(T)), "cudaMalloc");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr_); }
  T* get() const { return ptr_; }
  std::size_t bytes() const { return count_ * sizeof(T); }

 private:
  T* ptr_ = nullptr;
  std::size_t count_;
};

void upload(DeviceBuffer<float>& d, std::span<const float> x, cudaStream_t stream) {
  check(cudaMemcpyAsync(d.get(), x.data(), d.bytes(), cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
}

cuda_quantize::StridedInput contiguous(const float* data, std::int64_t B, std::int64_t S, std::int64_t H,
                                       std::int64_t D) {
  return {data, cuda_quantize::ElementType::f32, B, S, H, D, S * H * D, H * D, D};
}

float bf16_bits_to_float(std::uint16_t bits) {
  return __builtin_bit_cast(float, static_cast<std::uint32_t>(bits) << 16);
}

}  // namespace

bool sm90_device_present() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" status for later calls
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return false;
  return prop.major == kHopperMajor && prop.minor == kHopperMinor;
}

ForwardOutput sm90_forward(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                           std::span<const float> v, const AttentionOptions& opt) {
  check_sm90_grid(shape);
  const bool mx = opt.recipe == Recipe::mxfp4 || opt.recipe == Recipe::mxfp4_train;
  const bool nvfp4 = opt.recipe == Recipe::nvfp4;
  if (opt.recipe != Recipe::fp8 && !mx && !nvfp4)
    throw Error("recipe", "the sm90 executor implements recipes fp8, mxfp4, mxfp4_train and nvfp4; " +
                              std::string(to_string(opt.recipe)) + " runs on the emulator");
  if (opt.block_q != cuda_quantize::kTokenBlock || opt.block_k != cuda_quantize::kTokenBlock)
    throw Error("block_q", "the sm90 kernel's tiles (and FP8 scale blocks) are 128 tokens");
  const float scale = opt.softmax_scale > 0.0f ? opt.softmax_scale : 1.0f / std::sqrt(static_cast<float>(shape.D));
  const cudaStream_t stream = nullptr;

  DeviceBuffer<float> dq(q.size()), dk(k.size()), dv(v.size());
  upload(dq, q, stream);
  upload(dk, k, stream);
  upload(dv, v, stream);
  const auto q_in = contiguous(dq.get(), shape.B, shape.Sq, shape.Hq, shape.D);
  const auto k_in = contiguous(dk.get(), shape.B, shape.Sk, shape.Hkv, shape.D);
  const auto v_in = contiguous(dv.get(), shape.B, shape.Sk, shape.Hkv, shape.D);
  DeviceBuffer<std::uint16_t> o(shape.q_elems());
  DeviceBuffer<float> lse(shape.lse_elems());
  // Exactly one of the operand sets is built; it must outlive the kernel.
  std::unique_ptr<sm90::fwd::Fp8Operands> fp8_operands;
  std::unique_ptr<sm90::fwd::MxOperands> mx_operands;
  std::unique_ptr<sm90::fwd::Nvfp4Operands> nvfp4_operands;
  sm90::fwd::Fp8ForwardArgs a;
  if (nvfp4) {
    nvfp4_operands = std::make_unique<sm90::fwd::Nvfp4Operands>(shape);
    nvfp4_operands->prepare(q_in, k_in, v_in, opt.smooth_k, scale, stream);
    nvfp4_operands->check_finite(stream);
    sm90::fwd::Nvfp4ForwardArgs na = nvfp4_operands->forward_args(opt.mask, opt.direct_p, scale, opt.smooth_k);
    na.window_left = kernel_window_bound(opt.window.left), na.window_right = kernel_window_bound(opt.window.right);
    na.o = o.get();
    na.o_stride_b = shape.Sq * shape.Hq * shape.D, na.o_stride_s = shape.Hq * shape.D, na.o_stride_h = shape.D;
    na.lse = lse.get();
    sm90::fwd::forward_nvfp4(na, stream);
  } else if (mx) {
    mx_operands = std::make_unique<sm90::fwd::MxOperands>(shape, opt.recipe, opt.mx_scale_rule);
    mx_operands->prepare(q_in, k_in, v_in, opt.smooth_k, scale, stream);
    mx_operands->check_finite(stream);
    a = mx_operands->forward_args(opt.mask, opt.direct_p, scale, opt.smooth_k);
  } else {
    fp8_operands = std::make_unique<sm90::fwd::Fp8Operands>(shape);
    const cuda_quantize::Fp8Buffers& bufs = fp8_operands->buffers();
    cuda_quantize::quantize_fp8(q_in, k_in, v_in, opt.smooth_k, scale, bufs, stream);
    cuda_quantize::check_finite(bufs, stream);
    a = fp8_operands->forward_args(opt.mask, opt.direct_p ? sm90::fwd::PCode::direct_p : sm90::fwd::PCode::exp2_cvt,
                                   scale, opt.smooth_k);
  }

  if (!nvfp4) {
    a.window_left = kernel_window_bound(opt.window.left), a.window_right = kernel_window_bound(opt.window.right);
    a.o = o.get();
    // O is dense (B, Sq, Hq, D) bf16 here; Q's codes may sit at a wider row pitch (Fp8Buffers::code_pitch).
    a.o_stride_h = shape.D, a.o_stride_s = shape.Hq * shape.D, a.o_stride_b = shape.Sq * shape.Hq * shape.D;
    a.lse = lse.get();
    sm90::fwd::forward_fp8(a, stream);
  }

  std::vector<std::uint16_t> o_bits(shape.q_elems());
  ForwardOutput out;
  out.lse.resize(shape.lse_elems());
  check(cudaMemcpyAsync(o_bits.data(), o.get(), o.bytes(), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaMemcpyAsync(out.lse.data(), lse.get(), lse.bytes(), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "sm90 forward");
  out.o.resize(o_bits.size());
  for (std::size_t i = 0; i < o_bits.size(); ++i) out.o[i] = bf16_bits_to_float(o_bits[i]);
  out.executor = Executor::sm90;
  return out;
}

}  // namespace fp4attn::dispatch

#endif  // FP4ATTN_HAS_CUDA
