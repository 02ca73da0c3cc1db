// Strided (B, S, H, D) inputs read by segments: 8 consecutive elements of one
// row, one 16-byte load for bf16 / fp16 (two for fp32) when the tensor's
// layout allows it, element by element otherwise.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <cstdint>
#include <type_traits>

namespace fp4attn::cuda_quantize {

inline constexpr int kSegment = 8;  // elements per segment
inline constexpr int kVectorBytes = 16;

// L2 policy of a load: `keep` for data read again soon (K and V in the
// statistics pass), `last` (evict first) for a final read, so that streamed
// data does not push out what the quantize pass still needs.
enum class L2Reuse : std::uint8_t { keep, last };

template <class T>
struct InputView {
  const T* data;
  std::int64_t stride_b, stride_s, stride_h;
  bool vector_loads;  // data and strides put every segment on a 16-byte boundary
  // Packed sequences (StridedInput::cu_seqlens): batch entry b starts at token
  // row token_offset[b] and stride_b is not used. Null: b · stride_b.
  const int* token_offset = nullptr;

  __device__ const T* segment(int b, int s, int h, int first_d) const {
    const std::int64_t batch = token_offset != nullptr ? token_offset[b] * stride_s : b * stride_b;
    return data + batch + s * stride_s + h * stride_h + first_d;
  }
};

// The raw bits of one segment. 16-bit types: element 2i in the low half of w[i].
template <class T>
struct Segment {
  std::uint32_t w[kSegment / 2];
};
template <>
struct Segment<float> {
  float f[kSegment];
};

template <L2Reuse R, class V>
__device__ __forceinline__ V load_global(const V* p) {
  if constexpr (R == L2Reuse::keep) return __ldg(p);
  else return __ldcs(p);
}

template <L2Reuse R, class T>
__device__ __forceinline__ void load_segment(const T* p, bool vector, Segment<T>& s) {
  if constexpr (sizeof(T) == sizeof(float)) {
    if (vector) {
#pragma unroll
      for (int i = 0; i < kSegment / 4; ++i) {
        const float4 v = load_global<R>(reinterpret_cast<const float4*>(p) + i);
        s.f[4 * i] = v.x, s.f[4 * i + 1] = v.y, s.f[4 * i + 2] = v.z, s.f[4 * i + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kSegment; ++i) s.f[i] = load_global<R>(reinterpret_cast<const float*>(p) + i);
    }
  } else {
    if (vector) {
      const uint4 v = load_global<R>(reinterpret_cast<const uint4*>(p));
      s.w[0] = v.x, s.w[1] = v.y, s.w[2] = v.z, s.w[3] = v.w;
    } else {
      const auto* h = reinterpret_cast<const unsigned short*>(p);
#pragma unroll
      for (int i = 0; i < kSegment / 2; ++i)
        s.w[i] = load_global<R>(h + 2 * i) | (static_cast<std::uint32_t>(load_global<R>(h + 2 * i + 1)) << 16);
    }
  }
}

template <class T>
__device__ __forceinline__ void zero_segment(Segment<T>& s) {
  if constexpr (sizeof(T) == sizeof(float)) {
#pragma unroll
    for (float& f : s.f) f = 0.0f;
  } else {
#pragma unroll
    for (std::uint32_t& w : s.w) w = 0u;
  }
}

// Writes a segment as is to 16-byte aligned shared memory.
template <class T>
__device__ __forceinline__ void store_segment(T* dst, const Segment<T>& s) {
  if constexpr (sizeof(T) == sizeof(float)) {
#pragma unroll
    for (int i = 0; i < kSegment / 4; ++i)
      reinterpret_cast<float4*>(dst)[i] = make_float4(s.f[4 * i], s.f[4 * i + 1], s.f[4 * i + 2], s.f[4 * i + 3]);
  } else {
    *reinterpret_cast<uint4*>(dst) = make_uint4(s.w[0], s.w[1], s.w[2], s.w[3]);
  }
}

// Element e of a segment, widened to float (exact for every input type).
__device__ __forceinline__ float element(const Segment<__nv_bfloat16>& s, int e) {
  const std::uint32_t w = s.w[e / 2];
  return __uint_as_float(e % 2 == 0 ? w << 16 : w & 0xFFFF0000u);
}
__device__ __forceinline__ float element(const Segment<__half>& s, int e) {
  const std::uint32_t w = s.w[e / 2];
  return __half2float(__ushort_as_half(static_cast<unsigned short>(e % 2 == 0 ? w : w >> 16)));
}
__device__ __forceinline__ float element(const Segment<float>& s, int e) { return s.f[e]; }

// Four consecutive channels of one token (a quad) as loaded: one 8-byte
// (16-bit types) or 16-byte (fp32) load when `vector` (InputView::vector_loads
// puts every segment on a 16-byte boundary, so every quad at a multiple of 4
// elements is aligned for its load too). The statistics passes hold a batch
// of quads as loaded and widen each only where it is summed: 16 quads of
// 16-bit data are 32 registers, as floats 64, and as the doubles that ptxas
// converted them to ahead of the sums 128, which left 4 CTAs per SM.
inline constexpr int kQuad = 4;
template <class T>
struct QuadBits {
  std::uint32_t w[kQuad / 2];  // element 2i in the low half of w[i]
};
template <>
struct QuadBits<float> {
  float f[kQuad];
};

template <L2Reuse R, class T>
__device__ __forceinline__ void load_quad(const T* p, bool vector, QuadBits<T>& q) {
  if constexpr (sizeof(T) == sizeof(float)) {
    if (vector) {
      const float4 v = load_global<R>(reinterpret_cast<const float4*>(p));
      q.f[0] = v.x, q.f[1] = v.y, q.f[2] = v.z, q.f[3] = v.w;
    } else {
#pragma unroll
      for (int e = 0; e < kQuad; ++e) q.f[e] = load_global<R>(reinterpret_cast<const float*>(p) + e);
    }
  } else {
    if (vector) {
      const uint2 v = load_global<R>(reinterpret_cast<const uint2*>(p));
      q.w[0] = v.x, q.w[1] = v.y;
    } else {
      const auto* h = reinterpret_cast<const unsigned short*>(p);
      q.w[0] = load_global<R>(h) | (static_cast<std::uint32_t>(load_global<R>(h + 1)) << 16);
      q.w[1] = load_global<R>(h + 2) | (static_cast<std::uint32_t>(load_global<R>(h + 3)) << 16);
    }
  }
}

// A quad's elements widened to float (exact for every input type).
template <class T>
__device__ __forceinline__ void widen(const QuadBits<T>& q, float (&x)[kQuad]) {
  if constexpr (sizeof(T) == sizeof(float)) {
#pragma unroll
    for (int e = 0; e < kQuad; ++e) x[e] = q.f[e];
  } else {
    Segment<T> seg{};  // elements 0 .. 3 only
    seg.w[0] = q.w[0], seg.w[1] = q.w[1];
#pragma unroll
    for (int e = 0; e < kQuad; ++e) x[e] = element(seg, e);
  }
}

// Hands `take` the quads of tokens 0 .. tokens − 1 of one channel quad (the
// token t at p + t · stride) as floats, in ascending t, the order the
// statistics passes' double sums depend on. kBatch tokens are loaded ahead of
// their use, held as loaded and widened one at a time. One whole walk per
// value of the uniform layout flag: with the flag inside the loop every token
// was loaded both ways, predicated (perf log fp4-q11).
template <int kBatch, L2Reuse R, class T, class Take>
__device__ __forceinline__ void walk_quads(const T* p, std::int64_t stride, int tokens, bool vector, Take&& take) {
  const auto walk = [&](auto vector_loads) {
    constexpr bool kVector = decltype(vector_loads)::value;
    int t = 0;
    for (; t + kBatch <= tokens; t += kBatch) {
      QuadBits<T> raw[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) load_quad<R>(p + static_cast<std::int64_t>(t + u) * stride, kVector, raw[u]);
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        float x[kQuad];
        widen(raw[u], x);
        take(x);
      }
    }
    for (; t < tokens; ++t) {
      QuadBits<T> raw;
      load_quad<R>(p + static_cast<std::int64_t>(t) * stride, kVector, raw);
      float x[kQuad];
      widen(raw, x);
      take(x);
    }
  };
  if (vector) walk(std::true_type{});
  else walk(std::false_type{});
}

// ---- smooth_k: the chunk sums of a mean, added in order -------------------------------
// The mean of a channel is its chunk sums (one double per 128-token chunk)
// added in ascending chunk order, the CPU's order, then divided by S. The
// adds are a dependent chain, but the loads need not be: a CTA takes
// kSumColumns neighbouring channels (a warp's lanes, 256 contiguous bytes of
// each chunk row), all its warps copy the rows of a slab into shared memory
// by cp.async, up to kSumSlabsInFlight slabs ahead, and warp 0 adds each
// slab's rows in order. One thread per channel with 16 loads ahead of its
// adds was S / 2048 load latencies in a row (perf log fp4-q31). The kernels
// take the ring (ChunkSumTile) as dynamic shared memory, and only when they
// add chunk sums.
inline constexpr int kSumColumns = 32;
inline constexpr int kSumSlabRows = 64;
inline constexpr int kSumSlabsInFlight = 2;
inline constexpr int kSumBuffers = kSumSlabsInFlight + 1;

struct ChunkSumTile {
  double rows[kSumBuffers][kSumSlabRows][kSumColumns];  // 48 KiB
};

// Σ over rows r = 0 .. rows − 1 in ascending r of column0[r · stride + lane],
// for lane < columns; the result is in warp 0's lanes. Every thread of the
// CTA (kWarpsPerCta warps) calls it. The slab geometry is fixed at compile
// time: with a slab size or ring length known only at run time, every copy's
// address took an integer division, and the copies went out slower (perf
// log fp4-q31).
template <int kWarpsPerCta>
__device__ __forceinline__ double ordered_column_sums(const double* column0, std::int64_t stride, int rows, int columns,
                                                      ChunkSumTile& tile) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int slabs = (rows + kSumSlabRows - 1) / kSumSlabRows;
  const auto issue = [&](int slab) {
    if (slab < slabs && lane < columns) {
      double(&buffer)[kSumSlabRows][kSumColumns] = tile.rows[slab % kSumBuffers];
#pragma unroll
      for (int r = warp; r < kSumSlabRows; r += kWarpsPerCta) {
        const int row = slab * kSumSlabRows + r;
        if (row < rows)
          __pipeline_memcpy_async(&buffer[r][lane], column0 + static_cast<std::int64_t>(row) * stride + lane,
                                  sizeof(double));
      }
    }
    __pipeline_commit();  // empty past the last slab: the group count stays uniform
  };
#pragma unroll
  for (int s = 0; s < kSumSlabsInFlight; ++s) issue(s);
  double total = 0.0;
  for (int s = 0; s < slabs; ++s) {
    // Buffer (s + kSumSlabsInFlight) % kSumBuffers was last read in slab s − 1,
    // before the barrier that ended it.
    issue(s + kSumSlabsInFlight);
    __pipeline_wait_prior(kSumSlabsInFlight);
    __syncthreads();  // every warp's copies of slab s have landed
    if (warp == 0) {
      const int n = min(kSumSlabRows, rows - s * kSumSlabRows);
      const double(&slab)[kSumSlabRows][kSumColumns] = tile.rows[s % kSumBuffers];
#pragma unroll 8
      for (int r = 0; r < n; ++r) total += slab[r][lane];
    }
    __syncthreads();  // slab s is read before its buffer is refilled
  }
  return total;
}

// One element as stored (the statistics pass stages K in shared memory as is).
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }

}  // namespace fp4attn::cuda_quantize
