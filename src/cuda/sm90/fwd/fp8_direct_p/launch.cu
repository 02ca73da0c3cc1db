// Entry of the FP8 Direct-P forward: checks the arguments, then hands the
// call to the launcher of its head dimension (launch_head_dim.hpp).
#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/sm90/fwd/fp8_direct_p/launch_head_dim.hpp"
#include "cuda/sm90/fwd/fwd.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::sm90::fwd {
namespace {

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

}  // namespace

void forward_fp8(const Fp8ForwardArgs& args, cudaStream_t stream) {
  Fp8ForwardArgs a = args;
  if (a.vt_keys % kVtKeyAlign != 0 || a.vt_keys < a.Sk)
    throw Error("vt", "Vᵀ rows must hold Sk keys padded to a multiple of " + std::to_string(kVtKeyAlign));
  if (a.Hkv <= 0 || a.Hq % a.Hkv != 0) throw Error("Hkv", "Hq must be a multiple of Hkv");
  if (a.o_stride_s % 2 != 0 || a.o_stride_h % 2 != 0 || a.o_stride_b % 2 != 0)
    throw Error("o", "element strides must be even (the kernel stores bf16 pairs)");
  if (!(a.softmax_scale > 0.0f)) throw Error("softmax_scale", "must be positive");
  if (a.q_scale_rows != 1 && a.q_scale_rows != kVtKeyAlign)
    throw Error("q_scale_rows", "must be 1 (MX Q folded per row) or 128 (the fp8 recipe's token block)");
  // Narrower head dims (multiples of 8, their code rows at strides of 16-byte
  // multiples for TMA: Fp8Buffers::code_pitch) run on the 64- or 128-wide
  // kernel from E4M3 in memory with FP8 P, recipe fp8 (zero channels by TMA,
  // launch_head_dim.cuh). D = 256 runs on the 256-wide kernel (its O split
  // over two CTAs, Fp8Config) from E4M3 in memory; the multiples of 8 between
  // 128 and 256 on it with FP8 P only, as the narrower ones on the 64- and
  // 128-wide kernels.
  const bool own_width = a.D == 64 || a.D == 128 || (a.D == 256 && a.q_fp4 == nullptr);
  const bool fp8_p = a.p_code == PCode::direct_p || a.p_code == PCode::exp2_cvt;
  if (!own_width && !(a.D > 0 && a.D <= 256 && a.D % 8 == 0 && a.q_fp4 == nullptr && fp8_p))
    throw Error("D", "the sm90 fp8 kernel supports D = 64, 128 and 256 (256 from E4M3 in memory; other multiples "
                     "of 8 from E4M3 in memory with FP8 P), got " + std::to_string(a.D));
  const int head_dim = a.D <= 64 ? 64 : a.D <= 128 ? 128 : 256;
  // FP4ATTN_FWD_CONSUMERS (1, 2 or 3) picks the consumer count of the calls
  // that leave it to the launcher and have a kernel of that many, so that A/B
  // runs of the whole library (bench/) compare the kernels in one process.
  const bool one_consumer_kernel = a.q_fp4 == nullptr && ((a.D == 64 && fp8_p) || (a.D == 128 && p_by_exp2(a.p_code)));
  if (const char* forced = std::getenv("FP4ATTN_FWD_CONSUMERS"); forced != nullptr && a.consumers == 0) {
    const int n = std::atoi(forced);
    if (n == 2 || (n == 1 && one_consumer_kernel) || (n == 3 && head_dim == 64 && a.q_fp4 == nullptr)) a.consumers = n;
  }
  if (a.consumers < 0 || a.consumers > 3)
    throw Error("consumers", "must be 0 (the launcher chooses), 1, 2 or 3, got " + std::to_string(a.consumers));
  if (a.consumers == 3 && (head_dim != 64 || a.q_fp4 != nullptr))
    throw Error("consumers", "three consumer warpgroups run at D ≤ 64 from E4M3 in memory only");
  if (a.consumers == 1 && !one_consumer_kernel)
    throw Error("consumers", "one consumer warpgroup runs from E4M3 in memory at D = 64 with FP8 P and at "
                             "D = 128 with P by exp2 (FP8 or FP4) only");
  if (a.q_fp4 != nullptr) check_fp4_inputs(a);
  if ((a.cu_seqlens_q == nullptr) != (a.cu_seqlens_k == nullptr))
    throw Error("cu_seqlens", "packed sequences need both cu_seqlens_q and cu_seqlens_k");
  if (a.cu_seqlens_q != nullptr && (a.q_fp4 != nullptr || a.q_scale_rows != 128 || !fp8_p))
    throw Error("cu_seqlens", "packed sequences run recipe fp8's E4M3 operands only");
  if (a.cu_seqlens_q != nullptr && a.lse_pitch <= 0) throw Error("lse_pitch", "packed sequences need the LSE's pitch");
  if (a.cu_seqlens_q != nullptr &&
      (a.rows_q == nullptr || a.rows_k == nullptr || a.q_rows % kVtKeyAlign != 0 || a.k_rows % kVtKeyAlign != 0 ||
       a.q_rows < a.Sq || a.k_rows < a.Sk || a.vt_keys != a.k_rows))
    throw Error("rows", "packed sequences need their tile-aligned layout (rows_q, rows_k, q_rows, k_rows = vt_keys)");
  if (a.qk_in_place && (a.cu_seqlens_q == nullptr || a.total_q <= 0 || a.total_k <= 0))
    throw Error("qk_in_place", "reads packed sequences' Q and K in place: needs cu_seqlens, total_q and total_k");
  if (head_dim == 256) return forward_fp8_head_dim<256>(a, stream);
  if (head_dim == 128) return forward_fp8_head_dim<128>(a, stream);
  forward_fp8_head_dim<64>(a, stream);
}

}  // namespace fp4attn::sm90::fwd

#ifdef FP4ATTN_FWD_TIMELINE
// dev/fwd_timeline reads the marks of one head dimension's kernels through
// these (timeline.cuh). At D = 64 the two- and three-consumer kernels record
// into copies of their own; a CTA's marks are in the copy of the kernel that
// ran and the other copy holds zeros there, so the read adds the two.
extern "C" __attribute__((visibility("default"))) int fp4attn_fwd_timeline_read(int head_dim, void* dst,
                                                                                unsigned long long bytes) {
  using namespace fp4attn::sm90::fwd;
  if (head_dim == 128) return static_cast<int>(timeline_read<128, 2>(dst, bytes));
  if (const cudaError_t err = timeline_read<64, 2>(dst, bytes); err != cudaSuccess) return static_cast<int>(err);
  std::vector<unsigned long long> three(bytes / sizeof(unsigned long long));
  if (const cudaError_t err = timeline_read<64, 3>(three.data(), three.size() * sizeof(unsigned long long));
      err != cudaSuccess)
    return static_cast<int>(err);
  auto* marks = static_cast<unsigned long long*>(dst);
  for (std::size_t i = 0; i < three.size(); ++i) marks[i] += three[i];
  return 0;
}
extern "C" __attribute__((visibility("default"))) int fp4attn_fwd_timeline_clear(int head_dim) {
  using namespace fp4attn::sm90::fwd;
  if (head_dim == 128) return static_cast<int>(timeline_clear<128, 2>());
  if (const cudaError_t err = timeline_clear<64, 2>(); err != cudaSuccess) return static_cast<int>(err);
  return static_cast<int>(timeline_clear<64, 3>());
}
#endif
