// Emulator backward (recipes fp8 and mxfp4_train, DESIGN §5): FP8 gradients.
//
// Per (query tile, key tile) pair, as the kernel does it:
//   S  = Q·Kᵀ recomputed from the quantized operands of the forward (MXFP4
//        Q on sm90: folded per query tile, not per row, see backward())
//   P  = Direct-P E4M3 code of u = s·scale_log2 − lse·log2(e), i.e. 2^(u+8)/256
//   dP = dO·Vᵀ           (FP8 × FP8, fp32)
//   dS = P ⊙ (dP − D),   D = rowsum(dO ⊙ O) from the unquantized dO and bf16 O
//   dS → FP8 (E4M3 or E5M2) with fp32 scales: for dK one per pair, for dQ one
//        per opt.dq_ds_rows query rows (the dQ kernel's consumer warpgroup)
//   dV += Pᵀ·dO, dK += scale·dSᵀ·Q, dQ += scale·dS·K  (FP8 operands, fp32 accumulation)
// The kernels accumulate dQ across key tiles with atomics or a reduction; to
// stay deterministic the emulator runs two passes over the same pairs, one
// owning each query tile (dQ) and one owning each key tile (dK, dV, summed over
// the GQA group). Both passes call the same pair function, so they see
// identical P and unquantized dS; each quantizes dS in its own scale blocks.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "emulator/checks.hpp"
#include "emulator/ex2_sm90.hpp"
#include "emulator/numerics.hpp"
#include "emulator/operands.hpp"
#include "emulator/parallel.hpp"
#include "emulator/scores.hpp"
#include "emulator/tensor_core.hpp"
#include "fp4attn/direct_p.hpp"
#include "fp4attn/emulator.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::emulator {
namespace {

// P = 2^(u + 8) / 256: the E4M3 code stands for 2^(u+8), the 2^-8 stays outside.
const float kPUnscale = exp2i(-static_cast<int>(direct_p::kFp8Offset));

// Row-major operand of a gradient product: per-element values the FP8 MMA
// multiplies and one factor per row (the FP8 token-block scale). MXFP4 Q and K
// (mxfp4_train) enter, for target sm100, with their exact dequantized values
// and factor 1; for target sm90 folded into E4M3 with one power of two per
// tile (tile_folded below).
struct PlainOperand {
  std::int64_t H = 0, S = 0, D = 0;
  std::vector<float> values;  // (B, H, S, D)
  std::vector<float> factor;  // (B, H, S)
  const float* row(std::int64_t b, std::int64_t h, std::int64_t s) const { return &values[((b * H + h) * S + s) * D]; }
  float factor_of(std::int64_t b, std::int64_t h, std::int64_t s) const { return factor[(b * H + h) * S + s]; }
};

PlainOperand plain_operand(const QuantizedTensor& t) {
  PlainOperand op{t.H, t.S, t.D, std::vector<float>(static_cast<std::size_t>(t.numel())),
                  std::vector<float>(static_cast<std::size_t>(t.B * t.H * t.S), 1.0f)};
  const bool fp8 = t.format == TensorFormat::fp8_e4m3;
  for (std::int64_t b = 0; b < t.B; ++b)
    for (std::int64_t h = 0; h < t.H; ++h)
      for (std::int64_t s = 0; s < t.S; ++s) {
        float* out = &op.values[((b * t.H + h) * t.S + s) * t.D];
        if (fp8) op.factor[(b * t.H + h) * t.S + s] = t.scales[t.scale_index(b, s, h, 0)];
        for (std::int64_t d = 0; d < t.D; ++d)
          out[d] = fp8 ? decode(ElemFormat::e4m3, t.codes[bshd_index(t.S, t.H, t.D, b, s, h, d)]) : t.value(b, s, h, d);
      }
  return op;
}

// The sm90 operand of a tile-folded MXFP4 Q or K (qk_operand with fold_rows =
// the tile): E4M3 values and one factor per tile, as the fp8 recipe's codes
// and token-block scales. A gradient product reduces over tokens (dK = dSᵀ·Q,
// dQ = dS·K), so a factor must be constant over the tile to come out of the
// sum: the forward's per-row fold of Q would not.
PlainOperand tile_folded(const QkOperand& t) {
  for (float f : t.block_factor)
    if (f != 1.0f) throw Error("t", "a tile-folded operand has one factor per row, none per block");
  return PlainOperand{t.H, t.S, t.D, t.values, t.row_factor};
}

struct Problem {
  AttentionShape shape;
  AttentionOptions opt;
  QkOperand q_s, k_s;          // S recomputation: the forward's operands
  PlainOperand q, k;           // dK = dSᵀ·Q, dQ = dS·K
  PlainOperand d_o, v;         // dP = dO·Vᵀ (V re-quantized per key tile along D)
  std::vector<float> delta;    // (B, Hq, Sq) D = rowsum(dO ⊙ O)
  std::vector<float> lse_log2; // (B, Hq, Sq) log2-domain LSE of the smoothed scores
  ElemFormat ds_format = ElemFormat::e4m3;
  float ds_max = kE4M3Max;
  float scale = 0.0f, scale_log2 = 0.0f;
};

// P (E4M3 values, 2^-8 outside) and quantized dS of one (query tile, key tile) pair.
struct PairTile {
  std::int64_t rows = 0, kn = 0, block_k = 0;
  std::vector<float> p, ds;    // (block_q, block_k)
  std::vector<float> ds_scale; // (block_q): the scale of each row's dS block
  KeyTile keys;
  KeyTile values;  // V's rows as a key tile: the B operand of dP = dO·Vᵀ in the FP8 wgmma model
  std::vector<float> s, dp;
  PairTile(std::int64_t D, std::int64_t block_q, std::int64_t bk)
      : block_k(bk),
        p(static_cast<std::size_t>(block_q * bk)),
        ds(static_cast<std::size_t>(block_q * bk)),
        ds_scale(static_cast<std::size_t>(block_q), 1.0f),
        keys(D, bk),
        values(D, bk),
        s(static_cast<std::size_t>(bk)),
        dp(static_cast<std::size_t>(bk)) {}
};

// V rows [j0, j0 + kn) of kv head h in the (D, block_k) layout of a key tile,
// with their E4M3 exponents.
void load_value_tile(const PlainOperand& v, std::int64_t b, std::int64_t h, std::int64_t j0, std::int64_t kn,
                     KeyTile& t) {
  const std::int64_t D = v.D, bk = t.block_k;
  t.kn = kn;
  for (std::int64_t j = 0; j < kn; ++j) {
    const float* row = v.row(b, h, j0 + j);
    for (std::int64_t d = 0; d < D; ++d) t.values[d * bk + j] = row[d];
  }
  for (std::int64_t d = 0; d < D; ++d) e4m3_exponents(&t.values[d * bk], kn, &t.exponents[d * bk]);
}

// dS is quantized in blocks of `ds_rows` consecutive rows of the pair (all of
// its keys): the whole pair for dK, a consumer's rows for the dQ kernel.
void compute_pair(const Problem& pb, std::int64_t b, std::int64_t hq, std::int64_t i0, std::int64_t rows,
                  std::int64_t j0, std::int64_t kn, std::int64_t ds_rows, PairTile& t) {
  const AttentionShape& sh = pb.shape;
  const std::int64_t hkv = hq / sh.group(), bk = t.block_k, D = sh.D;
  t.rows = rows, t.kn = kn;
  load_key_tile(pb.k_s, b, hkv, j0, kn, t.keys);
  // On sm90 dP = dO·Vᵀ runs on FP8 wgmma: its sum is the tensor core's, k32
  // step by step from zero (the same model as S), and dP·f − Δ one FFMA, as in
  // the kernels; dS codes then match the GPU's wherever P and Δ do.
  const bool mma = uses_fp8_mma_model(pb.opt);
  if (mma) load_value_tile(pb.v, b, hkv, j0, kn, t.values);
  std::vector<float>& row_amax = t.ds_scale;  // each row's largest |dS| first, its block's scale below
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = i0 + r, row = (b * sh.Hq + hq) * sh.Sq + i;
    row_amax[r] = 0.0f;
    const TileKeys seen = keys_in_tile(visible_keys(pb.opt, sh.Sq, sh.Sk, i), j0, kn);
    float* p = &t.p[r * bk];
    float* ds = &t.ds[r * bk];
    std::fill_n(p, kn, 0.0f);
    std::fill_n(ds, kn, 0.0f);
    if (seen.hi <= seen.lo || !std::isfinite(pb.lse_log2[row])) continue;  // no visible key: P = dS = 0
    // Same accumulation as the forward, so P is recomputed from the scores its LSE saw.
    const float c = score_row(pb.q_s, b, hq, i, t.keys, uses_fp8_mma_model(pb.opt), t.s.data()) * pb.scale_log2;
    const float* dov = pb.d_o.row(b, hq, i);
    const float dof = pb.d_o.factor_of(b, hq, i);
    if (mma) {
      float* dov_exp = t.values.q_exponents.data();
      e4m3_exponents(dov, D, dov_exp);
      std::fill_n(t.dp.data(), kn, 0.0f);
      for (std::int64_t d = 0; d < D; d += kFp8MmaK)
        fp8_mma_step(dov + d, dov_exp + d, &t.values.values[d * bk], &t.values.exponents[d * bk], bk, kFp8MmaK, kn,
                     t.dp.data(), t.values.mma_scratch.data());
    }
    for (std::int64_t j = seen.lo; j < seen.hi; ++j) {
      const float u = direct_p::log2_score(t.s[j], c, pb.lse_log2[row]);
      p[j] = decode(ElemFormat::e4m3, pb.opt.direct_p ? direct_p::fp8_code(u) : fp8_code_exp2(pb.opt.target, u));
      const float dp_factor = dof * pb.v.factor_of(b, hkv, j0 + j);
      float dp_minus_delta;
      if (mma) {
        dp_minus_delta = std::fma(t.dp[j], dp_factor, -pb.delta[row]);
      } else {
        // dP = dO·Vᵀ: exact E4M3 products summed in fp32, then both scales.
        const float* vv = pb.v.row(b, hkv, j0 + j);
        float acc = 0.0f;
        for (std::int64_t d = 0; d < D; ++d) acc += dov[d] * vv[d];
        dp_minus_delta = acc * dp_factor - pb.delta[row];
      }
      ds[j] = p[j] * kPUnscale * dp_minus_delta;
      row_amax[r] = std::max(row_amax[r], std::abs(ds[j]));
    }
  }
  // One fp32 scale per block maps its largest |dS| to the format's maximum.
  // The sm90 kernels multiply by the correctly rounded reciprocal instead of
  // dividing (at most an ulp apart), so the model does too.
  for (std::int64_t r0 = 0; r0 < rows; r0 += ds_rows) {
    const std::int64_t r1 = std::min(rows, r0 + ds_rows);
    const float amax = *std::max_element(row_amax.begin() + r0, row_amax.begin() + r1);
    const float block_scale = amax / pb.ds_max;
    const float scale = block_scale > 0.0f ? block_scale : 1.0f;
    const float inv = 1.0f / scale;
    for (std::int64_t r = r0; r < r1; ++r) {
      t.ds_scale[r] = scale;
      for (std::int64_t j = 0; j < kn; ++j) {
        float& x = t.ds[r * bk + j];
        x = round_to(pb.ds_format, mma ? x * inv : x / scale);
      }
    }
  }
}

// The keys a query tile's rows see together: from its first row's first to
// its last row's end (recipe.hpp).
KeyRange tile_keys(const Problem& pb, std::int64_t i0, std::int64_t rows) {
  return {visible_keys(pb.opt, pb.shape.Sq, pb.shape.Sk, i0).first,
          visible_keys(pb.opt, pb.shape.Sq, pb.shape.Sk, i0 + rows - 1).end};
}

void dq_item(const Problem& pb, std::int64_t item, std::vector<float>& dq) {
  const AttentionShape& sh = pb.shape;
  const std::int64_t bq = pb.opt.block_q, bk = pb.opt.block_k, D = sh.D, q_tiles = ceil_div(sh.Sq, bq);
  const std::int64_t qt = item % q_tiles, hq = (item / q_tiles) % sh.Hq, b = item / (q_tiles * sh.Hq);
  const std::int64_t hkv = hq / sh.group(), i0 = qt * bq, rows = std::min(bq, sh.Sq - i0);
  PairTile t(D, bq, bk);
  std::vector<float> acc(static_cast<std::size_t>(rows * D), 0.0f), part(static_cast<std::size_t>(D));
  const KeyRange keys = tile_keys(pb, i0, rows);
  for (std::int64_t j0 = keys.first / bk * bk; j0 < keys.end; j0 += bk) {
    const std::int64_t kn = std::min(bk, sh.Sk - j0);
    compute_pair(pb, b, hq, i0, rows, j0, kn, pb.opt.dq_ds_rows, t);
    // K's FP8 scale is one per key tile, so it factors out of the sum over keys.
    const float k_factor = pb.k.factor_of(b, hkv, j0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float factor = t.ds_scale[r] * k_factor;
      std::fill(part.begin(), part.end(), 0.0f);
      for (std::int64_t j = 0; j < kn; ++j) {
        const float ds = t.ds[r * bk + j];
        if (ds == 0.0f) continue;
        const float* kv = pb.k.row(b, hkv, j0 + j);
        for (std::int64_t d = 0; d < D; ++d) part[d] += ds * kv[d];
      }
      for (std::int64_t d = 0; d < D; ++d) acc[r * D + d] += part[d] * factor;
    }
  }
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t d = 0; d < D; ++d) dq[bshd_index(sh.Sq, sh.Hq, D, b, i0 + r, hq, d)] = pb.scale * acc[r * D + d];
}

void dkv_item(const Problem& pb, std::int64_t item, std::vector<float>& dk, std::vector<float>& dv) {
  const AttentionShape& sh = pb.shape;
  const std::int64_t bq = pb.opt.block_q, bk = pb.opt.block_k, D = sh.D, k_tiles = ceil_div(sh.Sk, bk);
  const std::int64_t kt = item % k_tiles, hkv = (item / k_tiles) % sh.Hkv, b = item / (k_tiles * sh.Hkv);
  const std::int64_t j0 = kt * bk, kn = std::min(bk, sh.Sk - j0);
  PairTile t(D, bq, bk);
  std::vector<float> acc_k(static_cast<std::size_t>(kn * D), 0.0f), acc_v(acc_k.size(), 0.0f);
  std::vector<float> part_k(static_cast<std::size_t>(D)), part_v(static_cast<std::size_t>(D));
  for (std::int64_t hq = hkv * sh.group(); hq < (hkv + 1) * sh.group(); ++hq)
    for (std::int64_t i0 = 0; i0 < sh.Sq; i0 += bq) {
      const std::int64_t rows = std::min(bq, sh.Sq - i0);
      const KeyRange keys = tile_keys(pb, i0, rows);
      if (keys.end <= j0 || keys.first >= j0 + kn) continue;  // the whole pair is masked
      compute_pair(pb, b, hq, i0, rows, j0, kn, bq, t);
      // Q's and dO's FP8 scales are one per query tile, and dSᵀ's one per
      // pair: they factor out of the sum over queries.
      const float k_factor = t.ds_scale[0] * pb.q.factor_of(b, hq, i0);
      const float v_factor = kPUnscale * pb.d_o.factor_of(b, hq, i0);
      for (std::int64_t j = 0; j < kn; ++j) {
        std::fill(part_k.begin(), part_k.end(), 0.0f);
        std::fill(part_v.begin(), part_v.end(), 0.0f);
        for (std::int64_t r = 0; r < rows; ++r) {
          const float ds = t.ds[r * bk + j], p = t.p[r * bk + j];
          const float* qv = pb.q.row(b, hq, i0 + r);
          const float* dov = pb.d_o.row(b, hq, i0 + r);
          for (std::int64_t d = 0; d < D; ++d) {
            part_k[d] += ds * qv[d];
            part_v[d] += p * dov[d];
          }
        }
        for (std::int64_t d = 0; d < D; ++d) {
          acc_k[j * D + d] += part_k[d] * k_factor;
          acc_v[j * D + d] += part_v[d] * v_factor;
        }
      }
    }
  for (std::int64_t j = 0; j < kn; ++j)
    for (std::int64_t d = 0; d < D; ++d) {
      const std::int64_t o = bshd_index(sh.Sk, sh.Hkv, D, b, j0 + j, hkv, d);
      dk[o] = pb.scale * acc_k[j * D + d];
      dv[o] = acc_v[j * D + d];
    }
}

}  // namespace

BackwardResult backward(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                        std::span<const float> v, std::span<const float> o, std::span<const float> lse,
                        std::span<const float> d_o, const AttentionOptions& opt) {
  if (shape.D % kChannelBlock != 0) {
    // As forward: padded up to the scale blocks, at the softmax scale of D.
    const ChannelPadded p = channel_padded(shape, opt, q, k, v);
    check_element_count(o.size(), shape.q_elems(), "o");
    check_element_count(d_o.size(), shape.q_elems(), "d_o");
    const auto pad = [&](std::span<const float> x) { return append_zero_channels(x, shape.D, p.shape.D); };
    BackwardResult r = backward(p.shape, pad(q), pad(k), pad(v), pad(o), lse, pad(d_o), p.opt);
    for (std::vector<float>* g : {&r.dq, &r.dk, &r.dv}) *g = first_channels(*g, p.shape.D, shape.D);
    return r;
  }
  check_problem(shape, opt);
  if (!spec_of(opt.recipe).has_backward)
    throw Error("recipe", std::string(to_string(opt.recipe)) + " is inference only: no backward (use fp8 or mxfp4_train)");
  check_element_count(o.size(), shape.q_elems(), "o");
  check_element_count(d_o.size(), shape.q_elems(), "d_o");
  check_element_count(lse.size(), shape.lse_elems(), "lse");
  require_finite(d_o, "d_o");

  const QuantizedInputs in = quantize_inputs(shape, q, k, v, opt);
  Problem pb;
  pb.shape = shape;
  pb.opt = opt;
  // MXFP4 Q and K on sm90 (no FP4 tensor cores): folded into E4M3 per query
  // tile and per key tile, and these same bytes and factors recompute S and
  // enter dK and dQ, as on the GPU. The forward folded Q per row; S differs
  // from the forward's only where an MX block lies more than 14 binades below
  // its tile's largest block (E4M3 subnormals or zero instead of exact bytes).
  const bool fold_tiles = spec_of(opt.recipe).qk == TensorFormat::mxfp4 && opt.target == Target::sm90;
  pb.q_s = qk_operand(in.q, opt.target, fold_tiles ? opt.block_q : 1);
  pb.k_s = qk_operand(in.k, opt.target, opt.block_k);
  pb.q = fold_tiles ? tile_folded(pb.q_s) : plain_operand(in.q);
  pb.k = fold_tiles ? tile_folded(pb.k_s) : plain_operand(in.k);
  // dO and V meet in dP = dO·Vᵀ, a reduction over D: both need scales per
  // token block (the forward's per-channel V scale would not factor out).
  QuantizeOptions qo;
  qo.fp8_token_block = opt.block_q;
  pb.d_o = plain_operand(quantize(d_o, shape.B, shape.Sq, shape.Hq, shape.D, TensorFormat::fp8_e4m3,
                                  BlockAxis::along_d, qo, "d_o"));
  qo.fp8_token_block = opt.block_k;
  pb.v = plain_operand(quantize(v, shape.B, shape.Sk, shape.Hkv, shape.D, TensorFormat::fp8_e4m3, BlockAxis::along_d,
                                qo, "v"));
  pb.ds_format = opt.ds_format == GradFormat::e5m2 ? ElemFormat::e5m2 : ElemFormat::e4m3;
  pb.ds_max = opt.ds_format == GradFormat::e5m2 ? kE5M2Max : kE4M3Max;
  pb.scale = resolve_softmax_scale(opt.softmax_scale, shape.D);
  pb.scale_log2 = pb.scale * direct_p::kLog2e;

  const std::int64_t D = shape.D;
  pb.delta.resize(static_cast<std::size_t>(shape.lse_elems()));
  pb.lse_log2.resize(pb.delta.size());
  for (std::int64_t b = 0; b < shape.B; ++b)
    for (std::int64_t h = 0; h < shape.Hq; ++h)
      for (std::int64_t i = 0; i < shape.Sq; ++i) {
        const std::int64_t row = (b * shape.Hq + h) * shape.Sq + i, base = bshd_index(shape.Sq, shape.Hq, D, b, i, h, 0);
        float delta = 0.0f;
        for (std::int64_t d = 0; d < D; ++d) delta += d_o[base + d] * o[base + d];
        pb.delta[row] = delta;
        // The forward's LSE is that of the original scores; the recomputed
        // scores use the smoothed K, so take its smooth_k correction back out.
        const float correction = smooth_k_shift(in, shape, pb.scale, b, h, i);
        pb.lse_log2[row] = (lse[row] - correction) * direct_p::kLog2e;
      }

  BackwardResult out{std::vector<float>(static_cast<std::size_t>(shape.q_elems())),
                     std::vector<float>(static_cast<std::size_t>(shape.kv_elems())),
                     std::vector<float>(static_cast<std::size_t>(shape.kv_elems()))};
  parallel_for(shape.B * shape.Hq * ceil_div(shape.Sq, opt.block_q), opt.threads,
               [&](std::int64_t item) { dq_item(pb, item, out.dq); });
  parallel_for(shape.B * shape.Hkv * ceil_div(shape.Sk, opt.block_k), opt.threads,
               [&](std::int64_t item) { dkv_item(pb, item, out.dk, out.dv); });
  return out;
}

}  // namespace fp4attn::emulator
