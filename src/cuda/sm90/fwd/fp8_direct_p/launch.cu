// Host launcher of the FP8 Direct-P forward: tensor maps, grid, shared memory.
#include <string>

#include "cuda/common/device_info.hpp"
#include "cuda/sm90/fwd/fp8_direct_p/consumer_count.hpp"
#include "cuda/sm90/fwd/fp8_direct_p/kernel.cuh"
#include "cuda/sm90/tensor_map.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::sm90::fwd {
namespace {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error("cuda", std::string(what) + ": " + cudaGetErrorString(err));
}

std::uint64_t u64(std::int64_t v) { return static_cast<std::uint64_t>(v); }

// O is stored by TMA (kernel.cuh) where its rows start on 16-byte boundaries,
// as TMA requires; otherwise by the threads, 4 bytes at a time.
bool o_rows_aligned(const Fp8ForwardArgs& a) {
  const std::uint64_t bits = reinterpret_cast<std::uintptr_t>(a.o) | u64(a.o_stride_b * 2) | u64(a.o_stride_s * 2) |
                             u64(a.o_stride_h * 2);
  return bits % 16 == 0;
}

template <int HeadDim, int kConsumers, PCode kPCode, bool kFp4In>
void run_kernel(const Fp8ForwardArgs& a, const CUtensorMap& tm_q, const CUtensorMap& tm_k, const CUtensorMap& tm_vt,
                cudaStream_t stream) {
  using Cfg = Fp8Config<HeadDim, kConsumers>;
  auto* kernel = &fp8_forward_kernel<HeadDim, kConsumers, kPCode, kFp4In>;
  constexpr int kSmem = smem_bytes<Cfg, kFp4In>();
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem), "cudaFuncSetAttribute");
  const dim3 grid((a.Sq + Cfg::kBlockQ - 1) / Cfg::kBlockQ, a.Hq, a.B);
  const bool o_by_tma = !kFp4In && o_rows_aligned(a);
  CUtensorMap tm_o{};
  if (o_by_tma)
    tm_o = make_byte_tensor_map(a.o, {u64(HeadDim * 2), u64(a.Sq), u64(a.Hq), u64(a.B)},
                                {u64(a.o_stride_s * 2), u64(a.o_stride_h * 2), u64(a.o_stride_b * 2)},
                                {OStaging<Cfg>::kBoxRowBytes, Cfg::kRowsPerConsumer, 1, 1}, TmaSwizzle::b128, "o");
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(a, tm_q, tm_k, tm_vt, tm_o, o_by_tma);
  check_cuda(cudaGetLastError(), "fp8_forward_kernel launch");
}

// Recipe mxfp4 from MXFP4 in memory (Fp8ForwardArgs::q_fp4): its two P codes only.
void check_fp4_inputs(const Fp8ForwardArgs& a) {
  if (a.p_code != PCode::mxfp4_direct_p && a.p_code != PCode::mxfp4_exp2)
    throw Error("p_code", "MXFP4 operands in memory serve recipe mxfp4's FP4 P only");
  if (a.k_fp4 == nullptr || a.vt_fp4 == nullptr || a.q_fp4_scales == nullptr || a.k_fp4_scales == nullptr ||
      a.v_fp4_scales == nullptr)
    throw Error("q_fp4", "MXFP4 operands need Q, K and Vᵀ codes and scales together");
  if (a.v_fp4_tokens % 32 != 0 || a.v_fp4_tokens < a.Sk)
    throw Error("v_fp4_tokens", "must be Sk padded to a multiple of 32");
  if (a.q_scale_rows != 1) throw Error("q_scale_rows", "MXFP4 Q folds per row: must be 1");
}

bool three_consumers(const Fp8ForwardArgs& a) {
  return three_consumers_pay_off(a.B, a.Hq, a.Sq, a.mask != MaskKind::none, cuda_common::sm_count());
}

template <int HeadDim, int kConsumers, PCode kPCode>
void launch(const Fp8ForwardArgs& a, cudaStream_t stream) {
  using Cfg = Fp8Config<HeadDim, kConsumers>;
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
  run_kernel<HeadDim, kConsumers, kPCode, false>(a, tm_q, tm_k, tm_vt, stream);
}

template <PCode kPCode>
void launch_for_head_dim(const Fp8ForwardArgs& a, cudaStream_t stream) {
  if (a.D == 128) return launch<128, 2, kPCode>(a, stream);
  if (a.consumers == 3 || (a.consumers == 0 && three_consumers(a))) return launch<64, 3, kPCode>(a, stream);
  launch<64, 2, kPCode>(a, stream);
}

// MXFP4 in memory: Q and K come by plain bulk copies (their maps are unused);
// Vᵀ's codes by a dense TMA box of the tile's 128 keys (64 bytes) × D rows.
template <int HeadDim, PCode kPCode>
void launch_fp4(const Fp8ForwardArgs& a, cudaStream_t stream) {
  using Cfg = Fp8Config<HeadDim, 2>;
  const std::int64_t row = a.v_fp4_tokens / 2;
  const CUtensorMap tm_vt = make_byte_tensor_map(a.vt_fp4, {u64(row), u64(HeadDim), u64(a.Hkv), u64(a.B)},
                                                 {u64(row), u64(row * HeadDim), u64(row * HeadDim * a.Hkv)},
                                                 {Cfg::kBlockK / 2, HeadDim, 1, 1}, TmaSwizzle::none, "vt_fp4");
  run_kernel<HeadDim, 2, kPCode, true>(a, CUtensorMap{}, CUtensorMap{}, tm_vt, stream);
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
  if (a.consumers != 0 && a.consumers != 2 && a.consumers != 3)
    throw Error("consumers", "must be 0 (the launcher chooses), 2 or 3, got " + std::to_string(a.consumers));
  if (a.consumers == 3 && (a.D != 64 || a.q_fp4 != nullptr))
    throw Error("consumers", "three consumer warpgroups run at D = 64 from E4M3 in memory only");
  const bool d128 = a.D == 128;
  if (a.q_fp4 != nullptr) {
    check_fp4_inputs(a);
    if (a.p_code == PCode::mxfp4_direct_p)
      return d128 ? launch_fp4<128, PCode::mxfp4_direct_p>(a, stream)
                  : launch_fp4<64, PCode::mxfp4_direct_p>(a, stream);
    return d128 ? launch_fp4<128, PCode::mxfp4_exp2>(a, stream) : launch_fp4<64, PCode::mxfp4_exp2>(a, stream);
  }
  switch (a.p_code) {
    case PCode::direct_p: return launch_for_head_dim<PCode::direct_p>(a, stream);
    case PCode::exp2_cvt: return launch_for_head_dim<PCode::exp2_cvt>(a, stream);
    case PCode::mxfp4_direct_p: return launch_for_head_dim<PCode::mxfp4_direct_p>(a, stream);
    case PCode::mxfp4_exp2: return launch_for_head_dim<PCode::mxfp4_exp2>(a, stream);
  }
  throw Error("p_code", "unknown P code");
}

}  // namespace fp4attn::sm90::fwd

#ifdef FP4ATTN_FWD_TIMELINE
// dev/fwd_timeline reads the marks through these (timeline.cuh).
extern "C" __attribute__((visibility("default"))) int fp4attn_fwd_timeline_read(void* dst, unsigned long long bytes) {
  return static_cast<int>(cudaMemcpyFromSymbol(dst, fp4attn::sm90::fwd::timeline::marks, bytes));
}
extern "C" __attribute__((visibility("default"))) int fp4attn_fwd_timeline_clear() {
  void* at = nullptr;
  if (const cudaError_t err = cudaGetSymbolAddress(&at, fp4attn::sm90::fwd::timeline::marks); err != cudaSuccess)
    return static_cast<int>(err);
  return static_cast<int>(cudaMemset(at, 0, sizeof(fp4attn::sm90::fwd::timeline::marks)));
}
#endif
