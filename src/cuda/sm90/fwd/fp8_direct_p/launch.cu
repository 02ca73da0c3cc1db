// Host launcher of the FP8 Direct-P forward: tensor maps, grid, shared memory.
#include <string>

#include "cuda/sm90/fwd/fp8_direct_p/kernel.cuh"
#include "cuda/sm90/tensor_map.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::sm90::fwd {
namespace {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error("cuda", std::string(what) + ": " + cudaGetErrorString(err));
}

std::uint64_t u64(std::int64_t v) { return static_cast<std::uint64_t>(v); }

template <int HeadDim, PCode kPCode>
void launch(const Fp8ForwardArgs& a, cudaStream_t stream) {
  using Cfg = Fp8Config<HeadDim>;
  constexpr TmaSwizzle kQk = HeadDim == 128 ? TmaSwizzle::b128 : TmaSwizzle::b64;
  const CUtensorMap tm_q = make_byte_tensor_map(
      a.q, {u64(HeadDim), u64(a.Sq), u64(a.Hq), u64(a.B)}, {u64(a.q_stride_s), u64(a.q_stride_h), u64(a.q_stride_b)},
      {HeadDim, Cfg::kBlockQ, 1, 1}, kQk, "q");
  const CUtensorMap tm_k = make_byte_tensor_map(
      a.k, {u64(HeadDim), u64(a.Sk), u64(a.Hkv), u64(a.B)}, {u64(a.k_stride_s), u64(a.k_stride_h), u64(a.k_stride_b)},
      {HeadDim, Cfg::kBlockK, 1, 1}, kQk, "k");
  const std::int64_t vt_row = a.vt_keys;
  const CUtensorMap tm_vt = make_byte_tensor_map(
      a.vt, {u64(a.vt_keys), u64(HeadDim), u64(a.Hkv), u64(a.B)},
      {u64(vt_row), u64(vt_row * HeadDim), u64(vt_row * HeadDim * a.Hkv)}, {Cfg::kBlockK, HeadDim, 1, 1},
      TmaSwizzle::b128, "vt");

  auto* kernel = &fp8_forward_kernel<HeadDim, kPCode>;
  constexpr int kSmem = smem_bytes<Cfg>();
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem), "cudaFuncSetAttribute");
  const dim3 grid((a.Sq + Cfg::kBlockQ - 1) / Cfg::kBlockQ, a.Hq, a.B);
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(a, tm_q, tm_k, tm_vt);
  check_cuda(cudaGetLastError(), "fp8_forward_kernel launch");
}

}  // namespace

void forward_fp8(const Fp8ForwardArgs& a, cudaStream_t stream) {
  if (a.vt_keys % kVtKeyAlign != 0 || a.vt_keys < a.Sk)
    throw Error("vt", "Vᵀ rows must hold Sk keys padded to a multiple of " + std::to_string(kVtKeyAlign));
  if (a.Hkv <= 0 || a.Hq % a.Hkv != 0) throw Error("Hkv", "Hq must be a multiple of Hkv");
  if (a.o_stride_s % 2 != 0 || a.o_stride_h % 2 != 0 || a.o_stride_b % 2 != 0)
    throw Error("o", "element strides must be even (the kernel stores bf16 pairs)");
  if (!(a.softmax_scale > 0.0f)) throw Error("softmax_scale", "must be positive");
  if (a.q_scale_rows != 1 && a.q_scale_rows != kVtKeyAlign)
    throw Error("q_scale_rows", "must be 1 (MX Q folded per row) or 128 (the fp8 recipe's token block)");
  if (a.D != 64 && a.D != 128)
    throw Error("D", "the sm90 fp8 kernel supports D = 64 and 128, got " + std::to_string(a.D));
  const bool d128 = a.D == 128;
  switch (a.p_code) {
    case PCode::direct_p: return d128 ? launch<128, PCode::direct_p>(a, stream) : launch<64, PCode::direct_p>(a, stream);
    case PCode::exp2_cvt: return d128 ? launch<128, PCode::exp2_cvt>(a, stream) : launch<64, PCode::exp2_cvt>(a, stream);
    case PCode::mxfp4_direct_p:
      return d128 ? launch<128, PCode::mxfp4_direct_p>(a, stream) : launch<64, PCode::mxfp4_direct_p>(a, stream);
    case PCode::mxfp4_exp2:
      return d128 ? launch<128, PCode::mxfp4_exp2>(a, stream) : launch<64, PCode::mxfp4_exp2>(a, stream);
  }
  throw Error("p_code", "unknown P code");
}

}  // namespace fp4attn::sm90::fwd
