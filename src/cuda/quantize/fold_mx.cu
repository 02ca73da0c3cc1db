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
  __shared__ alignas(16) std::uint8_t tile[kRowsPerCta * 128];  // D ≤ 128 with out_t (check_head_dim)
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

// prmt.b32 with an immediate selector, both sources in registers.
template <std::uint32_t kSelector>
__device__ __forceinline__ std::uint32_t prmt_imm(std::uint32_t a, std::uint32_t b) {
  std::uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "n"(kSelector));
  return r;
}

// The smooth_k LSE correction of each query row, softmax_scale · Σ_d q[d] · k̄[d]
// over Q's MXFP4 values, summed in d order with every product rounded (the
// CPU's smooth_k_shift), so one dependent chain per row: one row per thread.
// An element's doubled E2M1 magnitude is a byte of a four-way table permute;
// a second permute sets it into the mantissa of 2^23, one FADD removes the
// 2^23, one FMUL by scale / 2 gives |q| (exact for an E8M0 scale, a power of
// two: one rounding, that of value · scale) and a LOP3 puts the sign in
// (rounding is symmetric); then the product and the add: about eight
// instructions an element. The row's codes come in 16-byte loads, k̄ in float4
// loads. (Decoding each nibble by shifts with four-byte loads: 13.7
// instructions an element, 71 % of the SM's issue for 42 µs at S = 4k, B = 8,
// H = 16, D = 128; perf log mx10.)
template <int D>
__global__ void __launch_bounds__(kFoldThreads) lse_shift_kernel(const std::uint8_t* __restrict__ codes,
                                                                 const std::uint8_t* __restrict__ scales, int S,
                                                                 int Hq, int Hkv, const float* __restrict__ k_mean,
                                                                 float softmax_scale, float* __restrict__ lse_shift) {
  constexpr int kBlocks = D / kMxBlock;  // a block's 32 codes are one 16-byte load
  constexpr std::uint32_t kTwiceLo = 0x03020100u, kTwiceHi = 0x0C080604u;  // 2·{0, .5, 1, 1.5}, 2·{2, 3, 4, 6}
  const int s = blockIdx.x * kRowsPerCta + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (s >= S) return;
  // 2^23's bits in a register, so that the permutes below take their
  // selectors as immediates (with the constant as the immediate, ptxas moved
  // each selector into a register first). S ≥ 0, so the term is zero; ptxas
  // cannot fold it.
  const std::uint32_t magic = 0x4B000000u | (static_cast<std::uint32_t>(S) >> 31);
  const std::int64_t row = (static_cast<std::int64_t>(b) * Hq + h) * S + s;
  const auto* mean4 =
      reinterpret_cast<const float4*>(k_mean + (static_cast<std::int64_t>(b) * Hkv + h / (Hq / Hkv)) * D);
  const auto* blocks = reinterpret_cast<const uint4*>(codes + row * (D / 2));
  uint4 block_codes[kBlocks];
  float half_scale[kBlocks];
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
    block_codes[blk] = blocks[blk];
    half_scale[blk] = 0.5f * decode_e8m0(scales[row * kBlocks + blk]);  // exact: a power of two ≥ 2^-127
  }
  float dot = 0.0f;
#pragma unroll
  for (int blk = 0; blk < kBlocks; ++blk) {
    const std::uint32_t words[4] = {block_codes[blk].x, block_codes[blk].y, block_codes[blk].z, block_codes[blk].w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const std::uint32_t word = words[w];
      const int d0 = blk * kMxBlock + 8 * w;
      const float4 m0 = __ldg(mean4 + d0 / 4), m1 = __ldg(mean4 + d0 / 4 + 1);
      const float mean[8] = {m0.x, m0.y, m0.z, m0.w, m1.x, m1.y, m1.z, m1.w};
      // Doubled magnitudes of elements 0..3 and 4..7 of this word, one byte each.
      const std::uint32_t twice[2] = {prmt(kTwiceLo, kTwiceHi, word & 0x7777u),
                                      prmt(kTwiceLo, kTwiceHi, (word >> 16) & 0x7777u)};
      // Element i: byte i % 4 of its twice word under 2^23's upper bytes.
      const std::uint32_t biased[8] = {
          prmt_imm<0x7440u>(twice[0], magic), prmt_imm<0x7441u>(twice[0], magic),
          prmt_imm<0x7442u>(twice[0], magic), prmt_imm<0x7443u>(twice[0], magic),
          prmt_imm<0x7440u>(twice[1], magic), prmt_imm<0x7441u>(twice[1], magic),
          prmt_imm<0x7442u>(twice[1], magic), prmt_imm<0x7443u>(twice[1], magic)};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float magnitude = __fmul_rn(__fadd_rn(__uint_as_float(biased[i]), -8388608.0f), half_scale[blk]);
        const float q = __uint_as_float(__float_as_uint(magnitude) | ((word << (28 - 4 * i)) & 0x80000000u));
        dot = __fadd_rn(dot, __fmul_rn(q, mean[i]));  // no FMA: the CPU rounds each product
      }
    }
  }
  lse_shift[row] = __fmul_rn(softmax_scale, dot);
}

// The FP8 forward kernel's head dims; 256 (the MX recipes' forward on the
// 256-wide kernel) without the backward's transposed copy, whose staging
// tile holds 128 channels.
void check_head_dim(std::int64_t D, bool transposed = false) {
  if (D != 64 && D != 128 && (D != 256 || transposed))
    throw Error("D", "the MX fold serves the sm90 kernel's head dims 64 and 128, and 256 without the transposed "
                     "copy, got " + std::to_string(D));
}

}  // namespace

void fold_mx_qk(const Fp4Output& in, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D, int fold_rows,
                std::uint8_t* e4m3, float* factor, cudaStream_t stream, std::uint8_t* e4m3_t) {
  check_head_dim(D, e4m3_t != nullptr);
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
  // The kernel reads a row's codes by 16-byte loads and k_mean by float4.
  if (reinterpret_cast<std::uintptr_t>(q.codes) % 16 != 0) throw Error("q", "MXFP4 codes must be 16-byte aligned");
  if (reinterpret_cast<std::uintptr_t>(k_mean) % 16 != 0) throw Error("k_mean", "must be 16-byte aligned");
  if (Sq <= 0) return;
  const dim3 grid(static_cast<unsigned>((Sq + kRowsPerCta - 1) / kRowsPerCta), static_cast<unsigned>(Hq),
                  static_cast<unsigned>(B));
  const auto kernel = D == 256 ? &lse_shift_kernel<256> : D == 128 ? &lse_shift_kernel<128> : &lse_shift_kernel<64>;
  kernel<<<grid, kFoldThreads, 0, stream>>>(q.codes, q.scales, static_cast<int>(Sq), static_cast<int>(Hq),
                                            static_cast<int>(Hkv), k_mean, softmax_scale, lse_shift);
  check_cuda(cudaGetLastError(), "lse_shift_kernel launch");
}

}  // namespace fp4attn::cuda_quantize
