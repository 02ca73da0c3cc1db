"""fp64 attention in NumPy, and the error metrics the tests compare with.

Independent of the C++ reference on purpose: the Python API is checked
against softmax written out directly, in the caller's (B, S, H, D) layout.
"""

import numpy as np

MASKS = ("none", "bottom_right", "top_left")


def visible(mask: str, sq: int, sk: int, window=(-1, -1)) -> np.ndarray:
    """(Sq, Sk) boolean: may query i see key j? window = (left, right) as FlashAttention's
    window_size: keys i + d - left .. i + d + right, d = Sk - Sq (0 top-left), -1 no bound."""
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    d = 0 if mask == "top_left" else sk - sq
    if mask == "none":
        seen = np.ones((sq, sk), dtype=bool)
    elif mask == "bottom_right":  # FlashAttention: the last query sees every key
        seen = j <= i + d
    elif mask == "top_left":  # PyTorch SDPA: query i sees keys 0..i
        seen = j <= i
    else:
        raise ValueError(mask)
    left, right = window
    if left >= 0:
        seen = seen & (j >= i + d - left)
    if right >= 0:
        seen = seen & (j <= i + d + right)
    return seen


def attention_bshd(q, k, v, mask="none", scale=None, window=(-1, -1)):
    """O (B, Sq, Hq, D) and natural-log LSE (B, Hq, Sq); fully masked rows give O = 0, LSE = -inf."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    group = hq // hkv
    k = np.repeat(k, group, axis=2)  # query head h reads key head h // group
    v = np.repeat(v, group, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale
    s = np.where(visible(mask, sq, sk, window), s, -np.inf)
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


def attention_backward_bshd(q, k, v, d_o, mask="none", scale=None, d_lse=None, window=(-1, -1)):
    """dQ, dK, dV (fp64, shapes of q, k, v) of attention_bshd for the upstream gradients dO and dLSE.

    dS = P ⊙ (dP − Delta) with Delta = rowsum(dO ⊙ O) − dLSE, since ∂LSE/∂S = P.
    Key heads shared by a GQA group get the sum of their query heads' gradients.
    """
    q, k, v, d_o = (np.asarray(x, dtype=np.float64) for x in (q, k, v, d_o))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    group = hq // hkv
    kr = np.repeat(k, group, axis=2)
    vr = np.repeat(v, group, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, kr) * scale
    s = np.where(visible(mask, sq, sk, window), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    l = p.sum(axis=-1, keepdims=True)
    p = p / np.where(l > 0, l, 1.0)  # masked rows: P = 0
    o = np.einsum("bhij,bjhd->bihd", p, vr)
    dp = np.einsum("bihd,bjhd->bhij", d_o, vr)
    delta = np.einsum("bihd,bihd->bhi", d_o, o)[..., None]
    if d_lse is not None:
        delta = delta - np.asarray(d_lse, dtype=np.float64)[..., None]
    ds = p * (dp - delta)
    dq = np.einsum("bhij,bjhd->bihd", ds, kr) * scale
    dk = np.einsum("bhij,bihd->bjhd", ds, q) * scale
    dv = np.einsum("bhij,bihd->bjhd", p, d_o)
    fold = lambda x: x.reshape(b, sk, hkv, group, d).sum(axis=3)  # noqa: E731
    return dq, fold(dk), fold(dv)
