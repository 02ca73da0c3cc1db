// GPU quantizer for the FP4 recipes, host side: argument checks, the
// workspace, and the launch sequence of quantize_fp4_kernel.cuh per operand:
//   q, v, k without smooth_k  MXFP4: one quantize launch
//                             NVFP4: tensor amax, then quantize (backwards)
//   k with smooth_k           chunk sums (+ max / min for NVFP4), the mean
//                             (+ the amax of k − mean), then quantize
//                             (backwards)
// The quantize launch for q and k of 16-bit data in a 16-byte aligned layout
// with D ≥ 32 is the pipelined fp4_rows_stream_kernel, else fp4_rows_kernel;
// for V of 16-bit data in such a layout with D = 64 or 128 the pipelined
// fp4_columns_stream_kernel (Vᵀ, or untransposed V into a 16-byte aligned
// buffer), else (fp32, other D) fp4_columns_kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <limits>
#include <string>

#include "cuda/common/device_memory.hpp"
#include "cuda/quantize/host_launch.hpp"
#include "cuda/quantize/quantize_fp4.hpp"
#include "cuda/quantize/quantize_fp4_kernel.cuh"
#include "fp4attn/error.hpp"

namespace fp4attn::cuda_quantize {
namespace {

constexpr int kNonfiniteFlags = 3;
constexpr std::size_t kDefaultSmemLimit = 48 * 1024;
constexpr int kAmaxCtasPerSm = 8;
constexpr std::size_t kCodeStoreAlign = 4;         // one 32-bit word per store
constexpr std::size_t kTransposedStoreAlign = 16;  // Vᵀ: 16 bytes per store
constexpr std::size_t kBlockStoreAlign = 16;       // fp4_rows_stream_kernel: one 16-byte store per 32 elements
constexpr std::size_t kMeanLoadAlign = 16;         // fp4_rows_stream_kernel: the mean read 16 bytes at a time
constexpr std::int64_t kStreamMinHeadDim = 32;     // a lane owns 32 elements of one row
constexpr std::int64_t kWarpSizeTimesBlock = fp4::kWarpSize * kMxfp4Block;  // elements of a rows round: R = this / D

using cuda_common::check_cuda;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

const char* name_of(Fp4Operand op) { return op == Fp4Operand::q ? "q" : op == Fp4Operand::k ? "k" : "v"; }

std::int64_t mean_chunks(std::int64_t S) { return ceil_div(S, kSequenceMeanChunk); }

// Byte offsets inside the workspace; the amax word is reset by each call that uses it.
struct WorkspaceLayout {
  std::size_t amax, k_partial, k_max, k_min, bytes;
};

WorkspaceLayout workspace_layout(std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D) {
  const std::size_t partials = static_cast<std::size_t>(B * mean_chunks(S) * H * D);
  WorkspaceLayout l{};
  l.amax = 0;
  l.k_partial = alignof(double);
  l.k_max = l.k_partial + sizeof(double) * partials;
  l.k_min = l.k_max + sizeof(float) * partials;
  l.bytes = l.k_min + sizeof(float) * partials;
  return l;
}

fp4::FastDivisor fast_divisor(unsigned d) {
  fp4::FastDivisor f;
  f.d = d;
  if (d > 1) {
    const unsigned l = static_cast<unsigned>(std::bit_width(d - 1));  // ceil(log2 d) ≥ 1
    f.multiplier = static_cast<unsigned>(((std::uint64_t{1} << (31 + l)) + d - 1) / d);
    f.shift = l - 1;
  }
  return f;
}

// The device's SMs and shared memory per SM, read once per process: they
// only size the persistent grid, and any grid is correct.
struct StreamGridLimits {
  int device, sms, smem_per_sm;
};
const StreamGridLimits& stream_grid_limits() {
  static const StreamGridLimits limits = [] {
    int device = 0, smem = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
               "cudaDeviceGetAttribute");
    return StreamGridLimits{device, sm_count(), smem};
  }();
  return limits;
}

// Dynamic shared memory beyond 48 KiB must be allowed per kernel and device:
// once per process and input type for the largest size asked (a driver call
// each launch costs about a microsecond of host time, which a lone call waits
// for). A call on another device than the first sets it every time.
template <class T, bool kSmooth>
void allow_rows_stream_smem(std::size_t bytes, int first_device) {
  static std::atomic<std::size_t> allowed{kDefaultSmemLimit};
  int device = first_device;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (device == first_device && bytes <= allowed.load(std::memory_order_relaxed)) return;
  check_cuda(cudaFuncSetAttribute(fp4::fp4_rows_stream_kernel<T, kSmooth>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)),
             "cudaFuncSetAttribute");
  if (device == first_device) allowed.store(std::max(bytes, allowed.load(std::memory_order_relaxed)));
}

// fp4_columns_stream_kernel for D = kD (its shared memory, kStreamBuffers
// tile buffers and, for untransposed V, the code stage, is allowed once per
// device, as above).
template <class T, int kD, bool kTransposed>
void launch_columns_stream(const fp4::Job<T>& job, std::int64_t tiles, cudaStream_t stream) {
  constexpr std::size_t kSmem = fp4::kStreamBuffers * sizeof(T) * fp4::kStreamTileElems +
                                sizeof(fp4::NvDivisorTable) + (kTransposed ? 0 : fp4::kStreamCodeStageBytes);
  static std::atomic<int> allowed_on{-1};
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (allowed_on.load(std::memory_order_relaxed) != device) {
    check_cuda(cudaFuncSetAttribute(fp4::fp4_columns_stream_kernel<T, kD, kTransposed>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem)),
               "cudaFuncSetAttribute");
    allowed_on.store(device, std::memory_order_relaxed);
  }
  const auto ctas = static_cast<unsigned>(
      std::min<std::int64_t>(tiles, std::int64_t{stream_grid_limits().sms} * fp4::kStreamCtasPerSm));
  // NVFP4's V follows the tensor amax pass: a programmatic dependent launch.
  launch_kernel(fp4::fp4_columns_stream_kernel<T, kD, kTransposed>, dim3(ctas), fp4::kStreamThreads, kSmem, stream,
                job.nvfp4, "quantize_fp4 launch", job, static_cast<int>(tiles));
}

template <class T, int kD>
void launch_columns_stream(const fp4::Job<T>& job, std::int64_t tiles, cudaStream_t stream) {
  if (job.v_transposed) launch_columns_stream<T, kD, true>(job, tiles, stream);
  else launch_columns_stream<T, kD, false>(job, tiles, stream);
}

constexpr std::size_t kSmemReservedPerCta = 1024;  // what the runtime keeps per resident CTA
constexpr std::int64_t kMinRoundsPerWarp = 6;

// What fp4_rows_stream_kernel needs beyond the input and output.
struct RowStreamExtras {
  const float* mean;      // smooth_k, else null
  const unsigned* amax;   // NVFP4
  bool reverse;
};

// Rows of q / k through fp4_rows_stream_kernel when the call allows it:
// 16-bit data with D ≥ 32, rows on 16-byte boundaries (bulk copies), codes
// on 16 (one 16-byte store per 32 elements), the mean on 16. Returns false,
// launching nothing, otherwise.
template <class T>
bool launch_rows_stream(const StridedInput& x, Fp4Operand op, const Fp4Options& opt, const Fp4Output& dst,
                        int* nonfinite, const InputView<T>& view, const RowStreamExtras& extras,
                        cudaStream_t stream) {
  if (op == Fp4Operand::v || x.D < kStreamMinHeadDim || !view.vector_loads || !aligned(dst.codes, kBlockStoreAlign) ||
      (extras.mean != nullptr && !aligned(extras.mean, kMeanLoadAlign)))
    return false;
  const std::int64_t rows = x.B * x.S * x.H;
  const std::int64_t rows_per_round = kWarpSizeTimesBlock / x.D;
  if (rows > std::numeric_limits<int>::max() / 2) return false;  // 32-bit row indices, room for a round past the end

  fp4::RowStreamJob job{};
  job.in = static_cast<const unsigned char*>(x.data);
  job.stride_b = x.stride_b * 2, job.stride_s = x.stride_s * 2, job.stride_h = x.stride_h * 2;
  job.S = static_cast<int>(x.S), job.H = static_cast<int>(x.H), job.D = static_cast<int>(x.D);
  job.rows = static_cast<int>(rows);
  job.rounds = static_cast<int>(ceil_div(rows, rows_per_round));
  job.by_heads = fast_divisor(static_cast<unsigned>(x.H));
  job.by_tokens = fast_divisor(static_cast<unsigned>(x.S));
  job.round_up = opt.mx_scale_rule == MxScaleRule::round_up;
  job.nvfp4 = opt.format == TensorFormat::nvfp4;
  job.reverse = extras.reverse;
  // Dense (B, S, H, D): rows in (B, S, H) order follow one another in memory.
  job.contiguous = x.stride_h == x.D && (x.S == 1 || x.stride_s == x.H * x.D) &&
                   (x.B == 1 || x.stride_b == x.S * x.H * x.D);
  job.mean = extras.mean, job.amax = extras.amax, job.tensor_scale = dst.tensor_scale;
  job.codes = dst.codes, job.scales = dst.scales;
  job.nonfinite = nonfinite;

  const std::size_t slot_bytes =
      static_cast<std::size_t>(rows_per_round * (2 * x.D + (job.contiguous ? 0 : fp4::kRowPadBytes)));
  const std::size_t smem =
      fp4::kRowTableBytes + fp4::kRowBarrierBytes + std::size_t{fp4::kWarps} * fp4::kRowStages * slot_bytes;
  const StreamGridLimits& limits = stream_grid_limits();
  const bool smooth = extras.mean != nullptr;
  if (smooth) allow_rows_stream_smem<T, true>(smem, limits.device);
  else allow_rows_stream_smem<T, false>(smem, limits.device);
  const int by_smem = static_cast<int>(static_cast<std::size_t>(limits.smem_per_sm) / (smem + kSmemReservedPerCta));
  const int per_sm =
      std::max(1, std::min(smooth ? fp4::kRowStreamSmoothCtasPerSm : fp4::kRowStreamCtasPerSm, by_smem));
  // At least kMinRoundsPerWarp rounds a warp: a warp's first rounds pay the
  // pipeline's fill, and small inputs are done by fewer, fuller warps.
  const auto ctas = static_cast<unsigned>(std::min<std::int64_t>(
      ceil_div(job.rounds, fp4::kWarps * kMinRoundsPerWarp), std::int64_t{limits.sms} * per_sm));
  // After a statistics pass (NVFP4's amax, smooth_k's mean): a programmatic dependent launch.
  const bool after_statistics = extras.mean != nullptr || extras.amax != nullptr;
  if (smooth)
    launch_kernel(fp4::fp4_rows_stream_kernel<T, true>, dim3(ctas), fp4::kThreads, smem, stream, after_statistics,
                  "quantize_fp4 launch", job);
  else
    launch_kernel(fp4::fp4_rows_stream_kernel<T, false>, dim3(ctas), fp4::kThreads, smem, stream, after_statistics,
                  "quantize_fp4 launch", job);
  return true;
}

template <class T>
void launch(const StridedInput& x, Fp4Operand op, const Fp4Options& opt, const Fp4Buffers& out, cudaStream_t stream) {
  const Fp4Output& dst = op == Fp4Operand::q ? out.q : op == Fp4Operand::k ? out.k : out.v;
  const bool nvfp4 = opt.format == TensorFormat::nvfp4;
  const bool smooth = op == Fp4Operand::k && opt.smooth_k;
  const int B = static_cast<int>(x.B), S = static_cast<int>(x.S), H = static_cast<int>(x.H), D = static_cast<int>(x.D);

  // Without statistics MXFP4 needs no workspace: try the stream kernel first.
  if constexpr (sizeof(T) == 2)
    if (!nvfp4 && !smooth &&
        launch_rows_stream<T>(x, op, opt, dst, out.nonfinite + static_cast<int>(op), view_of<T>(x),
                              RowStreamExtras{nullptr, nullptr, false}, stream))
      return;

  const WorkspaceLayout layout = workspace_layout(x.B, x.S, x.H, x.D);
  CallWorkspace ws(out.workspace, layout.bytes, stream);
  fp4::Workspace w{reinterpret_cast<unsigned*>(ws.bytes() + layout.amax),
                   reinterpret_cast<double*>(ws.bytes() + layout.k_partial),
                   reinterpret_cast<float*>(ws.bytes() + layout.k_max),
                   reinterpret_cast<float*>(ws.bytes() + layout.k_min)};

  fp4::Job<T> job{};
  job.in = view_of<T>(x);
  job.S = S, job.H = H, job.D = D;
  job.seg_shift = std::countr_zero(static_cast<unsigned>(D / kSegment));
  job.padded_tokens = static_cast<int>(fp4_padded_tokens(x.S));
  job.nvfp4 = nvfp4;
  job.round_up = opt.mx_scale_rule == MxScaleRule::round_up;
  job.v_transposed = opt.v_transposed;
  job.codes = dst.codes, job.scales = dst.scales, job.tensor_scale = dst.tensor_scale;
  job.mean = smooth ? out.k_mean : nullptr;
  job.amax = w.amax;
  job.nonfinite = out.nonfinite + static_cast<int>(op);

  if (nvfp4) check_cuda(cudaMemsetAsync(w.amax, 0, sizeof(unsigned), stream), "cudaMemsetAsync");
  if (smooth) {
    const int chunks = static_cast<int>(mean_chunks(x.S));
    const int channels = H * D;
    const int channel_blocks = static_cast<int>(ceil_div(channels / kQuad, fp4::kMeanThreads));
    const dim3 grid(static_cast<unsigned>(std::int64_t{chunks} * channel_blocks), static_cast<unsigned>(B));
    fp4::fp4_mean_partial_kernel<T><<<grid, fp4::kMeanThreads, 0, stream>>>(job, w, chunks, channel_blocks, nvfp4);
    check_cuda(cudaGetLastError(), "quantize_fp4 (mean) launch");
    const std::int64_t finalize_ctas = x.B * ceil_div(channels, kSumColumns);
    if (finalize_ctas > std::numeric_limits<int>::max()) throw Error("k", "too large for one launch");
    launch_kernel(fp4::fp4_mean_finalize_kernel, dim3(static_cast<unsigned>(finalize_ctas)), fp4::kThreads,
                  sizeof(ChunkSumTile), stream, true, "quantize_fp4 (mean) launch", w, channels, chunks, S, out.k_mean,
                  nvfp4);
  } else if (nvfp4) {
    // About kAmaxCtasPerSm CTAs per SM over all batch entries, each with a few tokens at least.
    const std::int64_t per_batch = std::max<std::int64_t>(1, sm_count() * kAmaxCtasPerSm / x.B);
    const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>(per_batch, ceil_div(x.S, fp4::kAmaxItems))),
                    static_cast<unsigned>(x.B));
    fp4::fp4_amax_kernel<T><<<grid, fp4::kThreads, 0, stream>>>(job, w.amax);
    check_cuda(cudaGetLastError(), "quantize_fp4 (amax) launch");
  }
  // After a full pass over the tensor, its tail is what L2 still holds.
  job.reverse = nvfp4 || smooth;
  if constexpr (sizeof(T) == 2)
    if ((nvfp4 || smooth) && launch_rows_stream<T>(x, op, opt, dst, job.nonfinite, job.in,
                                                   RowStreamExtras{job.mean, job.amax, job.reverse}, stream))
      return;

  const std::int64_t slices = x.B * x.H;
  if (op == Fp4Operand::v) {
    if constexpr (sizeof(T) == 2) {
      fp4::Job<T> stream_job = job;  // the stream kernel's tiles
      // Token tiles per (b, h); each is D / 64 tiles of 64 channels. Untransposed
      // codes go out 16 bytes at a time: the stream kernel takes them from a
      // 16-byte aligned buffer (any D / 2-byte row then starts on 16 bytes).
      stream_job.tiles_per_slice = static_cast<int>(ceil_div(job.padded_tokens, fp4::kStreamTileTokens));
      const std::int64_t tiles = slices * stream_job.tiles_per_slice * (D * fp4::kStreamTileTokens / fp4::kStreamTileElems);
      if ((opt.v_transposed || aligned(dst.codes, kTransposedStoreAlign)) && job.in.vector_loads &&
          (D == 64 || D == 128) &&
          tiles <= std::numeric_limits<int>::max()) {
        if (D == 128) launch_columns_stream<T, 128>(stream_job, tiles, stream);
        else launch_columns_stream<T, 64>(stream_job, tiles, stream);
        return;
      }
    }
    job.tiles_per_slice = static_cast<int>(ceil_div(job.padded_tokens, fp4::kColumnTileElems / D));
    const std::size_t smem = sizeof(T) * fp4::kColumnTileElems + (opt.v_transposed ? 0 : fp4::kColumnTileElems);
    // The default limit counts the kernel's static shared memory (the NVFP4 divisor table) too.
    if (smem + sizeof(fp4::NvDivisorTable) > kDefaultSmemLimit)
      check_cuda(cudaFuncSetAttribute(fp4::fp4_columns_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)),
                 "cudaFuncSetAttribute");
    const std::int64_t ctas = slices * job.tiles_per_slice;
    if (ctas > std::numeric_limits<int>::max()) throw Error("v", "too large for one launch");
    fp4::fp4_columns_kernel<T><<<static_cast<unsigned>(ctas), fp4::kThreads, smem, stream>>>(job);
  } else {
    job.tiles_per_slice = static_cast<int>(ceil_div(x.S * (x.D / kSegment), fp4::kRowTileSegments));
    const std::int64_t ctas = slices * job.tiles_per_slice;
    if (ctas > std::numeric_limits<int>::max()) throw Error(name_of(op), "too large for one launch");
    fp4::fp4_rows_kernel<T><<<static_cast<unsigned>(ctas), fp4::kThreads, 0, stream>>>(job);
  }
  check_cuda(cudaGetLastError(), "quantize_fp4 launch");
}

void check_arguments(const StridedInput& x, Fp4Operand op, const Fp4Options& opt, const Fp4Buffers& out) {
  const char* name = name_of(op);
  if (x.B <= 0 || x.S <= 0 || x.H <= 0 || x.D <= 0)
    throw Error(name, "sizes must be positive, got (B, S, H, D) = (" + std::to_string(x.B) + ", " +
                          std::to_string(x.S) + ", " + std::to_string(x.H) + ", " + std::to_string(x.D) + ")");
  if (x.data == nullptr) throw Error(name, "is a null pointer");
  if (opt.format != TensorFormat::mxfp4 && opt.format != TensorFormat::nvfp4)
    throw Error("format", "the FP4 quantizer writes mxfp4 or nvfp4, got " + std::string(to_string(opt.format)));
  if (x.D < kFp4MinHeadDim || x.D > kFp4MaxHeadDim || !std::has_single_bit(static_cast<std::uint64_t>(x.D)))
    throw Error("D", "must be a power of two in [" + std::to_string(kFp4MinHeadDim) + ", " +
                         std::to_string(kFp4MaxHeadDim) + "], got " + std::to_string(x.D));
  if (op != Fp4Operand::v && x.D % fp4_block(opt.format) != 0)
    throw Error("D", "head dim " + std::to_string(x.D) + " is not a multiple of the " +
                         std::string(to_string(opt.format)) + " block of " + std::to_string(fp4_block(opt.format)));
  if (fp4_padded_tokens(x.S) > std::numeric_limits<int>::max() - fp4::kColumnTileElems ||
      x.B * x.H > std::numeric_limits<int>::max() || x.B > std::numeric_limits<std::uint16_t>::max() ||
      mean_chunks(x.S) > std::numeric_limits<std::uint16_t>::max())
    throw Error(name, "is too large for the quantizer's 32-bit token and slice indices");
  const Fp4Output& dst = op == Fp4Operand::q ? out.q : op == Fp4Operand::k ? out.k : out.v;
  if (dst.codes == nullptr || dst.scales == nullptr) throw Error("out", std::string(name) + " needs codes and scales");
  const std::size_t align = op == Fp4Operand::v && opt.v_transposed ? kTransposedStoreAlign : kCodeStoreAlign;
  if (!aligned(dst.codes, align))
    throw Error("out", std::string(name) + " codes must be " + std::to_string(align) + "-byte aligned");
  if (opt.format == TensorFormat::nvfp4 && dst.tensor_scale == nullptr)
    throw Error("out", std::string(name) + " needs a tensor_scale for nvfp4");
  if (op == Fp4Operand::k && opt.smooth_k && out.k_mean == nullptr) throw Error("smooth_k", "needs a k_mean buffer");
  if (out.nonfinite == nullptr) throw Error("out", "needs the nonfinite flags");
}

}  // namespace

std::int64_t fp4_padded_tokens(std::int64_t S) { return ceil_div(S, kFp4TokenPad) * kFp4TokenPad; }

int fp4_block(TensorFormat format) { return format == TensorFormat::nvfp4 ? kNvfp4Block : kMxfp4Block; }

Fp4Sizes fp4_sizes(Fp4Operand op, TensorFormat format, std::int64_t B, std::int64_t S, std::int64_t H,
                   std::int64_t D) {
  const std::int64_t block = fp4_block(format);
  if (op != Fp4Operand::v) return {B * H * S * D / 2, B * H * S * (D / block)};
  const std::int64_t padded = fp4_padded_tokens(S);
  return {B * H * padded * D / 2, B * H * (padded / block) * D};
}

std::size_t fp4_workspace_bytes(std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D) {
  return workspace_layout(B, S, H, D).bytes;
}

void quantize_fp4(const StridedInput& x, Fp4Operand op, const Fp4Options& options, const Fp4Buffers& out,
                  cudaStream_t stream) {
  check_arguments(x, op, options, out);
  switch (x.type) {
    case ElementType::f32: return launch<float>(x, op, options, out, stream);
    case ElementType::f16: return launch<__half>(x, op, options, out, stream);
    case ElementType::bf16: return launch<__nv_bfloat16>(x, op, options, out, stream);
  }
  throw Error("dtype", "unknown element type");
}

void check_finite(const Fp4Buffers& out, cudaStream_t stream) {
  int flags[kNonfiniteFlags] = {0, 0, 0};
  check_cuda(cudaMemcpyAsync(flags, out.nonfinite, sizeof(flags), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (flags[0] || flags[1] || flags[2]) {
    check_cuda(cudaMemsetAsync(out.nonfinite, 0, sizeof(flags), stream), "cudaMemsetAsync");
    const char* name = flags[0] ? "q" : flags[1] ? "k" : "v";
    throw Error(name, "non-finite value in the input of the GPU quantizer");
  }
}

}  // namespace fp4attn::cuda_quantize
