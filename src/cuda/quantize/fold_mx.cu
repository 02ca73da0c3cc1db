// Device side of fold_mx.hpp: one CTA per fold region, the group exponent R
// by a max over its E8M0 codes, then one pass that rewrites E2M1 nibbles as
// E4M3 bytes in the forward kernel's layout.
#include "cuda/quantize/fold_mx.hpp"

#include <string>

#include "cuda/common/device_memory.hpp"
#include "cuda/quantize/fold_table.hpp"
#include "cuda/quantize/quantize_fp8.hpp"  // vt_key_of_slot, kVtKeyGroup
#include "cuda/quantize/transposed_tile.cuh"
#include "fp4attn/error.hpp"
#include "fp4attn/formats.hpp"

namespace fp4attn::cuda_quantize {
namespace {

constexpr int kMxBlock = 32;
constexpr int kFoldThreads = 128;
constexpr int kRowsPerCta = 128;
constexpr int kNoExponent = -127;  // below every E8M0 exponent

using cuda_common::check_cuda;

__device__ __forceinline__ int mx_exponent(std::uint8_t code) { return static_cast<int>(code) - kE8M0Bias; }

// Max of v over the CTA (kFoldThreads threads), returned to every thread.
__device__ int cta_max(int v, int* scratch) {
  for (int off = 16; off > 0; off /= 2) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  int m = scratch[0];
#pragma unroll
  for (int w = 1; w < kFoldThreads / 32; ++w) m = max(m, scratch[w]);
  __syncthreads();
  return m;
}

// grid (ceil(S / 128), H, B): rows s0 .. s0 + 127 of one (b, h).
// With out_t, the folded rows also go to a shared tile that is then stored
// transposed ((B, H, D, padded), transposed_tile.cuh).
__global__ void __launch_bounds__(kFoldThreads) fold_qk_kernel(const std::uint8_t* __restrict__ codes,
                                                               const std::uint8_t* __restrict__ scales, int S, int H,
                                                               int D, int fold_rows, std::uint8_t* __restrict__ out,
                                                               float* __restrict__ factor,
                                                               std::uint8_t* __restrict__ out_t, std::int64_t padded) {
  static_assert(kRowsPerCta == kTransposedTileTokens && kTransposeStoreThreads<128> <= kFoldThreads,
                "one transposed tile per CTA");
  __shared__ alignas(16) std::uint8_t tile[kRowsPerCta * 128];  // D ≤ 128
  __shared__ int row_exp[kRowsPerCta];
  __shared__ int scratch[kFoldThreads / 32];
  const int s0 = blockIdx.x * kRowsPerCta, h = blockIdx.y, b = blockIdx.z;
  const int blocks = D / kMxBlock;
  const std::int64_t head_row0 = (static_cast<std::int64_t>(b) * H + h) * S;  // row index of (b, h, 0)
  const int s = s0 + static_cast<int>(threadIdx.x);
  int r = kNoExponent;
  if (s < S)
    for (int blk = 0; blk < blocks; ++blk) r = max(r, mx_exponent(scales[(head_row0 + s) * blocks + blk]));
  if (fold_rows == kRowsPerCta) r = cta_max(r, scratch);
  row_exp[threadIdx.x] = r;
  if (s < S && static_cast<int>(threadIdx.x) % fold_rows == 0)
    factor[(static_cast<std::int64_t>(b) * H + h) * ((S + fold_rows - 1) / fold_rows) + s / fold_rows] =
        exp2i(r - kFoldHeadroom);
  if (out == nullptr) return;  // factors only: the forward kernel expands the codes itself
  __syncthreads();

  // Four code bytes (eight elements) per item; a row is D / 8 items.
  const int items_per_row = D / 8;
  const int rows = min(kRowsPerCta, S - s0);
  for (int item = threadIdx.x; item < rows * items_per_row; item += kFoldThreads) {
    const int row = item / items_per_row, d0 = (item % items_per_row) * 8;
    const std::int64_t src_row = head_row0 + s0 + row;
    const std::uint32_t word = *reinterpret_cast<const std::uint32_t*>(codes + src_row * (D / 2) + d0 / 2);
    const int e = mx_exponent(scales[src_row * blocks + d0 / kMxBlock]);
    const uint2 bytes = fold_word(word, fold_table(e, row_exp[row]));
    const std::int64_t dst = ((static_cast<std::int64_t>(b) * S + s0 + row) * H + h) * D + d0;
    *reinterpret_cast<uint2*>(out + dst) = bytes;
    if (out_t != nullptr) *reinterpret_cast<uint2*>(tile + row * D + d0) = bytes;
  }
  if (out_t == nullptr) return;
  // Tokens past S are zero codes in the transposed copy.
  for (int i = rows * D / 16 + static_cast<int>(threadIdx.x); i < kRowsPerCta * D / 16; i += kFoldThreads)
    reinterpret_cast<uint4*>(tile)[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  std::uint8_t* dst_t = out_t + (static_cast<std::int64_t>(b) * H + h) * D * padded + s0;
  if (D == 128) store_tile_transposed<128>(tile, dst_t, padded, static_cast<int>(threadIdx.x));
  else store_tile_transposed<64>(tile, dst_t, padded, static_cast<int>(threadIdx.x));
}

// grid (D, H, B): channel d of one (b, h). Thread t folds 32-key groups t, t + 128, ...
__global__ void __launch_bounds__(kFoldThreads) fold_v_kernel(const std::uint8_t* __restrict__ codes,
                                                              const std::uint8_t* __restrict__ scales, int S, int H,
                                                              int D, int s_pad, std::int64_t vt_keys,
                                                              std::uint8_t* __restrict__ vt,
                                                              float* __restrict__ factor) {
  __shared__ int scratch[kFoldThreads / 32];
  const int d = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const std::int64_t head = static_cast<std::int64_t>(b) * H + h;
  const int sblocks = (S + kMxBlock - 1) / kMxBlock;
  const std::uint8_t* head_scales = scales + head * (s_pad / kMxBlock) * D;
  int r = kNoExponent;
  for (int blk = threadIdx.x; blk < sblocks; blk += kFoldThreads) r = max(r, mx_exponent(head_scales[blk * D + d]));
  r = cta_max(r, scratch);
  if (threadIdx.x == 0) factor[head * D + d] = exp2i(r - kFoldHeadroom);
  if (vt == nullptr) return;  // factors only

  const std::uint8_t* row = codes + (head * D + d) * (s_pad / 2);
  std::uint8_t* out = vt + (head * D + d) * vt_keys;
  const int groups = static_cast<int>(vt_keys / kVtKeyGroup);
  for (int g = threadIdx.x; g < groups; g += kFoldThreads) {
    std::uint8_t key_byte[kVtKeyGroup];  // folded bytes in key order
    if (g < sblocks) {
      const uint4 w = *reinterpret_cast<const uint4*>(row + g * (kVtKeyGroup / 2));
      const FoldTable table = fold_table(mx_exponent(head_scales[g * D + d]), r);
      const std::uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint2 f = fold_word(words[i], table);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          key_byte[8 * i + j] = static_cast<std::uint8_t>(f.x >> (8 * j));
          key_byte[8 * i + 4 + j] = static_cast<std::uint8_t>(f.y >> (8 * j));
        }
      }
      // Tokens S .. S_pad − 1 hold code 0 already (+0 folds to +0).
    } else {
#pragma unroll
      for (int k = 0; k < kVtKeyGroup; ++k) key_byte[k] = 0;
    }
    std::uint32_t slots[kVtKeyGroup / 4];
#pragma unroll
    for (int w = 0; w < kVtKeyGroup / 4; ++w) {
      std::uint32_t x = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) x |= static_cast<std::uint32_t>(key_byte[vt_key_of_slot(4 * w + j)]) << (8 * j);
      slots[w] = x;
    }
    uint4* dst = reinterpret_cast<uint4*>(out + g * kVtKeyGroup);
    dst[0] = make_uint4(slots[0], slots[1], slots[2], slots[3]);
    dst[1] = make_uint4(slots[4], slots[5], slots[6], slots[7]);
  }
}

// Signed E2M1 value of a nibble: twice its magnitude sits in nibble `code & 7`
// of kTwiceE2M1, turned into a float by one FADD on a 2^23 bias.
__device__ __forceinline__ float e2m1_value(std::uint32_t nib) {
  constexpr std::uint32_t kTwiceE2M1 = 0xC8643210u;
  constexpr float kIntMagic = 8388608.0f;  // 2^23
  const float twice =
      __fadd_rn(__uint_as_float(__float_as_uint(kIntMagic) | ((kTwiceE2M1 >> (4 * (nib & 7u))) & 0xFu)), -kIntMagic);
  return __uint_as_float(__float_as_uint(0.5f * twice) | ((nib & 8u) << 28));
}

// grid (ceil(Sq / 128), Hq, B): one query row per thread, d in order (the
// CPU's sum is sequential, so the dependent chain is the price of matching it).
__global__ void __launch_bounds__(kFoldThreads) lse_shift_kernel(const std::uint8_t* __restrict__ codes,
                                                                 const std::uint8_t* __restrict__ scales, int S,
                                                                 int Hq, int Hkv, int D,
                                                                 const float* __restrict__ k_mean, float softmax_scale,
                                                                 float* __restrict__ lse_shift) {
  const int s = blockIdx.x * kRowsPerCta + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (s >= S) return;
  const std::int64_t row = (static_cast<std::int64_t>(b) * Hq + h) * S + s;
  const float* mean = k_mean + (static_cast<std::int64_t>(b) * Hkv + h / (Hq / Hkv)) * D;
  const auto* words = reinterpret_cast<const std::uint32_t*>(codes + row * (D / 2));
  float dot = 0.0f;
  for (int blk = 0; blk < D / kMxBlock; ++blk) {
    const float scale = decode_e8m0(scales[row * (D / kMxBlock) + blk]);
#pragma unroll
    for (int w = 0; w < kMxBlock / 8; ++w) {
      const std::uint32_t word = words[blk * (kMxBlock / 8) + w];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int d = blk * kMxBlock + 8 * w + i;
        const float q = __fmul_rn(e2m1_value((word >> (4 * i)) & 0xFu), scale);
        dot = __fadd_rn(dot, __fmul_rn(q, __ldg(mean + d)));  // no FMA: the CPU rounds each product
      }
    }
  }
  lse_shift[row] = __fmul_rn(softmax_scale, dot);
}

void check_head_dim(std::int64_t D) {
  if (D != 64 && D != 128) throw Error("D", "the MX fold serves the sm90 kernel's head dims 64 and 128");
}

}  // namespace

void fold_mx_qk(const Fp4Output& in, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D, int fold_rows,
                std::uint8_t* e4m3, float* factor, cudaStream_t stream, std::uint8_t* e4m3_t) {
  check_head_dim(D);
  if (fold_rows != 1 && fold_rows != kRowsPerCta) throw Error("fold_rows", "must be 1 (Q) or 128 (K)");
  if (e4m3_t != nullptr && (e4m3 == nullptr || reinterpret_cast<std::uintptr_t>(e4m3_t) % 16 != 0))
    throw Error("e4m3_t", "needs the row-major codes too and 16-byte alignment");
  if (S <= 0) return;
  const std::int64_t blocks = (S + kRowsPerCta - 1) / kRowsPerCta;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(H), static_cast<unsigned>(B));
  fold_qk_kernel<<<grid, kFoldThreads, 0, stream>>>(in.codes, in.scales, static_cast<int>(S), static_cast<int>(H),
                                                    static_cast<int>(D), fold_rows, e4m3, factor, e4m3_t,
                                                    blocks * kRowsPerCta);
  check_cuda(cudaGetLastError(), "fold_qk_kernel launch");
}

void fold_mx_v(const Fp4Output& in, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D,
               std::int64_t vt_keys, std::uint8_t* vt, float* factor, cudaStream_t stream) {
  check_head_dim(D);
  if (vt_keys % kVtKeyGroup != 0 || vt_keys < fp4_padded_tokens(S))
    throw Error("vt_keys", "must cover the padded sequence in whole groups of 32");
  const dim3 grid(static_cast<unsigned>(D), static_cast<unsigned>(H), static_cast<unsigned>(B));
  fold_v_kernel<<<grid, kFoldThreads, 0, stream>>>(in.codes, in.scales, static_cast<int>(S), static_cast<int>(H),
                                                   static_cast<int>(D), static_cast<int>(fp4_padded_tokens(S)), vt_keys,
                                                   vt, factor);
  check_cuda(cudaGetLastError(), "fold_v_kernel launch");
}

void mx_lse_shift(const Fp4Output& q, std::int64_t B, std::int64_t Sq, std::int64_t Hq, std::int64_t Hkv,
                  std::int64_t D, const float* k_mean, float softmax_scale, float* lse_shift, cudaStream_t stream) {
  check_head_dim(D);
  if (Sq <= 0) return;
  const dim3 grid(static_cast<unsigned>((Sq + kRowsPerCta - 1) / kRowsPerCta), static_cast<unsigned>(Hq),
                  static_cast<unsigned>(B));
  lse_shift_kernel<<<grid, kFoldThreads, 0, stream>>>(q.codes, q.scales, static_cast<int>(Sq), static_cast<int>(Hq),
                                                      static_cast<int>(Hkv), static_cast<int>(D), k_mean, softmax_scale,
                                                      lse_shift);
  check_cuda(cudaGetLastError(), "lse_shift_kernel launch");
}

}  // namespace fp4attn::cuda_quantize
