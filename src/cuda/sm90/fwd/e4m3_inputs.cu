// One memory-bound launch before recipe fp8's kernel on caller-quantized E4M3
// inputs (e4m3_inputs.hpp). Its first CTAs transpose V's 128-key tiles; the
// rest scan Q's and K's codes for NaN, slab by slab of consecutive tokens, and
// write the broadcast scales. One launch, so that the two parts share the
// machine instead of each leaving a tail.
#include "cuda/sm90/fwd/e4m3_inputs.hpp"

#include <algorithm>
#include <cstdint>

#include "cuda/common/device_memory.hpp"
#include "cuda/quantize/byte_transpose.cuh"
#include "cuda/quantize/fast_div.hpp"
#include "cuda/quantize/quantize_fp8.hpp"  // kTokenBlock, kVtKeyGroup, vt_key_of_slot, padded_keys

namespace fp4attn::sm90::fwd {
namespace {

using cuda_quantize::FastDiv;

constexpr int kThreads = 256;
constexpr int kChunk = 16;  // bytes per vector load; D is a multiple of it
constexpr int kMaxD = 256;
constexpr int kTileKeys = cuda_quantize::kTokenBlock;
constexpr int kGroup = cuda_quantize::kVtKeyGroup;
// Loads a thread has in flight: a Vᵀ tile of 128 keys × 256 codes is 8 of
// them per thread, and a scan CTA takes 8 per thread too.
constexpr int kLoadsPerThread = kTileKeys * kMaxD / kChunk / kThreads;
constexpr int kScanChunksPerCta = kLoadsPerThread * kThreads;
constexpr int kFlagQ = 0, kFlagK = 1, kFlagV = 2;

// E4M3's NaN is S.1111.111 (it has no infinities): a byte whose low seven bits
// are all ones. Adding 1 to each masked byte carries into bit 7 only for those.
__device__ __forceinline__ bool has_nan_code(uint4 w) {
  const auto nan_bytes = [](std::uint32_t x) { return ((x & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u; };
  return (nan_bytes(w.x) | nan_bytes(w.y) | nan_bytes(w.z) | nan_bytes(w.w)) != 0u;
}

__device__ __forceinline__ bool good_descale(float x) { return x > 0.0f && isfinite(x); }

// A load that every thread issues: an out-of-range lane reads `fallback` (a
// valid address) and drops the value later. Branch-free, so that ptxas keeps
// all of a thread's loads in flight before the first use; a branch per load
// made each one wait for the one before.
__device__ __forceinline__ uint4 load_clamped(const std::uint8_t* p, bool valid, const std::uint8_t* fallback) {
  return __ldg(reinterpret_cast<const uint4*>(valid ? p : fallback));
}

__device__ __forceinline__ uint4 zero_unless(uint4 w, bool valid) {
  return valid ? w : make_uint4(0u, 0u, 0u, 0u);
}

__device__ __forceinline__ void raise_flag(bool bad, int* flag) {
  // One store per warp that saw a bad value; every writer stores the same 1.
  if (__any_sync(0xFFFFFFFFu, bad) && (threadIdx.x % 32) == 0) *flag = 1;
}

// A tensor's scan geometry: slabs of `tokens_per_cta` consecutive (b, s)
// tokens, each token H rows of D codes; a token of more chunks than a CTA
// takes (H · D/16 > 2048) is split over `parts` CTAs.
struct ScanPlan {
  E4m3View x;
  FastDiv per_token;  // H · D/16 chunks
  FastDiv chunks;     // D/16 chunks per row
  FastDiv seq;        // S
  FastDiv parts;      // CTAs per slab
  std::uint32_t tokens = 0;  // B · S
  int tokens_per_cta = 0;
  int ctas = 0;
};

struct Plan {
  E4m3CallerInputs in;
  E4m3KernelOperands out;
  std::int64_t vt_keys = 0;
  int vt_heads = 1;   // kv heads per Vᵀ CTA: consecutive, of one batch, vt_heads · D ≤ 256
  FastDiv vt_tiles;   // 128-key tiles per (b, group of vt_heads kv heads)
  FastDiv vt_chunks;  // 16-byte chunks of a tile row: vt_heads · D / 16
  int vt_ctas = 0;
  ScanPlan q, k;
};

// The staged Vᵀ tile: channel r's 128 codes as 8 chunks of 16 bytes, chunk j
// stored at position j ^ ((r / 4) mod 8). The transposing threads of a warp
// write four channels apart and the storing threads read one row's eight
// chunks, so both touch eight different 16-byte bank groups at a time.
constexpr int kVtRowChunks = kTileKeys / kChunk;
static_assert(kMaxD * kTileKeys <= kTileKeys * (kMaxD + kChunk), "the Vᵀ tile fits where the V tile was");
__device__ __forceinline__ int vt_tile_offset(int r, int j) {
  return r * kTileKeys + kChunk * (j ^ ((r >> 2) & (kVtRowChunks - 1)));
}

// V's tile (kv heads h0 … h0 + vt_heads − 1 of batch b, 128 keys) into shared
// memory, a row per key of the heads' codes side by side (zero codes past Sk),
// then Vᵀ: a thread takes four channels of one 32-key group and, per four
// slots, reads the four keys' words of those channels and transposes the 4 × 4
// bytes (slot s holds key vt_key_of_slot(s)): 32 bytes of a channel row. A
// warp's lanes read neighbouring words of one key row: no bank conflicts. The
// Vᵀ tile (W = vt_heads · D rows of 128 codes; consecutive heads' rows are
// consecutive in Vᵀ) then replaces the V tile in shared memory. Several heads
// a CTA at D < 256: a CTA of one small head's tile spent more on its start,
// its barriers and its end than on its bytes (D = 64 took longer than D = 128).
__device__ void transpose_v_tile(const Plan& p, int cta, std::uint8_t* tile) {
  constexpr int kPitch = kMaxD + kChunk;
  const int W = p.vt_heads * p.in.D;
  const std::uint32_t group = p.vt_tiles.quotient(static_cast<std::uint32_t>(cta));
  const std::uint32_t t = p.vt_tiles.remainder(static_cast<std::uint32_t>(cta), group);
  const std::int64_t bh0 = static_cast<std::int64_t>(group) * p.vt_heads;  // b · Hkv + h0
  const std::int64_t b = bh0 / p.in.Hkv, h0 = bh0 % p.in.Hkv, key0 = static_cast<std::int64_t>(t) * kTileKeys;
  const std::uint8_t* src = p.in.v.data + b * p.in.v.stride_b + h0 * p.in.v.stride_h;
  bool bad = false;
  uint4 w[kLoadsPerThread];
#pragma unroll
  for (int l = 0; l < kLoadsPerThread; ++l) {
    const std::uint32_t i = threadIdx.x + l * kThreads, row = p.vt_chunks.quotient(i);
    const std::uint32_t cc = p.vt_chunks.remainder(i, row), head = p.q.chunks.quotient(cc);  // q.chunks: D / 16
    const bool valid = row < kTileKeys && key0 + row < p.in.Sk;
    w[l] = load_clamped(src + (key0 + row) * p.in.v.stride_s + head * p.in.v.stride_h +
                            p.q.chunks.remainder(cc, head) * kChunk,
                        valid, src);
  }
#pragma unroll
  for (int l = 0; l < kLoadsPerThread; ++l) {
    const std::uint32_t i = threadIdx.x + l * kThreads, row = p.vt_chunks.quotient(i);
    const uint4 x = zero_unless(w[l], row < kTileKeys && key0 + row < p.in.Sk);  // zero codes past Sk
    if (row < kTileKeys) *reinterpret_cast<uint4*>(tile + row * kPitch + p.vt_chunks.remainder(i, row) * kChunk) = x;
    bad |= has_nan_code(x);
  }
  __syncthreads();
  const int quads = W / 4;
  const bool transposer = threadIdx.x < quads * (kTileKeys / kGroup);
  const int quad = threadIdx.x % quads, g = threadIdx.x / quads;
  std::uint32_t rows[4][kGroup / 4];  // channel 4·quad + c, slots 4m .. 4m + 3 in word m
  if (transposer) {
    const std::uint8_t* column = tile + g * kGroup * kPitch + 4 * quad;
#pragma unroll
    for (int m = 0; m < kGroup / 4; ++m) {
      std::uint32_t in[4], out[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        in[i] = *reinterpret_cast<const std::uint32_t*>(column + cuda_quantize::vt_key_of_slot(4 * m + i) * kPitch);
      cuda_quantize::transpose_bytes_4x4(in, out);
#pragma unroll
      for (int c = 0; c < 4; ++c) rows[c][m] = out[c];
    }
  }
  // The Vᵀ tile goes back through shared memory (it is read out of the key-major
  // tile first), so that each warp then stores whole 128-byte channel rows:
  // stored straight from the transposing threads, every 32-byte sector came as
  // two 16-byte halves from two instructions, twice the L2 write requests.
  __syncthreads();
  if (transposer) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = 4 * quad + c;
      *reinterpret_cast<uint4*>(tile + vt_tile_offset(r, 2 * g)) =
          make_uint4(rows[c][0], rows[c][1], rows[c][2], rows[c][3]);
      *reinterpret_cast<uint4*>(tile + vt_tile_offset(r, 2 * g + 1)) =
          make_uint4(rows[c][4], rows[c][5], rows[c][6], rows[c][7]);
    }
  }
  __syncthreads();
  std::uint8_t* dst = p.out.vt + bh0 * p.in.D * p.vt_keys + key0;
  for (int i = threadIdx.x; i < W * kVtRowChunks; i += kThreads) {
    const int r = i / kVtRowChunks, j = i % kVtRowChunks;
    *reinterpret_cast<uint4*>(dst + r * p.vt_keys + j * kChunk) =
        *reinterpret_cast<const uint4*>(tile + vt_tile_offset(r, j));
  }
  raise_flag(bad, p.out.nonfinite + kFlagV);
}

// The scan CTA `cta` of a tensor (slab cta / parts, its part cta % parts):
// every 16-byte chunk loaded (all of a thread's loads in flight at once) and
// tested for a NaN code. A chunk past the slab's tokens falls on local ≥
// tokens_per_cta, which is 1 where a token takes several parts.
__device__ bool scan_slab(const ScanPlan& s, int cta) {
  const std::uint32_t slab = s.parts.quotient(static_cast<std::uint32_t>(cta));
  const std::uint32_t part = s.parts.remainder(static_cast<std::uint32_t>(cta), slab);
  const std::uint32_t first_token = slab * s.tokens_per_cta;
  uint4 w[kLoadsPerThread];
  bool valid[kLoadsPerThread];
#pragma unroll
  for (int l = 0; l < kLoadsPerThread; ++l) {
    const std::uint32_t j = part * kScanChunksPerCta + threadIdx.x + l * kThreads;  // chunk of the slab
    const std::uint32_t local = s.per_token.quotient(j), item = s.per_token.remainder(j, local);
    const std::uint32_t token = first_token + local;  // b · S + s
    valid[l] = local < static_cast<std::uint32_t>(s.tokens_per_cta) && token < s.tokens;
    const std::uint32_t b = s.seq.quotient(token), pos = s.seq.remainder(token, b);
    const std::uint32_t h = s.chunks.quotient(item), c = s.chunks.remainder(item, h);
    w[l] = load_clamped(s.x.data + b * s.x.stride_b + pos * s.x.stride_s + h * s.x.stride_h + c * kChunk, valid[l],
                        s.x.data);
  }
  bool bad = false;
#pragma unroll
  for (int l = 0; l < kLoadsPerThread; ++l) bad |= valid[l] & has_nan_code(w[l]);  // no short-circuit branch
  return bad;
}

// Every scale element from its descale (1 without one); a bad descale raises its tensor's flag.
__device__ void write_scales(const Plan& p, std::int64_t first, std::int64_t stride) {
  const E4m3CallerInputs& in = p.in;
  const int group = in.Hq / in.Hkv;
  const std::int64_t q_blocks = (in.Sq + kTileKeys - 1) / kTileKeys, k_blocks = (in.Sk + kTileKeys - 1) / kTileKeys;
  const std::int64_t n_q = static_cast<std::int64_t>(in.B) * in.Hq * q_blocks;
  const std::int64_t n_k = static_cast<std::int64_t>(in.B) * in.Hkv * k_blocks;
  const std::int64_t n_v = static_cast<std::int64_t>(in.B) * in.Hkv * in.D;
  bool bad_q = false, bad_k = false, bad_v = false;
  for (std::int64_t i = first; i < n_q + n_k + n_v; i += stride) {
    if (i < n_q) {
      const std::int64_t bh = i / q_blocks;  // b · Hq + hq
      const float x = in.q_descale != nullptr ? in.q_descale[bh / in.Hq * in.Hkv + bh % in.Hq / group] : 1.0f;
      bad_q |= !good_descale(x);
      p.out.q_scale[i] = x;
    } else if (i < n_q + n_k) {
      const std::int64_t j = i - n_q;
      const float x = in.k_descale != nullptr ? in.k_descale[j / k_blocks] : 1.0f;  // b · Hkv + h
      bad_k |= !good_descale(x);
      p.out.k_scale[j] = x;
    } else {
      const std::int64_t j = i - n_q - n_k;
      const float x = in.v_descale != nullptr ? in.v_descale[j / in.D] : 1.0f;
      bad_v |= !good_descale(x);
      p.out.v_scale[j] = x;
    }
  }
  raise_flag(bad_q, p.out.nonfinite + kFlagQ);
  raise_flag(bad_k, p.out.nonfinite + kFlagK);
  raise_flag(bad_v, p.out.nonfinite + kFlagV);
}

// CTAs [0, vt_ctas): Vᵀ tiles; then Q's slabs, then K's. The scan CTAs also
// write the scales (a few thousand elements, spread over them).
__global__ void __launch_bounds__(kThreads, 5) e4m3_prepare_kernel(const __grid_constant__ Plan p) {
  __shared__ __align__(16) std::uint8_t tile[kTileKeys * (kMaxD + kChunk)];
  const int cta = static_cast<int>(blockIdx.x);
  if (cta < p.vt_ctas) {
    transpose_v_tile(p, cta, tile);
    return;
  }
  const int scan = cta - p.vt_ctas;
  const bool is_q = scan < p.q.ctas;
  const bool bad = scan_slab(is_q ? p.q : p.k, is_q ? scan : scan - p.q.ctas);
  raise_flag(bad, p.out.nonfinite + (is_q ? kFlagQ : kFlagK));
  write_scales(p, static_cast<std::int64_t>(scan) * kThreads + threadIdx.x,
               static_cast<std::int64_t>(p.q.ctas + p.k.ctas) * kThreads);
}

ScanPlan scan_plan(const E4m3View& x, int B, int S, int H, int D) {
  ScanPlan s;
  s.x = x;
  const int per_token = H * (D / kChunk);
  s.per_token = FastDiv(static_cast<std::uint32_t>(per_token));
  s.chunks = FastDiv(static_cast<std::uint32_t>(D / kChunk));
  s.seq = FastDiv(static_cast<std::uint32_t>(S));
  s.tokens = static_cast<std::uint32_t>(B) * static_cast<std::uint32_t>(S);
  s.tokens_per_cta = std::max(1, kScanChunksPerCta / per_token);
  const int parts = (per_token + kScanChunksPerCta - 1) / kScanChunksPerCta;  // 1 unless one token is more
  s.parts = FastDiv(static_cast<std::uint32_t>(parts));
  s.ctas = static_cast<int>((s.tokens + s.tokens_per_cta - 1) / s.tokens_per_cta) * parts;
  return s;
}

}  // namespace

void prepare_e4m3_operands(const E4m3CallerInputs& in, const E4m3KernelOperands& out, cudaStream_t stream) {
  Plan p;
  p.in = in;
  p.out = out;
  p.vt_keys = cuda_quantize::padded_keys(in.Sk);
  const auto tiles = static_cast<std::uint32_t>(p.vt_keys / kTileKeys);
  p.vt_heads = 1;
  for (int n = kMaxD / in.D; n > 1; --n)
    if (in.Hkv % n == 0) {
      p.vt_heads = n;
      break;
    }
  p.vt_tiles = FastDiv(tiles);
  p.vt_chunks = FastDiv(static_cast<std::uint32_t>(p.vt_heads * in.D / kChunk));
  p.vt_ctas = static_cast<int>(static_cast<std::int64_t>(in.B) * (in.Hkv / p.vt_heads) * tiles);
  p.q = scan_plan(in.q, in.B, in.Sq, in.Hq, in.D);
  p.k = scan_plan(in.k, in.B, in.Sk, in.Hkv, in.D);
  e4m3_prepare_kernel<<<p.vt_ctas + p.q.ctas + p.k.ctas, kThreads, 0, stream>>>(p);
  cuda_common::check_cuda(cudaGetLastError(), "e4m3_prepare_kernel launch");
}

}  // namespace fp4attn::sm90::fwd
