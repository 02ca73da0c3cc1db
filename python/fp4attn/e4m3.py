"""Attention on inputs the caller has already quantized to E4M3, as FlashAttention-3's FP8
interface takes them: q, k, v in float8_e4m3fn, (B, S, H, D), and optional float32 descales of
shape (B, Hkv), one per batch entry and key/value head (a group's query heads share theirs);
the value of a code is code × descale. Recipe fp8 runs on the codes as they are: no quantizer
pass, and no smooth_k (it subtracts K's mean before K is quantized).

* torch CUDA tensors on a Hopper GPU: the custom op fp4attn::attention_e4m3 on the device,
  zero-copy on the current stream (the kernel reads Q and K where they are; V's codes are
  transposed into a workspace), capturable in a CUDA graph and traceable by torch.compile.
  There a NaN code or a descale that is not finite and positive makes O and the LSE NaN (an
  error would need a host synchronisation).
* Every other call runs on the host entry point (the emulator, or the sm90 kernels where
  present): CUDA tensors are copied there and back with a RuntimeWarning. It raises ValueError
  naming a NaN code or a bad descale.

NumPy inputs are ml_dtypes.float8_e4m3fn arrays. O comes back as bfloat16 (NumPy: float32
holding bf16 values) of shape (B, Sq, Hq, D), the LSE as float32 (B, Hq, Sq); without keys
O is 0 and the LSE -inf.
"""

from __future__ import annotations

import numpy as np

from . import _ext, _host, _validate

E4M3 = "float8_e4m3fn"
_NAMES = ("q", "k", "v")


def is_e4m3(x) -> bool:
    return hasattr(x, "dtype") and _validate._dtype_name(x) == E4M3


def settings(s: _host.Settings) -> _host.Settings:
    """`s` for E4M3 inputs: recipe fp8 only, and smooth_k off."""
    if s.recipe != "fp8":
        raise ValueError(f"recipe: E4M3 inputs run recipe fp8 (its operands are E4M3), not {s.recipe}")
    return s._replace(smooth_k=False)


def check(q, k, v, descales: tuple, s: _host.Settings) -> _validate.Dims:
    """The operands and descales (errors name the argument); returns the sizes."""
    dims = _validate.check_qkv(q, k, v, s.layout, _NAMES, dtypes=(E4M3,))
    for d, name in zip(descales, ("q_descale", "k_descale", "v_descale")):
        _check_descale(d, name, q, dims)
    return dims


def _check_descale(d, name: str, q, dims: _validate.Dims) -> None:
    if d is None:
        return
    if not hasattr(d, "shape") or not hasattr(d, "dtype"):
        raise TypeError(f"{name}: expected an array or None, got {type(d).__name__}")
    if _validate._dtype_name(d) != "float32":
        raise TypeError(f"{name}: dtype {_validate._dtype_name(d)} is not supported; use float32")
    if tuple(d.shape) != (dims.B, dims.Hkv):
        raise ValueError(f"{name}: expected shape (B, Hkv) = ({dims.B}, {dims.Hkv}), got {tuple(d.shape)}")
    if getattr(d, "device", None) != getattr(q, "device", None):
        raise ValueError(f"{name}: is on device {d.device}, q on {q.device}")


def host_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, descales: tuple, s: _host.Settings):
    """O (float32 holding bf16 values) and LSE from the host entry point: the codes as uint8, each
    descale as float32 or None."""
    codes = [np.ascontiguousarray(x).view(np.uint8) for x in (q, k, v)]
    scales = [None if d is None else np.ascontiguousarray(d, dtype=np.float32) for d in descales]
    o, lse, _ = _ext.forward_e4m3(*codes, *scales, _host.options(s))
    return o, lse


def no_tokens(dims: _validate.Dims) -> bool:
    """Nothing to attend (as the other inputs: empty outputs, or O = 0 and LSE -inf without keys)."""
    return dims.B == 0 or dims.Sq == 0 or dims.Hq == 0 or dims.Sk == 0


def numpy_forward(q, k, v, descales: tuple, s: _host.Settings):
    dims = check(q, k, v, descales, s)
    if no_tokens(dims):
        return (np.zeros((dims.B, dims.Sq, dims.Hq, dims.D), np.float32),
                np.full((dims.B, dims.Hq, dims.Sq), -np.inf, np.float32))
    return host_forward(q, k, v, descales, s)
