"""Attention and quantization on host arrays: conversion to the C++ core's
(B, S, H, D) float32 arrays, and the call into fp4attn._ext.

Every front end (the NumPy API, the torch custom ops) ends here, so the
conversion rules live in one place.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from . import _ext, _validate

# Mask names as the C++ MaskKind spells them.
MASK_NONE = "none"
MASK_BOTTOM_RIGHT = "causal"  # FlashAttention >= 2.1
MASK_TOP_LEFT = "causal_top_left"  # PyTorch SDPA

# Errors of numpy.from_dlpack when the producer lives on another device or
# holds a dtype NumPy lacks; the next conversion route is tried then.
_DLPACK_ERRORS = (BufferError, RuntimeError, TypeError, ValueError)


class Settings(NamedTuple):
    """One attention call's options, in plain values (the torch op passes them as is)."""

    layout: str  # "bshd" or "bhsd"
    mask: str  # a MaskKind name
    scale: float  # 0 means 1/sqrt(D)
    recipe: str
    smooth_k: bool
    direct_p: bool
    gqa: bool  # may Hkv differ from Hq?
    names: str  # the caller's names for q, k, v, comma-separated, for error messages
    target: str = "sm90"  # whose numerics the emulator models; the sm90 kernels run only for "sm90"
    # A sliding window (FlashAttention's window_size): with d the mask's diagonal offset (Sk - Sq,
    # 0 top-left), query i sees keys i + d - window_left .. i + d + window_right; -1 is no bound.
    window_left: int = -1
    window_right: int = -1


def make_settings(*, layout, mask, scale, scale_name, recipe, smooth_k, direct_p, gqa, names, target="sm90",
                  window=(-1, -1), window_name="window_size") -> Settings:
    window_left, window_right = _validate.check_window(window, window_name, causal=mask != MASK_NONE)
    return Settings(
        layout=_validate.check_layout(layout),
        mask=mask,
        scale=_validate.check_scale(scale, scale_name),
        recipe=_validate.check_recipe(recipe),
        smooth_k=_validate.check_flag(smooth_k, "smooth_k"),
        direct_p=_validate.check_flag(direct_p, "direct_p"),
        gqa=gqa,
        names=",".join(names),
        target=_validate.check_choice(target, _validate.TARGETS, "target"),
        window_left=window_left,
        window_right=window_right,
    )


def check(q, k, v, s: Settings) -> _validate.Dims:
    """Checks the operands (NumPy arrays or torch tensors) against the settings."""
    names = tuple(s.names.split(","))
    dims = _validate.check_qkv(q, k, v, s.layout, names)
    if not s.gqa and dims.Hkv != dims.Hq:
        raise ValueError(
            f"{names[1]}: has {dims.Hkv} heads but {names[0]} has {dims.Hq}; pass enable_gqa=True for grouped-query attention"
        )
    return dims


def validate_sizes(dims: _validate.Dims, s: Settings) -> None:
    """The C++ core's checks of a call's sizes and options (errors name the argument)."""
    _ext.device_forward_supported((dims.B, dims.Sq, dims.Sk, dims.Hq, dims.Hkv, dims.D), options(s))


def equal_length_runs(lens_q: list, lens_k: list) -> list:
    """(first sequence, count) of each run of consecutive sequences with equal (query, key) lengths:
    the sequences a varlen call runs as one batched call."""
    runs, i = [], 0
    while i < len(lens_q):
        n = 1
        while i + n < len(lens_q) and (lens_q[i + n], lens_k[i + n]) == (lens_q[i], lens_k[i]):
            n += 1
        runs.append((i, n))
        i += n
    return runs


# A packed device call's grids span (sequences, longest sequence) tiles, those past a
# sequence's end leaving at once (its operands take only the tokens, tile-aligned); past
# this many times the tokens it holds (plus a tile per sequence), a batch is cut into
# groups. One sequence of 32768 tokens and 64 of 512: 842 TFLOP/s forward as two groups,
# 749 as one call. Cutting costs too: at 2, the 8 prompts of bench_varlen.py (2.3 times)
# ran as two calls, 16 % slower forward and 18 % forward + backward (perf log v7, v9).
PACKED_LAYOUT_WASTE = 4


def packed_groups(lens_q: list, lens_k: list) -> list:
    """(first sequence, count) of consecutive groups, each one packed device call: a group grows
    while (count · longest) stays within PACKED_LAYOUT_WASTE times its tokens plus 128 per
    sequence, for queries and for keys, so that the call's grids (count · longest tokens of
    tiles) stay near the tiles its tokens fill; and at most DEVICE_MAX_BATCH sequences, the
    most one device call's grids hold."""
    def fits(count, longest, total):
        return count * longest <= PACKED_LAYOUT_WASTE * total + 128 * count

    groups, first = [], 0
    while first < len(lens_q):
        n, max_q, max_k, sum_q, sum_k = 1, lens_q[first], lens_k[first], lens_q[first], lens_k[first]
        while first + n < len(lens_q) and n < _ext.DEVICE_MAX_BATCH:
            lq, lk = lens_q[first + n], lens_k[first + n]
            if not (fits(n + 1, max(max_q, lq), sum_q + lq) and fits(n + 1, max(max_k, lk), sum_k + lk)):
                break
            max_q, max_k, sum_q, sum_k, n = max(max_q, lq), max(max_k, lk), sum_q + lq, sum_k + lk, n + 1
        groups.append((first, n))
        first += n
    return groups


def to_host(x, name: str) -> np.ndarray:
    """A NumPy view of `x` where one exists (NumPy arrays, CPU DLPack producers), else a host copy."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)  # zero-copy
        except _DLPACK_ERRORS:
            pass
        try:
            # NumPy >= 2.1 can ask a device-side producer for a host copy.
            return np.from_dlpack(x, device="cpu", copy=True)
        except _DLPACK_ERRORS:
            pass
    if hasattr(x, "__array__") or hasattr(x, "__array_interface__"):
        try:
            return np.asarray(x)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{name}: cannot be read as a host array: {e}") from e
    raise TypeError(
        f"{name}: expected a NumPy array or an object with __dlpack__ or __array__, got {type(x).__name__}"
    )


def _to_bshd_f32(x: np.ndarray, layout: str) -> np.ndarray:
    """The C++ core reads (B, S, H, D) float32, C-contiguous; no copy when x already is."""
    if layout == "bhsd":
        x = x.transpose(0, 2, 1, 3)
    return np.ascontiguousarray(x, dtype=np.float32)


def options(s: Settings) -> "_ext.AttentionOptions":
    """The C++ options of `s`; one object per distinct settings, which no caller modifies (building
    one costs several µs of the host's time a call)."""
    try:
        return _options_of(s)
    except TypeError:  # a field without a hash (a symbolic size under tracing)
        return _build_options(s)


def _build_options(s: Settings) -> "_ext.AttentionOptions":
    opt = _ext.AttentionOptions()
    opt.recipe = _ext.Recipe.__members__[s.recipe]
    opt.mask = _ext.MaskKind.__members__[s.mask]
    opt.softmax_scale = s.scale
    opt.smooth_k = s.smooth_k
    opt.direct_p = s.direct_p
    opt.target = _ext.Target.__members__[s.target]
    opt.window_left = s.window_left
    opt.window_right = s.window_right
    return opt


_options_of = functools.lru_cache(maxsize=256)(_build_options)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, s: Settings) -> tuple[np.ndarray, np.ndarray]:
    """O in the caller's layout (float32, bf16 values) and LSE (B, Hq, Sq); inputs already checked."""
    o, lse, _executor = _ext.forward(
        _to_bshd_f32(q, s.layout), _to_bshd_f32(k, s.layout), _to_bshd_f32(v, s.layout), options(s)
    )
    if s.layout == "bhsd":
        o = np.ascontiguousarray(o.transpose(0, 2, 1, 3))
    return o, lse


def quantize(x: np.ndarray, fmt: str, axis: str, fp8_token_block: int, mx_scale_rule: str) -> "_ext.QuantizedTensor":
    opt = _ext.QuantizeOptions()
    opt.fp8_token_block = fp8_token_block
    opt.mx_scale_rule = _ext.MxScaleRule.__members__[mx_scale_rule]
    return _ext.quantize(
        _to_bshd_f32(x, "bshd"),
        _ext.TensorFormat.__members__[fmt],
        _ext.BlockAxis.__members__[axis],
        opt,
        "x",
    )
