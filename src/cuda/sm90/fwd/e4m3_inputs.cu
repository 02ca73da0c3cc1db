// One memory-bound launch before recipe fp8's kernel on caller-quantized E4M3
// inputs (e4m3_inputs.hpp). Its first CTAs transpose V's 128-key tiles; the
// rest scan Q's and K's codes for NaN, slab by slab of consecutive tokens, and
// write the broadcast scales. One launch, so that the two parts share the
// machine instead of each leaving a tail. Packed sequences take a second
// kernel of one CTA per tile of the tile-aligned layout and group of heads:
// Vᵀ's tiles are written there, Q's and K's scanned where they are.
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

// A tile of 128 token rows of `heads` consecutive heads: row r's codes of head
// j at row0 + r · stride_s + j · stride_h. Rows from `rows` on (past the
// sequence) read as zero codes.
struct TileSource {
  const std::uint8_t* row0;
  std::int64_t stride_s, stride_h;
  int rows;
};

// The tile's codes into registers: chunk i of the tile (16 bytes, row-major
// over rows of W = heads · D bytes; row_chunks divides by W / 16, head_chunks
// by D / 16) is w[l] of thread i mod 256, l = i / 256; zero past the rows and
// past 128 rows. Raises `bad` for a NaN code.
__device__ __forceinline__ void load_tile(const TileSource& s, const FastDiv& row_chunks, const FastDiv& head_chunks,
                                          uint4 (&w)[kLoadsPerThread], bool& bad) {
#pragma unroll
  for (int l = 0; l < kLoadsPerThread; ++l) {
    const std::uint32_t i = threadIdx.x + l * kThreads, row = row_chunks.quotient(i);
    const std::uint32_t cc = row_chunks.remainder(i, row), head = head_chunks.quotient(cc);
    w[l] = load_clamped(s.row0 + row * s.stride_s + head * s.stride_h + head_chunks.remainder(cc, head) * kChunk,
                        row < static_cast<std::uint32_t>(s.rows), s.row0);
  }
#pragma unroll
  for (int l = 0; l < kLoadsPerThread; ++l) {
    const std::uint32_t row = row_chunks.quotient(threadIdx.x + l * kThreads);
    w[l] = zero_unless(w[l], row < static_cast<std::uint32_t>(s.rows));
    bad |= has_nan_code(w[l]);
  }
}

// The loaded V tile (W = heads · D ≤ 256 channels) as Vᵀ: into shared memory,
// a row per key, then a thread takes four channels of one 32-key group and,
// per four slots, reads the four keys' words of those channels and transposes
// the 4 × 4 bytes (slot s holds key vt_key_of_slot(s)): 32 bytes of a channel
// row. A warp's lanes read neighbouring words of one key row: no bank
// conflicts. The Vᵀ tile (W rows of 128 codes; consecutive heads' rows are
// consecutive in Vᵀ) then replaces the V tile in shared memory, and `dst`
// (channel 0's first key of the tile, rows vt_keys apart) gets whole 128-byte
// rows. Several heads a CTA at D < 256: a CTA of one small head's tile spent
// more on its start, its barriers and its end than on its bytes (D = 64 took
// longer than D = 128).
__device__ void store_vt_tile(const uint4 (&w)[kLoadsPerThread], int W, const FastDiv& row_chunks, std::uint8_t* tile,
                              std::uint8_t* dst, std::int64_t vt_keys) {
  constexpr int kPitch = kMaxD + kChunk;
#pragma unroll
  for (int l = 0; l < kLoadsPerThread; ++l) {
    const std::uint32_t i = threadIdx.x + l * kThreads, row = row_chunks.quotient(i);
    if (row < kTileKeys) *reinterpret_cast<uint4*>(tile + row * kPitch + row_chunks.remainder(i, row) * kChunk) = w[l];
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
  // Stored straight from the transposing threads, every 32-byte sector of
  // Vᵀ came as two 16-byte halves from two instructions: twice the L2 write
  // requests, and a warp's lanes four channel rows apart.
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
  for (int i = threadIdx.x; i < W * kVtRowChunks; i += kThreads) {
    const int r = i / kVtRowChunks, j = i % kVtRowChunks;
    *reinterpret_cast<uint4*>(dst + r * vt_keys + j * kChunk) =
        *reinterpret_cast<const uint4*>(tile + vt_tile_offset(r, j));
  }
}

// V's tile (kv heads h0 … h0 + vt_heads − 1 of batch b, 128 keys) as Vᵀ.
__device__ void transpose_v_tile(const Plan& p, int cta, std::uint8_t* tile) {
  const std::uint32_t group = p.vt_tiles.quotient(static_cast<std::uint32_t>(cta));
  const std::uint32_t t = p.vt_tiles.remainder(static_cast<std::uint32_t>(cta), group);
  const std::int64_t bh0 = static_cast<std::int64_t>(group) * p.vt_heads;  // b · Hkv + h0
  const std::int64_t b = bh0 / p.in.Hkv, h0 = bh0 % p.in.Hkv, key0 = static_cast<std::int64_t>(t) * kTileKeys;
  const E4m3View& v = p.in.v;
  const TileSource src{v.data + b * v.stride_b + key0 * v.stride_s + h0 * v.stride_h, v.stride_s, v.stride_h,
                       static_cast<int>(std::min<std::int64_t>(kTileKeys, p.in.Sk - key0))};
  bool bad = false;
  uint4 w[kLoadsPerThread];
  load_tile(src, p.vt_chunks, p.q.chunks, w, bad);  // q.chunks: D / 16
  store_vt_tile(w, p.vt_heads * p.in.D, p.vt_chunks, tile, p.out.vt + bh0 * p.in.D * p.vt_keys + key0, p.vt_keys);
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

// ---- Packed sequences: one CTA per (layout tile, group of heads) and tensor.

struct PackedPlan {
  E4m3CallerInputs in;
  E4m3KernelOperands out;
  E4m3PackedLayout lay;
  int q_heads = 1, k_heads = 1;  // heads per CTA (q_heads · D, k_heads · D ≤ 256)
  FastDiv q_groups, k_groups;    // Hq / q_heads, Hkv / k_heads
  FastDiv q_chunks, k_chunks;    // 16-byte chunks of a tile row: q_heads · D / 16, k_heads · D / 16
  FastDiv d_chunks;              // D / 16
  FastDiv d;                     // D (the host keeps B · Hkv · D below 2^31)
  int q_tiles = 0, k_tiles = 0;  // q_rows / 128, k_rows / 128
  int vt_ctas = 0, q_ctas = 0;   // then as many K CTAs as Vᵀ CTAs
};

// The sequence holding layout row `row` (the last b with rows[b] ≤ row, so
// that sequences without tokens are passed over), or −1 past rows[B].
__device__ int sequence_of(const int* rows, int B, int row) {
  if (row >= rows[B]) return -1;
  int lo = 0, hi = B - 1;  // rows[0] = 0
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (rows[mid] <= row) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// What a packed CTA works on: layout tile `tile` of a tensor and its heads
// h0 …; the caller's rows of that tile's sequence b.
struct PackedTile {
  int b = -1, tile = 0, h0 = 0;
  TileSource src{};
};

__device__ PackedTile packed_tile(const PackedPlan& p, E4m3View x, const int* cu, const int* rows, FastDiv groups,
                                  int heads, int cta) {
  PackedTile t;
  t.tile = static_cast<int>(groups.quotient(static_cast<std::uint32_t>(cta)));
  t.h0 = static_cast<int>(groups.remainder(static_cast<std::uint32_t>(cta), static_cast<std::uint32_t>(t.tile))) * heads;
  const int row0 = t.tile * kTileKeys;
  t.b = sequence_of(rows, p.in.B, row0);
  if (t.b < 0) return t;
  const int first = cu[t.b] + (row0 - rows[t.b]);  // the caller's row of the tile's first row
  t.src = {x.data + static_cast<std::int64_t>(first) * x.stride_s + static_cast<std::int64_t>(t.h0) * x.stride_h,
           x.stride_s, x.stride_h, min(kTileKeys, cu[t.b + 1] - first)};
  return t;
}

// Q's or K's tile, which the kernel reads in place, scanned for NaN codes, and
// the tile's scales: its sequence's descale for each of its heads. A template
// on the tensor: members of the kernel's parameter picked at run time went
// through local memory.
template <bool is_q>
__device__ void scan_packed_tile(const PackedPlan& p, int cta) {
  const int heads = is_q ? p.q_heads : p.k_heads;
  const PackedTile t = packed_tile(p, is_q ? p.in.q : p.in.k, is_q ? p.lay.cu_q : p.lay.cu_k,
                                   is_q ? p.lay.rows_q : p.lay.rows_k, is_q ? p.q_groups : p.k_groups, heads, cta);
  if (t.b < 0) return;  // a tile past the sequences (the host sized the layout for the most it can take)
  bool bad = false;
  uint4 w[kLoadsPerThread];
  load_tile(t.src, is_q ? p.q_chunks : p.k_chunks, p.d_chunks, w, bad);
  if (static_cast<int>(threadIdx.x) < heads) {
    const int h = t.h0 + static_cast<int>(threadIdx.x), kv = is_q ? h / (p.in.Hq / p.in.Hkv) : h;
    const float* descale = is_q ? p.in.q_descale : p.in.k_descale;
    (is_q ? p.out.q_scale : p.out.k_scale)[static_cast<std::int64_t>(h) * (is_q ? p.q_tiles : p.k_tiles) + t.tile] =
        descale != nullptr ? descale[t.b * p.in.Hkv + kv] : 1.0f;
  }
  raise_flag(bad, p.out.nonfinite + (is_q ? kFlagQ : kFlagK));
}

// V's tile of kv heads h0 … as Vᵀ columns tile · 128 … of the layout.
__device__ void transpose_packed_v_tile(const PackedPlan& p, int cta, std::uint8_t* tile) {
  const PackedTile t = packed_tile(p, p.in.v, p.lay.cu_k, p.lay.rows_k, p.k_groups, p.k_heads, cta);
  if (t.b < 0) return;
  bool bad = false;
  uint4 w[kLoadsPerThread];
  load_tile(t.src, p.k_chunks, p.d_chunks, w, bad);
  store_vt_tile(w, p.k_heads * p.in.D, p.k_chunks, tile,
                p.out.vt + static_cast<std::int64_t>(t.h0) * p.in.D * p.lay.k_rows + static_cast<std::int64_t>(t.tile) * kTileKeys,
                p.lay.k_rows);
  raise_flag(bad, p.out.nonfinite + kFlagV);
}

// V's channel scales (B, Hkv, D) and every sequence's three descales checked,
// spread over all CTAs.
__device__ void write_packed_v_scales(const PackedPlan& p) {
  const E4m3CallerInputs& in = p.in;
  const std::uint32_t heads = static_cast<std::uint32_t>(in.B) * in.Hkv, n_v = heads * in.D;
  const std::uint32_t stride = gridDim.x * kThreads;
  bool bad_q = false, bad_k = false, bad_v = false;
  for (std::uint32_t i = blockIdx.x * kThreads + threadIdx.x; i < n_v; i += stride) {
    const float x = in.v_descale != nullptr ? in.v_descale[p.d.quotient(i)] : 1.0f;
    bad_v |= !good_descale(x);
    p.out.v_scale[i] = x;
    if (i < heads) {
      bad_q |= in.q_descale != nullptr && !good_descale(in.q_descale[i]);
      bad_k |= in.k_descale != nullptr && !good_descale(in.k_descale[i]);
    }
  }
  raise_flag(bad_q, p.out.nonfinite + kFlagQ);
  raise_flag(bad_k, p.out.nonfinite + kFlagK);
  raise_flag(bad_v, p.out.nonfinite + kFlagV);
}

// CTAs [0, vt_ctas): Vᵀ tiles; then Q's tiles, then K's. Three CTAs per SM:
// at five (48 registers) or four (64) the three paths' addresses spilled.
__global__ void __launch_bounds__(kThreads, 3) e4m3_prepare_packed_kernel(const __grid_constant__ PackedPlan p) {
  __shared__ __align__(16) std::uint8_t tile[kTileKeys * (kMaxD + kChunk)];
  write_packed_v_scales(p);
  const int cta = static_cast<int>(blockIdx.x);
  if (cta < p.vt_ctas) transpose_packed_v_tile(p, cta, tile);
  else if (cta < p.vt_ctas + p.q_ctas) scan_packed_tile<true>(p, cta - p.vt_ctas);
  else scan_packed_tile<false>(p, cta - p.vt_ctas - p.q_ctas);
}

// The most heads of D codes up to 256 bytes that divide H.
int heads_per_cta(int H, int D) {
  for (int n = kMaxD / D; n > 1; --n)
    if (H % n == 0) return n;
  return 1;
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
  p.vt_heads = heads_per_cta(in.Hkv, in.D);
  p.vt_tiles = FastDiv(tiles);
  p.vt_chunks = FastDiv(static_cast<std::uint32_t>(p.vt_heads * in.D / kChunk));
  p.vt_ctas = static_cast<int>(static_cast<std::int64_t>(in.B) * (in.Hkv / p.vt_heads) * tiles);
  p.q = scan_plan(in.q, in.B, in.Sq, in.Hq, in.D);
  p.k = scan_plan(in.k, in.B, in.Sk, in.Hkv, in.D);
  e4m3_prepare_kernel<<<p.vt_ctas + p.q.ctas + p.k.ctas, kThreads, 0, stream>>>(p);
  cuda_common::check_cuda(cudaGetLastError(), "e4m3_prepare_kernel launch");
}

void prepare_e4m3_packed_operands(const E4m3CallerInputs& in, const E4m3PackedLayout& packed,
                                  const E4m3KernelOperands& out, cudaStream_t stream) {
  PackedPlan p;
  p.in = in;
  p.out = out;
  p.lay = packed;
  p.q_heads = heads_per_cta(in.Hq, in.D);
  p.k_heads = heads_per_cta(in.Hkv, in.D);
  p.q_groups = FastDiv(static_cast<std::uint32_t>(in.Hq / p.q_heads));
  p.k_groups = FastDiv(static_cast<std::uint32_t>(in.Hkv / p.k_heads));
  p.q_chunks = FastDiv(static_cast<std::uint32_t>(p.q_heads * in.D / kChunk));
  p.k_chunks = FastDiv(static_cast<std::uint32_t>(p.k_heads * in.D / kChunk));
  p.d_chunks = FastDiv(static_cast<std::uint32_t>(in.D / kChunk));
  p.d = FastDiv(static_cast<std::uint32_t>(in.D));
  p.q_tiles = static_cast<int>(packed.q_rows / kTileKeys);
  p.k_tiles = static_cast<int>(packed.k_rows / kTileKeys);
  p.vt_ctas = p.k_tiles * (in.Hkv / p.k_heads);
  p.q_ctas = p.q_tiles * (in.Hq / p.q_heads);
  e4m3_prepare_packed_kernel<<<2 * p.vt_ctas + p.q_ctas, kThreads, 0, stream>>>(p);
  cuda_common::check_cuda(cudaGetLastError(), "e4m3_prepare_packed_kernel launch");
}

}  // namespace fp4attn::sm90::fwd
