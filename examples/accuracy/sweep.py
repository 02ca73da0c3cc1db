"""The grid of the study: every recipe x Direct-P on/off x smooth_k on/off x
emulator target, and the inputs-only baseline that splits each recipe's error.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np

import fp4attn
import reference

# Emulator targets: sm90 (Hopper, FP4 expanded into E4M3) and sm100 (Blackwell,
# ideal block-scaled FP4). The H200's figures come from gpu_columns.py.
TARGETS = ("sm90", "sm100")
ON_OFF = (True, False)

# Storage formats of (Q and K, V) per recipe, as DESIGN §2 lists them; the
# inputs-only baseline quantizes with these and nothing else.
INPUT_FORMATS = {
    "fp8": ("fp8_e4m3", "fp8_e4m3"),
    "mxfp4": ("mxfp4", "mxfp4"),
    "nvfp4": ("nvfp4", "nvfp4"),
    "mxfp4_train": ("mxfp4", "fp8_e4m3"),
}


class Setting(NamedTuple):
    recipe: str
    direct_p: bool
    smooth_k: bool
    target: str


def grid() -> list[Setting]:
    return [Setting(*c) for c in itertools.product(fp4attn.RECIPES, ON_OFF, ON_OFF, TARGETS)]


def attention(setting: Setting):
    """An attention function (B, S, H, D) -> (B, S, H, D) that runs one setting on the fp4attn emulator."""

    def run(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        return fp4attn.attention(
            q,
            k,
            v,
            recipe=setting.recipe,
            direct_p=setting.direct_p,
            smooth_k=setting.smooth_k,
            target=setting.target,
        )

    return run


def inputs_only(recipe: str, smooth_k: bool):
    """Float64 attention on Q, K, V rounded to the recipe's formats, with P and the
    accumulation exact: the part of a recipe's error that its inputs alone cause.
    The rest comes from P's format and the kernel."""
    qk_format, v_format = INPUT_FORMATS[recipe]

    def run(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        q_deq = fp4attn.quantize(q, qk_format, axis="along_d").dequantize()
        k_deq = fp4attn.quantize(_keys_as_stored(k, smooth_k), qk_format, axis="along_d").dequantize()
        v_deq = fp4attn.quantize(v, v_format, axis="along_s").dequantize()
        return reference.attention(q_deq, k_deq, v_deq)

    return run


def _keys_as_stored(k: np.ndarray, smooth_k: bool) -> np.ndarray:
    # Subtracting K's mean over the sequence shifts every score row by a
    # constant, so the exact attention of the shifted K is the same O.
    if not smooth_k:
        return k
    return (k - k.mean(axis=1, keepdims=True, dtype=np.float64)).astype(np.float32)


def k_error(k: np.ndarray, recipe: str, smooth_k: bool) -> float:
    """Quantization error of K in the recipe's format, relative to K's spread
    around its mean (the part of K that changes the scores): the same yardstick
    with and without smooth_k."""
    stored = _keys_as_stored(k, smooth_k)
    deq = fp4attn.quantize(stored, INPUT_FORMATS[recipe][0], axis="along_d").dequantize()
    spread = k - k.mean(axis=1, keepdims=True, dtype=np.float64)
    return float(np.linalg.norm(deq - stored) / np.linalg.norm(spread))
