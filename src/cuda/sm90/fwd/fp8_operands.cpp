// Sizes of the fp8 operands follow cuda/quantize/quantize_fp8.hpp's layouts.
#include "cuda/sm90/fwd/fp8_operands.hpp"

namespace fp4attn::sm90::fwd {
namespace {

constexpr int kNonfiniteFlags = 3;  // q, k, v

std::int64_t token_blocks(std::int64_t S) {
  return (S + cuda_quantize::kTokenBlock - 1) / cuda_quantize::kTokenBlock;
}

}  // namespace

void* Fp8Operands::allocate(std::size_t bytes) {
  owned_.push_back(cuda_common::device_alloc(bytes));
  return owned_.back().get();
}

Fp8Operands::Fp8Operands(const AttentionShape& s) : shape_(s) {
  const auto floats = [this](std::int64_t n) { return static_cast<float*>(allocate(n * sizeof(float))); };
  bufs_.vt_keys = cuda_quantize::padded_keys(s.Sk);
  bufs_.code_pitch = cuda_quantize::tma_code_pitch(s.D);
  bufs_.q = static_cast<std::uint8_t*>(allocate(cuda_quantize::tma_code_bytes(s.q_elems(), s.D)));
  bufs_.k = static_cast<std::uint8_t*>(allocate(cuda_quantize::tma_code_bytes(s.kv_elems(), s.D)));
  bufs_.vt = static_cast<std::uint8_t*>(allocate(s.B * s.Hkv * s.D * bufs_.vt_keys));
  bufs_.q_scale = floats(s.B * s.Hq * token_blocks(s.Sq));
  bufs_.k_scale = floats(s.B * s.Hkv * token_blocks(s.Sk));
  bufs_.v_scale = floats(s.B * s.Hkv * s.D);
  bufs_.k_mean = floats(s.B * s.Hkv * s.D);
  bufs_.lse_shift = floats(s.lse_elems());
  bufs_.nonfinite = static_cast<int*>(allocate(kNonfiniteFlags * sizeof(int)));
  bufs_.workspace = allocate(cuda_quantize::fp8_workspace_bytes(s.B, s.Hkv, s.Sk, s.D));
  cuda_common::check_cuda(cudaMemset(bufs_.nonfinite, 0, kNonfiniteFlags * sizeof(int)), "cudaMemset");
}

std::size_t Fp8Operands::code_bytes() const {
  // The kernel reads D bytes of each code row; the rest of its pitch stays unread.
  return static_cast<std::size_t>(shape_.q_elems() + shape_.kv_elems() + shape_.B * shape_.Hkv * shape_.D * bufs_.vt_keys);
}

Fp8ForwardArgs contiguous_forward_args(const AttentionShape& s, const cuda_quantize::Fp8Buffers& bufs,
                                       MaskKind mask, PCode p_code, float softmax_scale, bool smooth_k) {
  Fp8ForwardArgs a;
  const std::int64_t pitch = cuda_quantize::code_pitch_of(bufs, s.D);
  a.q = bufs.q;
  a.q_stride_b = s.Sq * s.Hq * pitch, a.q_stride_s = s.Hq * pitch, a.q_stride_h = pitch;
  a.k = bufs.k;
  a.k_stride_b = s.Sk * s.Hkv * pitch, a.k_stride_s = s.Hkv * pitch, a.k_stride_h = pitch;
  a.vt = bufs.vt;
  a.vt_keys = bufs.vt_keys;
  a.q_scale = bufs.q_scale, a.k_scale = bufs.k_scale, a.v_scale = bufs.v_scale;
  a.lse_shift = smooth_k ? bufs.lse_shift : nullptr;
  a.B = static_cast<int>(s.B), a.Hq = static_cast<int>(s.Hq), a.Hkv = static_cast<int>(s.Hkv);
  a.Sq = static_cast<int>(s.Sq), a.Sk = static_cast<int>(s.Sk), a.D = static_cast<int>(s.D);
  a.softmax_scale = softmax_scale;
  a.mask = mask;
  a.p_code = p_code;
  return a;
}

}  // namespace fp4attn::sm90::fwd
