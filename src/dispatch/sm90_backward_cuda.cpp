// The sm90 backward in a CUDA build: device entry (zero-copy, on the caller's
// stream, every intermediate in the caller's workspace) and the host-array
// path of fp4attn::backward on top of it.
#if defined(FP4ATTN_HAS_CUDA)

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "cuda/common/device_memory.hpp"
#include "cuda/common/packed_rows.hpp"
#include "cuda/quantize/fold_mx.hpp"
#include "cuda/quantize/quantize_fp4.hpp"
#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/sm90/bwd/bwd.hpp"
#include "dispatch/device_workspace.hpp"
#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::dispatch {
namespace {

constexpr int kNonfiniteFlags = 3;

std::int64_t token_blocks(std::int64_t S) { return (S + cuda_quantize::kTokenBlock - 1) / cuda_quantize::kTokenBlock; }

// Byte offsets inside the workspace. The two quantizer calls (Q, K as the
// forward; dO, V per token block) skip V's forward format (Vᵀ and its
// channel scales, which no gradient product reads) and share the flags and
// the quantizer's scratch. Recipe
// mxfp4_train adds the MXFP4 codes and scales of Q and K and the MXFP4
// quantizer's scratch (mx_*); its folded E4M3 operands and their per-tile
// factors take the places of the fp8 recipe's Q, K codes and scales.
// With the forward's kept operands (DeviceBackwardArgs::saved) the regions
// those replace are left out (kAbsent): K's codes and Kᵀ, for fp8 also Q's
// codes and Qᵀ (mxfp4_train still folds the kept Q per tile into them), and
// the MXFP4 codes and their quantizer's scratch.
constexpr std::size_t kAbsent = ~std::size_t{0};

// Packed sequences lay the per-token regions out tile-aligned (layout_shape;
// the dS scales per query tile of that layout and key tile of the longest
// sequence) and add their first rows (packed_rows).
struct BackwardLayout {
  std::size_t q, k, d_o, v, qt, d_ot, kt;
  std::size_t q_scale, k_scale, do_scale, v_scale, k_mean, lse_shift, nonfinite, scratch;
  std::size_t delta, lse_log2, ds_scales, packed_rows = 0;
  std::size_t mx_q_codes = 0, mx_q_scales = 0, mx_k_codes = 0, mx_k_scales = 0, mx_scratch = 0;
  std::size_t dq_accum, bytes;
};

BackwardLayout backward_layout(const AttentionShape& entries, Recipe recipe, bool kept, PackedTokens packed) {
  const auto floats = [](std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(float); };
  const AttentionShape s = layout_shape(entries, packed);
  const std::int64_t pq = sm90::bwd::padded_tokens(s.Sq), pk = sm90::bwd::padded_tokens(s.Sk);
  const bool mx = recipe == Recipe::mxfp4_train;
  const bool own_q = !kept || mx, own_k = !kept;
  BackwardLayout l{};
  WorkspaceRegions regions;
  const auto take = [&regions](std::size_t bytes) { return regions.take(bytes); };
  const auto take_if = [&regions](bool needed, std::size_t bytes) { return needed ? regions.take(bytes) : kAbsent; };
  l.q = take_if(own_q, static_cast<std::size_t>(s.q_elems()));
  l.k = take_if(own_k, static_cast<std::size_t>(s.kv_elems()));
  l.d_o = take(static_cast<std::size_t>(s.q_elems()));
  l.v = take(static_cast<std::size_t>(s.kv_elems()));
  l.qt = take_if(own_q, static_cast<std::size_t>(s.B * s.Hq * s.D * pq));
  l.d_ot = take(static_cast<std::size_t>(s.B * s.Hq * s.D * pq));
  l.kt = take_if(own_k, static_cast<std::size_t>(s.B * s.Hkv * s.D * pk));
  l.q_scale = take(floats(s.B * s.Hq * token_blocks(s.Sq)));
  l.do_scale = take(floats(s.B * s.Hq * token_blocks(s.Sq)));
  l.k_scale = take(floats(s.B * s.Hkv * token_blocks(s.Sk)));
  l.v_scale = take(floats(s.B * s.Hkv * token_blocks(s.Sk)));
  l.k_mean = take(floats(entries.B * s.Hkv * s.D));
  l.lse_shift = take(floats(s.lse_elems()));
  l.nonfinite = take(kNonfiniteFlags * sizeof(int));
  l.scratch = take(cuda_quantize::fp8_workspace_bytes(entries.B, s.Hkv, entries.Sk, s.D, packed.packed() ? s.Sk : 0));
  l.delta = take(floats(s.B * s.Hq * pq));
  l.lse_log2 = take(floats(s.B * s.Hq * pq));
  // Two dS scales per (query tile, key tile) pair, one per 64-query half:
  // the dQ kernel hands them to the dK/dV kernel. Quadratic in S, but below
  // the linear terms up to sequences of millions of tokens (8 bytes per
  // 128 × 128 pair and head).
  l.ds_scales =
      take(floats(s.B * s.Hq * token_blocks(s.Sq) * token_blocks(entries.Sk) * sm90::bwd::kDsScalesPerPair));
  if (packed.packed()) l.packed_rows = take(packed_rows_bytes(entries));
  if (mx && !kept) {
    namespace cq = cuda_quantize;
    const cq::Fp4Sizes zq = cq::fp4_sizes(cq::Fp4Operand::q, TensorFormat::mxfp4, s.B, s.Sq, s.Hq, s.D);
    const cq::Fp4Sizes zk = cq::fp4_sizes(cq::Fp4Operand::k, TensorFormat::mxfp4, s.B, s.Sk, s.Hkv, s.D);
    l.mx_q_codes = take(static_cast<std::size_t>(zq.code_bytes));
    l.mx_q_scales = take(static_cast<std::size_t>(zq.scale_bytes));
    l.mx_k_codes = take(static_cast<std::size_t>(zk.code_bytes));
    l.mx_k_scales = take(static_cast<std::size_t>(zk.scale_bytes));
    l.mx_scratch = take(std::max(cq::fp4_workspace_bytes(s.B, s.Sq, s.Hq, s.D),
                                 cq::fp4_workspace_bytes(s.B, s.Sk, s.Hkv, s.D)));
  }
  // Non-deterministic mode only: last, so the other mode can omit it.
  l.dq_accum = take(floats(sm90::bwd::dq_accum_elems(s.B, s.Hq, s.Sq, s.D)));
  l.bytes = regions.bytes();
  return l;
}

sm90::bwd::TensorRef output_ref(void* p, std::int64_t b, std::int64_t s, std::int64_t h, const char* name) {
  if (p == nullptr) throw Error(name, "is a null device pointer");
  return {p, b, s, h};
}

// Recipe mxfp4_train: Q and K by the GPU MXFP4 quantizer exactly as the
// forward (K with the same smooth_k mean; the LSE shift from Q's MXFP4
// values), then folded into E4M3 with one power of two per 128-token tile for
// both. The forward folds Q per row, but dK = dSᵀ·Q sums over queries, so Q's
// factor has to be constant over a query tile to come out of that product.
// Codes (B, S, H, D) with one factor per (b, h, 128-token block) are the fp8
// recipe's Q/K format, so the rest of the pipeline runs unchanged. The MXFP4
// quantizer raises q's and k's non-finite flags, the dO/V call its own.
void quantize_mx_qk(const cuda_quantize::StridedInput& q, const cuda_quantize::StridedInput& k,
                    const AttentionOptions& opt, float scale, unsigned char* base, const BackwardLayout& layout,
                    const cuda_quantize::Fp8Buffers& out, cudaStream_t stream) {
  namespace cq = cuda_quantize;
  cq::Fp4Buffers mx;
  mx.q = {base + layout.mx_q_codes, base + layout.mx_q_scales, nullptr};
  mx.k = {base + layout.mx_k_codes, base + layout.mx_k_scales, nullptr};
  mx.k_mean = out.k_mean;
  mx.nonfinite = out.nonfinite;
  mx.workspace = base + layout.mx_scratch;
  cq::Fp4Options o;
  o.format = TensorFormat::mxfp4;
  o.mx_scale_rule = opt.mx_scale_rule;
  cq::quantize_fp4(q, cq::Fp4Operand::q, o, mx, stream);
  o.smooth_k = opt.smooth_k;
  cq::quantize_fp4(k, cq::Fp4Operand::k, o, mx, stream);
  cq::fold_mx_qk(mx.q, q.B, q.S, q.H, q.D, cq::kTokenBlock, out.q, out.q_scale, stream, base + layout.qt);
  cq::fold_mx_qk(mx.k, k.B, k.S, k.H, k.D, cq::kTokenBlock, out.k, out.k_scale, stream, base + layout.kt);
  if (opt.smooth_k) cq::mx_lse_shift(mx.q, q.B, q.S, q.H, k.H, q.D, out.k_mean, scale, out.lse_shift, stream);
}

}  // namespace

bool sm90_backward_supports(const AttentionShape& shape, const AttentionOptions& opt) {
  return sm90_supports(shape, opt) && sm90_kernel_head_dim(shape.D) &&
         (opt.recipe == Recipe::fp8 || opt.recipe == Recipe::mxfp4_train) &&
         opt.ds_format == GradFormat::e4m3;
}

std::size_t sm90_device_backward_workspace_bytes(const AttentionShape& shape, bool deterministic, Recipe recipe,
                                                 bool kept, PackedTokens packed) {
  check_shape(shape);
  if (recipe != Recipe::fp8 && recipe != Recipe::mxfp4_train)
    throw Error("recipe", "the sm90 backward runs recipes fp8 and mxfp4_train, not " + std::string(to_string(recipe)));
  if (packed.packed() && recipe != Recipe::fp8)
    throw Error("recipe", "packed sequences run recipe fp8 on the device for now");
  const BackwardLayout layout = backward_layout(shape, recipe, kept, packed);
  return deterministic ? layout.dq_accum : layout.bytes;
}

void sm90_backward_device(const DeviceBackwardArgs& args, const AttentionOptions& opt, bool deterministic,
                          void* stream_handle) {
  const AttentionShape& s = args.shape;
  validate(s, opt);
  check_sm90_grid(s);
  if (!spec_of(opt.recipe).has_backward)
    throw Error("recipe", std::string(to_string(opt.recipe)) + " is inference only: no backward");
  if (!sm90_backward_supports(s, opt))
    throw Error("executor", "the sm90 backward does not implement this call (it runs recipes fp8 and mxfp4_train, "
                            "target sm90, 128-token tiles, D = 64 or 128, E4M3 dS)");
  if (args.lse == nullptr) throw Error("lse", "is a null device pointer");
  if (args.cu_seqlens_q != nullptr || args.cu_seqlens_k != nullptr) {
    if (args.cu_seqlens_q == nullptr || args.cu_seqlens_k == nullptr)
      throw Error("cu_seqlens", "packed sequences need both cu_seqlens_q and cu_seqlens_k");
    if (opt.recipe != Recipe::fp8) throw Error("recipe", "packed sequences run recipe fp8 on the device for now");
    if (args.lse_pitch <= 0) throw Error("lse_pitch", "must be the number of query tokens in all");
    if (args.k_tokens <= 0) throw Error("k_tokens", "must be the number of key tokens in all");
  }
  const bool packed = args.cu_seqlens_q != nullptr;
  const PackedTokens tokens = packed ? PackedTokens{args.lse_pitch, args.k_tokens} : PackedTokens{};
  const AttentionShape lay = layout_shape(s, tokens);
  const BackwardLayout layout = backward_layout(s, opt.recipe, args.saved != nullptr, tokens);
  check_workspace(args.workspace, args.workspace_bytes, deterministic ? layout.dq_accum : layout.bytes);
  if (args.saved != nullptr) check_saved(args.saved, args.saved_bytes, s, opt.recipe, tokens);

  sm90::bwd::Fp8BackwardArgs a;
  a.dq = output_ref(args.dq, args.dq_stride_b, args.dq_stride_s, args.dq_stride_h, "dq");
  a.dk = output_ref(args.dk, args.dk_stride_b, args.dk_stride_s, args.dk_stride_h, "dk");
  a.dv = output_ref(args.dv, args.dv_stride_b, args.dv_stride_s, args.dv_stride_h, "dv");
  for (const auto& [view, name] :
       {std::pair{&args.q, "q"}, {&args.k, "k"}, {&args.v, "v"}, {&args.o, "o"}, {&args.d_o, "d_o"}})
    if (view->data == nullptr) throw Error(name, "is a null device pointer");
  if (!sm90_available()) throw Error("executor", "no compute-capability 9.0 GPU found");

  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const float scale = opt.softmax_scale > 0.0f ? opt.softmax_scale : 1.0f / std::sqrt(static_cast<float>(s.D));
  auto* base = static_cast<unsigned char*>(args.workspace);
  const auto floats = [base](std::size_t offset) { return reinterpret_cast<float*>(base + offset); };
  const auto region = [base](std::size_t offset) { return offset == kAbsent ? nullptr : base + offset; };

  // Q, K as the forward quantized them; V's forward format is not needed
  // (vt null: the quantizer skips V).
  cuda_quantize::Fp8Buffers fwd;
  fwd.q = region(layout.q);
  fwd.k = region(layout.k);
  fwd.q_scale = floats(layout.q_scale);
  fwd.k_scale = floats(layout.k_scale);
  fwd.k_mean = floats(layout.k_mean);
  fwd.lse_shift = floats(layout.lse_shift);
  fwd.nonfinite = reinterpret_cast<int*>(base + layout.nonfinite);
  fwd.workspace = base + layout.scratch;
  // Packed sequences: every input's rows come from cu_seqlens; the
  // workspace takes the tile-aligned layout the kernels' tensor maps address.
  // cu_seqlens are checked on the device first and every kernel after reads
  // the checked copies (all sequences empty, the gradients NaN, where they do
  // not fit the call's sizes).
  const int *cu_q = args.cu_seqlens_q, *cu_k = args.cu_seqlens_k;
  if (packed) {
    auto* ints = reinterpret_cast<int*>(base + layout.packed_rows);
    using Fill = cuda_common::NanFill;
    const auto fill = [&args](const sm90::bwd::TensorRef& out, std::int64_t rows, std::int64_t heads) {
      const auto type = args.element == DeviceElement::f32   ? Fill::Type::f32
                        : args.element == DeviceElement::f16 ? Fill::Type::f16
                                                             : Fill::Type::bf16;
      return Fill{out.data, type, rows, heads, args.shape.D, out.stride_s, out.stride_h};
    };
    cuda_common::check_packed_sequences(
        cu_q, cu_k, {static_cast<int>(s.B), args.lse_pitch, args.k_tokens, s.Sq, s.Sk}, ints,
        {fill(a.dq, args.lse_pitch, s.Hq), fill(a.dk, args.k_tokens, s.Hkv), fill(a.dv, args.k_tokens, s.Hkv)},
        stream);
    const cuda_common::PackedSequences seqs = cuda_common::packed_sequences(ints, static_cast<int>(s.B));
    cu_q = seqs.cu_q, cu_k = seqs.cu_k;
    fwd.rows_q = seqs.rows_q, fwd.rows_k = seqs.rows_k;
    fwd.q_rows = lay.Sq, fwd.k_rows = lay.Sk;
  }
  const auto in_q = strided(args.q, args.element, s.B, s.Sq, s.Hq, s.D, "q", cu_q);
  const auto in_k = strided(args.k, args.element, s.B, s.Sk, s.Hkv, s.D, "k", cu_k);
  const auto in_v = strided(args.v, args.element, s.B, s.Sk, s.Hkv, s.D, "v", cu_k);
  // The forward's operands when it kept them: the codes, transposes and LSE
  // shift are read where they are; the scales are copied (below) so that
  // non-finite input poisons the copies, not the saved block. mxfp4_train
  // keeps Q as MXFP4, folded per query tile below (the forward folds per row).
  const auto* kept = static_cast<const unsigned char*>(args.saved);
  const bool mx = opt.recipe == Recipe::mxfp4_train;
  const bool kept_q = kept != nullptr && !mx;
  const SavedLayout sl = saved_layout(s, opt.recipe, tokens);
  const auto kept_floats = [kept](std::size_t offset) { return reinterpret_cast<const float*>(kept + offset); };
  const std::uint8_t* q_codes = kept_q ? kept + sl.q : fwd.q;
  const std::uint8_t* k_codes = kept != nullptr ? kept + sl.k : fwd.k;
  const std::uint8_t* qt = kept_q ? kept + sl.qt : region(layout.qt);
  const std::uint8_t* kt = kept != nullptr ? kept + sl.kt : region(layout.kt);
  const float* lse_shift = kept != nullptr ? kept_floats(sl.lse_shift) : fwd.lse_shift;
  // The workspace arrives with any content: the flags start clear on every call.
  cuda_common::check_cuda(cudaMemsetAsync(fwd.nonfinite, 0, kNonfiniteFlags * sizeof(int), stream),
                          "cudaMemsetAsync");
  if (kept == nullptr && mx) {
    quantize_mx_qk(in_q, in_k, opt, scale, base, layout, fwd, stream);
  } else if (mx) {
    // The forward's MXFP4 Q folded per query tile, with Qᵀ (the fold reads only).
    static_assert(cuda_quantize::kMxFoldKeyTile == cuda_quantize::kTokenBlock, "K is folded per tile both ways");
    const cuda_quantize::Fp4Output q_mx{const_cast<std::uint8_t*>(kept + sl.mx_q_codes),
                                        const_cast<std::uint8_t*>(kept + sl.mx_q_scales), nullptr};
    cuda_quantize::fold_mx_qk(q_mx, s.B, s.Sq, s.Hq, s.D, cuda_quantize::kTokenBlock, fwd.q, fwd.q_scale, stream,
                              base + layout.qt);
  } else if (kept == nullptr) {
    // Qᵀ and Kᵀ come from the blocks the quantizer holds anyway (for
    // mxfp4_train from the fold's tiles).
    cuda_quantize::Fp8Buffers with_t = fwd;
    with_t.qt = base + layout.qt;
    with_t.kt = base + layout.kt;
    cuda_quantize::quantize_fp8(in_q, in_k, in_v, opt.smooth_k, scale, with_t, stream);
  }
  // dO and V meet in dP = dO·Vᵀ, a reduction over D: both per token block
  // along D, which is how the quantizer treats Q and K without smooth_k.
  cuda_quantize::Fp8Buffers grad = fwd;
  grad.q = base + layout.d_o;
  grad.q_scale = floats(layout.do_scale);
  grad.k = base + layout.v;
  grad.k_scale = floats(layout.v_scale);
  grad.qt = base + layout.d_ot;  // dOᵀ; V is needed in its token-major form only
  // delta = Σ_d dO·O per row, taken while the call holds dO's blocks.
  cuda_quantize::QRowDot delta;
  delta.with = strided(args.o, args.element, s.B, s.Sq, s.Hq, s.D, "o", cu_q);
  delta.out = floats(layout.delta);
  delta.pitch = sm90::bwd::padded_tokens(lay.Sq);
  cuda_quantize::quantize_fp8(strided(args.d_o, args.element, s.B, s.Sq, s.Hq, s.D, "d_o", cu_q), in_v, in_v, false,
                              scale, grad, delta, stream);
  // Non-finite input cannot raise an error without a host synchronisation:
  // it makes the gradients NaN. After both quantizers, so that a non-finite
  // q, k, d_o or v counts.
  const std::int64_t q_blocks = lay.B * s.Hq * token_blocks(lay.Sq), k_blocks = lay.B * s.Hkv * token_blocks(lay.Sk);
  sm90::bwd::nan_scales_if_flagged(
      fwd.nonfinite, kNonfiniteFlags, kept != nullptr ? reinterpret_cast<const int*>(kept + sl.nonfinite) : nullptr,
      kSavedFlags, {fwd.q_scale, kept_q ? kept_floats(sl.q_scale) : nullptr, q_blocks},
      {fwd.k_scale, kept != nullptr ? kept_floats(sl.k_scale) : nullptr, k_blocks}, {grad.q_scale, nullptr, q_blocks},
      stream);

  const int B = static_cast<int>(s.B), Sq = static_cast<int>(s.Sq), Sk = static_cast<int>(s.Sk);
  const int Hq = static_cast<int>(s.Hq), Hkv = static_cast<int>(s.Hkv), D = static_cast<int>(s.D);
  sm90::bwd::PackedRows rows;
  if (packed) rows = {fwd.rows_q, fwd.rows_k, static_cast<int>(lay.Sq), static_cast<int>(lay.Sk)};
  sm90::bwd::lse_statistics(args.lse, opt.smooth_k ? lse_shift : nullptr, floats(layout.delta),
                            floats(layout.lse_log2), B, Sq, Hq, cu_q, args.lse_pitch, rows, stream);

  a.q = q_codes, a.k = k_codes, a.d_o = grad.q, a.v = grad.k;
  a.qt = qt, a.d_ot = base + layout.d_ot, a.kt = kt;
  a.q_scale = fwd.q_scale, a.k_scale = fwd.k_scale, a.do_scale = grad.q_scale, a.v_scale = grad.k_scale;
  a.lse_log2 = floats(layout.lse_log2), a.delta = floats(layout.delta);
  a.ds_scales = floats(layout.ds_scales);
  a.out_type = element_type(args.element);
  a.B = B, a.Hq = Hq, a.Hkv = Hkv, a.Sq = Sq, a.Sk = Sk, a.D = D;
  a.cu_seqlens_q = cu_q, a.cu_seqlens_k = cu_k;
  a.rows = rows;
  a.softmax_scale = scale;
  a.mask = opt.mask;
  a.window_left = kernel_window_bound(opt.window.left), a.window_right = kernel_window_bound(opt.window.right);
  a.p_code = opt.direct_p ? sm90::bwd::PCode::direct_p : sm90::bwd::PCode::exp2_cvt;
  if (!deterministic) {
    // One pass: the dK/dV kernel adds dQ to fp32 sums (order varies run to run).
    a.dq_mode = sm90::bwd::DqMode::one_pass;
    a.dq_accum = floats(layout.dq_accum);
    const auto sums = static_cast<std::size_t>(sm90::bwd::dq_accum_elems(lay.B, s.Hq, lay.Sq, s.D));
    cuda_common::check_cuda(cudaMemsetAsync(a.dq_accum, 0, sums * sizeof(float), stream), "cudaMemsetAsync");
  }
  sm90::bwd::backward_fp8(a, stream);
}

BackwardOutput sm90_backward(const AttentionShape& s, std::span<const float> q, std::span<const float> k,
                             std::span<const float> v, std::span<const float> o, std::span<const float> lse,
                             std::span<const float> d_o, const AttentionOptions& opt) {
  const cudaStream_t stream = nullptr;
  std::vector<cuda_common::DeviceMemory> owned;
  const auto upload = [&](std::span<const float> x) {
    owned.push_back(cuda_common::device_alloc(x.size() * sizeof(float)));
    cuda_common::check_cuda(cudaMemcpyAsync(owned.back().get(), x.data(), x.size() * sizeof(float),
                                            cudaMemcpyHostToDevice, stream),
                            "cudaMemcpyAsync");
    return owned.back().get();
  };
  const auto output = [&](std::int64_t n) {
    owned.push_back(cuda_common::device_alloc(static_cast<std::size_t>(n) * sizeof(float)));
    return owned.back().get();
  };
  const auto view = [](const void* p, std::int64_t S, std::int64_t H, std::int64_t D) {
    return DeviceTensorView{p, S * H * D, H * D, D};
  };
  DeviceBackwardArgs a;
  a.shape = s;
  a.element = DeviceElement::f32;
  a.q = view(upload(q), s.Sq, s.Hq, s.D);
  a.k = view(upload(k), s.Sk, s.Hkv, s.D);
  a.v = view(upload(v), s.Sk, s.Hkv, s.D);
  a.o = view(upload(o), s.Sq, s.Hq, s.D);
  a.d_o = view(upload(d_o), s.Sq, s.Hq, s.D);
  a.lse = static_cast<const float*>(upload(lse));
  a.dq = output(s.q_elems());
  a.dq_stride_b = s.Sq * s.Hq * s.D, a.dq_stride_s = s.Hq * s.D, a.dq_stride_h = s.D;
  a.dk = output(s.kv_elems());
  a.dk_stride_b = s.Sk * s.Hkv * s.D, a.dk_stride_s = s.Hkv * s.D, a.dk_stride_h = s.D;
  a.dv = output(s.kv_elems());
  a.dv_stride_b = a.dk_stride_b, a.dv_stride_s = a.dk_stride_s, a.dv_stride_h = a.dk_stride_h;
  a.workspace_bytes = sm90_device_backward_workspace_bytes(s, true, opt.recipe);
  owned.push_back(cuda_common::device_alloc(a.workspace_bytes));
  a.workspace = owned.back().get();
  sm90_backward_device(a, opt, true, stream);

  BackwardOutput out{std::vector<float>(static_cast<std::size_t>(s.q_elems())),
                     std::vector<float>(static_cast<std::size_t>(s.kv_elems())),
                     std::vector<float>(static_cast<std::size_t>(s.kv_elems())), Executor::sm90};
  const auto download = [&](std::vector<float>& dst, const void* src) {
    cuda_common::check_cuda(
        cudaMemcpyAsync(dst.data(), src, dst.size() * sizeof(float), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  };
  download(out.dq, a.dq);
  download(out.dk, a.dk);
  download(out.dv, a.dv);
  cuda_common::check_cuda(cudaStreamSynchronize(stream), "sm90 backward");
  return out;
}

}  // namespace fp4attn::dispatch

#endif  // FP4ATTN_HAS_CUDA
