"""Synthetic Q, K, V shaped like the attention of video diffusion transformers.

Such models show three features that hurt low-bit attention, added here one at
a time so that the study can tell which one costs what:

* heavy tails: activations closer to a Student-t than to a Gaussian;
* outlier channels: a few head-dim channels of Q and K many times larger than
  the rest, at the same index in both, so they dominate the scores;
* a large K mean shared by all tokens (per head and channel): it shifts each
  score row by a constant, which softmax ignores, but it inflates K's block
  maxima and so its quantization error. smooth_k removes exactly this.
"""

from __future__ import annotations

import numpy as np

# Features switched on by each variant, in the order they are added.
VARIANTS = {
    "gaussian": (),
    "heavy_tails": ("heavy_tails",),
    "outlier_channels": ("heavy_tails", "outlier_channels"),
    "video_like": ("heavy_tails", "outlier_channels", "k_mean"),
}
STUDENT_T_DOF = 3.0  # the heaviest tail that still has a finite variance
OUTLIER_CHANNELS = 2  # per head, shared by Q and K
OUTLIER_GAIN = 4.0  # x the typical channel's std
K_MEAN_STD = 4.0  # std of the per-(head, channel) K offset, x the per-token std

# The video-like problem: one sequence of latent tokens, several heads.
BATCH = 1
SEQ = 256
HEADS = 4
HEAD_DIMS = (64, 128)
SEEDS = (0, 1, 2, 3)


def _unit_student_t(rng: np.random.Generator, shape) -> np.ndarray:
    # Var of t(nu) is nu / (nu - 2): rescale so every variant has unit std.
    return rng.standard_t(STUDENT_T_DOF, size=shape) / np.sqrt(STUDENT_T_DOF / (STUDENT_T_DOF - 2.0))


def make_qkv(variant: str, head_dim: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B, S, H, D) float32 q, k, v of one variant."""
    features = VARIANTS[variant]
    rng = np.random.default_rng(seed)
    shape = (BATCH, SEQ, HEADS, head_dim)
    draw = (lambda: _unit_student_t(rng, shape)) if "heavy_tails" in features else (lambda: rng.standard_normal(shape))
    q, k, v = draw(), draw(), draw()
    if "outlier_channels" in features:
        for h in range(HEADS):
            channels = rng.choice(head_dim, size=OUTLIER_CHANNELS, replace=False)
            q[:, :, h, channels] *= OUTLIER_GAIN
            k[:, :, h, channels] *= OUTLIER_GAIN
    if "k_mean" in features:
        k += rng.normal(0.0, K_MEAN_STD, size=(BATCH, 1, HEADS, head_dim))
    return tuple(x.astype(np.float32) for x in (q, k, v))
