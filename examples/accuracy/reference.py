"""Float64 attention, the truth every figure of the study is measured against."""

from __future__ import annotations

import numpy as np


def _probabilities(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """softmax(q kᵀ / sqrt(D)) as (B, H, Sq, Sk) float64; no mask (the study runs unpadded sequences)."""
    q, k = q.astype(np.float64), k.astype(np.float64)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    return p / p.sum(axis=-1, keepdims=True)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(B, S, H, D) in and out, float64."""
    return np.einsum("bhqk,bkhd->bqhd", _probabilities(q, k), v.astype(np.float64))


def row_peak(q: np.ndarray, k: np.ndarray) -> float:
    """Mean over query rows of the largest probability: how peaked attention is (1/Sk = flat, 1 = one-hot)."""
    return float(_probabilities(q, k).max(axis=-1).mean())
