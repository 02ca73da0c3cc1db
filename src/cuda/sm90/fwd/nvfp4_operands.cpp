// Buffer sizes follow cuda/quantize/quantize_fp4.hpp (NVFP4 output) and
// cuda/sm90/fwd/nvfp4_fwd.hpp (the kernel's BF16 operands).
#include "cuda/sm90/fwd/nvfp4_operands.hpp"

#include <algorithm>

#include "cuda/sm90/fwd/nvfp4_bf16/expand.hpp"
#include "cuda/sm90/fwd/workspace_regions.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::sm90::fwd {
namespace {

namespace cq = cuda_quantize;
constexpr int kNonfiniteFlags = 3;  // q, k, v
constexpr std::int64_t kBf16Bytes = 2;

struct Layout {
  cq::Fp4Buffers fp4;
  void *q = nullptr, *k = nullptr, *vt = nullptr;
  std::int64_t vt_keys = 0;
  float* lse_shift = nullptr;
  std::size_t bytes = 0;
};

// The one place that sizes and places every buffer.
Layout layout(const AttentionShape& s, unsigned char* base) {
  WorkspaceRegions r(base);
  Layout l;
  const auto fp4_out = [&](cq::Fp4Operand op, std::int64_t S, std::int64_t H) {
    const cq::Fp4Sizes z = cq::fp4_sizes(op, TensorFormat::nvfp4, s.B, S, H, s.D);
    cq::Fp4Output out;
    out.codes = r.take<std::uint8_t>(z.code_bytes);
    out.scales = r.take<std::uint8_t>(z.scale_bytes);
    out.tensor_scale = r.take<float>(1);
    return out;
  };
  l.fp4.q = fp4_out(cq::Fp4Operand::q, s.Sq, s.Hq);
  l.fp4.k = fp4_out(cq::Fp4Operand::k, s.Sk, s.Hkv);
  l.fp4.v = fp4_out(cq::Fp4Operand::v, s.Sk, s.Hkv);
  l.fp4.k_mean = r.take<float>(s.B * s.Hkv * s.D);
  l.fp4.nonfinite = r.take<int>(kNonfiniteFlags);
  l.fp4.workspace = r.take<unsigned char>(static_cast<std::int64_t>(
      std::max(cq::fp4_workspace_bytes(s.B, s.Sq, s.Hq, s.D), cq::fp4_workspace_bytes(s.B, s.Sk, s.Hkv, s.D))));
  l.q = r.take<unsigned char>(s.q_elems() * kBf16Bytes);
  l.k = r.take<unsigned char>(s.kv_elems() * kBf16Bytes);
  l.vt_keys = cq::fp4_padded_tokens(s.Sk);
  l.vt = r.take<unsigned char>(s.B * s.Hkv * s.D * l.vt_keys * kBf16Bytes);
  l.lse_shift = r.take<float>(s.lse_elems());
  l.bytes = r.bytes();
  return l;
}

}  // namespace

std::size_t Nvfp4Operands::workspace_bytes(const AttentionShape& shape) { return layout(shape, nullptr).bytes; }

Nvfp4Operands::Nvfp4Operands(const AttentionShape& s) : shape_(s) {
  owned_ = cuda_common::device_alloc(workspace_bytes(s));
  carve(static_cast<unsigned char*>(owned_.get()));
}

Nvfp4Operands::Nvfp4Operands(const AttentionShape& s, void* workspace) : shape_(s) {
  if (workspace == nullptr) throw Error("workspace", "is a null device pointer");
  carve(static_cast<unsigned char*>(workspace));
}

void Nvfp4Operands::carve(unsigned char* base) {
  const Layout l = layout(shape_, base);
  fp4_ = l.fp4;
  q_ = l.q, k_ = l.k, vt_ = l.vt;
  vt_keys_ = l.vt_keys;
  lse_shift_ = l.lse_shift;
}

void Nvfp4Operands::prepare(const cq::StridedInput& q, const cq::StridedInput& k, const cq::StridedInput& v,
                            bool smooth_k, float softmax_scale, cudaStream_t stream) {
  const AttentionShape& s = shape_;
  // The buffers may arrive with any content: the flags start clear on every call.
  cuda_common::check_cuda(cudaMemsetAsync(fp4_.nonfinite, 0, kNonfiniteFlags * sizeof(int), stream),
                          "cudaMemsetAsync");
  cq::Fp4Options opt;
  opt.format = TensorFormat::nvfp4;
  cq::quantize_fp4(q, cq::Fp4Operand::q, opt, fp4_, stream);
  opt.smooth_k = smooth_k;
  cq::quantize_fp4(k, cq::Fp4Operand::k, opt, fp4_, stream);
  opt.smooth_k = false;
  cq::quantize_fp4(v, cq::Fp4Operand::v, opt, fp4_, stream);  // transposed: Vᵀ codes
  expand_nvfp4_qk(fp4_.q, s.B, s.Sq, s.Hq, s.D, q_, stream);
  expand_nvfp4_qk(fp4_.k, s.B, s.Sk, s.Hkv, s.D, k_, stream);
  expand_nvfp4_vt(fp4_.v, s.B, s.Sk, s.Hkv, s.D, vt_, stream);
  if (smooth_k) nvfp4_lse_shift(fp4_.q, s.B, s.Sq, s.Hq, s.Hkv, s.D, fp4_.k_mean, softmax_scale, lse_shift_, stream);
}

void Nvfp4Operands::check_finite(cudaStream_t stream) const { cq::check_finite(fp4_, stream); }

Nvfp4ForwardArgs Nvfp4Operands::forward_args(MaskKind mask, bool direct_p, float softmax_scale, bool smooth_k) const {
  const AttentionShape& s = shape_;
  Nvfp4ForwardArgs a;
  a.q = q_, a.k = k_, a.vt = vt_;
  a.vt_keys = vt_keys_;
  a.q_tensor_scale = fp4_.q.tensor_scale;
  a.k_tensor_scale = fp4_.k.tensor_scale;
  a.v_tensor_scale = fp4_.v.tensor_scale;
  a.lse_shift = smooth_k ? lse_shift_ : nullptr;
  a.nonfinite = fp4_.nonfinite;
  a.B = static_cast<int>(s.B), a.Hq = static_cast<int>(s.Hq), a.Hkv = static_cast<int>(s.Hkv);
  a.Sq = static_cast<int>(s.Sq), a.Sk = static_cast<int>(s.Sk), a.D = static_cast<int>(s.D);
  a.softmax_scale = softmax_scale;
  a.mask = mask;
  a.direct_p = direct_p;
  return a;
}

std::size_t Nvfp4Operands::kernel_operand_bytes() const {
  const AttentionShape& s = shape_;
  return static_cast<std::size_t>((s.q_elems() + s.kv_elems() + s.B * s.Hkv * s.D * vt_keys_) * kBf16Bytes);
}

}  // namespace fp4attn::sm90::fwd
