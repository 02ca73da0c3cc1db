// Buffer sizes follow cuda/quantize/quantize_fp4.hpp (MXFP4 output) and
// cuda/quantize/fold_mx.hpp (folded operands).
#include "cuda/sm90/fwd/mx_operands.hpp"

#include <algorithm>

#include "cuda/quantize/fold_mx.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::sm90::fwd {
namespace {

namespace cq = cuda_quantize;
constexpr int kNonfiniteFlags = 3;  // q, k, v

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

void* MxOperands::allocate(std::size_t bytes) {
  owned_.push_back(cuda_common::device_alloc(std::max<std::size_t>(bytes, 1)));
  return owned_.back().get();
}

MxOperands::MxOperands(const AttentionShape& s, Recipe recipe, MxScaleRule mx_scale_rule)
    : shape_(s), recipe_(recipe), mx_scale_rule_(mx_scale_rule) {
  if (recipe != Recipe::mxfp4 && recipe != Recipe::mxfp4_train)
    throw Error("recipe", "MxOperands serves recipes mxfp4 and mxfp4_train");
  const auto bytes = [this](std::int64_t n) { return static_cast<std::uint8_t*>(allocate(n)); };
  const auto floats = [this](std::int64_t n) { return static_cast<float*>(allocate(n * sizeof(float))); };
  const auto fp4_out = [&](cq::Fp4Operand op, std::int64_t S, std::int64_t H) {
    const cq::Fp4Sizes z = cq::fp4_sizes(op, TensorFormat::mxfp4, s.B, S, H, s.D);
    return cq::Fp4Output{bytes(z.code_bytes), bytes(z.scale_bytes), nullptr};
  };
  fp4_.q = fp4_out(cq::Fp4Operand::q, s.Sq, s.Hq);
  fp4_.k = fp4_out(cq::Fp4Operand::k, s.Sk, s.Hkv);
  if (recipe == Recipe::mxfp4) fp4_.v = fp4_out(cq::Fp4Operand::v, s.Sk, s.Hkv);
  fp4_.k_mean = floats(s.B * s.Hkv * s.D);
  fp4_.nonfinite = static_cast<int*>(allocate(kNonfiniteFlags * sizeof(int)));
  fp4_.workspace = allocate(std::max(cq::fp4_workspace_bytes(s.B, s.Sq, s.Hq, s.D),
                                     cq::fp4_workspace_bytes(s.B, s.Sk, s.Hkv, s.D)));
  cuda_common::check_cuda(cudaMemset(fp4_.nonfinite, 0, kNonfiniteFlags * sizeof(int)), "cudaMemset");

  folded_.q = bytes(s.q_elems());
  folded_.q_scale = floats(s.B * s.Hq * s.Sq);  // one factor per query row
  folded_.k = bytes(s.kv_elems());
  folded_.k_scale = floats(s.B * s.Hkv * ceil_div(s.Sk, cq::kMxFoldKeyTile));
  folded_.lse_shift = floats(s.lse_elems());
  folded_.k_mean = fp4_.k_mean;
  folded_.nonfinite = fp4_.nonfinite;
  if (recipe == Recipe::mxfp4) {
    folded_.vt_keys = cq::padded_keys(s.Sk);
    folded_.vt = bytes(s.B * s.Hkv * s.D * folded_.vt_keys);
    folded_.v_scale = floats(s.B * s.Hkv * s.D);
  } else {
    fp8_v_ = std::make_unique<Fp8Operands>(s);
    const cq::Fp8Buffers& v = fp8_v_->buffers();
    folded_.vt_keys = v.vt_keys;
    folded_.vt = v.vt;
    folded_.v_scale = v.v_scale;
  }
}

void MxOperands::prepare(const cq::StridedInput& q, const cq::StridedInput& k, const cq::StridedInput& v,
                         bool smooth_k, float softmax_scale, cudaStream_t stream) {
  const AttentionShape& s = shape_;
  cq::Fp4Options opt;
  opt.format = TensorFormat::mxfp4;
  opt.mx_scale_rule = mx_scale_rule_;
  cq::quantize_fp4(q, cq::Fp4Operand::q, opt, fp4_, stream);
  opt.smooth_k = smooth_k;
  cq::quantize_fp4(k, cq::Fp4Operand::k, opt, fp4_, stream);
  opt.smooth_k = false;
  if (recipe_ == Recipe::mxfp4) {
    cq::quantize_fp4(v, cq::Fp4Operand::v, opt, fp4_, stream);
    cq::fold_mx_v(fp4_.v, s.B, s.Sk, s.Hkv, s.D, folded_.vt_keys, folded_.vt, folded_.v_scale, stream);
  } else {
    // V (and, unused, FP8 copies of Q and K) by the fp8 quantizer; its flags
    // are the same three ints as the MXFP4 quantizer's.
    cq::Fp8Buffers v_bufs = fp8_v_->buffers();
    v_bufs.nonfinite = fp4_.nonfinite;
    cq::quantize_fp8(q, k, v, false, softmax_scale, v_bufs, stream);
  }
  cq::fold_mx_qk(fp4_.q, s.B, s.Sq, s.Hq, s.D, 1, folded_.q, folded_.q_scale, stream);
  cq::fold_mx_qk(fp4_.k, s.B, s.Sk, s.Hkv, s.D, cq::kMxFoldKeyTile, folded_.k, folded_.k_scale, stream);
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
  return a;
}

std::size_t MxOperands::kernel_code_bytes() const {
  return static_cast<std::size_t>(shape_.q_elems() + shape_.kv_elems() +
                                  shape_.B * shape_.Hkv * shape_.D * folded_.vt_keys);
}

}  // namespace fp4attn::sm90::fwd
