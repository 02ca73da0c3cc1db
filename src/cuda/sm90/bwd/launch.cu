// Host launcher of the FP8 backward kernels: tensor maps, grids, shared memory.
#include <string>

#include "cuda/common/device_memory.hpp"
#include "cuda/sm90/bwd/dkv_kernel.cuh"
#include "cuda/sm90/bwd/dq_kernel.cuh"
#include "cuda/sm90/tensor_map.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::sm90::bwd {
namespace {

using cuda_common::check_cuda;

std::uint64_t u64(std::int64_t v) { return static_cast<std::uint64_t>(v); }

// Token-major contiguous codes (B, S, H, D), boxes of 128 tokens.
template <int D>
CUtensorMap token_map(const std::uint8_t* codes, int B, int S, int H, const char* name) {
  constexpr TmaSwizzle kSwizzle = D == 128 ? TmaSwizzle::b128 : TmaSwizzle::b64;
  return make_byte_tensor_map(codes, {u64(D), u64(S), u64(H), u64(B)}, {u64(H) * D, u64(D), u64(S) * H * D},
                              {D, kTile, 1, 1}, kSwizzle, name);
}

// Transposed codes (B, H, D, padded), boxes of D rows × 128 tokens.
template <int D>
CUtensorMap transposed_map(const std::uint8_t* codes, int B, int S, int H, const char* name) {
  const std::uint64_t padded = u64(padded_tokens(S));
  return make_byte_tensor_map(codes, {padded, u64(D), u64(H), u64(B)}, {padded, padded * D, padded * D * H},
                              {kTile, D, 1, 1}, TmaSwizzle::b128, name);
}

template <int D, PCode kPCode>
void launch(const Fp8BackwardArgs& a, cudaStream_t stream) {
  using Cfg = BwdConfig<D>;
  // Packed sequences: every operand is one batch entry of the tile-aligned layout.
  const bool packed = a.cu_seqlens_q != nullptr;
  const int B = packed ? 1 : a.B, Sq = packed ? a.rows.q_rows : a.Sq, Sk = packed ? a.rows.k_rows : a.Sk;
  const CUtensorMap tm_q = token_map<D>(a.q, B, Sq, a.Hq, "q");
  const CUtensorMap tm_do = token_map<D>(a.d_o, B, Sq, a.Hq, "d_o");
  const CUtensorMap tm_k = token_map<D>(a.k, B, Sk, a.Hkv, "k");
  const CUtensorMap tm_v = token_map<D>(a.v, B, Sk, a.Hkv, "v");
  const CUtensorMap tm_qt = transposed_map<D>(a.qt, B, Sq, a.Hq, "q");
  const CUtensorMap tm_dot = transposed_map<D>(a.d_ot, B, Sq, a.Hq, "d_o");
  const CUtensorMap tm_kt = transposed_map<D>(a.kt, B, Sk, a.Hkv, "k");

  if (a.dq_mode == DqMode::two_pass) {
    // A window's left edge runs the instances that mask both bounds (dq_kernel.cuh).
    auto* dq_kernel = a.window_left >= 0 ? &fp8_dq_kernel<D, kPCode, true> : &fp8_dq_kernel<D, kPCode, false>;
    constexpr int kDqSmem = shared_bytes<DqShared<Cfg>>();
    check_cuda(cudaFuncSetAttribute(dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDqSmem),
               "cudaFuncSetAttribute");
    const dim3 dq_grid((a.Sq + kTile - 1) / kTile, a.Hq, a.B);
    dq_kernel<<<dq_grid, Cfg::kThreads, kDqSmem, stream>>>(a, tm_q, tm_do, tm_k, tm_v, tm_kt);
    check_cuda(cudaGetLastError(), "fp8_dq_kernel launch");
  }

  auto* dkv_kernel = a.dq_mode == DqMode::two_pass
                        ? (a.window_left >= 0 ? &fp8_dkv_kernel<D, kPCode, DqMode::two_pass, true>
                                              : &fp8_dkv_kernel<D, kPCode, DqMode::two_pass, false>)
                        : (a.window_left >= 0 ? &fp8_dkv_kernel<D, kPCode, DqMode::one_pass, true>
                                              : &fp8_dkv_kernel<D, kPCode, DqMode::one_pass, false>);
  constexpr int kDkvSmem = shared_bytes<DkvShared<Cfg>>();
  check_cuda(cudaFuncSetAttribute(dkv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDkvSmem),
             "cudaFuncSetAttribute");
  const dim3 dkv_grid((a.Sk + kTile - 1) / kTile, a.Hkv, a.B);
  dkv_kernel<<<dkv_grid, Cfg::kThreads, kDkvSmem, stream>>>(a, tm_q, tm_do, tm_qt, tm_dot, tm_k, tm_v, tm_kt);
  check_cuda(cudaGetLastError(), "fp8_dkv_kernel launch");
  if (a.dq_mode == DqMode::one_pass)
    finalize_dq(a.dq_accum, a.out_type, a.dq, a.softmax_scale, a.B, a.Sq, a.Hq, D, a.cu_seqlens_q, a.rows, stream);
}

}  // namespace

void backward_fp8(const Fp8BackwardArgs& a, cudaStream_t stream) {
  if (a.Hkv <= 0 || a.Hq % a.Hkv != 0) throw Error("Hkv", "Hq must be a multiple of Hkv");
  if (!(a.softmax_scale > 0.0f)) throw Error("softmax_scale", "must be positive");
  if (a.dq_mode == DqMode::one_pass && a.dq_accum == nullptr)
    throw Error("dq_accum", "DqMode::one_pass needs the buffer");
  if (a.dq_mode == DqMode::two_pass && a.ds_scales == nullptr)
    throw Error("ds_scales", "DqMode::two_pass needs the dS scale buffer");
  if ((a.cu_seqlens_q == nullptr) != (a.cu_seqlens_k == nullptr))
    throw Error("cu_seqlens", "packed sequences need both cu_seqlens_q and cu_seqlens_k");
  if (a.cu_seqlens_q != nullptr &&
      (a.rows.q == nullptr || a.rows.k == nullptr || a.rows.q_rows % kTile != 0 || a.rows.k_rows % kTile != 0 ||
       a.rows.q_rows < a.Sq || a.rows.k_rows < a.Sk))
    throw Error("rows", "packed sequences need their tile-aligned layout (rows.q, rows.k, q_rows, k_rows)");
  const bool direct = a.p_code == PCode::direct_p;
  switch (a.D) {
    case 64: return direct ? launch<64, PCode::direct_p>(a, stream) : launch<64, PCode::exp2_cvt>(a, stream);
    case 128: return direct ? launch<128, PCode::direct_p>(a, stream) : launch<128, PCode::exp2_cvt>(a, stream);
    default: throw Error("D", "the sm90 backward supports D = 64 and 128, got " + std::to_string(a.D));
  }
}

}  // namespace fp4attn::sm90::bwd
