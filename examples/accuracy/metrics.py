"""The figures of the study: error of an attention output against its float64
reference (DESIGN §7), how a tensor departs from i.i.d. data, and how far
sentence embeddings and their nearest-neighbour rankings move."""

from __future__ import annotations

import numpy as np

# How many nearest neighbours the retrieval check compares in order.
TOP_K = 5


def errors(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """Cosine similarity, relative L2 and max abs error over all elements, in float64."""
    o = np.asarray(out, dtype=np.float64).ravel()
    r = np.asarray(ref, dtype=np.float64).ravel()
    if not (np.isfinite(o).all() and np.isfinite(r).all()):
        raise ValueError("non-finite output: every figure here assumes finite O")
    diff = o - r
    return {
        "cosine": float(o @ r / (np.linalg.norm(o) * np.linalg.norm(r))),
        "rel_l2": float(np.linalg.norm(diff) / np.linalg.norm(r)),
        "max_abs": float(np.abs(diff).max()),
    }


def channel_stats(x: np.ndarray) -> dict[str, float]:
    """How far a (B, S, H, D) tensor is from i.i.d.: its shared mean and its outlier channels."""
    x = x.astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)  # per (batch, head, channel), over tokens
    spread = np.sqrt(((x - mean) ** 2).mean())
    channel_rms = np.sqrt((x**2).mean(axis=(0, 1)))  # (H, D)
    return {
        "mean_over_spread": float(np.sqrt((mean**2).mean()) / spread),
        "max_channel_over_median": float((channel_rms.max(axis=1) / np.median(channel_rms, axis=1)).mean()),
    }


def ranks(row: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(row))


def retrieval(base: np.ndarray, test: np.ndarray) -> dict[str, float]:
    """Does each sentence keep its nearest neighbours? Row i ranks the other sentences by cosine.

    Sentences 2i and 2i+1 are paraphrases (texts.PARAPHRASE_PAIRS).
    """
    n = len(base)
    off_diag = ~np.eye(n, dtype=bool)
    sim_ref = (base @ base.T)[off_diag].reshape(n, n - 1)
    sim_test = (test @ test.T)[off_diag].reshape(n, n - 1)
    order_ref = np.argsort(-sim_ref, axis=1)
    order_test = np.argsort(-sim_test, axis=1)
    # Spearman's rho of each row: Pearson correlation of the ranks (no ties here).
    rho = [np.corrcoef(ranks(a), ranks(b))[0, 1] for a, b in zip(sim_ref, sim_test)]
    partner = np.arange(n) ^ 1
    # Column j of a row without its diagonal is sentence j + (j >= i).
    nearest = order_test[:, 0] + (order_test[:, 0] >= np.arange(n))
    return {
        "top1_same": float((order_ref[:, 0] == order_test[:, 0]).mean()),
        "topk_same": float((order_ref[:, :TOP_K] == order_test[:, :TOP_K]).all(axis=1).mean()),
        "partner_is_nearest": float((nearest == partner).mean()),
        "spearman_mean": float(np.mean(rho)),
        "spearman_min": float(np.min(rho)),
    }


def embedding_cosine(base: np.ndarray, test: np.ndarray) -> dict[str, float]:
    """Mean and min over rows of the cosine between unit-length embeddings."""
    cos = np.sum(base * test, axis=1)
    return {"emb_cos_mean": float(cos.mean()), "emb_cos_min": float(cos.min())}
