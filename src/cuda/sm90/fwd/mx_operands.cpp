// Buffer sizes follow cuda/quantize/quantize_fp4.hpp (MXFP4 output) and
// cuda/quantize/fold_mx.hpp (folded operands).
#include "cuda/sm90/fwd/mx_operands.hpp"

#include <algorithm>

#include "cuda/quantize/fold_mx.hpp"
#include "cuda/sm90/fwd/workspace_regions.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::sm90::fwd {
namespace {

namespace cq = cuda_quantize;
constexpr int kNonfiniteFlags = 3;  // q, k, v

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

struct Layout {
  cq::Fp4Buffers fp4;
  cq::Fp8Buffers fp8_v, folded;
  std::size_t bytes = 0;
};

// The one place that sizes and places every buffer (sizes from
// cuda/quantize/quantize_fp4.hpp, quantize_fp8.hpp and fold_mx.hpp).
Layout layout(const AttentionShape& s, Recipe recipe, Fp4Expansion expansion, unsigned char* base) {
  const bool fold = expansion == Fp4Expansion::fold_pass;
  WorkspaceRegions r(base);
  Layout l;
  const auto fp4_out = [&](cq::Fp4Operand op, std::int64_t S, std::int64_t H) {
    const cq::Fp4Sizes z = cq::fp4_sizes(op, TensorFormat::mxfp4, s.B, S, H, s.D);
    cq::Fp4Output out;
    out.codes = r.take<std::uint8_t>(z.code_bytes);
    out.scales = r.take<std::uint8_t>(z.scale_bytes);
    return out;
  };
  l.fp4.q = fp4_out(cq::Fp4Operand::q, s.Sq, s.Hq);
  l.fp4.k = fp4_out(cq::Fp4Operand::k, s.Sk, s.Hkv);
  if (recipe == Recipe::mxfp4) l.fp4.v = fp4_out(cq::Fp4Operand::v, s.Sk, s.Hkv);
  l.fp4.k_mean = r.take<float>(s.B * s.Hkv * s.D);
  l.fp4.nonfinite = r.take<int>(kNonfiniteFlags);
  l.fp4.workspace = r.take<unsigned char>(static_cast<std::int64_t>(
      std::max(cq::fp4_workspace_bytes(s.B, s.Sq, s.Hq, s.D), cq::fp4_workspace_bytes(s.B, s.Sk, s.Hkv, s.D))));

  l.folded.q = fold ? r.take<std::uint8_t>(s.q_elems()) : nullptr;
  l.folded.q_scale = r.take<float>(s.B * s.Hq * s.Sq);  // one factor per query row
  l.folded.k = fold ? r.take<std::uint8_t>(s.kv_elems()) : nullptr;
  l.folded.k_scale = r.take<float>(s.B * s.Hkv * ceil_div(s.Sk, cq::kMxFoldKeyTile));
  l.folded.lse_shift = r.take<float>(s.lse_elems());
  l.folded.k_mean = l.fp4.k_mean;
  l.folded.nonfinite = l.fp4.nonfinite;
  l.folded.vt_keys = cq::padded_keys(s.Sk);
  if (recipe == Recipe::mxfp4) {
    l.folded.vt = fold ? r.take<std::uint8_t>(s.B * s.Hkv * s.D * l.folded.vt_keys) : nullptr;
    l.folded.v_scale = r.take<float>(s.B * s.Hkv * s.D);
  } else {
    // V alone by the fp8 quantizer (null q and k codes), which shares the
    // MXFP4 quantizer's three non-finite flags.
    cq::Fp8Buffers& v = l.fp8_v;
    v.vt_keys = l.folded.vt_keys;
    v.vt = r.take<std::uint8_t>(s.B * s.Hkv * s.D * v.vt_keys);
    v.v_scale = r.take<float>(s.B * s.Hkv * s.D);
    v.nonfinite = l.fp4.nonfinite;
    v.workspace = r.take<unsigned char>(static_cast<std::int64_t>(cq::fp8_workspace_bytes(s.B, s.Hkv, s.Sk, s.D)));
    l.folded.vt = v.vt;
    l.folded.v_scale = v.v_scale;
  }
  l.bytes = r.bytes();
  return l;
}

void check_recipe(Recipe recipe, Fp4Expansion expansion) {
  if (recipe != Recipe::mxfp4 && recipe != Recipe::mxfp4_train)
    throw Error("recipe", "MxOperands serves recipes mxfp4 and mxfp4_train");
  if (expansion == Fp4Expansion::in_kernel && recipe != Recipe::mxfp4)
    throw Error("expansion", "the in-kernel MXFP4 expansion serves recipe mxfp4 (mxfp4_train's V is FP8)");
}

}  // namespace

std::size_t MxOperands::workspace_bytes(const AttentionShape& shape, Recipe recipe, Fp4Expansion expansion) {
  check_recipe(recipe, expansion);
  return layout(shape, recipe, expansion, nullptr).bytes;
}

MxOperands::MxOperands(const AttentionShape& s, Recipe recipe, MxScaleRule mx_scale_rule, Fp4Expansion expansion)
    : shape_(s), recipe_(recipe), mx_scale_rule_(mx_scale_rule), expansion_(expansion) {
  owned_ = cuda_common::device_alloc(workspace_bytes(s, recipe, expansion));
  carve(static_cast<unsigned char*>(owned_.get()));
}

MxOperands::MxOperands(const AttentionShape& s, Recipe recipe, MxScaleRule mx_scale_rule, void* workspace,
                       Fp4Expansion expansion)
    : shape_(s), recipe_(recipe), mx_scale_rule_(mx_scale_rule), expansion_(expansion) {
  check_recipe(recipe, expansion);
  if (workspace == nullptr) throw Error("workspace", "is a null device pointer");
  carve(static_cast<unsigned char*>(workspace));
}

void MxOperands::carve(unsigned char* base) {
  const Layout l = layout(shape_, recipe_, expansion_, base);
  fp4_ = l.fp4;
  fp8_v_ = l.fp8_v;
  folded_ = l.folded;
}

void MxOperands::keep_for_backward(const MxKept& kept) {
  if (recipe_ != Recipe::mxfp4_train || expansion_ != Fp4Expansion::fold_pass)
    throw Error("saved", "only recipe mxfp4_train's fold pass keeps its operands for the backward");
  fp4_.q.codes = kept.q_codes, fp4_.q.scales = kept.q_scales;
  folded_.k = kept.k, folded_.k_scale = kept.k_scale;
  kt_ = kept.kt;
  fp4_.k_mean = folded_.k_mean = kept.k_mean;
  folded_.lse_shift = kept.lse_shift;
  fp4_.nonfinite = folded_.nonfinite = fp8_v_.nonfinite = kept.nonfinite;
}

void MxOperands::prepare(const cq::StridedInput& q, const cq::StridedInput& k, const cq::StridedInput& v,
                         bool smooth_k, float softmax_scale, cudaStream_t stream) {
  // The buffers may arrive with any content: the flags start clear on every call.
  cuda_common::check_cuda(cudaMemsetAsync(fp4_.nonfinite, 0, kNonfiniteFlags * sizeof(int), stream),
                          "cudaMemsetAsync");
  cq::Fp4Options opt;
  opt.format = TensorFormat::mxfp4;
  opt.mx_scale_rule = mx_scale_rule_;
  cq::quantize_fp4(q, cq::Fp4Operand::q, opt, fp4_, stream);
  opt.smooth_k = smooth_k;
  cq::quantize_fp4(k, cq::Fp4Operand::k, opt, fp4_, stream);
  opt.smooth_k = false;
  if (recipe_ == Recipe::mxfp4) {
    cq::quantize_fp4(v, cq::Fp4Operand::v, opt, fp4_, stream);
  } else {
    cq::quantize_fp8(q, k, v, false, softmax_scale, fp8_v_, stream);
  }
  fold(smooth_k, softmax_scale, stream);
}

void MxOperands::fold(bool smooth_k, float softmax_scale, cudaStream_t stream) {
  const AttentionShape& s = shape_;
  if (recipe_ == Recipe::mxfp4)
    cq::fold_mx_v(fp4_.v, s.B, s.Sk, s.Hkv, s.D, folded_.vt_keys, folded_.vt, folded_.v_scale, stream);
  // in_kernel: folded_.q, k and vt are null, so the folds write only the factors.
  cq::fold_mx_qk(fp4_.q, s.B, s.Sq, s.Hq, s.D, 1, folded_.q, folded_.q_scale, stream);
  cq::fold_mx_qk(fp4_.k, s.B, s.Sk, s.Hkv, s.D, cq::kMxFoldKeyTile, folded_.k, folded_.k_scale, stream, kt_);
  if (smooth_k)
    cq::mx_lse_shift(fp4_.q, s.B, s.Sq, s.Hq, s.Hkv, s.D, fp4_.k_mean, softmax_scale, folded_.lse_shift, stream);
}

void MxOperands::check_finite(cudaStream_t stream) const { cq::check_finite(fp4_, stream); }

Fp8ForwardArgs MxOperands::forward_args(MaskKind mask, bool direct_p, float softmax_scale, bool smooth_k) const {
  const PCode p_code = recipe_ == Recipe::mxfp4 ? (direct_p ? PCode::mxfp4_direct_p : PCode::mxfp4_exp2)
                                                : (direct_p ? PCode::direct_p : PCode::exp2_cvt);
  Fp8ForwardArgs a = contiguous_forward_args(shape_, folded_, mask, p_code, softmax_scale, smooth_k);
  a.q_scale_rows = 1;
  a.mx_scale_rule = mx_scale_rule_;
  a.nonfinite = fp4_.nonfinite;
  if (expansion_ == Fp4Expansion::in_kernel) {
    a.q_fp4 = fp4_.q.codes, a.q_fp4_scales = fp4_.q.scales;
    a.k_fp4 = fp4_.k.codes, a.k_fp4_scales = fp4_.k.scales;
    a.vt_fp4 = fp4_.v.codes, a.v_fp4_scales = fp4_.v.scales;
    a.v_fp4_tokens = cq::fp4_padded_tokens(shape_.Sk);
  }
  return a;
}

std::size_t MxOperands::kernel_code_bytes() const {
  const AttentionShape& s = shape_;
  if (expansion_ == Fp4Expansion::in_kernel) {
    const auto bytes = [&](cq::Fp4Operand op, std::int64_t S, std::int64_t H) {
      const cq::Fp4Sizes z = cq::fp4_sizes(op, TensorFormat::mxfp4, s.B, S, H, s.D);
      return z.code_bytes + z.scale_bytes;
    };
    return static_cast<std::size_t>(bytes(cq::Fp4Operand::q, s.Sq, s.Hq) + bytes(cq::Fp4Operand::k, s.Sk, s.Hkv) +
                                    bytes(cq::Fp4Operand::v, s.Sk, s.Hkv));
  }
  return static_cast<std::size_t>(s.q_elems() + s.kv_elems() + s.B * s.Hkv * s.D * folded_.vt_keys);
}

}  // namespace fp4attn::sm90::fwd
