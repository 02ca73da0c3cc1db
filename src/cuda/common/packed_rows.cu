// check_packed_sequences: the caller's cu_seqlens checked, copied and turned
// into the tile-aligned layout's first rows (an exclusive scan of the
// lengths rounded up to the tile) by one CTA in chunks of its threads; B is
// the number of sequences in a batch, thousands at most: one launch of a few
// µs. Only input it rejects costs more (the NaN fills, by the same CTA).
#include <cub/block/block_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/device_memory.hpp"
#include "cuda/common/packed_rows.hpp"

namespace fp4attn::cuda_common {
namespace {

constexpr int kScanThreads = 512;

struct Fills {
  NanFill f[3];
};

// Whether one cu_seqlens array is what the call was sized for.
__device__ bool valid_offsets(const int* __restrict__ cu, int B, std::int64_t total, std::int64_t longest) {
  bool ok = threadIdx.x != 0 || (cu[0] == 0 && cu[B] == total);
  for (int b = static_cast<int>(threadIdx.x); b < B; b += kScanThreads) {
    const std::int64_t len = static_cast<std::int64_t>(cu[b + 1]) - cu[b];
    ok = ok && len >= 0 && len <= longest;
  }
  return __syncthreads_and(ok) != 0;
}

// out[b] = cu[b] (or 0), rows[b] = 128·Σ_{i<b} ⌈len_i / 128⌉ (or 0), b = 0 .. B.
__device__ void lay_out(const int* __restrict__ cu, int B, bool valid, int* __restrict__ out,
                        int* __restrict__ rows) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage scan;
  int carry = 0;  // rows of the chunks before this one
  for (int first = 0; first <= B; first += kScanThreads) {
    const int b = first + static_cast<int>(threadIdx.x);
    const int len = valid && b < B ? cu[b + 1] - cu[b] : 0;
    const int tiled = (len + kPackedRowAlign - 1) / kPackedRowAlign * kPackedRowAlign;
    int before = 0, chunk = 0;
    Scan(scan).ExclusiveSum(tiled, before, chunk);
    if (b <= B) {
      out[b] = valid ? cu[b] : 0;
      rows[b] = carry + before;
    }
    carry += chunk;
    __syncthreads();  // the temp storage is reused by the next chunk
  }
}

__device__ void fill_nan(const NanFill& f) {
  const std::int64_t n = f.rows * f.heads * f.cols;
  for (std::int64_t i = threadIdx.x; i < n; i += kScanThreads) {
    const std::int64_t c = i % f.cols, rh = i / f.cols, h = rh % f.heads, r = rh / f.heads;
    const std::int64_t at = r * f.stride_row + h * f.stride_head + c;
    switch (f.type) {
      case NanFill::Type::f32: static_cast<float*>(f.data)[at] = __int_as_float(0x7FC00000); break;
      case NanFill::Type::f16: static_cast<__half*>(f.data)[at] = __ushort_as_half(0x7E00); break;
      case NanFill::Type::bf16: static_cast<__nv_bfloat16*>(f.data)[at] = __ushort_as_bfloat16(0x7FC0); break;
    }
  }
}

__global__ void __launch_bounds__(kScanThreads)
    check_packed_kernel(const int* __restrict__ cu_q, const int* __restrict__ cu_k, PackedBounds bounds,
                        int* __restrict__ ints, const __grid_constant__ Fills fills) {
  const int B = bounds.B;
  const bool valid = valid_offsets(cu_q, B, bounds.total_q, bounds.max_q) &&
                     valid_offsets(cu_k, B, bounds.total_k, bounds.max_k);
  lay_out(cu_q, B, valid, ints, ints + 2 * (B + 1));
  lay_out(cu_k, B, valid, ints + (B + 1), ints + 3 * (B + 1));
  if (!valid)
    for (const NanFill& f : fills.f)
      if (f.data != nullptr) fill_nan(f);
}

}  // namespace

void check_packed_sequences(const int* cu_seqlens_q, const int* cu_seqlens_k, const PackedBounds& bounds, int* ints,
                            const std::array<NanFill, 3>& fills, cudaStream_t stream) {
  check_packed_kernel<<<1, kScanThreads, 0, stream>>>(cu_seqlens_q, cu_seqlens_k, bounds, ints,
                                                      Fills{{fills[0], fills[1], fills[2]}});
  check_cuda(cudaGetLastError(), "check_packed_kernel launch");
}

}  // namespace fp4attn::cuda_common
