// Host side of the FP8 forward's launch for one head dimension: tensor maps,
// grid and shared memory (launch_head_dim.hpp). Included by launch_d64.cu,
// launch_d64_three.cu, launch_d128.cu and launch_d256.cu only. Arguments were checked by
// forward_fp8 (launch.cu).
#pragma once

#include <string>

#include "cuda/common/device_info.hpp"
#include "cuda/common/device_memory.hpp"
#include "cuda/sm90/fwd/fp8_direct_p/consumer_count.hpp"
#include "cuda/sm90/fwd/fp8_direct_p/kernel.cuh"
#include "cuda/sm90/fwd/fp8_direct_p/launch_head_dim.hpp"
#include "cuda/sm90/tensor_map.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::sm90::fwd::fp8_launch {

using cuda_common::check_cuda;

inline std::uint64_t u64(std::int64_t v) { return static_cast<std::uint64_t>(v); }

// O is stored by TMA (kernel.cuh) where its rows start on 16-byte boundaries,
// as TMA requires; otherwise by the threads, 4 bytes at a time.
inline bool o_rows_aligned(const Fp8ForwardArgs& a) {
  const std::uint64_t bits = reinterpret_cast<std::uintptr_t>(a.o) | u64(a.o_stride_b * 2) | u64(a.o_stride_s * 2) |
                             u64(a.o_stride_h * 2);
  return bits % 16 == 0;
}

template <int HeadDim, int kConsumers, PCode kPCode, bool kFp4In, bool kNarrowD = false, int kUsedDim = HeadDim>
void run_kernel(const Fp8ForwardArgs& a, const CUtensorMap& tm_q, const CUtensorMap& tm_k, const CUtensorMap& tm_vt,
                cudaStream_t stream) {
  using Cfg = Fp8Config<HeadDim, kConsumers, kUsedDim>;
  // Calls with a window's left edge run the kernel that masks both bounds;
  // the others one whose masked tiles test the upper bound only (kernel.cuh).
  auto* kernel = a.window_left >= 0 ? &fp8_forward_kernel<HeadDim, kConsumers, kPCode, kFp4In, kNarrowD, kUsedDim, true>
                                    : &fp8_forward_kernel<HeadDim, kConsumers, kPCode, kFp4In, kNarrowD, kUsedDim, false>;
  constexpr int kSmem = smem_bytes<Cfg, kFp4In>();
  // FP4 P's fold table (p_operand.cuh) is static shared memory beside it.
  static_assert(kPCode != PCode::mxfp4_direct_p || kSmem + sizeof(PFoldTable) <= kSmemPerBlockLimit,
                "shared memory with FP4 P's fold table over budget");
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem), "cudaFuncSetAttribute");
  const dim3 grid((a.Sq + Cfg::kBlockQ - 1) / Cfg::kBlockQ * Cfg::kOSplits, a.Hq, a.B);
  // Packed sequences: one map over all lse_pitch token rows (a batch of one);
  // the kernel stores by TMA only the 64-row halves that end inside their
  // entry (the map would not clip at an entry's end), the rest by threads.
  const bool packed = a.cu_seqlens_q != nullptr;
  const bool o_by_tma = !kFp4In && o_rows_aligned(a);
  CUtensorMap tm_o{};
  if (o_by_tma) {
    const std::uint64_t rows = u64(packed ? a.lse_pitch : a.Sq), batches = packed ? 1 : u64(a.B);
    const std::uint64_t batch_bytes = packed ? rows * u64(a.o_stride_s * 2) : u64(a.o_stride_b * 2);
    tm_o = make_byte_tensor_map(a.o, {u64(a.D * 2), rows, u64(a.Hq), batches},
                                {u64(a.o_stride_s * 2), u64(a.o_stride_h * 2), batch_bytes},
                                {OStaging<Cfg>::kBoxRowBytes, Cfg::kRowsPerConsumer, 1, 1}, TmaSwizzle::b128, "o");
  }
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(a, tm_q, tm_k, tm_vt, tm_o, o_by_tma);
  check_cuda(cudaGetLastError(), "fp8_forward_kernel launch");
}

// Head dims 72 … 96 run on the 128-wide tiles with products over 96 channels.
inline constexpr int kNarrowProductDim = 96;

inline bool three_consumers(const Fp8ForwardArgs& a) {
  return three_consumers_pay_off(a.B, a.Hq, a.Sq, a.mask != MaskKind::none, cuda_common::sm_count());
}

inline bool one_consumer(const Fp8ForwardArgs& a) {
  return one_consumer_pays_off(a.Sk, a.D, a.mask != MaskKind::none, p_by_exp2(a.p_code));
}

// The maps describe the operands as they are in memory, a.D channels; the
// boxes are one panel of Q and K (HeadDim wide, 128 at D = 256) and the CTA's
// kOColumns rows of Vᵀ. For a narrower head dim (a multiple of 8, e.g. 32 or
// 40 on the 64-wide kernel, 72 or 96 on the 128-wide one, 160 on the 256-wide
// one; Q's and K's rows then at a pitch of whole 16 bytes) TMA
// fills the missing channels of Q and K, and Vᵀ's missing rows, with zeros:
// they add exact zeros to every score and give O columns that the TMA store
// (map a.D wide) clips and the threads' store skips (kernel.cuh, kNarrowD).
template <int HeadDim, int kConsumers, PCode kPCode, bool kNarrowD = false, int kUsedDim = HeadDim>
void launch(const Fp8ForwardArgs& a, cudaStream_t stream) {
  using Cfg = Fp8Config<HeadDim, kConsumers, kUsedDim>;
  constexpr TmaSwizzle kQk = Cfg::kQkPanelBytes == 128 ? TmaSwizzle::b128 : TmaSwizzle::b64;
  // Packed sequences: the operands are one batch entry of the tile-aligned
  // layout, or, for Q and K read in place, of the caller's packed tokens.
  const bool packed = a.cu_seqlens_q != nullptr;
  const std::int64_t batches = packed ? 1 : a.B;
  const std::int64_t q_tokens = !packed ? a.Sq : a.qk_in_place ? a.total_q : a.q_rows;
  const std::int64_t k_tokens = !packed ? a.Sk : a.qk_in_place ? a.total_k : a.k_rows;
  const CUtensorMap tm_q = make_byte_tensor_map(
      a.q, {u64(a.D), u64(q_tokens), u64(a.Hq), u64(batches)},
      {u64(a.q_stride_s), u64(a.q_stride_h), u64(a.q_stride_b)}, {Cfg::kQkPanelBytes, Cfg::kBlockQ, 1, 1}, kQk, "q");
  const CUtensorMap tm_k = make_byte_tensor_map(
      a.k, {u64(a.D), u64(k_tokens), u64(a.Hkv), u64(batches)},
      {u64(a.k_stride_s), u64(a.k_stride_h), u64(a.k_stride_b)}, {Cfg::kQkPanelBytes, Cfg::kBlockK, 1, 1}, kQk, "k");
  const std::int64_t vt_row = a.vt_keys;
  const CUtensorMap tm_vt = make_byte_tensor_map(
      a.vt, {u64(a.vt_keys), u64(a.D), u64(a.Hkv), u64(batches)},
      {u64(vt_row), u64(vt_row * a.D), u64(vt_row * a.D * a.Hkv)}, {Cfg::kBlockK, Cfg::kOColumns, 1, 1},
      TmaSwizzle::b128, "vt");
  run_kernel<HeadDim, kConsumers, kPCode, false, kNarrowD, kUsedDim>(a, tm_q, tm_k, tm_vt, stream);
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

// The one-consumer kernels (two CTAs an SM) of recipe fp8's P codes at D = 64,
// in a translation unit of their own (launch_d64_one.cu).
extern template void launch<64, 1, PCode::direct_p>(const Fp8ForwardArgs&, cudaStream_t);
extern template void launch<64, 1, PCode::exp2_cvt>(const Fp8ForwardArgs&, cudaStream_t);
// With exp2 P also at D = 128 (launch_d128_one.cu), recipe mxfp4's FP4 P too.
extern template void launch<128, 1, PCode::exp2_cvt>(const Fp8ForwardArgs&, cudaStream_t);
extern template void launch<128, 1, PCode::mxfp4_exp2>(const Fp8ForwardArgs&, cudaStream_t);

// E4M3 Q, K and Vᵀ in memory; at D = 64 with one, two or three consumers (at
// D = 128 with exp2 P one or two), and so
// narrower head dims on it; those above 64 on the 128-wide kernel (recipe
// fp8's P codes only, launch.cu), up to 96 with the products over 96
// channels (Fp8Config's UsedDim).
template <int HeadDim, PCode kPCode>
void launch_e4m3_inputs(const Fp8ForwardArgs& a, cudaStream_t stream) {
  // The launcher's choice at D = 64: three consumers where they pay off, else
  // one where a CTA's keys are few or P comes by exp2, else two (perf log
  // sc1, sc2, sc3); at D = 128 one with P by exp2, FP8 or FP4, else two (sc3, mx11).
  if constexpr ((kPCode == PCode::direct_p || kPCode == PCode::exp2_cvt) && HeadDim == 64)
    if (a.D == HeadDim && (a.consumers == 1 || (a.consumers == 0 && one_consumer(a) && !three_consumers(a))))
      return launch<64, 1, kPCode>(a, stream);
  if constexpr (p_by_exp2(kPCode) && HeadDim == 128)
    if (a.D == HeadDim && (a.consumers == 1 || (a.consumers == 0 && one_consumer(a))))
      return launch<128, 1, kPCode>(a, stream);
  if constexpr (kPCode == PCode::direct_p || kPCode == PCode::exp2_cvt)
    if (a.D != HeadDim) {
      if constexpr (HeadDim == 64)
        if (a.consumers == 3 || (a.consumers == 0 && three_consumers(a))) return launch<64, 3, kPCode, true>(a, stream);
      if constexpr (HeadDim == 128)
        if (a.D <= kNarrowProductDim) return launch<128, 2, kPCode, true, kNarrowProductDim>(a, stream);
      return launch<HeadDim, 2, kPCode, true>(a, stream);
    }
  if constexpr (HeadDim == 64)
    if (a.consumers == 3 || (a.consumers == 0 && three_consumers(a))) return launch<64, 3, kPCode>(a, stream);
  launch<HeadDim, 2, kPCode>(a, stream);
}

// Every kernel of one head dimension: MXFP4 operands (recipe mxfp4 expanded
// in the kernel) or E4M3 ones, by the P code. At D = 256 from E4M3 in
// memory only (recipe fp8, and the MX recipes folded into E4M3; launch.cu checks).
template <int HeadDim>
void launch_head_dim(const Fp8ForwardArgs& a, cudaStream_t stream) {
  if constexpr (HeadDim != 256) {
    if (a.q_fp4 != nullptr) {
      if (a.p_code == PCode::mxfp4_direct_p) return launch_fp4<HeadDim, PCode::mxfp4_direct_p>(a, stream);
      return launch_fp4<HeadDim, PCode::mxfp4_exp2>(a, stream);
    }
  }
  switch (a.p_code) {
    case PCode::direct_p: return launch_e4m3_inputs<HeadDim, PCode::direct_p>(a, stream);
    case PCode::exp2_cvt: return launch_e4m3_inputs<HeadDim, PCode::exp2_cvt>(a, stream);
    case PCode::mxfp4_direct_p: return launch_e4m3_inputs<HeadDim, PCode::mxfp4_direct_p>(a, stream);
    case PCode::mxfp4_exp2: return launch_e4m3_inputs<HeadDim, PCode::mxfp4_exp2>(a, stream);
  }
  throw Error("p_code", "unknown P code");
}

}  // namespace fp4attn::sm90::fwd::fp8_launch

namespace fp4attn::sm90::fwd {

template <int HeadDim>
void forward_fp8_head_dim(const Fp8ForwardArgs& args, cudaStream_t stream) {
  fp8_launch::launch_head_dim<HeadDim>(args, stream);
}

#ifdef FP4ATTN_FWD_TIMELINE
template <int HeadDim, int Consumers>
cudaError_t timeline_read(void* dst, unsigned long long bytes) {
  return cudaMemcpyFromSymbol(dst, timeline::marks, bytes);
}
template <int HeadDim, int Consumers>
cudaError_t timeline_clear() {
  void* at = nullptr;
  if (const cudaError_t err = cudaGetSymbolAddress(&at, timeline::marks); err != cudaSuccess) return err;
  return cudaMemset(at, 0, sizeof(timeline::marks));
}
#endif

}  // namespace fp4attn::sm90::fwd
