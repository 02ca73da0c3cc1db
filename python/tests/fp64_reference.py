"""fp64 attention in NumPy, and the error metrics the tests compare with.

Independent of the C++ reference on purpose: the Python API is checked
against softmax written out directly, in the caller's (B, S, H, D) layout.
"""

import numpy as np

MASKS = ("none", "bottom_right", "top_left")


def visible(mask: str, sq: int, sk: int) -> np.ndarray:
    """(Sq, Sk) boolean: may query i see key j?"""
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    if mask == "none":
        return np.ones((sq, sk), dtype=bool)
    if mask == "bottom_right":  # FlashAttention: the last query sees every key
        return j <= i + (sk - sq)
    if mask == "top_left":  # PyTorch SDPA: query i sees keys 0..i
        return j <= i
    raise ValueError(mask)


def attention_bshd(q, k, v, mask="none", scale=None):
    """O (B, Sq, Hq, D) and natural-log LSE (B, Hq, Sq); fully masked rows give O = 0, LSE = -inf."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    group = hq // hkv
    k = np.repeat(k, group, axis=2)  # query head h reads key head h // group
    v = np.repeat(v, group, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale
    s = np.where(visible(mask, sq, sk), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True)
    o = np.einsum("bhij,bjhd->bihd", p / np.where(l > 0, l, 1.0), v)
    with np.errstate(divide="ignore"):
        lse = (np.log(l) + m_safe)[..., 0]
    return o, lse


def cosine(a, b) -> float:
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def rel_l2(a, ref) -> float:
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))
