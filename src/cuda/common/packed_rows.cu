// fill_packed_rows: an exclusive scan of the sequences' lengths rounded up to
// the tile, by one CTA in chunks of its threads (B is the number of
// sequences in a batch: thousands at most, one launch of a few µs).
#include <cub/block/block_scan.cuh>

#include "cuda/common/device_memory.hpp"
#include "cuda/common/packed_rows.hpp"

namespace fp4attn::cuda_common {
namespace {

constexpr int kScanThreads = 256;

__global__ void __launch_bounds__(kScanThreads) packed_rows_kernel(const int* __restrict__ cu_seqlens, int B,
                                                                    int* __restrict__ rows) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage scan;
  int carry = 0;  // rows of the chunks before this one
  for (int first = 0; first < B; first += kScanThreads) {
    const int b = first + static_cast<int>(threadIdx.x);
    const int len = b < B ? cu_seqlens[b + 1] - cu_seqlens[b] : 0;
    const int tiled = (len + kPackedRowAlign - 1) / kPackedRowAlign * kPackedRowAlign;
    int before = 0, chunk = 0;
    Scan(scan).ExclusiveSum(tiled, before, chunk);
    if (b < B) rows[b] = carry + before;
    carry += chunk;
    __syncthreads();  // the temp storage is reused by the next chunk
  }
  if (threadIdx.x == 0) rows[B] = carry;
}

}  // namespace

void fill_packed_rows(const int* cu_seqlens, int B, int* rows, cudaStream_t stream) {
  packed_rows_kernel<<<1, kScanThreads, 0, stream>>>(cu_seqlens, B, rows);
  check_cuda(cudaGetLastError(), "packed_rows_kernel launch");
}

}  // namespace fp4attn::cuda_common
