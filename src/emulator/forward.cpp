// Emulator forward: the kernels' tiled online-softmax algorithm on the CPU.
//
// One work item is what one kernel thread block does: a (batch, query head,
// query tile of block_q rows) triple. It walks the key tiles of block_k keys
// that its rows can see and, per tile and row:
//   S = Q·Kᵀ            with the operands and the accumulation the tensor core has
//   m_new = max(m, max_j s·c)  c = softmax scale · log2 e (· the Q, K factors, as the kernel folds them)
//   u = s·c − m_new, P = codes of u (Direct-P or exp2 + quantizer)
//   l = l·alpha + Σ P,  O = O·alpha + P·V,  alpha = 2^(m − m_new)
// (on sm90 FP8, Σ P is a column of ones in the same tensor-core product as P·V)
// and the epilogue divides by l, applies V's per-channel factors and rounds O
// to bf16. Every rounding rule comes from formats.hpp / direct_p.hpp, the
// functions the CUDA kernels call.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "emulator/checks.hpp"
#include "emulator/numerics.hpp"
#include "emulator/operands.hpp"
#include "emulator/p_row.hpp"
#include "emulator/parallel.hpp"
#include "emulator/scores.hpp"
#include "emulator/tensor_core.hpp"
#include "fp4attn/direct_p.hpp"
#include "fp4attn/emulator.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::emulator {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void check_quantized(const QuantizedTensor& t, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D,
                     TensorFormat format, const char* name) {
  if (t.B != B || t.S != S || t.H != H || t.D != D || t.format != format ||
      static_cast<std::int64_t>(t.codes.size()) != t.numel())
    throw Error(name, "quantized tensor does not match the shape and the recipe's format");
}

// Everything a work item reads, prepared once per call.
struct Problem {
  AttentionShape shape;
  AttentionOptions opt;
  const QuantizedInputs* in = nullptr;
  QkOperand q, k;
  VOperand v;
  PConfig p;
  float scale = 0.0f;       // softmax scale
  float scale_log2 = 0.0f;  // softmax scale · log2(e): the whole softmax runs in base 2
  float offset = 0.0f;      // log2 of the factor the P values carry
  bool fp8_mma = false;     // both products follow the sm90 FP8 wgmma model (tensor_core.hpp)
  std::vector<float> v_exponents;  // e4m3_exponent of v.values, when fp8_mma
};

// Scratch of one work item, sized for one tile.
struct TileScratch {
  TileScratch(std::int64_t D, std::int64_t block_q, std::int64_t block_k)
      : keys(D, block_k),
        partial(static_cast<std::size_t>(D)),
        s(static_cast<std::size_t>(block_k)),
        u(static_cast<std::size_t>(block_k)),
        p(static_cast<std::size_t>(block_k)),
        p_block(static_cast<std::size_t>(block_k / kMxfp4Block + 1)),
        p_exponents(static_cast<std::size_t>(kFp8MmaK)),
        ones(static_cast<std::size_t>(kFp8MmaK), 1.0f),
        ones_exponents(static_cast<std::size_t>(kFp8MmaK)),
        mma_scratch(static_cast<std::size_t>(2 * D)),
        o_tile(static_cast<std::size_t>(D)),
        o_acc(static_cast<std::size_t>(block_q * D)),
        m(static_cast<std::size_t>(block_q)),
        l(static_cast<std::size_t>(block_q)) {
    e4m3_exponents(ones.data(), kFp8MmaK, ones_exponents.data());
  }

  KeyTile keys;
  std::vector<float> partial;    // (D): one 32-key block's partial P·V sums
  std::vector<float> s;          // (block_k) scores of one row
  std::vector<float> u;          // (block_k) log2-domain scores
  std::vector<float> p;          // (block_k) P values
  std::vector<float> p_block;    // (block_k / 32) P block factors
  std::vector<float> p_exponents;  // (32) one k32 step's P exponents, for the FP8 wgmma model
  std::vector<float> ones, ones_exponents;  // (32) the ones column of the kernel's Vᵀ and its exponents
  float l_tile = 0.0f;             // one row's Σ P for this tile, as the FP8 wgmma model adds it
  std::vector<float> mma_scratch;  // (2 · D) scratch of fp8_mma_step
  std::vector<float> o_tile;     // (D) one row's P·V for this tile
  std::vector<float> o_acc;      // (block_q, D)
  std::vector<float> m, l;       // (block_q) running max (log2 domain) and row sum
};

// The kernel's P·V for one tile: a fresh accumulator, then one wgmma k32 step
// per 32 keys. The kernel feeds each group's keys in the order of the
// quantizer's Vᵀ permutation; the fused sum of a step does not depend on the
// order of its 32 products, so key order serves as well. The kernel's B
// operand carries a column of ones after V's D columns: l_tile is that
// column's result, Σ P summed by the same model.
void fp8_mma_pv_row(const Problem& pb, std::int64_t b, std::int64_t hkv, std::int64_t j0, std::int64_t kn,
                    TileScratch& t) {
  const VOperand& v = pb.v;
  const std::int64_t D = v.D;
  for (std::int64_t k0 = 0; k0 < kn; k0 += kFp8MmaK) {
    const int terms = static_cast<int>(std::min<std::int64_t>(kFp8MmaK, kn - k0));
    e4m3_exponents(&t.p[k0], terms, t.p_exponents.data());
    const std::int64_t first = v.values_of(b, hkv, j0 + k0) - v.values.data();
    fp8_mma_step(&t.p[k0], t.p_exponents.data(), &v.values[first], &pb.v_exponents[first], D, terms, D,
                 t.o_tile.data(), t.mma_scratch.data());
    fp8_mma_step(&t.p[k0], t.p_exponents.data(), t.ones.data(), t.ones_exponents.data(), 1, terms, 1, &t.l_tile,
                 t.mma_scratch.data());
  }
}

// o_tile = P·V for one row against key tile [j0, j0 + kn), before the row factor.
void pv_row(const Problem& pb, std::int64_t b, std::int64_t hkv, std::int64_t j0, std::int64_t kn, TileScratch& t) {
  const VOperand& v = pb.v;
  const std::int64_t D = v.D;
  std::fill(t.o_tile.begin(), t.o_tile.end(), 0.0f);
  t.l_tile = 0.0f;
  if (pb.fp8_mma) return fp8_mma_pv_row(pb, b, hkv, j0, kn, t);
  // Block-scaled V (MXFP4 on sm100) sums 32 keys at a time, then applies
  // 2^(Ep + Ev); every other operand is one block spanning the tile.
  const std::int64_t block = v.block > 0 ? v.block : kn;
  for (std::int64_t k0 = 0; k0 < kn; k0 += block) {
    const std::int64_t k1 = std::min(kn, k0 + block);
    float* acc = v.block > 0 ? t.partial.data() : t.o_tile.data();
    if (v.block > 0) std::fill_n(t.partial.begin(), D, 0.0f);
    for (std::int64_t j = k0; j < k1; ++j) {
      const float p = t.p[j];
      if (p == 0.0f) continue;  // adds exact zeros only
      const float* vr = v.values_of(b, hkv, j0 + j);
      for (std::int64_t d = 0; d < D; ++d) acc[d] += p * vr[d];
    }
    if (v.block > 0) {
      const float pf = t.p_block[k0 / v.block];
      const float* vb = &v.block_factor[(v.head(b, hkv) * ceil_div(v.S, v.block) + (j0 + k0) / v.block) * D];
      for (std::int64_t d = 0; d < D; ++d) t.o_tile[d] += t.partial[d] * (pf * vb[d]);
    }
  }
}

void run_query_tile(const Problem& pb, std::int64_t item, TileScratch& t, ForwardResult& out) {
  const AttentionShape& sh = pb.shape;
  const std::int64_t block_q = pb.opt.block_q, block_k = pb.opt.block_k, D = sh.D;
  const std::int64_t q_tiles = ceil_div(sh.Sq, block_q);
  const std::int64_t qt = item % q_tiles, hq = (item / q_tiles) % sh.Hq, b = item / (q_tiles * sh.Hq);
  const std::int64_t hkv = hq / sh.group();  // GQA: a group of query heads shares one kv head
  const std::int64_t i0 = qt * block_q, rows = std::min(block_q, sh.Sq - i0);

  std::fill(t.m.begin(), t.m.end(), kNegInf);
  std::fill(t.l.begin(), t.l.end(), 0.0f);
  std::fill(t.o_acc.begin(), t.o_acc.end(), 0.0f);
  // The rows' keys lie between the first row's first and the last row's end
  // (recipe.hpp); the kernel skips the tiles outside, so the model does. A
  // tile inside that a row does not see leaves its m, l and O as they were,
  // in the kernel too (all of its P codes are 0).
  const std::int64_t keys_first = visible_keys(pb.opt, sh.Sq, sh.Sk, i0).first;
  const std::int64_t keys_end = visible_keys(pb.opt, sh.Sq, sh.Sk, i0 + rows - 1).end;
  for (std::int64_t j0 = keys_first / block_k * block_k; j0 < keys_end; j0 += block_k) {
    const std::int64_t kn = std::min(block_k, sh.Sk - j0);
    load_key_tile(pb.k, b, hkv, j0, kn, t.keys);
    for (std::int64_t r = 0; r < rows; ++r) {
      const TileKeys seen = keys_in_tile(visible_keys(pb.opt, sh.Sq, sh.Sk, i0 + r), j0, kn);
      if (seen.hi <= seen.lo) continue;  // fully masked for this row: m, l, O unchanged
      // c turns s into the log2 domain: the kernel's one multiplier (scales · softmax scale · log2 e).
      // A product that underflows to 0 (MXFP4 fold factors of an all-zero Q row and K tile, 2^-133
      // each) becomes the smallest subnormal, as in the kernels: masked scores stay −inf instead
      // of −inf·0 = NaN.
      float c = score_row(pb.q, b, hq, i0 + r, t.keys, pb.fp8_mma, t.s.data()) * pb.scale_log2;
      if (c == 0.0f) c = std::numeric_limits<float>::denorm_min();
      float tile_max = kNegInf;
      for (std::int64_t j = 0; j < kn; ++j) {
        if (j < seen.lo || j >= seen.hi) t.s[j] = kNegInf;
        else tile_max = std::max(tile_max, t.s[j] * c);
      }
      const float m_new = std::max(t.m[r], tile_max);
      for (std::int64_t j = 0; j < kn; ++j) t.u[j] = direct_p::log2_score(t.s[j], c, m_new);
      const float alpha = exp2f(t.m[r] - m_new);  // 0 on the row's first tile (m = −inf)
      const PRowResult p = make_p_row(pb.p, std::span<const float>(t.u.data(), kn),
                                      MufuInputs{std::span<const float>(t.s.data(), kn), c, m_new}, j0,
                                      std::span<float>(t.p.data(), kn), std::span<float>(t.p_block));
      pv_row(pb, b, hkv, j0, kn, t);
      float* o = &t.o_acc[r * D];
      if (pb.fp8_mma) {  // the kernel's one FFMA: O·alpha + tile, l·alpha + the tensor core's Σ P
        for (std::int64_t d = 0; d < D; ++d) o[d] = std::fma(o[d], alpha, t.o_tile[d] * p.row_factor);
        t.l[r] = std::fma(t.l[r], alpha, t.l_tile * p.row_factor);
      } else {
        for (std::int64_t d = 0; d < D; ++d) o[d] = o[d] * alpha + t.o_tile[d] * p.row_factor;
        t.l[r] = t.l[r] * alpha + p.sum;
      }
      t.m[r] = m_new;
    }
  }

  const float* v_col = &pb.v.col_factor[pb.v.head(b, hkv) * D];
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = i0 + r;
    float* o_out = &out.o[bshd_index(sh.Sq, sh.Hq, D, b, i, hq, 0)];
    float& lse = out.lse[(b * sh.Hq + hq) * sh.Sq + i];
    if (!(t.l[r] > 0.0f)) {  // no visible key: O = 0, LSE = −inf
      std::fill_n(o_out, D, 0.0f);
      lse = kNegInf;
      continue;
    }
    const float inv_l = 1.0f / t.l[r];
    for (std::int64_t d = 0; d < D; ++d) o_out[d] = round_to_bf16(t.o_acc[r * D + d] * inv_l * v_col[d]);
    // l sums 2^(u + offset) with u = s·scale_log2 − m, so log2 Σ 2^(s·scale_log2) = m + log2 l − offset;
    // the smooth_k shift is added back so LSE is that of the original scores.
    lse = (t.m[r] + std::log2(t.l[r]) - pb.offset) * kLn2 + smooth_k_shift(*pb.in, sh, pb.scale, b, hq, i);
  }
}

}  // namespace

QuantizedInputs quantize_inputs(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                                std::span<const float> v, const AttentionOptions& opt) {
  check_problem(shape, opt);
  check_element_count(q.size(), shape.q_elems(), "q");
  check_element_count(k.size(), shape.kv_elems(), "k");
  check_element_count(v.size(), shape.kv_elems(), "v");
  const RecipeSpec spec = spec_of(opt.recipe);
  QuantizeOptions qo;
  qo.mx_scale_rule = opt.mx_scale_rule;
  QuantizedInputs in;
  // FP8 Q and K scales cover one kernel tile of tokens, so each tile of S has
  // a single scale product.
  qo.fp8_token_block = opt.block_q;
  in.q = quantize(q, shape.B, shape.Sq, shape.Hq, shape.D, spec.qk, BlockAxis::along_d, qo, "q");
  qo.fp8_token_block = opt.block_k;
  if (opt.smooth_k) {
    require_finite(k, "k");  // the mean of a non-finite K would hide which element was bad
    in.k_mean = sequence_mean(k, shape.B, shape.Sk, shape.Hkv, shape.D);
    const std::vector<float> smoothed = subtract_sequence_mean(k, in.k_mean, shape.B, shape.Sk, shape.Hkv, shape.D);
    in.k = quantize(smoothed, shape.B, shape.Sk, shape.Hkv, shape.D, spec.qk, BlockAxis::along_d, qo, "k");
  } else {
    in.k = quantize(k, shape.B, shape.Sk, shape.Hkv, shape.D, spec.qk, BlockAxis::along_d, qo, "k");
  }
  in.v = quantize(v, shape.B, shape.Sk, shape.Hkv, shape.D, spec.v, BlockAxis::along_s, qo, "v");
  return in;
}

ForwardResult forward(const AttentionShape& shape, const QuantizedInputs& in, const AttentionOptions& opt) {
  check_problem(shape, opt);
  const RecipeSpec spec = spec_of(opt.recipe);
  check_quantized(in.q, shape.B, shape.Sq, shape.Hq, shape.D, spec.qk, "q");
  check_quantized(in.k, shape.B, shape.Sk, shape.Hkv, shape.D, spec.qk, "k");
  check_quantized(in.v, shape.B, shape.Sk, shape.Hkv, shape.D, spec.v, "v");
  if (!in.k_mean.empty()) check_element_count(in.k_mean.size(), shape.B * shape.Hkv * shape.D, "k_mean");

  Problem pb;
  pb.shape = shape;
  pb.opt = opt;
  pb.in = &in;
  pb.q = qk_operand(in.q, opt.target, 1);             // sm90 fold: one factor per query row
  pb.k = qk_operand(in.k, opt.target, opt.block_k);   // sm90 fold: one factor per key tile
  pb.v = v_operand(in.v, opt.target);
  pb.p = PConfig{spec.p, opt.target, opt.direct_p, opt.mx_scale_rule};
  pb.scale = resolve_softmax_scale(opt.softmax_scale, shape.D);
  pb.scale_log2 = pb.scale * direct_p::kLog2e;
  pb.offset = p_offset(spec.p);
  pb.fp8_mma = uses_fp8_mma_model(opt);
  if (pb.fp8_mma) {
    pb.v_exponents.resize(pb.v.values.size());
    e4m3_exponents(pb.v.values.data(), static_cast<std::int64_t>(pb.v.values.size()), pb.v_exponents.data());
  }

  ForwardResult out{std::vector<float>(static_cast<std::size_t>(shape.q_elems())),
                    std::vector<float>(static_cast<std::size_t>(shape.lse_elems()))};
  const std::int64_t items = shape.B * shape.Hq * ceil_div(shape.Sq, opt.block_q);
  parallel_for(items, opt.threads, [&](std::int64_t item) {
    // Allocating per item costs little next to a tile's arithmetic.
    TileScratch t(shape.D, opt.block_q, opt.block_k);
    run_query_tile(pb, item, t, out);
  });
  return out;
}

ForwardResult forward(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                      std::span<const float> v, const AttentionOptions& opt) {
  if (shape.D % kChannelBlock == 0) return forward(shape, quantize_inputs(shape, q, k, v, opt), opt);
  // Scale blocks run 32 channels along D: another D runs padded up to them.
  const ChannelPadded p = channel_padded(shape, opt, q, k, v);
  const auto pad = [&](std::span<const float> x) { return append_zero_channels(x, shape.D, p.shape.D); };
  ForwardResult r = forward(p.shape, pad(q), pad(k), pad(v), p.opt);
  r.o = first_channels(r.o, p.shape.D, shape.D);
  return r;
}

}  // namespace fp4attn::emulator
