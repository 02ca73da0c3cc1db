// The sm90 executor on tensors already on the device: the GPU quantizer reads
// q, k and v where they are (any element strides, D contiguous), the kernel
// writes O and LSE where the caller wants them, and every intermediate lives in
// the caller's workspace. Everything is enqueued on the caller's stream; no
// allocation, no host synchronisation, so the call can be captured in a CUDA graph.
#if defined(FP4ATTN_HAS_CUDA)

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/common/packed_rows.hpp"
#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/sm90/fwd/fp8_operands.hpp"
#include "cuda/sm90/fwd/fwd.hpp"
#include "cuda/sm90/fwd/mx_operands.hpp"
#include "cuda/sm90/fwd/nvfp4_fwd.hpp"
#include "cuda/sm90/fwd/nvfp4_operands.hpp"
#include "dispatch/device_workspace.hpp"
#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::dispatch {
namespace {

constexpr int kNonfiniteFlags = 3;   // q, k, v: cleared here, raised by the quantizer, read by the kernel

std::int64_t token_blocks(std::int64_t S) {
  return (S + cuda_quantize::kTokenBlock - 1) / cuda_quantize::kTokenBlock;
}

// Byte offsets of cuda_quantize::Fp8Buffers inside the workspace, with the
// sizes that cuda/quantize/quantize_fp8.hpp documents (as Fp8Operands allocates them).
// Packed sequences lay the per-token regions out tile-aligned (layout_shape)
// and add their first rows (packed_rows).
struct WorkspaceLayout {
  std::size_t q, k, vt, q_scale, k_scale, v_scale, k_mean, lse_shift, nonfinite, scratch, packed_rows, bytes;
};

WorkspaceLayout workspace_layout(const AttentionShape& entries, PackedTokens packed) {
  const auto floats = [](std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(float); };
  const AttentionShape s = layout_shape(entries, packed);
  WorkspaceLayout l{};
  WorkspaceRegions regions;
  const auto take = [&regions](std::size_t bytes) { return regions.take(bytes); };
  // Code rows at a pitch TMA can address (D = 40, 72: 48, 80 bytes).
  l.q = take(static_cast<std::size_t>(cuda_quantize::tma_code_bytes(s.q_elems(), s.D)));
  l.k = take(static_cast<std::size_t>(cuda_quantize::tma_code_bytes(s.kv_elems(), s.D)));
  l.vt = take(static_cast<std::size_t>(s.B * s.Hkv * s.D * cuda_quantize::padded_keys(s.Sk)));
  l.q_scale = take(floats(s.B * s.Hq * token_blocks(s.Sq)));
  l.k_scale = take(floats(s.B * s.Hkv * token_blocks(s.Sk)));
  l.v_scale = take(floats(entries.B * s.Hkv * s.D));
  l.k_mean = take(floats(entries.B * s.Hkv * s.D));
  l.lse_shift = take(floats(s.lse_elems()));
  l.nonfinite = take(kNonfiniteFlags * sizeof(int));
  l.scratch = take(cuda_quantize::fp8_workspace_bytes(entries.B, s.Hkv, entries.Sk, s.D, packed.packed() ? s.Sk : 0));
  l.packed_rows = packed.packed() ? take(packed_rows_bytes(entries)) : 0;
  l.bytes = regions.bytes();
  return l;
}

// Packed sequences run recipe fp8 only (its operands in the tile-aligned layout).
void check_packed_recipe(PackedTokens packed, Recipe recipe) {
  if (packed.packed() && recipe != Recipe::fp8)
    throw Error("recipe", "packed sequences run recipe fp8 on the device for now");
}

}  // namespace

std::size_t sm90_device_saved_bytes(const AttentionShape& shape, Recipe recipe, PackedTokens packed) {
  check_shape(shape);
  if (keeps_operands(recipe)) check_packed_recipe(packed, recipe);
  return keeps_operands(recipe) ? saved_layout(shape, recipe, packed).bytes : 0;
}

std::size_t sm90_device_saved_k_mean_offset(const AttentionShape& shape, Recipe recipe, PackedTokens packed) {
  check_shape(shape);
  if (!keeps_operands(recipe)) throw Error("recipe", std::string(to_string(recipe)) + " keeps no operands");
  check_packed_recipe(packed, recipe);
  return saved_layout(shape, recipe, packed).k_mean;
}

std::size_t sm90_device_workspace_bytes(const AttentionShape& shape, Recipe recipe, PackedTokens packed) {
  check_shape(shape);
  check_packed_recipe(packed, recipe);
  switch (recipe) {
    case Recipe::fp8: return workspace_layout(shape, packed).bytes;
    case Recipe::mxfp4:
    case Recipe::mxfp4_train: return sm90::fwd::MxOperands::workspace_bytes(shape, recipe);
    case Recipe::nvfp4: return sm90::fwd::Nvfp4Operands::workspace_bytes(shape);
  }
  throw Error("recipe", "the sm90 device path runs recipes fp8, mxfp4, mxfp4_train and nvfp4, not " +
                            std::string(to_string(recipe)));
}

void sm90_forward_device(const DeviceForwardArgs& args, const AttentionOptions& opt, void* stream_handle) {
  const AttentionShape& s = args.shape;
  validate(s, opt);
  check_sm90_grid(s);
  if (!sm90_supports(s, opt))
    throw Error("executor", "the sm90 executor does not implement this call (it runs recipes fp8, mxfp4, "
                            "mxfp4_train and nvfp4, target sm90, 128-token tiles, D = 64 or 128, for fp8 any multiple "
                            "of 8 from 16 to 256, for mxfp4 and mxfp4_train also 256)");
  if (!sm90_available()) throw Error("executor", "no compute-capability 9.0 GPU found");
  if (args.o == nullptr) throw Error("o", "is a null device pointer");
  if (args.lse == nullptr) throw Error("lse", "is a null device pointer");
  const bool packed = args.cu_seqlens_q != nullptr || args.cu_seqlens_k != nullptr;
  if (packed) {
    if (args.cu_seqlens_q == nullptr || args.cu_seqlens_k == nullptr)
      throw Error("cu_seqlens", "packed sequences need both cu_seqlens_q and cu_seqlens_k");
    if (opt.recipe != Recipe::fp8) throw Error("recipe", "packed sequences run recipe fp8 on the device for now");
    if (args.lse_pitch <= 0) throw Error("lse_pitch", "must be the number of query tokens in all");
    if (args.k_tokens <= 0) throw Error("k_tokens", "must be the number of key tokens in all");
  }
  const PackedTokens tokens = packed ? PackedTokens{args.lse_pitch, args.k_tokens} : PackedTokens{};
  check_workspace(args.workspace, args.workspace_bytes, sm90_device_workspace_bytes(s, opt.recipe, tokens));
  if (args.saved != nullptr) check_saved(args.saved, args.saved_bytes, s, opt.recipe, tokens);

  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const float scale = opt.softmax_scale > 0.0f ? opt.softmax_scale : 1.0f / std::sqrt(static_cast<float>(s.D));
  const auto with_output = [&args, &opt](sm90::fwd::Fp8ForwardArgs a) {
    a.window_left = kernel_window_bound(opt.window.left), a.window_right = kernel_window_bound(opt.window.right);
    a.o = args.o;
    a.o_stride_b = args.o_stride_b, a.o_stride_s = args.o_stride_s, a.o_stride_h = args.o_stride_h;
    a.lse = args.lse;
    return a;
  };
  // Packed sequences: cu_seqlens checked on the device first, and every
  // kernel after reads the checked copies (all sequences empty, O and LSE
  // NaN, where they do not fit the call's sizes).
  cuda_common::PackedSequences seqs{args.cu_seqlens_q, args.cu_seqlens_k, nullptr, nullptr};
  if (packed) {
    auto* ints = reinterpret_cast<int*>(static_cast<unsigned char*>(args.workspace) +
                                        workspace_layout(s, tokens).packed_rows);
    seqs = check_packed_call(args.cu_seqlens_q, args.cu_seqlens_k, s, args.lse_pitch, args.k_tokens, args.o,
                             args.o_stride_s, args.o_stride_h, args.lse, ints, stream);
  }
  const auto q = strided(args.q, args.element, s.B, s.Sq, s.Hq, s.D, "q", seqs.cu_q);
  const auto k = strided(args.k, args.element, s.B, s.Sk, s.Hkv, s.D, "k", seqs.cu_k);
  const auto v = strided(args.v, args.element, s.B, s.Sk, s.Hkv, s.D, "v", seqs.cu_k);

  if (opt.recipe == Recipe::nvfp4) {
    // NVFP4: the quantizer and the BF16 expansion write into the workspace;
    // the kernel reads their flags (non-finite input: O and LSE NaN).
    sm90::fwd::Nvfp4Operands nv(s, args.workspace);
    nv.prepare(q, k, v, opt.smooth_k, scale, stream);
    sm90::fwd::Nvfp4ForwardArgs a = nv.forward_args(opt.mask, opt.direct_p, scale, opt.smooth_k);
    a.window_left = kernel_window_bound(opt.window.left), a.window_right = kernel_window_bound(opt.window.right);
    a.o = args.o;
    a.o_stride_b = args.o_stride_b, a.o_stride_s = args.o_stride_s, a.o_stride_h = args.o_stride_h;
    a.lse = args.lse;
    sm90::fwd::forward_nvfp4(a, stream);
    return;
  }
  if (opt.recipe != Recipe::fp8) {
    // MX recipes: the MXFP4 quantizer and the fold write into the workspace;
    // the kernel reads their flags (non-finite input: O and LSE NaN).
    sm90::fwd::MxOperands mx(s, opt.recipe, opt.mx_scale_rule, args.workspace);
    if (args.saved != nullptr) {
      // Training (mxfp4_train): Q's MXFP4 codes, K's tile fold and its
      // transposed copy, the factors, mean, shift and flags go where the
      // backward reads them.
      auto* kept = static_cast<unsigned char*>(args.saved);
      const SavedLayout sl = saved_layout(s, opt.recipe);
      sm90::fwd::MxKept m;
      m.q_codes = kept + sl.mx_q_codes, m.q_scales = kept + sl.mx_q_scales;
      m.k = kept + sl.k, m.kt = kept + sl.kt;
      m.k_scale = reinterpret_cast<float*>(kept + sl.k_scale);
      m.k_mean = reinterpret_cast<float*>(kept + sl.k_mean);
      m.lse_shift = reinterpret_cast<float*>(kept + sl.lse_shift);
      m.nonfinite = reinterpret_cast<int*>(kept + sl.nonfinite);
      mx.keep_for_backward(m);
    }
    mx.prepare(q, k, v, opt.smooth_k, scale, stream);
    sm90::fwd::forward_fp8(with_output(mx.forward_args(opt.mask, opt.direct_p, scale, opt.smooth_k)), stream);
    return;
  }

  const WorkspaceLayout layout = workspace_layout(s, tokens);
  const AttentionShape lay = layout_shape(s, tokens);
  auto* base = static_cast<unsigned char*>(args.workspace);
  const auto floats = [base](std::size_t offset) { return reinterpret_cast<float*>(base + offset); };

  cuda_quantize::Fp8Buffers bufs;
  bufs.q = base + layout.q;
  bufs.k = base + layout.k;
  bufs.vt = base + layout.vt;
  bufs.vt_keys = cuda_quantize::padded_keys(lay.Sk);
  bufs.code_pitch = cuda_quantize::tma_code_pitch(s.D);
  bufs.q_scale = floats(layout.q_scale);
  bufs.k_scale = floats(layout.k_scale);
  bufs.v_scale = floats(layout.v_scale);
  bufs.k_mean = floats(layout.k_mean);
  bufs.lse_shift = floats(layout.lse_shift);
  bufs.nonfinite = reinterpret_cast<int*>(base + layout.nonfinite);
  bufs.workspace = base + layout.scratch;
  if (packed) {
    // Each sequence's first row in the tile-aligned layout (check_packed_sequences above).
    bufs.rows_q = seqs.rows_q, bufs.rows_k = seqs.rows_k;
    bufs.q_rows = lay.Sq, bufs.k_rows = lay.Sk;
  }
  if (args.saved != nullptr) {
    // Training: Q's and K's operands, their flags and the transposed copies
    // go where the backward will read them.
    auto* kept = static_cast<unsigned char*>(args.saved);
    const SavedLayout sl = saved_layout(s, opt.recipe, tokens);
    bufs.q = kept + sl.q, bufs.k = kept + sl.k, bufs.qt = kept + sl.qt, bufs.kt = kept + sl.kt;
    bufs.code_pitch = s.D;  // the backward reads the kept codes at D (a power of two there)
    bufs.q_scale = reinterpret_cast<float*>(kept + sl.q_scale);
    bufs.k_scale = reinterpret_cast<float*>(kept + sl.k_scale);
    bufs.k_mean = reinterpret_cast<float*>(kept + sl.k_mean);
    bufs.lse_shift = reinterpret_cast<float*>(kept + sl.lse_shift);
    bufs.nonfinite = reinterpret_cast<int*>(kept + sl.nonfinite);
  }
  // The workspace arrives with any content: the flags start clear on every call.
  if (cudaMemsetAsync(bufs.nonfinite, 0, kNonfiniteFlags * sizeof(int), stream) != cudaSuccess)
    throw Error("cuda", std::string("cudaMemsetAsync: ") + cudaGetErrorString(cudaGetLastError()));
  cuda_quantize::quantize_fp8(q, k, v, opt.smooth_k, scale, bufs, stream);

  // The kernel reads the contiguous codes the quantizer wrote (as in sm90_forward).
  sm90::fwd::Fp8ForwardArgs a = with_output(sm90::fwd::contiguous_forward_args(
      lay, bufs, opt.mask, opt.direct_p ? sm90::fwd::PCode::direct_p : sm90::fwd::PCode::exp2_cvt, scale, opt.smooth_k));
  a.nonfinite = bufs.nonfinite;
  if (packed) {
    // The grid covers each sequence's longest; the operands are the one-entry layout above.
    a.B = static_cast<int>(s.B), a.Sq = static_cast<int>(s.Sq), a.Sk = static_cast<int>(s.Sk);
    a.cu_seqlens_q = seqs.cu_q, a.cu_seqlens_k = seqs.cu_k, a.lse_pitch = args.lse_pitch;
    a.rows_q = bufs.rows_q, a.rows_k = bufs.rows_k, a.q_rows = lay.Sq, a.k_rows = lay.Sk;
  }
  sm90::fwd::forward_fp8(a, stream);
}

}  // namespace fp4attn::dispatch

#endif  // FP4ATTN_HAS_CUDA
