// One thread per 16-element NVFP4 block: 8 code bytes and one scale byte in,
// 16 bf16 (32 bytes) out. Memory-bound; the kernel's operands are 4× the
// size of the codes, which is the price of running FP4 on BF16 tensor cores.
#include "cuda/sm90/fwd/nvfp4_bf16/expand.hpp"

#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "cuda/common/device_memory.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/formats.hpp"

namespace fp4attn::sm90::fwd {
namespace {

namespace cq = cuda_quantize;
constexpr int kBlock = 16;  // NVFP4 block
constexpr int kThreads = 256;
constexpr std::uint32_t kTwiceE2M1 = 0xC8643210u;  // 2 × the E2M1 magnitude of code i, in nibble i
constexpr std::uint32_t kE2M1Sign = 8u;

// Element · s_b as a bf16, exact: 2|q| is an integer ≤ 12 and s_b / 2 a power
// of two times ≤ 4 significant bits, so the float product is exact and has at
// most 6 significant bits.
__device__ __nv_bfloat16 e2m1_times(std::uint32_t code, float half_scale) {
  const float twice = static_cast<float>((kTwiceE2M1 >> (4 * (code & 7u))) & 0xFu);
  const float v = twice * half_scale;
  return __float2bfloat16_rn(code & kE2M1Sign ? -v : v);
}

// 8 bytes of codes (16 elements, element 2i in the low nibble of byte i) → 16 bf16 at `out`.
__device__ void expand_block(const std::uint8_t* codes, std::uint8_t scale_code, __nv_bfloat16* out) {
  const float half_scale = 0.5f * decode(ElemFormat::ue4m3, scale_code);
  // Two 32-bit loads: the quantizer guarantees 4-byte alignment of the codes.
  const std::uint32_t c_lo = reinterpret_cast<const std::uint32_t*>(codes)[0];
  const std::uint32_t c_hi = reinterpret_cast<const std::uint32_t*>(codes)[1];
  alignas(16) __nv_bfloat16 v[kBlock];
#pragma unroll
  for (int i = 0; i < kBlock; ++i) v[i] = e2m1_times(((i < 8 ? c_lo : c_hi) >> (4 * (i % 8))) & 0xFu, half_scale);
  reinterpret_cast<uint4*>(out)[0] = reinterpret_cast<const uint4*>(v)[0];
  reinterpret_cast<uint4*>(out)[1] = reinterpret_cast<const uint4*>(v)[1];
}

__global__ void expand_qk_kernel(const std::uint8_t* codes, const std::uint8_t* scales, std::int64_t blocks,
                                 __nv_bfloat16* out) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= blocks) return;
  // Rows of D elements are D/16 consecutive blocks, so block i is element 16i.
  expand_block(codes + i * (kBlock / 2), scales[i], out + i * kBlock);
}

// Block i: key block kb = i % key_blocks of channel row (b, h, d) = i / key_blocks.
__global__ void expand_vt_kernel(const std::uint8_t* codes, const std::uint8_t* scales, std::int64_t blocks,
                                 std::int64_t key_blocks, std::int64_t D, __nv_bfloat16* out) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= blocks) return;
  const std::int64_t kb = i % key_blocks, row = i / key_blocks;
  const std::int64_t d = row % D, head = row / D;  // head = b·H + h
  expand_block(codes + i * (kBlock / 2), scales[(head * key_blocks + kb) * D + d], out + i * kBlock);
}

__global__ void lse_shift_kernel(const std::uint8_t* codes, const std::uint8_t* scales, const float* tensor_scale,
                                 std::int64_t B, std::int64_t Sq, std::int64_t Hq, std::int64_t Hkv, std::int64_t D,
                                 const float* k_mean, float softmax_scale, float* lse_shift) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // (b, h, s)
  if (row >= B * Hq * Sq) return;
  const std::int64_t bh = row / Sq, b = bh / Hq, h = bh % Hq;
  const float* mean = k_mean + (b * Hkv + h / (Hq / Hkv)) * D;
  const float ts = *tensor_scale;
  float dot = 0.0f;
  for (std::int64_t d = 0; d < D; ++d) {
    const std::uint32_t code = (codes[(row * D + d) / 2] >> (4 * (d % 2))) & 0xFu;
    const float scale = decode(ElemFormat::ue4m3, scales[row * (D / kBlock) + d / kBlock]);
    const float value = __fdiv_rn(__fmul_rn(decode(ElemFormat::e2m1, code), scale), ts);
    dot = __fadd_rn(dot, __fmul_rn(value, mean[d]));
  }
  lse_shift[row] = __fmul_rn(softmax_scale, dot);
}

unsigned grid_for(std::int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

void check_dims(std::int64_t D, const char* name) {
  if (D % kBlock != 0 || D <= 0) throw Error("D", std::string(name) + ": D must be a positive multiple of 16");
}

constexpr std::uintptr_t kCodeAlign = 4, kOutAlign = 16;  // 32-bit code loads, 16-byte stores

void check_buffers(const cq::Fp4Output& in, const void* out) {
  if (in.codes == nullptr || reinterpret_cast<std::uintptr_t>(in.codes) % kCodeAlign != 0)
    throw Error("codes", "must be a 4-byte aligned device pointer");
  if (in.scales == nullptr) throw Error("scales", "is a null device pointer");
  if (out == nullptr || reinterpret_cast<std::uintptr_t>(out) % kOutAlign != 0)
    throw Error("bf16_out", "must be a 16-byte aligned device pointer");
}

}  // namespace

void expand_nvfp4_qk(const cq::Fp4Output& in, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D,
                     void* bf16_out, cudaStream_t stream) {
  check_dims(D, "expand_nvfp4_qk");
  check_buffers(in, bf16_out);
  const std::int64_t blocks = B * H * S * D / kBlock;
  if (blocks == 0) return;
  expand_qk_kernel<<<grid_for(blocks), kThreads, 0, stream>>>(in.codes, in.scales, blocks,
                                                             static_cast<__nv_bfloat16*>(bf16_out));
  cuda_common::check_cuda(cudaGetLastError(), "expand_nvfp4_qk launch");
}

void expand_nvfp4_vt(const cq::Fp4Output& in, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D,
                     void* bf16_out, cudaStream_t stream) {
  check_dims(D, "expand_nvfp4_vt");
  check_buffers(in, bf16_out);
  const std::int64_t key_blocks = cq::fp4_padded_tokens(S) / kBlock;
  const std::int64_t blocks = B * H * D * key_blocks;
  if (blocks == 0) return;
  expand_vt_kernel<<<grid_for(blocks), kThreads, 0, stream>>>(in.codes, in.scales, blocks, key_blocks, D,
                                                             static_cast<__nv_bfloat16*>(bf16_out));
  cuda_common::check_cuda(cudaGetLastError(), "expand_nvfp4_vt launch");
}

void nvfp4_lse_shift(const cq::Fp4Output& q, std::int64_t B, std::int64_t Sq, std::int64_t Hq, std::int64_t Hkv,
                     std::int64_t D, const float* k_mean, float softmax_scale, float* lse_shift, cudaStream_t stream) {
  check_dims(D, "nvfp4_lse_shift");
  if (Hkv <= 0 || Hq % Hkv != 0) throw Error("Hkv", "Hq must be a multiple of Hkv");
  const std::int64_t rows = B * Hq * Sq;
  if (rows == 0) return;
  lse_shift_kernel<<<grid_for(rows), kThreads, 0, stream>>>(q.codes, q.scales, q.tensor_scale, B, Sq, Hq, Hkv, D,
                                                           k_mean, softmax_scale, lse_shift);
  cuda_common::check_cuda(cudaGetLastError(), "nvfp4_lse_shift launch");
}

}  // namespace fp4attn::sm90::fwd
