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

Packed sequences (flash_attn_varlen_func): q (total_q, Hq, D), k and v (total_k, Hkv, D), the
descales (B, Hkv) one row per sequence; O (total_q, Hq, D) and the LSE (Hq, total_q). On a
Hopper GPU one device call runs every sequence (fp4attn::attention_e4m3_varlen: the kernel's
packed path, which reads Q's and K's codes in place); elsewhere each sequence
runs as a call of its own. Each sequence's O and LSE are those of a call on it alone.
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
    return s._replace(smooth_k=False) if s.smooth_k else s


def check(q, k, v, descales: tuple, s: _host.Settings) -> _validate.Dims:
    """The operands and descales (errors name the argument); returns the sizes."""
    dims = _validate.check_qkv(q, k, v, s.layout, _NAMES, dtypes=(E4M3,))
    for d, name in zip(descales, ("q_descale", "k_descale", "v_descale")):
        _check_descale(d, name, q, dims)
    return dims


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, descales: tuple, s: _host.Settings) -> tuple:
    """The packed operands, the form of cu_seqlens (not their entries, which may be on the device)
    and the descales, one row per sequence; returns (B, Hq, Hkv, D)."""
    dims = _validate.check_qkv(*(x[None] for x in (q, k, v)), s.layout, _NAMES, dtypes=(E4M3,))
    B = _validate.check_cu_seqlens_form(cu_seqlens_q, "cu_seqlens_q")
    if _validate.check_cu_seqlens_form(cu_seqlens_k, "cu_seqlens_k") != B:
        raise ValueError(f"cu_seqlens_k: has {cu_seqlens_k.shape[0]} entries (batch size {cu_seqlens_k.shape[0] - 1}) "
                         f"but cu_seqlens_q has {B + 1}")
    per_sequence = _validate.Dims(B=B, Sq=dims.Sq, Sk=dims.Sk, Hq=dims.Hq, Hkv=dims.Hkv, D=dims.D)
    for d, name in zip(descales, ("q_descale", "k_descale", "v_descale")):
        _check_descale(d, name, q, per_sequence)
    return B, dims.Hq, dims.Hkv, dims.D


def host_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, total_q: int, total_k: int) -> tuple:
    """cu_seqlens read on the host and checked (starting at 0, never decreasing, ending at the
    token counts; no sequence longer than max_seqlen): the two lists of offsets."""
    sequences_q = _validate.checked_sequences(cu_seqlens_q, "cu_seqlens_q", total_q, "q")
    sequences_k = _validate.checked_sequences(cu_seqlens_k, "cu_seqlens_k", total_k, "k")
    _validate.check_max_seqlen(max_seqlen_q, "max_seqlen_q", sequences_q.longest)
    _validate.check_max_seqlen(max_seqlen_k, "max_seqlen_k", sequences_k.longest)
    return sequences_q.offsets, sequences_k.offsets


def host_varlen_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, cu_q: list, cu_k: list, descales: tuple,
                        s: _host.Settings):
    """O (total_q, Hq, D) and LSE (Hq, total_q) of packed sequences, one host call per sequence on
    its rows and its row of each descale (cu_q, cu_k: checked host offsets). Every code and
    descale is checked first, those no call reads (a sequence without queries) too, as the
    device call checks them."""
    _check_values(q, k, v, descales)
    hq, d = q.shape[1], q.shape[2]
    outs, lses = [np.zeros((0, hq, d), np.float32)], [np.zeros((hq, 0), np.float32)]
    for b in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        lq, lk = rows.stop - rows.start, keys.stop - keys.start
        if lq == 0:
            continue
        if lk == 0:  # nothing to attend: O = 0, LSE = -inf
            outs.append(np.zeros((lq, hq, d), np.float32))
            lses.append(np.full((hq, lq), -np.inf, np.float32))
            continue
        scales = [None if x is None else x[b:b + 1] for x in descales]
        o, lse = host_forward(q[None, rows], k[None, keys], v[None, keys], scales, s)
        outs.append(o[0])
        lses.append(lse[0])
    return np.concatenate(outs), np.concatenate(lses, axis=1)


def _check_values(q, k, v, descales: tuple) -> None:
    """ValueError naming the first NaN code (E4M3's S.1111.111) or descale that is not finite and
    positive."""
    for x, name in zip((q, k, v), _NAMES):
        codes = np.asarray(x).view(np.uint8)
        nan = np.flatnonzero((codes & 0x7F) == 0x7F)
        if nan.size:
            at = np.unravel_index(nan[0], codes.shape)
            raise ValueError(f"{name}: holds a NaN code (0x{codes.flat[nan[0]]:02X}) at (token, h, d) = "
                             f"{tuple(int(i) for i in at)}")
    for d, name in zip(descales, ("q_descale", "k_descale", "v_descale")):
        if d is None:
            continue
        bad = np.flatnonzero(~(np.isfinite(d) & (d > 0)))
        if bad.size:
            b, h = np.unravel_index(bad[0], d.shape)
            raise ValueError(f"{name}: must be finite and positive, got {d.flat[bad[0]]} at (b, h) = ({b}, {h})")


def numpy_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, descales: tuple,
                         s: _host.Settings):
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, descales, s)
    cu_q, cu_k = host_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q.shape[0], k.shape[0])
    return host_varlen_forward(q, k, v, cu_q, cu_k, descales, s)


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
