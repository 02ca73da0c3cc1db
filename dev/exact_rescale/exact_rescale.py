"""An exact rescale of O: the running row maximum rounded up to an integer.

The online softmax rescales O and l by α = 2^(m_old − m_new) whenever a tile
raises a row's maximum m. On sm90 α comes from ex2.approx, on the host from
exp2f; where their last bits differ a bf16 rounding of O can flip (the GPU
suites allow one element in 10^4). With m kept on the integers (m_ref =
ceil(m), log2 domain) α is a power of two: exact on both, and O·α exact too.
P = 2^(u + 8), u = s·c − m_ref, then has its row maximum in (128, 256]
instead of exactly 256: the same E4M3 relative precision, the subnormal
floor up to one binade lower relative to the row's largest P.

This simulates recipe fp8's forward in NumPy (FP8 Q, K, V with their scales,
P rounded to E4M3 by ml_dtypes, fp32 online softmax over 128-key tiles) with
m exact, m rounded up, and m − 0.8 rounded up (P's maximum then uses E4M3's
headroom up to 448 = 2^8.81: u < 0.8), against fp64, on four distributions.
Not bit-faithful to the kernel (RNE E4M3 for P instead of Direct-P's codes,
fp32 sums instead of the tensor core's): it measures the accuracy the change
would cost or gain, not the kernel's bits.

    python3 dev/exact_rescale/exact_rescale.py
"""

import numpy as np
import ml_dtypes

E4M3 = ml_dtypes.float8_e4m3fn


def fp8_rows(x, block=128):
    """(S, D) → E4M3 values times a per-128-row scale (amax / 448), dequantized."""
    out = np.empty_like(x, dtype=np.float32)
    for i in range(0, x.shape[0], block):
        b = x[i:i + block]
        scale = np.float32(max(np.abs(b).max(), 1e-30) / 448.0)
        out[i:i + block] = (b / scale).astype(E4M3).astype(np.float32) * scale
    return out


def fp8_columns(x):
    scale = np.maximum(np.abs(x).max(axis=0), 1e-30).astype(np.float32) / np.float32(448.0)
    return (x / scale).astype(E4M3).astype(np.float32) * scale


def attention(q, k, v, headroom, tile=128):
    """One head, noncausal: O (Sq, D) from the fp32 online softmax with E4M3 P.

    headroom None: m exact (the library's rule). Otherwise m_ref =
    ceil(m − headroom): P's row maximum 2^(8 + u), u in [headroom − 1, headroom).
    """
    c = np.float32(np.log2(np.e) / np.sqrt(q.shape[1]))
    s_all = (q @ k.T).astype(np.float32) * c
    m = np.full(q.shape[0], -np.inf, np.float32)
    l = np.zeros(q.shape[0], np.float32)
    o = np.zeros((q.shape[0], v.shape[1]), np.float32)
    for j in range(0, k.shape[0], tile):
        s = s_all[:, j:j + tile]
        m_new = np.maximum(m, s.max(axis=1))
        if headroom is not None:
            m_new = np.where(np.isfinite(m_new), np.ceil(m_new - np.float32(headroom)), m_new)
        alpha = np.exp2(m - m_new).astype(np.float32)
        p = np.exp2(s - m_new[:, None] + 8).astype(np.float32).astype(E4M3).astype(np.float32)
        o = o * alpha[:, None] + p @ v[j:j + tile]
        l = l * alpha + p.sum(axis=1)
        m = m_new
    return o / l[:, None]


def problem(rng, kind, S=1024, D=128):
    q, k, v = (rng.standard_normal((S, D)).astype(np.float32) for _ in range(3))
    k += 0.5
    if kind == "outliers":
        idx = rng.choice(D, size=D // 32, replace=False)
        for x in (q, k, v):
            x[:, idx] *= 20
    elif kind == "scale3":
        q, k = q * np.sqrt(3), k * np.sqrt(3)
    elif kind == "tiny":
        q, k, v = q * 1e-3, k * 1e-3, v * 1e-3
    return q, k, v


def main():
    print("| inputs | O rel L2, m exact | ceil(m) | ratio | ceil(m − 0.8) | ratio |")
    print("|---|---|---|---|---|---|")
    for kind in ("plain", "scale3", "outliers", "tiny"):
        a = b = e = 0.0
        for seed in range(4):
            q, k, v = problem(np.random.default_rng(seed), kind)
            s = (q.astype(np.float64) @ k.T.astype(np.float64)) / np.sqrt(q.shape[1])
            p = np.exp(s - s.max(axis=1, keepdims=True))
            ref = (p / p.sum(axis=1, keepdims=True)) @ v.astype(np.float64)
            qq, kk, vv = fp8_rows(q), fp8_rows(k - k.mean(axis=0)), fp8_columns(v)
            err = lambda o: np.linalg.norm(o - ref) / np.linalg.norm(ref)  # noqa: E731
            a += err(attention(qq, kk, vv, None)) / 4
            b += err(attention(qq, kk, vv, 0.0)) / 4
            e += err(attention(qq, kk, vv, 0.8)) / 4
        print(f"| {kind} | {a:.4g} | {b:.4g} | {b / a:.3f} | {e:.4g} | {e / a:.3f} |")


if __name__ == "__main__":
    main()
