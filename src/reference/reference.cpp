// fp64 attention forward and backward: the truth every executor is measured
// against. Each query row gets a plain two-pass softmax in double (row maximum,
// then exponentials), with no tiling and no online rescaling, so the error of a
// kernel or of the emulator is always measured against straightforward math.
//
// Work is split over (batch, query head) pairs across std::threads. Inside a
// pair, K and V of the matching key/value head are gathered once into
// contiguous buffers, both row-major (Sk, D) and transposed (D, Sk), so every
// inner loop runs with unit stride and the compiler can vectorize it without
// reordering any floating-point sum.
#include "fp4attn/reference.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <thread>

#include "fp4attn/error.hpp"

namespace fp4attn::reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

void validate(const AttentionShape& shape, std::span<const double> q, std::span<const double> k,
              std::span<const double> v, double scale, MaskKind mask, Window window) {
  check_shape(shape);
  check_window(mask, window);
  if (!std::isfinite(scale)) throw Error("scale", "must be finite");
  check_element_count(q.size(), shape.q_elems(), "q");
  check_element_count(k.size(), shape.kv_elems(), "k");
  check_element_count(v.size(), shape.kv_elems(), "v");
}

double resolve_scale(double scale, std::int64_t D) {
  return scale > 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(D));
}

// Runs body(t) for t in [0, count) on up to hardware_concurrency threads,
// handing out items one at a time so uneven rows (causal) balance out.
template <typename Body>
void parallel_for(std::int64_t count, const Body& body) {
  const std::int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const std::int64_t workers = std::min(count, cores);
  std::atomic<std::int64_t> next{0};
  const auto work = [&] {
    for (std::int64_t t = next.fetch_add(1); t < count; t = next.fetch_add(1)) body(t);
  };
  std::vector<std::thread> pool;
  for (std::int64_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (std::thread& th : pool) th.join();
}

// K or V of one (batch, key/value head), in both layouts the loops need.
struct HeadMatrix {
  std::vector<double> rows;        // (Sk, D)
  std::vector<double> transposed;  // (D, Sk)
};

// A row's visible keys [first, first + n) as the loops below take them: the
// key matrices seen from key `first` on.
struct KeysFrom {
  const double* rows;        // row `first` of (Sk, D)
  const double* transposed;  // column `first` of (D, Sk)
};
KeysFrom keys_from(const HeadMatrix& m, std::int64_t first, std::int64_t D) {
  return {m.rows.data() + first * D, m.transposed.data() + first};
}

HeadMatrix gather_head(std::span<const double> x, const AttentionShape& shape, std::int64_t b, std::int64_t h) {
  const std::int64_t Sk = shape.Sk, D = shape.D;
  HeadMatrix m{std::vector<double>(Sk * D), std::vector<double>(D * Sk)};
  for (std::int64_t j = 0; j < Sk; ++j) {
    const double* src = x.data() + bshd_index(Sk, shape.Hkv, D, b, j, h, 0);
    std::copy(src, src + D, m.rows.begin() + j * D);
    for (std::int64_t d = 0; d < D; ++d) m.transposed[d * Sk + j] = src[d];
  }
  return m;
}

// out[j] = x · row_j for j < n, from the transposed (D, Sk) matrix: the inner
// loop runs over keys, and each out[j] still sums over d in ascending order.
void dot_with_rows(const double* x, const double* transposed, std::int64_t Sk, std::int64_t n, std::int64_t D,
                   double* out) {
  std::fill(out, out + n, 0.0);
  for (std::int64_t d = 0; d < D; ++d) {
    const double xd = x[d];
    const double* col = transposed + d * Sk;
    for (std::int64_t j = 0; j < n; ++j) out[j] += xd * col[j];
  }
}

// out[d] = Σ_{j<n} w[j] · row_j[d], from the row-major (Sk, D) matrix.
void weighted_row_sum(const double* w, const double* rows, std::int64_t n, std::int64_t D, double* out) {
  std::fill(out, out + D, 0.0);
  for (std::int64_t j = 0; j < n; ++j) {
    const double wj = w[j];
    const double* row = rows + j * D;
    for (std::int64_t d = 0; d < D; ++d) out[d] += wj * row[d];
  }
}

// One query row's softmax over its n visible keys: p[j] = exp(s_j − lse),
// normalized, with s_j = scale · q·k_j. Returns lse. Subtracting the row
// maximum before exp keeps every exponential in (0, 1], so nothing overflows.
double softmax_row(const double* q_row, KeysFrom k, std::int64_t Sk, std::int64_t n, std::int64_t D, double scale,
                   double* p) {
  dot_with_rows(q_row, k.transposed, Sk, n, D, p);
  double m = kNegInf;
  for (std::int64_t j = 0; j < n; ++j) {
    p[j] *= scale;
    m = std::max(m, p[j]);
  }
  double l = 0.0;
  for (std::int64_t j = 0; j < n; ++j) {
    p[j] = std::exp(p[j] - m);
    l += p[j];
  }
  const double inv_l = 1.0 / l;
  for (std::int64_t j = 0; j < n; ++j) p[j] *= inv_l;
  return m + std::log(l);
}

}  // namespace

bool visible(MaskKind mask, Window window, std::int64_t Sq, std::int64_t Sk, std::int64_t i, std::int64_t j) {
  const KeyRange keys = visible_keys(mask, window, Sq, Sk, i);
  return j >= keys.first && j < keys.end;
}

ForwardResult forward(const AttentionShape& shape, std::span<const double> q, std::span<const double> k,
                      std::span<const double> v, MaskKind mask, double scale, Window window) {
  validate(shape, q, k, v, scale, mask, window);
  scale = resolve_scale(scale, shape.D);
  const std::int64_t Sq = shape.Sq, Sk = shape.Sk, Hq = shape.Hq, D = shape.D, group = shape.group();
  ForwardResult out{std::vector<double>(shape.q_elems(), 0.0), std::vector<double>(shape.lse_elems(), kNegInf)};

  parallel_for(shape.B * Hq, [&](std::int64_t task) {
    const std::int64_t b = task / Hq, h = task % Hq;
    const HeadMatrix kh = gather_head(k, shape, b, h / group);
    const HeadMatrix vh = gather_head(v, shape, b, h / group);
    std::vector<double> p(Sk);
    for (std::int64_t i = 0; i < Sq; ++i) {
      const KeyRange keys = visible_keys(mask, window, Sq, Sk, i);
      const std::int64_t n = keys.size();
      if (n == 0) continue;  // fully masked: O stays 0 and LSE −inf
      const std::int64_t row = bshd_index(Sq, Hq, D, b, i, h, 0);
      out.lse[(b * Hq + h) * Sq + i] =
          softmax_row(q.data() + row, keys_from(kh, keys.first, D), Sk, n, D, scale, p.data());
      weighted_row_sum(p.data(), keys_from(vh, keys.first, D).rows, n, D, out.o.data() + row);
    }
  });
  return out;
}

BackwardResult backward(const AttentionShape& shape, std::span<const double> q, std::span<const double> k,
                        std::span<const double> v, std::span<const double> d_o, MaskKind mask, double scale,
                        Window window) {
  validate(shape, q, k, v, scale, mask, window);
  check_element_count(d_o.size(), shape.q_elems(), "d_o");
  scale = resolve_scale(scale, shape.D);
  const std::int64_t B = shape.B, Sq = shape.Sq, Sk = shape.Sk, Hq = shape.Hq, Hkv = shape.Hkv, D = shape.D;
  const std::int64_t group = shape.group();
  const std::int64_t head_elems = Sk * D;

  // Each query head accumulates its own dK and dV, so threads never share an
  // output; the group sum below then runs in a fixed order (deterministic).
  std::vector<double> dk_part(B * Hq * head_elems, 0.0), dv_part(B * Hq * head_elems, 0.0);
  BackwardResult out{std::vector<double>(shape.q_elems(), 0.0), std::vector<double>(shape.kv_elems(), 0.0),
                     std::vector<double>(shape.kv_elems(), 0.0)};

  parallel_for(B * Hq, [&](std::int64_t task) {
    const std::int64_t b = task / Hq, h = task % Hq;
    const HeadMatrix kh = gather_head(k, shape, b, h / group);
    const HeadMatrix vh = gather_head(v, shape, b, h / group);
    double* dk = dk_part.data() + task * head_elems;
    double* dv = dv_part.data() + task * head_elems;
    std::vector<double> p(Sk), ds(Sk), o_row(D);
    for (std::int64_t i = 0; i < Sq; ++i) {
      const KeyRange keys = visible_keys(mask, window, Sq, Sk, i);
      const std::int64_t n = keys.size(), j0 = keys.first;
      if (n == 0) continue;  // fully masked: O is the constant 0, so no gradient flows
      const std::int64_t row = bshd_index(Sq, Hq, D, b, i, h, 0);
      const double* q_row = q.data() + row;
      const double* do_row = d_o.data() + row;
      const KeysFrom ks = keys_from(kh, j0, D), vs = keys_from(vh, j0, D);
      softmax_row(q_row, ks, Sk, n, D, scale, p.data());
      weighted_row_sum(p.data(), vs.rows, n, D, o_row.data());
      // D_i = rowsum(dO ⊙ O) equals Σ_j P_ij dP_ij, the softmax Jacobian's
      // shared term, at O(D) instead of O(Sk) cost.
      double delta = 0.0;
      for (std::int64_t d = 0; d < D; ++d) delta += do_row[d] * o_row[d];
      // dP_ij = dO_i · v_j, then dS_ij = P_ij (dP_ij − D_i).
      dot_with_rows(do_row, vs.transposed, Sk, n, D, ds.data());
      for (std::int64_t j = 0; j < n; ++j) ds[j] = p[j] * (ds[j] - delta);
      // S = scale · Q Kᵀ, so dQ = scale · dS K and dK = scale · dSᵀ Q.
      double* dq_row = out.dq.data() + row;
      weighted_row_sum(ds.data(), ks.rows, n, D, dq_row);
      for (std::int64_t d = 0; d < D; ++d) dq_row[d] *= scale;
      for (std::int64_t j = 0; j < n; ++j) {
        const double dsj = scale * ds[j], pj = p[j];
        double* dk_j = dk + (j0 + j) * D;
        double* dv_j = dv + (j0 + j) * D;
        for (std::int64_t d = 0; d < D; ++d) {
          dk_j[d] += dsj * q_row[d];
          dv_j[d] += pj * do_row[d];  // dV = Pᵀ dO
        }
      }
    }
  });

  // dK, dV of a key/value head: the sum over the query heads that share it.
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t hk = 0; hk < Hkv; ++hk)
      for (std::int64_t g = 0; g < group; ++g) {
        const std::int64_t part = (b * Hq + hk * group + g) * head_elems;
        for (std::int64_t j = 0; j < Sk; ++j)
          for (std::int64_t d = 0; d < D; ++d) {
            const std::int64_t dst = bshd_index(Sk, Hkv, D, b, j, hk, d);
            out.dk[dst] += dk_part[part + j * D + d];
            out.dv[dst] += dv_part[part + j * D + d];
          }
      }
  return out;
}

}  // namespace fp4attn::reference
