// The sm90 executor in a CUDA build: device check through the CUDA runtime,
// and the forward as upload → GPU quantizer → FP8 Direct-P kernel → download.
#if defined(FP4ATTN_HAS_CUDA)

#include <cuda_runtime_api.h>

#include <cmath>
#include <string>

#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/sm90/fwd/fwd.hpp"
#include "dispatch/sm90_executor.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::dispatch {
namespace {

constexpr int kHopperMajor = 9;
constexpr int kHopperMinor = 0;
constexpr int kNonfiniteFlags = 3;

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
  if (opt.recipe != Recipe::fp8)
    throw Error("recipe", "the sm90 executor implements recipe fp8; " + std::string(to_string(opt.recipe)) +
                              " runs on the emulator");
  if (opt.block_q != cuda_quantize::kTokenBlock || opt.block_k != cuda_quantize::kTokenBlock)
    throw Error("block_q", "the sm90 kernel's tiles (and FP8 scale blocks) are 128 tokens");
  const float scale = opt.softmax_scale > 0.0f ? opt.softmax_scale : 1.0f / std::sqrt(static_cast<float>(shape.D));
  const cudaStream_t stream = nullptr;

  DeviceBuffer<float> dq(q.size()), dk(k.size()), dv(v.size());
  upload(dq, q, stream);
  upload(dk, k, stream);
  upload(dv, v, stream);
  const std::int64_t vt_keys = cuda_quantize::padded_keys(shape.Sk);
  const std::int64_t q_blocks = (shape.Sq + cuda_quantize::kTokenBlock - 1) / cuda_quantize::kTokenBlock;
  const std::int64_t k_blocks = (shape.Sk + cuda_quantize::kTokenBlock - 1) / cuda_quantize::kTokenBlock;
  DeviceBuffer<std::uint8_t> q8(shape.q_elems()), k8(shape.kv_elems()),
      vt(static_cast<std::size_t>(shape.B * shape.Hkv * shape.D * vt_keys));
  DeviceBuffer<float> q_scale(shape.B * shape.Hq * q_blocks), k_scale(shape.B * shape.Hkv * k_blocks),
      v_scale(shape.B * shape.Hkv * shape.D), k_mean(shape.B * shape.Hkv * shape.D), lse_shift(shape.lse_elems());
  DeviceBuffer<int> flags(kNonfiniteFlags);
  check(cudaMemsetAsync(flags.get(), 0, flags.bytes(), stream), "cudaMemsetAsync");

  const cuda_quantize::Fp8Buffers bufs{q8.get(),    q_scale.get(), k8.get(),        k_scale.get(), vt.get(),
                                       v_scale.get(), k_mean.get(), lse_shift.get(), vt_keys,       flags.get()};
  cuda_quantize::quantize_fp8(contiguous(dq.get(), shape.B, shape.Sq, shape.Hq, shape.D),
                              contiguous(dk.get(), shape.B, shape.Sk, shape.Hkv, shape.D),
                              contiguous(dv.get(), shape.B, shape.Sk, shape.Hkv, shape.D), opt.smooth_k, scale, bufs,
                              stream);
  cuda_quantize::check_finite(bufs, stream);

  DeviceBuffer<std::uint16_t> o(shape.q_elems());
  DeviceBuffer<float> lse(shape.lse_elems());
  sm90::fwd::Fp8ForwardArgs a;
  a.q = q8.get();
  a.q_stride_b = shape.Sq * shape.Hq * shape.D, a.q_stride_s = shape.Hq * shape.D, a.q_stride_h = shape.D;
  a.k = k8.get();
  a.k_stride_b = shape.Sk * shape.Hkv * shape.D, a.k_stride_s = shape.Hkv * shape.D, a.k_stride_h = shape.D;
  a.vt = vt.get();
  a.vt_keys = vt_keys;
  a.q_scale = q_scale.get(), a.k_scale = k_scale.get(), a.v_scale = v_scale.get();
  a.lse_shift = opt.smooth_k ? lse_shift.get() : nullptr;
  a.o = o.get();
  a.o_stride_b = a.q_stride_b, a.o_stride_s = a.q_stride_s, a.o_stride_h = a.q_stride_h;
  a.lse = lse.get();
  a.B = static_cast<int>(shape.B), a.Hq = static_cast<int>(shape.Hq), a.Hkv = static_cast<int>(shape.Hkv);
  a.Sq = static_cast<int>(shape.Sq), a.Sk = static_cast<int>(shape.Sk), a.D = static_cast<int>(shape.D);
  a.softmax_scale = scale;
  a.mask = opt.mask;
  a.p_code = opt.direct_p ? sm90::fwd::PCode::direct_p : sm90::fwd::PCode::exp2_cvt;
  sm90::fwd::forward_fp8(a, stream);

  std::vector<std::uint16_t> o_bits(shape.q_elems());
  ForwardOutput out;
  out.lse.resize(shape.lse_elems());
  check(cudaMemcpyAsync(o_bits.data(), o.get(), o.bytes(), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaMemcpyAsync(out.lse.data(), lse.get(), lse.bytes(), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "fp8 forward");
  out.o.resize(o_bits.size());
  for (std::size_t i = 0; i < o_bits.size(); ++i) out.o[i] = bf16_bits_to_float(o_bits[i]);
  out.executor = Executor::sm90;
  return out;
}

}  // namespace fp4attn::dispatch

#endif  // FP4ATTN_HAS_CUDA
