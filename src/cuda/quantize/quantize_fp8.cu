// GPU quantizer for recipe fp8, host side: argument checks, the workspace and
// the three launches (quantize_fp8_kernel.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <bit>
#include <limits>
#include <string>

#include "cuda/common/device_memory.hpp"
#include "cuda/quantize/host_launch.hpp"
#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/quantize/quantize_fp8_kernel.cuh"
#include "fp4attn/error.hpp"

namespace fp4attn::cuda_quantize {
namespace {

constexpr std::int64_t kMaxGridY = 65535;
constexpr std::size_t kCodeStoreAlign = 8;  // Q and K codes: 8 per store
constexpr std::size_t kVtStoreAlign = 16;   // Vᵀ: 16 bytes of a row per store
constexpr int kNonfiniteFlags = 3;

using cuda_common::check_cuda;

std::int64_t blocks_of(std::int64_t S) { return (S + kTokenBlock - 1) / kTokenBlock; }

// Byte offsets inside the workspace: V's channel amax, which each call resets
// to zero, then K's chunk sums, written before they are read.
struct WorkspaceLayout {
  std::size_t v_amax, k_partial, bytes;
};

// K's chunk sums per KV head: B · (blocks per entry) dense; for packed
// sequences the chunks of the tile-aligned layout (k_rows / 128), each
// sequence's at its rows.
std::int64_t chunk_rows(std::int64_t B, std::int64_t blocks, std::int64_t k_rows) {
  return k_rows > 0 ? k_rows / kTokenBlock : B * blocks;
}

WorkspaceLayout workspace_layout(std::int64_t slices, std::int64_t chunks_per_head, std::int64_t D, std::int64_t B) {
  WorkspaceLayout l{};
  std::size_t at = 0;
  l.v_amax = at, at += sizeof(unsigned) * slices * D;
  at = (at + alignof(double) - 1) / alignof(double) * alignof(double);
  l.k_partial = at, at += sizeof(double) * (slices / B) * chunks_per_head * D;
  l.bytes = at;
  return l;
}

template <class T>
void launch(const StridedInput& q, const StridedInput& k, const StridedInput& v, bool smooth_k, float softmax_scale,
            const Fp8Buffers& out, const QRowDot& row_dot, cudaStream_t stream) {
  Job<T> job{};
  job.q = view_of<T>(q), job.k = view_of<T>(k), job.v = view_of<T>(v);
  if (row_dot.out != nullptr) job.dot_with = view_of<T>(row_dot.with);
  job.dot_out = row_dot.out, job.dot_pitch = row_dot.pitch;
  job.B = static_cast<int>(q.B), job.Hq = static_cast<int>(q.H), job.Hkv = static_cast<int>(k.H);
  job.Sq = static_cast<int>(q.S), job.Sk = static_cast<int>(k.S), job.D = static_cast<int>(q.D);
  // The quantize CTA's lanes: D's, or the next power of two's (96: 128, 160:
  // 256) with the lanes past D padded (fp8_quantize_kernel's kPaddedLanes).
  const int lane_d = static_cast<int>(std::bit_ceil(static_cast<std::uint64_t>(q.D)));
  job.seg_shift = std::countr_zero(static_cast<unsigned>(lane_d / kSegment));
  job.code_pitch = code_pitch_of(out, q.D);
  job.q_blocks = static_cast<int>(blocks_of(q.S)), job.k_blocks = static_cast<int>(blocks_of(k.S));
  job.smooth_k = smooth_k;
  job.softmax_scale = softmax_scale;
  job.out = out;
  job.by_hkv = FastDiv(static_cast<std::uint32_t>(k.H)), job.by_hq = FastDiv(static_cast<std::uint32_t>(q.H));
  job.by_group = FastDiv(static_cast<std::uint32_t>(q.H / k.H));
  job.by_k_blocks = FastDiv(static_cast<std::uint32_t>(job.k_blocks));
  job.by_q_blocks = FastDiv(static_cast<std::uint32_t>(job.q_blocks));
  job.cu_q = q.cu_seqlens, job.cu_k = k.cu_seqlens;

  const std::int64_t slices = k.B * k.H;
  const WorkspaceLayout layout = workspace_layout(slices, chunk_rows(k.B, job.k_blocks, out.k_rows), k.D, k.B);
  CallWorkspace ws(out.workspace, layout.bytes, stream);
  job.ws = {reinterpret_cast<unsigned*>(ws.bytes() + layout.v_amax),
            reinterpret_cast<double*>(ws.bytes() + layout.k_partial)};

  // Statistics: V (unless out.vt is null), K with smooth_k.
  const int channel_blocks = static_cast<int>((k.H * (k.D / kQuad) + kStatsThreads - 1) / kStatsThreads);
  const std::int64_t stats_x = static_cast<std::int64_t>(job.k_blocks) * channel_blocks;
  const std::int64_t kv_blocks = slices * job.k_blocks;
  // A V-only call (recipe mxfp4_train: null q and k code buffers) has V blocks
  // alone; a call without V (the backward's) Q and K blocks alone.
  const bool v_only = out.q == nullptr, has_v = out.vt != nullptr;
  const unsigned stats_tensors = (has_v ? 1u : 0u) + (smooth_k ? 1u : 0u);
  const std::int64_t blocks = ((v_only ? 0 : 1) + (has_v ? 1 : 0)) * kv_blocks +
                              (v_only ? 0 : q.B * q.H * static_cast<std::int64_t>(job.q_blocks));
  if (stats_x > std::numeric_limits<int>::max() || blocks > std::numeric_limits<int>::max())
    throw Error("k", "too many token blocks for one launch");
  if (k.B > kMaxGridY) throw Error("k", "batch size above " + std::to_string(kMaxGridY) + " for one launch");
  if (stats_tensors > 0) {
    if (has_v)
      check_cuda(cudaMemsetAsync(ws.bytes() + layout.v_amax, 0, sizeof(unsigned) * slices * k.D, stream),
                 "cudaMemsetAsync");
    const dim3 stats_grid(static_cast<unsigned>(stats_x), static_cast<unsigned>(k.B), stats_tensors);
    fp8_stats_kernel<T><<<stats_grid, kStatsThreads, 0, stream>>>(job, channel_blocks);
    check_cuda(cudaGetLastError(), "fp8_stats_kernel launch");
    // The finalize and quantize kernels are programmatic dependent launches:
    // each may start while its predecessor finishes, and waits for it
    // (cudaGridDependencySynchronize) before reading what it wrote.
    const std::int64_t finalize_ctas = smooth_k ? slices * ((k.D + kSumColumns - 1) / kSumColumns)
                                                : (slices * k.D + kThreads - 1) / kThreads;
    if (finalize_ctas > std::numeric_limits<int>::max()) throw Error("k", "too many channels for one launch");
    const std::size_t finalize_smem = smooth_k ? sizeof(ChunkSumTile) : 0;
    launch_kernel(fp8_finalize_kernel<T>, dim3(static_cast<unsigned>(finalize_ctas)), kThreads, finalize_smem, stream,
                  true, "fp8_finalize_kernel launch", job);
  }
  // Without statistics the quantize kernel is the call's first: launched
  // plainly, since the caller's work before it may write its input.
  const bool backward_operands = out.qt != nullptr || out.kt != nullptr || row_dot.out != nullptr;
  const bool padded_lanes = lane_d != job.D;  // never with backward_operands (quantize_fp8 checks)
  launch_kernel(lane_d > kMaxHeadDim ? fp8_quantize_kernel<T, false, true, kWideHeadDim>
                : padded_lanes       ? fp8_quantize_kernel<T, false, true>
                : backward_operands ? fp8_quantize_kernel<T, true>
                                    : fp8_quantize_kernel<T, false>,
                dim3(static_cast<unsigned>(blocks)), static_cast<unsigned>(quantize_threads(lane_d)), 0, stream,
                stats_tensors > 0, "fp8_quantize_kernel launch", job);
}

void check_shape(const StridedInput& x, const char* name) {
  if (x.B <= 0 || x.S <= 0 || x.H <= 0 || x.D <= 0)
    throw Error(name, "sizes must be positive, got (B, S, H, D) = (" + std::to_string(x.B) + ", " +
                          std::to_string(x.S) + ", " + std::to_string(x.H) + ", " + std::to_string(x.D) + ")");
  if (x.data == nullptr) throw Error(name, "is a null pointer");
  if (x.S > std::numeric_limits<int>::max() - kTokenBlock || x.B * x.H > std::numeric_limits<int>::max())
    throw Error(name, "is too large for the quantizer's 32-bit token and slice indices");
}

}  // namespace

std::int64_t padded_keys(std::int64_t Sk) { return blocks_of(Sk) * kTokenBlock; }

std::size_t fp8_workspace_bytes(std::int64_t B, std::int64_t Hkv, std::int64_t Sk, std::int64_t D,
                                std::int64_t k_rows) {
  return workspace_layout(B * Hkv, chunk_rows(B, blocks_of(Sk), k_rows), D, B).bytes;
}

void quantize_fp8(const StridedInput& q, const StridedInput& k, const StridedInput& v, bool smooth_k,
                  float softmax_scale, const Fp8Buffers& out, cudaStream_t stream) {
  quantize_fp8(q, k, v, smooth_k, softmax_scale, out, QRowDot{}, stream);
}

void quantize_fp8(const StridedInput& q, const StridedInput& k, const StridedInput& v, bool smooth_k,
                  float softmax_scale, const Fp8Buffers& out, const QRowDot& q_row_dot, cudaStream_t stream) {
  check_shape(q, "q");
  check_shape(k, "k");
  check_shape(v, "v");
  // A multiple of kSegment; one that is no power of two on the lanes of the next.
  if (q.D != k.D || k.D != v.D || q.D < kMinHeadDim || q.D > kWideHeadDim || q.D % kSegment != 0)
    throw Error("D", "must match across q, k, v and be a multiple of " + std::to_string(kSegment) + " in [" +
                         std::to_string(kMinHeadDim) + ", " + std::to_string(kWideHeadDim) + "], got " +
                         std::to_string(q.D));
  if ((!std::has_single_bit(static_cast<std::uint64_t>(q.D)) || q.D > kMaxHeadDim) &&
      (out.qt != nullptr || out.kt != nullptr || q_row_dot.out != nullptr))
    throw Error("D", "the backward's operands (Qᵀ, Kᵀ, the row dot) need a power of two up to " +
                         std::to_string(kMaxHeadDim) + ", got " + std::to_string(q.D));
  if (k.B != q.B || v.B != q.B || k.S != v.S || k.H != v.H) throw Error("k", "q, k and v shapes disagree");
  if (q.H % k.H != 0) throw Error("Hq", "must be a multiple of Hkv");
  if (q.type != k.type || k.type != v.type) throw Error("dtype", "q, k and v must share one element type");
  const bool packed = q.cu_seqlens != nullptr;
  if (packed != (k.cu_seqlens != nullptr)) throw Error("cu_seqlens", "q and k must both be packed or neither");
  if (packed && (out.rows_q == nullptr || out.rows_k == nullptr || out.q_rows < padded_keys(q.S) ||
                 out.k_rows < padded_keys(k.S) || out.q_rows % kTokenBlock != 0 || out.k_rows % kTokenBlock != 0 ||
                 out.q_rows > std::numeric_limits<int>::max() - kTokenBlock ||
                 out.k_rows > std::numeric_limits<int>::max() - kTokenBlock))
    throw Error("rows", "packed sequences need rows_q, rows_k and layouts of whole 128-token blocks (q_rows, k_rows)");
  if (out.vt != nullptr && out.vt_keys != (packed ? out.k_rows : padded_keys(k.S)))
    throw Error("vt_keys", packed ? "must be k_rows for packed sequences" : "must be padded_keys(Sk)");
  if (out.vt == nullptr && out.q == nullptr) throw Error("out", "no code buffers: nothing to quantize");
  if (smooth_k && (out.k_mean == nullptr || out.lse_shift == nullptr))
    throw Error("smooth_k", "needs k_mean and lse_shift buffers");
  if ((out.q == nullptr) != (out.k == nullptr)) throw Error("out", "q and k codes must both be given or both be null");
  if (out.q == nullptr && smooth_k) throw Error("smooth_k", "needs the q and k code buffers (V-only call)");
  if (!aligned(out.q, kCodeStoreAlign) || !aligned(out.k, kCodeStoreAlign) || !aligned(out.vt, kVtStoreAlign) ||
      !aligned(out.qt, kVtStoreAlign) || !aligned(out.kt, kVtStoreAlign))
    throw Error("out", "code buffers must be 8-byte (q, k) and 16-byte (vt, qt, kt) aligned");
  if ((out.qt != nullptr || out.kt != nullptr) && out.q == nullptr)
    throw Error("out", "transposed q or k codes need the q and k code buffers (V-only call)");
  if (out.code_pitch != 0 && (out.code_pitch < q.D || out.code_pitch % kSegment != 0))
    throw Error("code_pitch", "must be at least D and a multiple of " + std::to_string(kSegment) + ", got " +
                                  std::to_string(out.code_pitch));
  if (code_pitch_of(out, q.D) != q.D && (out.qt != nullptr || out.kt != nullptr))
    throw Error("code_pitch", "must be D with the backward's operands (they are read at D)");
  if (k.cu_seqlens != v.cu_seqlens) throw Error("cu_seqlens", "k and v must share their sequence boundaries");
  if (q_row_dot.out != nullptr) {
    const StridedInput& w = q_row_dot.with;
    check_shape(w, "q_row_dot.with");
    if (w.B != q.B || w.S != q.S || w.H != q.H || w.D != q.D || w.type != q.type)
      throw Error("q_row_dot.with", "must have q's shape and element type");
    if (w.cu_seqlens != q.cu_seqlens) throw Error("q_row_dot.with", "must share q's sequence boundaries");
    if (out.q == nullptr) throw Error("q_row_dot", "needs the q codes (a V-only call has no q blocks)");
    if (packed ? q_row_dot.pitch != out.q_rows : q_row_dot.pitch < padded_keys(q.S))
      throw Error("q_row_dot.pitch", packed ? "must be q_rows for packed sequences"
                                            : "must be at least Sq rounded up to 128");
  }
  switch (q.type) {
    case ElementType::f32: return launch<float>(q, k, v, smooth_k, softmax_scale, out, q_row_dot, stream);
    case ElementType::f16: return launch<__half>(q, k, v, smooth_k, softmax_scale, out, q_row_dot, stream);
    case ElementType::bf16: return launch<__nv_bfloat16>(q, k, v, smooth_k, softmax_scale, out, q_row_dot, stream);
  }
}

void check_finite(const Fp8Buffers& out, cudaStream_t stream) {
  int flags[kNonfiniteFlags] = {0, 0, 0};
  check_cuda(cudaMemcpyAsync(flags, out.nonfinite, sizeof(flags), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (flags[kQ] || flags[kK] || flags[kV]) {
    check_cuda(cudaMemsetAsync(out.nonfinite, 0, sizeof(flags), stream), "cudaMemsetAsync");
    const char* name = flags[kQ] ? "q" : flags[kK] ? "k" : "v";
    throw Error(name, "non-finite value in the input of the GPU quantizer");
  }
}

}  // namespace fp4attn::cuda_quantize
