// Two memory-bound launches before recipe fp8's kernel on caller-quantized
// E4M3 inputs (e4m3_inputs.hpp): the scales with Q's and K's NaN scan, then Vᵀ.
#include "cuda/sm90/fwd/e4m3_inputs.hpp"

#include <algorithm>
#include <cstdint>

#include "cuda/common/device_info.hpp"
#include "cuda/common/device_memory.hpp"
#include "cuda/quantize/quantize_fp8.hpp"  // kTokenBlock, kVtKeyGroup, vt_key_of_slot, padded_keys

namespace fp4attn::sm90::fwd {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 16;  // bytes per vector load; D is a multiple of it
constexpr int kMaxD = 256;
constexpr int kTileKeys = cuda_quantize::kTokenBlock;
constexpr int kFlagQ = 0, kFlagK = 1, kFlagV = 2;

// E4M3's NaN is S.1111.111 (it has no infinities): a byte whose low seven bits
// are all ones. Adding 1 to each masked byte carries into bit 7 only for those.
__device__ __forceinline__ bool has_nan_code(uint4 w) {
  const auto nan_bytes = [](std::uint32_t x) { return ((x & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u; };
  return (nan_bytes(w.x) | nan_bytes(w.y) | nan_bytes(w.z) | nan_bytes(w.w)) != 0u;
}

__device__ __forceinline__ bool good_descale(float x) { return x > 0.0f && isfinite(x); }

__device__ __forceinline__ void raise_flag(bool bad, int* flag) {
  // One store per warp that saw a bad value; every writer stores the same 1.
  if (__any_sync(0xFFFFFFFFu, bad) && (threadIdx.x % 32) == 0) *flag = 1;
}

struct ScanGeometry {
  int B, S, H;
};

__device__ bool scan_tensor(const E4m3View& x, ScanGeometry g, int D, std::int64_t first, std::int64_t stride) {
  const int chunks = D / kChunk;
  const std::int64_t total = static_cast<std::int64_t>(g.B) * g.S * g.H * chunks;
  bool bad = false;
  for (std::int64_t i = first; i < total; i += stride) {
    std::int64_t r = i / chunks;
    const int c = static_cast<int>(i - r * chunks);
    const std::int64_t h = r % g.H;
    r /= g.H;
    const std::int64_t s = r % g.S, b = r / g.S;
    const auto* p = reinterpret_cast<const uint4*>(x.data + b * x.stride_b + s * x.stride_s + h * x.stride_h) + c;
    bad |= has_nan_code(__ldg(p));
  }
  return bad;
}

// Grid-stride: every scale element, then Q's and K's code rows, 16 bytes a load.
__global__ void __launch_bounds__(kThreads) e4m3_scales_scan_kernel(E4m3CallerInputs in, E4m3KernelOperands out) {
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const int group = in.Hq / in.Hkv;
  const std::int64_t q_blocks = (in.Sq + kTileKeys - 1) / kTileKeys, k_blocks = (in.Sk + kTileKeys - 1) / kTileKeys;
  const std::int64_t n_q = static_cast<std::int64_t>(in.B) * in.Hq * q_blocks;
  const std::int64_t n_k = static_cast<std::int64_t>(in.B) * in.Hkv * k_blocks;
  const std::int64_t n_v = static_cast<std::int64_t>(in.B) * in.Hkv * in.D;
  bool bad_q = false, bad_k = false, bad_v = false;
  for (std::int64_t i = first; i < n_q + n_k + n_v; i += stride) {
    if (i < n_q) {
      const std::int64_t bh = i / q_blocks;  // b · Hq + hq
      const std::int64_t b = bh / in.Hq, hkv = (bh % in.Hq) / group;
      const float x = in.q_descale != nullptr ? in.q_descale[b * in.Hkv + hkv] : 1.0f;
      bad_q |= !good_descale(x);
      out.q_scale[i] = x;
    } else if (i < n_q + n_k) {
      const std::int64_t j = i - n_q, bh = j / k_blocks;  // b · Hkv + h
      const float x = in.k_descale != nullptr ? in.k_descale[bh] : 1.0f;
      bad_k |= !good_descale(x);
      out.k_scale[j] = x;
    } else {
      const std::int64_t j = i - n_q - n_k, bh = j / in.D;
      const float x = in.v_descale != nullptr ? in.v_descale[bh] : 1.0f;
      bad_v |= !good_descale(x);
      out.v_scale[j] = x;
    }
  }
  bad_q |= scan_tensor(in.q, {in.B, in.Sq, in.Hq}, in.D, first, stride);
  bad_k |= scan_tensor(in.k, {in.B, in.Sk, in.Hkv}, in.D, first, stride);
  raise_flag(bad_q, out.nonfinite + kFlagQ);
  raise_flag(bad_k, out.nonfinite + kFlagK);
  raise_flag(bad_v, out.nonfinite + kFlagV);
}

// One CTA per (b · Hkv + h, 128-key tile): the tile's V rows into shared
// memory (zero codes past Sk), then each thread writes whole 32-key groups of
// one channel row of Vᵀ, slot s of a group holding key vt_key_of_slot(s). A
// warp's lanes take 32 neighbouring channels of one group, so each of its
// shared-memory byte reads falls in one row: no bank conflicts.
__global__ void __launch_bounds__(kThreads) e4m3_vt_kernel(E4m3CallerInputs in, E4m3KernelOperands out, std::int64_t vt_keys) {
  constexpr int kPitch = kMaxD + kChunk;  // rows 16-byte aligned for the vector stores
  __shared__ __align__(16) std::uint8_t tile[kTileKeys * kPitch];
  const int D = in.D, chunks = D / kChunk;
  const std::int64_t bh = blockIdx.x, b = bh / in.Hkv, h = bh % in.Hkv;
  const std::int64_t key0 = static_cast<std::int64_t>(blockIdx.y) * kTileKeys;
  bool bad = false;
  for (int i = threadIdx.x; i < kTileKeys * chunks; i += kThreads) {
    const int row = i / chunks, c = i % chunks;
    const std::int64_t key = key0 + row;
    uint4 w = make_uint4(0u, 0u, 0u, 0u);
    if (key < in.Sk) {
      w = __ldg(reinterpret_cast<const uint4*>(in.v.data + b * in.v.stride_b + key * in.v.stride_s +
                                               h * in.v.stride_h) + c);
      bad |= has_nan_code(w);
    }
    *reinterpret_cast<uint4*>(tile + row * kPitch + c * kChunk) = w;
  }
  __syncthreads();
  constexpr int kGroups = kTileKeys / cuda_quantize::kVtKeyGroup;
  std::uint8_t* dst = out.vt + bh * D * vt_keys + key0;
  for (int i = threadIdx.x; i < D * kGroups; i += kThreads) {
    const int d = i % D, g = i / D;
    std::uint32_t words[cuda_quantize::kVtKeyGroup / 4];
#pragma unroll
    for (int m = 0; m < cuda_quantize::kVtKeyGroup / 4; ++m) {
      std::uint32_t w = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key = g * cuda_quantize::kVtKeyGroup + cuda_quantize::vt_key_of_slot(4 * m + j);
        w |= static_cast<std::uint32_t>(tile[key * kPitch + d]) << (8 * j);
      }
      words[m] = w;
    }
    auto* row = reinterpret_cast<uint4*>(dst + d * vt_keys + g * cuda_quantize::kVtKeyGroup);
    row[0] = make_uint4(words[0], words[1], words[2], words[3]);
    row[1] = make_uint4(words[4], words[5], words[6], words[7]);
  }
  raise_flag(bad, out.nonfinite + kFlagV);
}

}  // namespace

void prepare_e4m3_operands(const E4m3CallerInputs& in, const E4m3KernelOperands& out, cudaStream_t stream) {
  const std::int64_t scan_chunks =
      (static_cast<std::int64_t>(in.B) * in.Sq * in.Hq + static_cast<std::int64_t>(in.B) * in.Sk * in.Hkv) *
      (in.D / kChunk);
  const std::int64_t wanted = (scan_chunks + kThreads - 1) / kThreads;
  const int ctas = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(wanted, cuda_common::sm_count() * 8)));
  e4m3_scales_scan_kernel<<<ctas, kThreads, 0, stream>>>(in, out);
  cuda_common::check_cuda(cudaGetLastError(), "e4m3_scales_scan_kernel launch");
  const std::int64_t vt_keys = cuda_quantize::padded_keys(in.Sk);
  // (b, h) on x, whose limit is 2^31 − 1; the tiles on y (up to 65535 · 128 keys).
  const dim3 grid(static_cast<unsigned>(static_cast<std::int64_t>(in.B) * in.Hkv),
                  static_cast<unsigned>(vt_keys / kTileKeys));
  e4m3_vt_kernel<<<grid, kThreads, 0, stream>>>(in, out, vt_keys);
  cuda_common::check_cuda(cudaGetLastError(), "e4m3_vt_kernel launch");
}

}  // namespace fp4attn::sm90::fwd
