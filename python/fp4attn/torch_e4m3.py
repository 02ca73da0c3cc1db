"""The torch layer of attention on caller-quantized E4M3 inputs (fp4attn.e4m3 says what the
call means): the custom ops fp4attn::attention_e4m3 and, for packed sequences,
fp4attn::attention_e4m3_varlen, their fake implementations for torch.compile, and their
device and host paths. Forward only: E4M3 inputs carry no gradient.
"""

# No `from __future__ import annotations` here: custom_op reads the signature's annotations.
import atexit
import functools
import warnings
from typing import Optional

import torch

from . import _ext, _host, _validate, e4m3, torch_ops

_OP = "fp4attn::attention_e4m3"
_VARLEN_OP = "fp4attn::attention_e4m3_varlen"


def _bshd_shape(q: torch.Tensor, k: torch.Tensor) -> tuple:
    """(B, Sq, Sk, Hq, Hkv, D), the order the bindings take."""
    return q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]


def _settings(mask: str, scale: float, direct_p: bool, window_left: int, window_right: int) -> _host.Settings:
    return _host.Settings(layout="bshd", mask=mask, scale=scale, recipe="fp8", smooth_k=False, direct_p=direct_p,
                          gqa=True, names="q,k,v", window_left=window_left, window_right=window_right)


@functools.lru_cache(maxsize=64, typed=True)
def _kept_settings(mask: str, scale: float, direct_p: bool, window_left: int, window_right: int) -> tuple:
    s = _settings(mask, scale, direct_p, window_left, window_right)
    return s, _host.options(s)


# The op registry keeps this module's functions, and so this cache and its options, alive past the
# modules' teardown, where nanobind would report them as leaked: empty it at exit.
atexit.register(_kept_settings.cache_clear)


def _settings_and_options(mask: str, scale: float, direct_p: bool, window_left: int, window_right: int) -> tuple:
    """(_settings, its _host.options) of the ops' arguments; kept by value (types included): a model's
    calls repeat them, and the Settings and its lookup cost a few µs a call."""
    try:
        return _kept_settings(mask, scale, direct_p, window_left, window_right)
    except TypeError:  # an argument without a hash
        s = _settings(mask, scale, direct_p, window_left, window_right)
        return s, _host.options(s)


def _device_path(device: torch.device, shape: tuple, opt) -> bool:
    if device.type != "cuda" or not _ext.cuda_built():
        return False
    # device_e4m3_supported validates first, so both paths reject the same calls.
    return _ext.device_e4m3_supported(shape, opt) and torch_ops._is_sm90(device.index)


def _host_warning(q: torch.Tensor, D: int) -> None:
    warnings.warn(
        f"fp4attn: no GPU kernel for E4M3 inputs here (D = {D}, {torch.cuda.get_device_name(q.device)}): "
        "their CUDA tensors are copied to the host and run there, which synchronises with the device and is "
        "far slower",
        RuntimeWarning,
        stacklevel=3,
    )


def _e4m3_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_descale: Optional[torch.Tensor],
               k_descale: Optional[torch.Tensor], v_descale: Optional[torch.Tensor], mask: str, scale: float,
               direct_p: bool, window_left: int, window_right: int) -> tuple[torch.Tensor, torch.Tensor]:
    s, opt = _settings_and_options(mask, scale, direct_p, window_left, window_right)
    shape = _bshd_shape(q, k)
    B, Sq, _, Hq, _, D = shape
    descales = (q_descale, k_descale, v_descale)
    if _device_path(q.device, shape, opt):
        with torch_ops._on_device(q.device):
            o = torch.empty((B, Sq, Hq, D), dtype=torch.bfloat16, device=q.device)
            lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
            workspace = torch.empty(_ext.device_e4m3_workspace_bytes(shape), dtype=torch.uint8, device=q.device)
            scales = [None if d is None else d.contiguous() for d in descales]
            ptrs = [0 if d is None else d.data_ptr() for d in scales]
            _ext.forward_e4m3_device(shape, q.data_ptr(), q.stride()[:3], k.data_ptr(), k.stride()[:3],
                                     v.data_ptr(), v.stride()[:3], *ptrs, o.data_ptr(), o.stride()[:3],
                                     lse.data_ptr(), workspace.data_ptr(), workspace.numel(), opt,
                                     torch_ops._current_stream(q.device))
        return o, lse
    if q.device.type == "cuda":
        _host_warning(q, D)
    host = [x.detach().view(torch.uint8).cpu().numpy() for x in (q, k, v)]
    scales = [None if d is None else d.detach().float().cpu().numpy() for d in descales]
    o, lse = e4m3.host_forward(*host, scales, s)
    return (torch.from_numpy(o).to(device=q.device, dtype=torch.bfloat16),
            torch.from_numpy(lse).to(device=q.device))


_e4m3_op = torch.library.custom_op(_OP, _e4m3_impl, mutates_args=())


@_e4m3_op.register_fake
def _e4m3_fake(q, k, v, q_descale, k_descale, v_descale, mask, scale, direct_p, window_left, window_right):
    B, Sq, Hq, D = q.shape
    return q.new_empty((B, Sq, Hq, D), dtype=torch.bfloat16), q.new_empty((B, Hq, Sq), dtype=torch.float32)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, descales: tuple, s: _host.Settings):
    """(O, LSE) of E4M3 q, k, v with (B, Hkv) descales or None: through the op where something
    traces the call, else its implementation directly."""
    dims = e4m3.check(q, k, v, descales, s)
    if e4m3.no_tokens(dims):
        return (q.new_zeros((dims.B, dims.Sq, dims.Hq, dims.D), dtype=torch.bfloat16),
                q.new_full((dims.B, dims.Hq, dims.Sq), float("-inf"), dtype=torch.float32))
    args = (q, k, v, *descales, s.mask, s.scale, s.direct_p, s.window_left, s.window_right)
    # Plain tensors with nothing tracing them skip the op's dispatch (tens of µs of host time a
    # call); torch.compile, fake tensors and functorch transforms see the op.
    return _e4m3_impl(*args) if torch_ops._eager_call(args) else _e4m3_op(*args)


def _device_ints(cu: torch.Tensor, device: torch.device) -> torch.Tensor:
    """cu_seqlens as the device call reads them: int32, contiguous, on q's device."""
    if cu.dtype is torch.int32 and cu.device == device and cu.is_contiguous():
        return cu  # what the conversion below gives, without its two dispatches
    return cu.to(device=device, dtype=torch.int32).contiguous()


def _e4m3_varlen_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                      q_descale: Optional[torch.Tensor], k_descale: Optional[torch.Tensor],
                      v_descale: Optional[torch.Tensor], mask: str, scale: float, direct_p: bool, window_left: int,
                      window_right: int) -> tuple[torch.Tensor, torch.Tensor]:
    s, opt = _settings_and_options(mask, scale, direct_p, window_left, window_right)
    (total_q, Hq, D), (total_k, Hkv) = q.shape, k.shape[:2]
    B = cu_seqlens_q.shape[0] - 1
    descales = (q_descale, k_descale, v_descale)
    device = q.device
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    # Under capture nothing is read on the host: the device checks cu_seqlens at every replay
    # against these sizes (NaN outputs where they do not fit).
    lengths = None if capturing else e4m3.host_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                        total_q, total_k)
    shape = (B, max_seqlen_q, max_seqlen_k, Hq, Hkv, D)
    if _device_path(device, shape, opt):
        with torch_ops._on_device(device):
            o = torch.empty((total_q, Hq, D), dtype=torch.bfloat16, device=device)
            lse = torch.empty((Hq, total_q), dtype=torch.float32, device=device)
            workspace = torch.empty(_ext.device_e4m3_workspace_bytes(shape, (total_q, total_k)), dtype=torch.uint8,
                                    device=device)
            cu_q, cu_k = _device_ints(cu_seqlens_q, device), _device_ints(cu_seqlens_k, device)
            # Held until the call is enqueued: a copy made here for a strided descale must not be
            # freed (and its memory handed to the next copy) before then.
            scales = [None if d is None else d.contiguous() for d in descales]
            ptrs = [0 if d is None else d.data_ptr() for d in scales]
            # A packed tensor's rows: strides on S and H (the batch stride is not used).
            _ext.forward_e4m3_device(shape, q.data_ptr(), (0, *q.stride()[:2]), k.data_ptr(), (0, *k.stride()[:2]),
                                     v.data_ptr(), (0, *v.stride()[:2]), *ptrs, o.data_ptr(), (0, *o.stride()[:2]),
                                     lse.data_ptr(), workspace.data_ptr(), workspace.numel(), opt,
                                     torch_ops._current_stream(device), cu_q.data_ptr(), cu_k.data_ptr(), total_q,
                                     total_k)
        return o, lse
    if capturing:
        raise ValueError("cu_seqlens_q: a CUDA graph can capture flash_attn_varlen_func on E4M3 inputs only where "
                         "the Hopper kernels run it")
    if q.device.type == "cuda":
        _host_warning(q, D)
    host = [x.detach().view(torch.uint8).cpu().numpy() for x in (q, k, v)]
    scales = [None if d is None else d.detach().float().cpu().numpy() for d in descales]
    o, lse = e4m3.host_varlen_forward(*host, *lengths, scales, s)
    return (torch.from_numpy(o).to(device=q.device, dtype=torch.bfloat16),
            torch.from_numpy(lse).to(device=q.device))


_e4m3_varlen_op = torch.library.custom_op(_VARLEN_OP, _e4m3_varlen_impl, mutates_args=())


@_e4m3_varlen_op.register_fake
def _e4m3_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_descale, k_descale,
                      v_descale, mask, scale, direct_p, window_left, window_right):
    total_q, Hq, D = q.shape
    return q.new_empty((total_q, Hq, D), dtype=torch.bfloat16), q.new_empty((Hq, total_q), dtype=torch.float32)


def varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                   max_seqlen_k, descales: tuple, s: _host.Settings):
    """(O (total_q, Hq, D), LSE (Hq, total_q)) of packed E4M3 sequences: through the op where
    something traces the call, else its implementation directly (as `forward`)."""
    B, Hq, _, D = e4m3.check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, descales, s)
    max_seqlen_q = _validate.check_int(max_seqlen_q, "max_seqlen_q")
    max_seqlen_k = _validate.check_int(max_seqlen_k, "max_seqlen_k")
    for value, name in ((max_seqlen_q, "max_seqlen_q"), (max_seqlen_k, "max_seqlen_k")):
        if value < 0:
            raise ValueError(f"{name}: must not be negative, got {value}")
    for cu, name in ((cu_seqlens_q, "cu_seqlens_q"), (cu_seqlens_k, "cu_seqlens_k")):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name}: expected a torch tensor with torch inputs, got {type(cu).__name__}")
    total_q, total_k = q.shape[0], k.shape[0]
    if total_q == 0 or total_k == 0 or max_seqlen_q == 0 or max_seqlen_k == 0:
        # Nothing to attend (the token counts are known without reading cu_seqlens): O = 0, LSE = -inf,
        # after the offsets' own checks where they can be read.
        if not (q.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            e4m3.host_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, total_q, total_k)
        return (q.new_zeros((total_q, Hq, D), dtype=torch.bfloat16),
                q.new_full((Hq, total_q), float("-inf"), dtype=torch.float32))
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *descales, s.mask, s.scale, s.direct_p,
            s.window_left, s.window_right)
    # The op's other arguments are ints, floats, strings and bools: the tensors alone decide.
    eager = torch_ops._eager_call((q, k, v, cu_seqlens_q, cu_seqlens_k, *descales))
    return _e4m3_varlen_impl(*args) if eager else _e4m3_varlen_op(*args)
