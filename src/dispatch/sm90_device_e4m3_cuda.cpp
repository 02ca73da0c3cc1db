// Recipe fp8's forward on caller-quantized E4M3 tensors already on the
// device: the kernel reads Q's and K's codes in place; one pass writes the
// broadcast descales, V's transposed codes and the NaN flags into the
// caller's workspace (cuda/sm90/fwd/e4m3_inputs.hpp). Packed sequences:
// cu_seqlens checked on the device first; Q and K are read in place there too,
// the scales and Vᵀ take the tile-aligned layout. Enqueued on the
// caller's stream, no allocation, no host synchronisation.
#if defined(FP4ATTN_HAS_CUDA)

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/device_memory.hpp"
#include "cuda/common/packed_rows.hpp"
#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/sm90/fwd/e4m3_inputs.hpp"
#include "cuda/sm90/fwd/fwd.hpp"
#include "dispatch/device_workspace.hpp"
#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::dispatch {
namespace {

constexpr int kNonfiniteFlags = 3;                            // q, k, v
constexpr std::int64_t kTmaAlign = cuda_quantize::kTmaStrideAlign;  // bytes
constexpr std::int64_t kMaxKeyTiles = 65535;                  // the Vᵀ pass's grid y

std::int64_t token_blocks(std::int64_t S) {
  return (S + cuda_quantize::kTokenBlock - 1) / cuda_quantize::kTokenBlock;
}

// Packed sequences lay the per-token regions out for one entry of the
// tile-aligned layout (layout_shape) and add the checked cu_seqlens; V's
// channel scales stay per sequence.
struct E4m3Workspace {
  std::size_t q_scale, k_scale, v_scale, nonfinite, vt, packed_rows, bytes;
};

E4m3Workspace e4m3_workspace(const AttentionShape& entries, PackedTokens packed) {
  const AttentionShape s = layout_shape(entries, packed);
  WorkspaceRegions r;
  E4m3Workspace w{};
  w.q_scale = r.take(static_cast<std::size_t>(s.B * s.Hq * token_blocks(s.Sq)) * sizeof(float));
  w.k_scale = r.take(static_cast<std::size_t>(s.B * s.Hkv * token_blocks(s.Sk)) * sizeof(float));
  w.v_scale = r.take(static_cast<std::size_t>(entries.B * s.Hkv * s.D) * sizeof(float));
  w.nonfinite = r.take(kNonfiniteFlags * sizeof(int));
  w.vt = r.take(static_cast<std::size_t>(s.B * s.Hkv * s.D * cuda_quantize::padded_keys(s.Sk)));
  if (packed.packed()) w.packed_rows = r.take(packed_rows_bytes(entries));
  w.bytes = r.bytes();
  return w;
}

// The kernel reads q and k by TMA, the Vᵀ pass v by 16-byte loads. A
// dimension of size 1 is never stepped over, so its stride (which frameworks
// set freely) is replaced by the dense one before the checks.
sm90::fwd::E4m3View view_of(const DeviceTensorView& x, std::int64_t B, std::int64_t S, std::int64_t H,
                            std::int64_t D, const char* name) {
  if (x.data == nullptr) throw Error(name, "is a null device pointer");
  if (reinterpret_cast<std::uintptr_t>(x.data) % kTmaAlign != 0)
    throw Error(name, "must start on a 16-byte boundary (E4M3 inputs are read 16 bytes at a time)");
  sm90::fwd::E4m3View v{static_cast<const std::uint8_t*>(x.data), x.stride_b, x.stride_s, x.stride_h};
  if (H == 1) v.stride_h = D;
  if (S == 1) v.stride_s = H * v.stride_h;
  if (B == 1) v.stride_b = S * v.stride_s;
  for (const std::int64_t stride : {v.stride_b, v.stride_s, v.stride_h})
    if (stride % kTmaAlign != 0 || stride < 0)
      throw Error(name, "strides must be non-negative multiples of 16 elements (16 bytes), got (" +
                            std::to_string(x.stride_b) + ", " + std::to_string(x.stride_s) + ", " +
                            std::to_string(x.stride_h) + ")");
  return v;
}

}  // namespace

std::size_t sm90_device_e4m3_workspace_bytes(const AttentionShape& shape, PackedTokens packed) {
  return e4m3_workspace(shape, packed).bytes;
}

void sm90_forward_device_e4m3(const DeviceE4m3ForwardArgs& args, const AttentionOptions& opt, void* stream_handle) {
  const AttentionShape& s = args.shape;
  validate_e4m3(s, opt);
  check_sm90_grid(s);
  if (opt.target != Target::sm90)
    throw Error("target", "the sm90 kernels run target sm90, not " + std::string(to_string(opt.target)));
  if (opt.block_q != 128 || opt.block_k != 128)
    throw Error("block_q", "the sm90 kernels run 128-token tiles (block_q = block_k = 128)");
  const bool packed = args.cu_seqlens_q != nullptr || args.cu_seqlens_k != nullptr;
  if (packed) {
    if (args.cu_seqlens_q == nullptr || args.cu_seqlens_k == nullptr)
      throw Error("cu_seqlens", "packed sequences need both cu_seqlens_q and cu_seqlens_k");
    if (args.lse_pitch <= 0) throw Error("lse_pitch", "must be the number of query tokens in all");
    if (args.k_tokens <= 0) throw Error("k_tokens", "must be the number of key tokens in all");
  }
  const PackedTokens tokens = packed ? PackedTokens{args.lse_pitch, args.k_tokens} : PackedTokens{};
  const AttentionShape lay = layout_shape(s, tokens);  // s itself unless packed
  if (cuda_quantize::padded_keys(s.Sk) / cuda_quantize::kTokenBlock > kMaxKeyTiles)
    throw Error("Sk", "at most " + std::to_string(kMaxKeyTiles * cuda_quantize::kTokenBlock) +
                          " keys per call with E4M3 inputs, got " + std::to_string(s.Sk));
  // The preparation pass indexes tokens and its CTAs in 31 bits: at most one
  // CTA per Vᵀ tile and per token, times the CTAs a token's codes need.
  // Packed: one CTA per layout tile and group of heads, and V's channel
  // scales (B · Hkv · D) in 31 bits.
  constexpr std::int64_t kMax31 = (std::int64_t{1} << 31) - 1;
  const auto parts = [&s](std::int64_t H) { return (H * s.D / 16 + 2047) / 2048; };
  const std::int64_t tiles_q = lay.B * token_blocks(lay.Sq), tiles_k = lay.B * token_blocks(lay.Sk);
  if (lay.B * lay.Sq > kMax31 || lay.B * lay.Sk > kMax31 || s.B * s.Hkv * s.D > kMax31 ||
      (packed ? tiles_q * s.Hq + 2 * tiles_k * s.Hkv
              : s.Hkv * tiles_k + s.B * s.Sq * parts(s.Hq) + s.B * s.Sk * parts(s.Hkv)) > kMax31)
    throw Error("B", "B · Sq and B · Sk must stay below 2^31 tokens with E4M3 inputs; split the batch into calls");
  if (!sm90_available()) throw Error("executor", "no compute-capability 9.0 GPU found");
  // A packed tensor is one entry of all the tokens.
  const sm90::fwd::E4m3View q = view_of(args.q, packed ? 1 : s.B, packed ? args.lse_pitch : s.Sq, s.Hq, s.D, "q");
  const sm90::fwd::E4m3View k = view_of(args.k, packed ? 1 : s.B, packed ? args.k_tokens : s.Sk, s.Hkv, s.D, "k");
  const sm90::fwd::E4m3View v = view_of(args.v, packed ? 1 : s.B, packed ? args.k_tokens : s.Sk, s.Hkv, s.D, "v");
  if (args.o == nullptr) throw Error("o", "is a null device pointer");
  if (args.lse == nullptr) throw Error("lse", "is a null device pointer");
  const E4m3Workspace w = e4m3_workspace(s, tokens);
  check_workspace(args.workspace, args.workspace_bytes, w.bytes);

  auto* base = static_cast<unsigned char*>(args.workspace);
  sm90::fwd::E4m3KernelOperands ops;
  ops.q_scale = reinterpret_cast<float*>(base + w.q_scale);
  ops.k_scale = reinterpret_cast<float*>(base + w.k_scale);
  ops.v_scale = reinterpret_cast<float*>(base + w.v_scale);
  ops.nonfinite = reinterpret_cast<int*>(base + w.nonfinite);
  ops.vt = base + w.vt;
  sm90::fwd::E4m3CallerInputs in;
  in.q = q, in.k = k, in.v = v;
  in.q_descale = args.q_descale, in.k_descale = args.k_descale, in.v_descale = args.v_descale;
  in.B = static_cast<int>(s.B), in.Hq = static_cast<int>(s.Hq), in.Hkv = static_cast<int>(s.Hkv);
  in.Sq = static_cast<int>(s.Sq), in.Sk = static_cast<int>(s.Sk), in.D = static_cast<int>(s.D);

  const auto stream = static_cast<cudaStream_t>(stream_handle);
  // The workspace arrives with any content: the flags start clear on every call.
  cuda_common::check_cuda(cudaMemsetAsync(ops.nonfinite, 0, kNonfiniteFlags * sizeof(int), stream),
                          "cudaMemsetAsync");
  sm90::fwd::Fp8ForwardArgs a;
  if (packed) {
    // cu_seqlens checked on the device first (all sequences empty, O and the
    // LSE NaN, where they do not fit); everything after reads the checked copies.
    const cuda_common::PackedSequences seqs =
        check_packed_call(args.cu_seqlens_q, args.cu_seqlens_k, s, args.lse_pitch, args.k_tokens, args.o,
                          args.o_stride_s, args.o_stride_h, args.lse,
                          reinterpret_cast<int*>(base + w.packed_rows), stream);
    sm90::fwd::E4m3PackedLayout pl;
    pl.cu_q = seqs.cu_q, pl.cu_k = seqs.cu_k, pl.rows_q = seqs.rows_q, pl.rows_k = seqs.rows_k;
    pl.q_rows = lay.Sq, pl.k_rows = lay.Sk;
    sm90::fwd::prepare_e4m3_packed_operands(in, pl, ops, stream);
    // Q and K in place: one entry of all the tokens, sequence b's from row cu_seqlens[b].
    a.q = q.data, a.q_stride_b = q.stride_b, a.q_stride_s = q.stride_s, a.q_stride_h = q.stride_h;
    a.k = k.data, a.k_stride_b = k.stride_b, a.k_stride_s = k.stride_s, a.k_stride_h = k.stride_h;
    a.qk_in_place = true, a.total_q = args.lse_pitch, a.total_k = args.k_tokens;
    a.vt_keys = lay.Sk;
    a.cu_seqlens_q = seqs.cu_q, a.cu_seqlens_k = seqs.cu_k, a.lse_pitch = args.lse_pitch;
    a.rows_q = seqs.rows_q, a.rows_k = seqs.rows_k, a.q_rows = lay.Sq, a.k_rows = lay.Sk;
  } else {
    sm90::fwd::prepare_e4m3_operands(in, ops, stream);
    a.q = q.data, a.q_stride_b = q.stride_b, a.q_stride_s = q.stride_s, a.q_stride_h = q.stride_h;
    a.k = k.data, a.k_stride_b = k.stride_b, a.k_stride_s = k.stride_s, a.k_stride_h = k.stride_h;
    a.vt_keys = cuda_quantize::padded_keys(s.Sk);
  }
  a.vt = ops.vt;
  a.q_scale = ops.q_scale, a.k_scale = ops.k_scale, a.v_scale = ops.v_scale;
  a.lse_shift = nullptr;  // no smooth_k
  a.o = args.o;
  a.o_stride_b = args.o_stride_b, a.o_stride_s = args.o_stride_s, a.o_stride_h = args.o_stride_h;
  a.lse = args.lse;
  a.nonfinite = ops.nonfinite;
  a.B = in.B, a.Hq = in.Hq, a.Hkv = in.Hkv, a.Sq = in.Sq, a.Sk = in.Sk, a.D = in.D;
  a.softmax_scale = opt.softmax_scale > 0.0f ? opt.softmax_scale : 1.0f / std::sqrt(static_cast<float>(s.D));
  a.mask = opt.mask;
  a.window_left = kernel_window_bound(opt.window.left), a.window_right = kernel_window_bound(opt.window.right);
  a.p_code = opt.direct_p ? sm90::fwd::PCode::direct_p : sm90::fwd::PCode::exp2_cvt;
  sm90::fwd::forward_fp8(a, stream);
}

ForwardOutput sm90_forward_e4m3(const AttentionShape& s, const E4m3Inputs& in, const AttentionOptions& opt) {
  using cuda_common::check_cuda;
  const auto upload = [](const void* host, std::size_t bytes) {
    cuda_common::DeviceMemory d = cuda_common::device_alloc(bytes == 0 ? 1 : bytes);
    if (bytes != 0) check_cuda(cudaMemcpy(d.get(), host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    return d;
  };
  const auto floats = [&upload](std::span<const float> x) {
    return x.empty() ? cuda_common::DeviceMemory{} : upload(x.data(), x.size_bytes());
  };
  const cuda_common::DeviceMemory q = upload(in.q.data(), in.q.size()), k = upload(in.k.data(), in.k.size()),
                                  v = upload(in.v.data(), in.v.size());
  const cuda_common::DeviceMemory dq = floats(in.q_descale), dk = floats(in.k_descale), dv = floats(in.v_descale);
  const cuda_common::DeviceMemory o = cuda_common::device_alloc(static_cast<std::size_t>(s.q_elems()) * 2);
  const cuda_common::DeviceMemory lse = cuda_common::device_alloc(static_cast<std::size_t>(s.lse_elems()) * 4);
  const std::size_t ws_bytes = sm90_device_e4m3_workspace_bytes(s);
  const cuda_common::DeviceMemory ws = cuda_common::device_alloc(ws_bytes);

  DeviceE4m3ForwardArgs a;
  a.shape = s;
  a.q = {q.get(), s.Sq * s.Hq * s.D, s.Hq * s.D, s.D};
  a.k = {k.get(), s.Sk * s.Hkv * s.D, s.Hkv * s.D, s.D};
  a.v = {v.get(), s.Sk * s.Hkv * s.D, s.Hkv * s.D, s.D};
  a.q_descale = static_cast<const float*>(dq.get());
  a.k_descale = static_cast<const float*>(dk.get());
  a.v_descale = static_cast<const float*>(dv.get());
  a.o = o.get();
  a.o_stride_b = s.Sq * s.Hq * s.D, a.o_stride_s = s.Hq * s.D, a.o_stride_h = s.D;
  a.lse = static_cast<float*>(lse.get());
  a.workspace = ws.get(), a.workspace_bytes = ws_bytes;
  // NaN in every output byte first: anything the kernel leaves unwritten shows.
  check_cuda(cudaMemset(o.get(), 0xFF, static_cast<std::size_t>(s.q_elems()) * 2), "cudaMemset");
  check_cuda(cudaMemset(lse.get(), 0xFF, static_cast<std::size_t>(s.lse_elems()) * 4), "cudaMemset");
  sm90_forward_device_e4m3(a, opt, nullptr);

  std::vector<std::uint16_t> o_bits(static_cast<std::size_t>(s.q_elems()));
  ForwardOutput out;
  out.lse.resize(static_cast<std::size_t>(s.lse_elems()));
  check_cuda(cudaMemcpy(o_bits.data(), o.get(), o_bits.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
  check_cuda(cudaMemcpy(out.lse.data(), lse.get(), out.lse.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  out.o.resize(o_bits.size());
  for (std::size_t i = 0; i < o_bits.size(); ++i)
    out.o[i] = __builtin_bit_cast(float, static_cast<std::uint32_t>(o_bits[i]) << 16);
  out.executor = Executor::sm90;
  return out;
}

}  // namespace fp4attn::dispatch

#endif  // FP4ATTN_HAS_CUDA
