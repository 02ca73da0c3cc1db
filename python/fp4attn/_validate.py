"""Argument checks of the Python API, in one place.

They cover what only the Python layer knows: array types and dtypes, the
layout string, names of recipes and options, and how the user's arguments
(q or query, k or key, ...) relate to each other. Problem-level checks (head
dim, heads per group, tile sizes) are fp4attn::validate's in C++; its
fp4attn::Error arrives here as ValueError with the same message.
Every error names the argument it is about.
"""

from __future__ import annotations

import math
import operator
import sys
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import _ext

# Floating dtypes an input may have; anything else (ints, bools, complex) is
# almost certainly a mistake, so it is refused rather than cast.
SUPPORTED_DTYPES = ("float16", "bfloat16", "float32", "float64")
LAYOUTS = ("bshd", "bhsd")
# Names the C++ enums accept, read once from the extension.
RECIPES = tuple(_ext.Recipe.__members__)
TARGETS = tuple(_ext.Target.__members__)
FORMATS = tuple(_ext.TensorFormat.__members__)
BLOCK_AXES = tuple(_ext.BlockAxis.__members__)
MX_SCALE_RULES = tuple(_ext.MxScaleRule.__members__)
RANK = 4  # (B, S, H, D) or (B, H, S, D)

# Index of the sequence and head dimensions in each layout; batch is 0, D is 3.
_SEQ_HEAD_AXES = {"bshd": (1, 2), "bhsd": (2, 1)}


def seq_axis(layout: str) -> int:
    """The sequence's axis of a (B, S, H, D) ("bshd") or (B, H, S, D) ("bhsd") operand."""
    return _SEQ_HEAD_AXES[layout][0]


@dataclass(frozen=True)
class Dims:
    """Sizes of one attention call, read from q and k in the caller's layout."""

    B: int
    Sq: int
    Sk: int
    Hq: int
    Hkv: int
    D: int


# dtype -> bare name, filled as dtypes are seen (str() of a torch dtype is slow). NumPy's
# dtypes have a dict of their own: torch.compile traces the lookup for torch tensors,
# and its tracer cannot hash NumPy dtype objects.
_DTYPE_NAMES: dict = {}
_NUMPY_DTYPE_NAMES: dict = {}


def _dtype_name(x) -> str:
    # NumPy prints "float32", torch "torch.float32": compare the bare name.
    names = _NUMPY_DTYPE_NAMES if isinstance(x, np.ndarray) else _DTYPE_NAMES
    name = names.get(x.dtype)
    if name is None:
        name = names[x.dtype] = str(x.dtype).rsplit(".", 1)[-1]
    return name


def _last_stride_elems(x) -> int:
    """Stride of the last dimension in elements (NumPy counts bytes, torch elements)."""
    if isinstance(x, np.ndarray):
        return x.strides[-1] // x.itemsize
    return x.stride(-1)


def check_array(x, name: str, dtypes=SUPPORTED_DTYPES) -> None:
    """Dtype, rank and a contiguous last dimension: what every kernel needs."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name}: expected an array, got {type(x).__name__}")
    dtype = _dtype_name(x)
    if dtype not in dtypes:
        hint = " (float8_e4m3fn inputs: flash_attn_func or flash_attn_varlen_func with q_descale, k_descale, " \
            "v_descale)" \
            if dtype == "float8_e4m3fn" else ""
        raise TypeError(f"{name}: dtype {dtype} is not supported; use one of {', '.join(dtypes)}{hint}")
    if len(x.shape) != RANK:
        raise ValueError(f"{name}: expected a {RANK}-D array, got shape {tuple(x.shape)}")
    # A size-1 D has no meaningful stride; any other needs unit stride, as in
    # FlashAttention. An empty array has no stride either (NumPy reports 0):
    # fp4attn::validate names the empty dimension instead.
    if x.shape[-1] > 1 and math.prod(x.shape) > 0 and _last_stride_elems(x) != 1:
        raise ValueError(
            f"{name}: the last dimension (head dim D) must be contiguous, got stride {_last_stride_elems(x)}"
        )


def check_layout(layout) -> str:
    return check_choice(layout, LAYOUTS, "layout")


def check_qkv(q, k, v, layout: str, names=("q", "k", "v"), dtypes=SUPPORTED_DTYPES) -> Dims:
    """Checks the three operands and how their shapes agree; returns the sizes."""
    q_name, k_name, v_name = names
    for x, name in ((q, q_name), (k, k_name), (v, v_name)):
        check_array(x, name, dtypes)
    for x, name in ((k, k_name), (v, v_name)):
        if _dtype_name(x) != _dtype_name(q):
            raise TypeError(f"{name}: dtype {_dtype_name(x)} differs from {q_name}'s {_dtype_name(q)}")
        # Host arrays may lack a device attribute; torch tensors must all be on one device.
        if getattr(x, "device", None) != getattr(q, "device", None):
            raise ValueError(f"{name}: is on device {x.device}, {q_name} on {q.device}")
    seq, head = _SEQ_HEAD_AXES[layout]
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"{v_name}: shape {tuple(v.shape)} differs from {k_name}'s {tuple(k.shape)}")
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"{k_name}: batch size {k.shape[0]} differs from {q_name}'s {q.shape[0]}")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"{k_name}: head dim {k.shape[3]} differs from {q_name}'s {q.shape[3]}")
    # Plain ints for arrays; symbolic sizes stay symbolic when torch.compile traces.
    return Dims(
        B=q.shape[0], Sq=q.shape[seq], Sk=k.shape[seq], Hq=q.shape[head], Hkv=k.shape[head], D=q.shape[3]
    )


def check_choice(value, choices, name: str) -> str:
    """`value` if it is one of the names in `choices`, else an error naming `name`."""
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a string, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name}: unknown {name} {value!r}; use one of {', '.join(choices)}")
    return value


def check_recipe(recipe) -> str:
    return check_choice(recipe, RECIPES, "recipe")


def check_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    return int(value)


def check_scale(scale, name: str) -> float:
    """None means 1/sqrt(D), which the C++ core spells 0."""
    # Python numbers first: under torch.compile these checks are traced, and
    # the plain-type branches are the ones tracing handles without surprises.
    if scale is None:
        return 0.0
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        value = float(scale)
    elif isinstance(scale, (np.floating, np.integer)):
        value = float(scale)
    else:
        raise TypeError(f"{name}: expected a float or None, got {type(scale).__name__}")
    # Comparisons rather than math.isfinite: torch.compile may trace the value as a symbolic
    # float (a scale that changed between calls), on which it can compare but not call math.
    if not 0.0 < value < math.inf:  # NaN fails both
        # A traced value cannot be formatted (torch 2.11's Dynamo refuses the f-string, so the
        # error would be about tracing instead of the scale); the message then goes without it.
        got = "" if _traced() else f", got {scale!r}"
        raise ValueError(f"{name}: must be a positive finite number or None{got}")
    return value


def _traced() -> bool:
    """Whether torch.compile is tracing this call (torch is looked up, never imported, here)."""
    torch_module = sys.modules.get("torch")
    return torch_module is not None and torch_module.compiler.is_compiling()


def check_window(window, name: str, causal: bool) -> tuple:
    """(left, right) of a sliding window given as FlashAttention's window_size: two ints, -1 for
    no bound on that side. A causal mask already ends each row at its diagonal, so with one the
    right bound can only be -1 or 0."""
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"{name}: expected (left, right), two ints (-1 for no bound), got {window!r}")
    bounds = []
    for side, value in zip(("left", "right"), window):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name}: its {side} bound must be an int, got {type(value).__name__}")
        if value < -1:
            raise ValueError(f"{name}: its {side} bound must be -1 (no bound) or >= 0, got {int(value)}")
        bounds.append(int(value))
    if causal and bounds[1] > 0:
        raise ValueError(f"{name}: a causal mask ends each row at its diagonal, so the right bound must be -1 or 0, "
                         f"got {bounds[1]}")
    return bounds[0], bounds[1]


def check_absent(value, name: str, default, why: str) -> None:
    """Arguments kept for drop-in compatibility with PyTorch SDPA and
    FlashAttention whose features fp4attn lacks: only the value that turns the
    feature off is accepted (never ignored)."""
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
        if float(value) == default:
            return
    elif default is None:
        if value is None:
            return
    elif isinstance(default, tuple):
        if isinstance(value, (tuple, list)) and tuple(value) == default:
            return
    raise ValueError(f"{name}: {why}; only {default!r} is accepted, got {value!r}")


def check_flag(value, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")


def check_cu_seqlens_form(cu, name: str) -> int:
    """What the host knows of cumulative sequence lengths without reading them: a
    1-D int32 or int64 array of B + 1 >= 2 entries. Returns B."""
    if not hasattr(cu, "shape") or not hasattr(cu, "dtype"):
        raise TypeError(f"{name}: expected a 1-D integer array or tensor, got {type(cu).__name__}")
    dtype = _dtype_name(cu)
    if dtype not in ("int32", "int64"):
        raise TypeError(f"{name}: dtype {dtype} is not supported; use int32 (as FlashAttention) or int64")
    if len(cu.shape) != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name}: expected a 1-D array of batch size + 1 >= 2 entries, got shape {tuple(cu.shape)}")
    return int(cu.shape[0]) - 1


def check_cu_seqlens(cu, name: str, total: int, total_name: str) -> list:
    """A varlen batch's cumulative sequence lengths as host ints: a 1-D integer
    array of B + 1 entries, starting at 0, never decreasing, ending at `total`
    (the packed tensor's token count)."""
    return _checked_offsets(cu, name, total, total_name)[0]


def _checked_offsets(cu, name: str, total: int, total_name: str) -> tuple:
    """check_cu_seqlens's entries (a list) and the B lengths between them (a tuple)."""
    check_cu_seqlens_form(cu, name)
    values = _host_ints(cu, name)
    if values[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {values[0]}")
    # The lengths in one pass that stays in C (a Python loop over B + 1 entries costs µs a call
    # where the entries are read every call: inference tensors, new tensors); a negative length
    # is where the entries decrease.
    lengths = tuple(map(operator.sub, values[1:], values))
    if min(lengths) < 0:
        i = next(i for i, n in enumerate(lengths, 1) if n < 0)
        raise ValueError(f"{name}: must not decrease, got {values[i - 1]} then {values[i]} at entries {i - 1}, {i}")
    if values[-1] != total:
        raise ValueError(f"{name}: ends at {values[-1]}, but {total_name} holds {total} tokens")
    return values, lengths


# A torch tensor's entries read to the host, by id: (weak reference, version,
# data pointer, entries). Reading a CUDA tensor waits for the device; a model's
# layers pass one cu_seqlens tensor to every layer, so its entries are read
# once and kept while torch's version counter says the tensor is unchanged
# (every in-place write bumps it). Inference tensors have no version counter
# and are read on every call.
_HOST_INTS: dict = {}


def _host_ints(cu, name: str) -> list:
    """cu's entries as Python ints (a torch tensor's from _HOST_INTS while it is unchanged)."""
    if not hasattr(cu, "is_inference"):
        return [int(x) for x in (cu.tolist() if hasattr(cu, "tolist") else cu)]
    key = id(cu)
    kept = None if cu.is_inference() else _HOST_INTS.get(key)
    if kept is not None and kept[0]() is cu and kept[1] == cu._version and kept[2] == cu.data_ptr():
        return list(kept[3])
    if cu.is_cuda and sys.modules["torch"].cuda.is_current_stream_capturing():
        raise ValueError(f"{name}: its entries are read on the host, which a CUDA graph's capture cannot do")
    values = cu.tolist()  # an integer tensor's entries come as Python ints
    if not cu.is_inference():
        _HOST_INTS[key] = (weakref.ref(cu, lambda _, key=key: (_HOST_INTS.pop(key, None), _CHECKED.pop(key, None))),
                           cu._version, cu.data_ptr(), tuple(values))
    return values


class Sequences(NamedTuple):
    """A varlen batch's checked cumulative offsets (B + 1), the sequences' lengths (B) and the
    longest length, as tuples of host ints."""

    offsets: tuple
    lengths: tuple
    longest: int


# Offsets that passed check_cu_seqlens, by id: (the _HOST_INTS entries' tuple
# they were read as, the token count they were checked against, their
# Sequences). A call on the same unchanged tensor then skips the check's loops
# over the B + 1 entries and the lengths' (and gets the same tuples, which the
# packed path's caches compare cheaply).
_CHECKED: dict = {}


def checked_sequences(cu, name: str, total: int, total_name: str) -> Sequences:
    """check_cu_seqlens's offsets with the lengths and the longest; for a torch tensor that
    _HOST_INTS keeps and that passed the check against `total` before, the same Sequences
    object from _CHECKED without checking again."""
    key = id(cu)
    if hasattr(cu, "is_inference") and not cu.is_inference():
        kept, done = _HOST_INTS.get(key), _CHECKED.get(key)
        if (kept is not None and done is not None and kept[0]() is cu and kept[1] == cu._version
                and kept[2] == cu.data_ptr() and done[0] is kept[3] and done[1] == total):
            return done[2]
    values, lengths = _checked_offsets(cu, name, total, total_name)
    values = tuple(values)
    kept = _HOST_INTS.get(key)
    if kept is None or kept[3] != values:
        return Sequences(values, lengths, max(lengths, default=0))
    sequences = Sequences(kept[3], lengths, max(lengths, default=0))  # the kept tuple: compared by identity
    _CHECKED[key] = (kept[3], total, sequences)
    return sequences


def check_max_seqlen(value, name: str, longest: int) -> int:
    """max_seqlen_q / max_seqlen_k: FlashAttention sizes its grid by them, so a
    value below the longest sequence (Sequences.longest) would drop rows; here it is refused."""
    value = check_int(value, name)
    if value < longest:
        raise ValueError(f"{name}: {value} is below the longest sequence's {longest} tokens")
    return value
