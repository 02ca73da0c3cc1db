"""PyTorch integration: attention as a torch.library custom op.

The op `fp4attn::attention` has a fake (meta) implementation, so
torch.compile(fullgraph=True) keeps it in the graph without running it.
Eager calls on plain tensors run the op's implementation and backward
directly, without the op's dispatch (see "the eager path" below).

Execution:
* CUDA tensors, when this build has the sm90 executor, the tensors live on a
  compute-capability 9.0 GPU and the executor implements the call (recipes
  fp8, mxfp4_train, mxfp4 and nvfp4, Direct-P on or off, target sm90, D = 64
  or 128, and 256 for the forwards of all but nvfp4; other multiples of 8 from
  16 to 256 read as they are by recipe fp8's forward, and with zero channels
  appended to copies of q, k and v otherwise, as D = 8 is for every recipe,
  see _padded_head_dim):
  the device path.
  The GPU quantizers read q, k and v where they are (any strides with D
  contiguous, both layouts, no copy), the kernel writes O and LSE into
  tensors allocated here, and the quantized (for the MX recipes also the
  folded E4M3) operands live in a workspace tensor from torch's caching
  allocator. Everything is enqueued on the current CUDA stream of the
  tensors' device with no host synchronisation, so the op can be captured in
  a CUDA graph. Non-finite input cannot raise an error on this path (that
  would need a synchronisation): it makes every element of O and the LSE NaN.
* Every other call goes through the host entry point: CPU tensors run on the
  emulator (or on the sm90 kernels when this build has them and a Hopper GPU
  is present); other CUDA tensors (target sm100, head dims above 128 except
  the forwards of recipes fp8, mxfp4 and mxfp4_train, GPUs other than sm90,
  CPU-only builds) are COPIED TO THE HOST, run there, and the results copied
  back, with a RuntimeWarning (once per kind of call). That synchronises
  with the device and cannot be captured in a CUDA graph.

Both paths return O with q's shape, dtype and device (the kernels store bf16
values; for other input dtypes O is converted from bf16, on the device for
the device path) and the LSE as float32 (B, Hq, Sq). For the same inputs the
two paths give the same numbers: both quantize with the same GPU quantizer
and run the same kernel.

Autograd (recipes with a backward: fp8, mxfp4_train; DESIGN §5). The forward
saves q, k, v, O and the LSE; on the device path it keeps, instead of q and
k, what it quantized them to (the op's third output, a uint8 block): for
recipe fp8 the E4M3 codes, their scales and the transposed copies the
backward's products read (about 2 bytes per element of Q and K: what bf16 q
and k would take); for mxfp4_train K's E4M3 fold with its transposed copy
and Q's MXFP4 codes (2 and 0.53 bytes). So the backward does not quantize
q and k again (fp8: +3–7 % on a training step's attention at 1k–4k tokens),
and the gradients are the same bits.
The gradients come from a second custom op,
`fp4attn::attention_backward`, which has a fake implementation too, so
torch.compile(fullgraph=True) traces forward and backward. It runs:
* on the device, zero copy, on the current stream and with no host
  synchronisation, where this build has the sm90 backward kernel
  (`_ext.backward_device`) and `_ext.device_backward_supported` accepts the
  call (recipes fp8 and mxfp4_train, target sm90, D = 64 or 128; narrower
  head dims arrive padded);
  reproducible bit for bit except where the one pass is faster (D = 64, rows
  seeing at least 256 keys on average) while
  torch.are_deterministic_algorithms_enabled() is off and the call did not
  pass deterministic=True (DETERMINISTIC_BACKWARD says how dQ is summed);
* otherwise on the host through `_ext.backward` (the emulator's FP8 backward,
  or the sm90 kernels where the host entry point has them), copying CUDA
  tensors to the host and back, with a RuntimeWarning as the forward's.
The inference-only recipes (mxfp4, nvfp4) raise NotImplementedError naming
the recipe.

Gradient through the returned LSE: supported. A loss that uses the LSE adds
dLSE_i·P_ij to dS_ij (in FlashAttention terms Delta becomes
rowsum(dO ⊙ O) − dLSE). The backward bindings compute Delta from dO and O
themselves, so the term comes from a second backward call whose inputs make
dP = 0 and Delta = −dLSE (V = 0; O and dO one-hot in channel 0): its dQ and
dK are the term's, with dS = P ⊙ dLSE quantized as any dS is (dQ plus
scale·dLSE·k̄ under smooth_k, see _smooth_k_lse_dq). That
costs a second backward, so it runs only when the caller can hold the LSE
(attention(return_lse=True), flash_attn_func(return_attn_probs=True)); calls
that never hand the LSE out (sdpa, and the others without those flags) know
its gradient is zero. The host path also skips it when dLSE is all zeros.
"""

# No `from __future__ import annotations` here: custom_op reads the
# signature's annotations to build the op schema.
import contextlib
import functools
import warnings
from typing import NamedTuple, Optional, Sequence

import numpy as np
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import _ext, _host, _validate

_OP = "fp4attn::attention"
_BACKWARD_OP = "fp4attn::attention_backward"

# The checks' cache of dtype names, filled now for torch's dtypes: torch.compile guards
# on that dict's contents, and an op filling it while a graph runs would make the next
# call recompile.
for _dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.int16,
               torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2):
    _validate._DTYPE_NAMES.setdefault(_dtype, str(_dtype).rsplit(".", 1)[-1])
del _dtype

# The op's arguments are q, k, v, the fields of _host.Settings in order, then
# lse_returned, keep_for_backward and deterministic_backward.
_SETTINGS_ARGS = slice(3, 3 + len(_host.Settings._fields))
_LSE_RETURNED_ARG = _SETTINGS_ARGS.stop
_KEEP_ARG = _LSE_RETURNED_ARG + 1
_DETERMINISTIC_ARG = _KEEP_ARG + 1

# How the device backward sums dQ over key tiles. None (the default) follows
# torch.are_deterministic_algorithms_enabled(): while that is off, the faster
# mode for the problem (_ext.device_backward_one_pass_faster: at D = 64, where
# query rows see at least 256 keys on average, one pass whose dQ summation
# order varies from run to run, forward + backward 3–11 % faster on the H200;
# its dQ also quantizes dS with one scale per 128 x 128 pair where the two
# passes take one per 64 query rows, so the modes' dQ differ by part of the
# FP8 error;
# elsewhere the two passes, faster and reproducible there). The op decides
# when it runs, from the call's sizes, so that torch.compile's symbolic sizes
# need no guard.
# True: always the two passes (the same bits every run). False: the one pass
# (slower at D = 128 and for short sequences). A call that passed
# FlashAttention's deterministic=True takes the two passes whatever this says.
DETERMINISTIC_BACKWARD: Optional[bool] = None


def _deterministic_backward(call_asked: bool = False) -> Optional[bool]:
    """The backward's mode: True two passes, False one pass, None the faster for the call's problem.
    call_asked: the call passed deterministic=True (FlashAttention's flag), which takes the two passes
    whatever the default."""
    if call_asked:
        return True
    if DETERMINISTIC_BACKWARD is not None:
        return bool(DETERMINISTIC_BACKWARD)
    if torch.are_deterministic_algorithms_enabled():
        return True
    return None


def one_pass_faster(dims: _validate.Dims, mask: str, window_left: int = -1, window_right: int = -1) -> bool:
    """Whether the one-pass device backward is faster than the two passes for this problem, mask and window."""
    return _ext.device_backward_one_pass_faster(_device_shape(dims), _ext.MaskKind.__members__[mask], window_left,
                                                window_right)


def is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def host_array(x: torch.Tensor):
    """A float32 NumPy array on the host (NumPy has no bfloat16; the core reads fp32 anyway)."""
    return x.detach().to(device="cpu", dtype=torch.float32).numpy()


# The dtypes the GPU quantizer reads directly; float64 is narrowed to float32
# first (on the device), as the host path does.
_DEVICE_ELEMENTS = {
    torch.float32: _ext.DeviceElement.float32,
    torch.float16: _ext.DeviceElement.float16,
    torch.bfloat16: _ext.DeviceElement.bfloat16,
}
_SM90 = (9, 0)


@functools.lru_cache(maxsize=None)
def _is_sm90(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) == _SM90


# The raw cudaStream_t of a device's current stream, as torch's generated
# kernels read it: without a Stream object (about 3 µs a call).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(device: torch.device) -> int:
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


_NO_SWITCH = contextlib.nullcontext()
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def _on_device(device: torch.device):
    """torch.cuda.device(device), or nothing where it is already the current device (the common case;
    the tensors exist, so CUDA is initialised and the runtime's current device can be asked directly)."""
    return _NO_SWITCH if device.index == _current_device() else torch.cuda.device(device)


def _bshd_strides(x: torch.Tensor, layout: str) -> tuple[int, int, int]:
    """Element strides on B, S and H of x seen as (B, S, H, D)."""
    if layout == "bhsd":
        return x.stride(0), x.stride(2), x.stride(1)
    return x.stride(0), x.stride(1), x.stride(2)


def _device_shape(dims: _validate.Dims) -> tuple[int, int, int, int, int, int]:
    return dims.B, dims.Sq, dims.Sk, dims.Hq, dims.Hkv, dims.D


def _warn_host_copy(q: torch.Tensor, dims: _validate.Dims, s: _host.Settings, step: str) -> None:
    """Says that a call on CUDA tensors leaves the device (once per kind of call:
    Python's default warning filter shows each distinct message once)."""
    if q.device.type == "cuda":
        window = f", window ({s.window_left}, {s.window_right})" if max(s.window_left, s.window_right) >= 0 else ""
        warnings.warn(
            f"fp4attn: no GPU kernel for this {step} (recipe {s.recipe}, target {s.target}, D = {dims.D}{window}, "
            f"{torch.cuda.get_device_name(q.device)}): its CUDA tensors are copied to the host and run there, "
            "which synchronises with the device and is far slower",
            RuntimeWarning,
            stacklevel=2,
        )


def _uses_device_path(q: torch.Tensor, dims: _validate.Dims, opt) -> bool:
    """Whether the device path runs this call; raises the host path's errors for an invalid one."""
    if q.device.type != "cuda" or not _ext.cuda_built():
        return False
    # device_forward_supported validates first, so both paths reject the same calls.
    return _ext.device_forward_supported(_device_shape(dims), opt) and _is_sm90(q.device.index)


# The block where a recipe-fp8 forward keeps Q's and K's operands for the
# backward: regions on 256-byte boundaries (src/dispatch/device_workspace.hpp,
# saved_layout), in Python so that torch.compile's fake tensors, whose sizes
# may be symbolic, get the same size; test_torch checks it against the C++.
_REGION_ALIGN = 256
_TOKEN_BLOCK = 128
_KEPT_FLAGS = 3


def _kept_size(dims: _validate.Dims, recipe):
    def region(n):
        return (n + _REGION_ALIGN - 1) // _REGION_ALIGN * _REGION_ALIGN

    q_blocks = (dims.Sq + _TOKEN_BLOCK - 1) // _TOKEN_BLOCK
    k_blocks = (dims.Sk + _TOKEN_BLOCK - 1) // _TOKEN_BLOCK
    q_elems, k_elems = dims.B * dims.Sq * dims.Hq * dims.D, dims.B * dims.Sk * dims.Hkv * dims.D
    if recipe == _ext.Recipe.mxfp4_train:
        # Q's MXFP4 codes (two per byte) and E8M0 scales (one per 32 along D); no Qᵀ nor Q block scales.
        q_part = region(q_elems // 2) + region(q_elems // 32)
    else:
        q_part = (region(q_elems)  # codes
                  + region(dims.B * dims.Hq * dims.D * q_blocks * _TOKEN_BLOCK)  # Qᵀ
                  + region(4 * dims.B * dims.Hq * q_blocks))  # block scales
    return (q_part + region(k_elems)  # K's codes
            + region(dims.B * dims.Hkv * dims.D * k_blocks * _TOKEN_BLOCK)  # Kᵀ
            + region(4 * dims.B * dims.Hkv * k_blocks)  # K's block scales or fold factors
            + region(4 * dims.B * dims.Hkv * dims.D)  # smooth_k mean
            + region(4 * dims.B * dims.Hq * dims.Sq)  # LSE shift
            + region(4 * _KEPT_FLAGS))


def _kept_bytes(q: torch.Tensor, dims: _validate.Dims, opt, keep_for_backward: bool):
    """Bytes of the block where the forward keeps Q's and K's operands for the backward; 0: none kept.

    Kept when asked for (a call that autograd will differentiate), where both
    forward and backward run on the device and the recipe keeps operands
    (fp8, mxfp4_train), for inputs the kernels read as they are (float64 is converted, so
    its backward converts q and k again anyway). Whether the device runs a
    call depends on D and the options alone, so a probe shape answers it even
    where torch.compile's sizes are symbolic.
    """
    if not keep_for_backward or q.dtype not in _DEVICE_ELEMENTS or not _ext.recipe_has_backward(opt.recipe):
        return 0
    probe = _validate.Dims(B=1, Sq=_TOKEN_BLOCK, Sk=_TOKEN_BLOCK, Hq=1, Hkv=1, D=int(dims.D))
    if not (_uses_device_path(q, probe, opt) and _uses_device_backward(q, probe, opt)):
        return 0
    if _ext.device_saved_bytes(_device_shape(probe), opt.recipe) == 0:
        return 0
    return _kept_size(dims, opt.recipe)


def _attention_device(q, k, v, dims: _validate.Dims, s: _host.Settings, opt, kept_bytes: int = 0):
    """(O, LSE, kept operands) computed on q's device, enqueued on its current stream; no copy of q, k, v."""
    if q.dtype == torch.float64:
        q, k, v = (x.float() for x in (q, k, v))
    shape = _device_shape(dims)
    with _on_device(q.device):
        o = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
        lse = torch.empty((dims.B, dims.Hq, dims.Sq), dtype=torch.float32, device=q.device)
        if kept_bytes and kept_bytes != _ext.device_saved_bytes(shape, opt.recipe):
            raise RuntimeError("fp4attn: the kept-operand block's size disagrees with the library's layout")
        kept = torch.empty(kept_bytes, dtype=torch.uint8, device=q.device)
        workspace = torch.empty(_ext.device_workspace_bytes(shape, opt.recipe), dtype=torch.uint8, device=q.device)
        _ext.forward_device(
            shape,
            _DEVICE_ELEMENTS[q.dtype],
            q.data_ptr(),
            _bshd_strides(q, s.layout),
            k.data_ptr(),
            _bshd_strides(k, s.layout),
            v.data_ptr(),
            _bshd_strides(v, s.layout),
            o.data_ptr(),
            _bshd_strides(o, s.layout),
            lse.data_ptr(),
            workspace.data_ptr(),
            workspace.numel(),
            opt,
            _current_stream(q.device),
            kept.data_ptr() if kept_bytes else 0,
            kept_bytes,
        )
    return o, lse, kept


def _attention_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qkv_layout: str,
    mask_kind: str,
    softmax_scale: float,
    recipe: str,
    smooth_k: bool,
    direct_p: bool,
    gqa: bool,
    arg_names: str,
    target: str,
    window_left: int,
    window_right: int,
    lse_returned: bool = True,
    keep_for_backward: bool = False,
    deterministic_backward: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # lse_returned only tells the backward whether the LSE can carry a gradient;
    # keep_for_backward asks for the third output (empty where nothing is kept);
    # deterministic_backward makes the backward take the two deterministic passes.
    s = _host.Settings(qkv_layout, mask_kind, softmax_scale, recipe, smooth_k, direct_p, gqa, arg_names, target,
                       window_left, window_right)
    dims = _host.check(q, k, v, s)
    opt = _host.options(s)
    if _uses_device_path(q, dims, opt):
        o, lse, kept = _attention_device(q, k, v, dims, s, opt, _kept_bytes(q, dims, opt, keep_for_backward))
        return o.to(q.dtype), lse, kept
    _warn_host_copy(q, dims, s, "forward")
    o, lse = _host.attention(host_array(q), host_array(k), host_array(v), s)
    return (torch.from_numpy(o).to(device=q.device, dtype=q.dtype), torch.from_numpy(lse).to(device=q.device),
            torch.empty(0, dtype=torch.uint8, device=q.device))


_attention_op = torch.library.custom_op(_OP, _attention_impl, mutates_args=())


@_attention_op.register_fake
def _attention_fake(
    q, k, v, qkv_layout, mask_kind, softmax_scale, recipe, smooth_k, direct_p, gqa, arg_names, target, window_left,
    window_right, lse_returned=True, keep_for_backward=False, deterministic_backward=False
):
    # Runs at trace time on fake tensors: the same checks, so compiled code raises the same errors.
    s = _host.Settings(qkv_layout, mask_kind, softmax_scale, recipe, smooth_k, direct_p, gqa, arg_names, target,
                       window_left, window_right)
    dims = _host.check(q, k, v, s)
    kept = _kept_bytes(q, dims, _host.options(s), keep_for_backward)
    return (q.new_empty(q.shape), q.new_empty((dims.B, dims.Hq, dims.Sq), dtype=torch.float32),
            q.new_empty((kept,), dtype=torch.uint8))


def _has_backward(recipe: str) -> bool:
    return _ext.recipe_has_backward(_ext.Recipe.__members__[recipe])


def _inference_only_message(recipe: str) -> str:
    trainable = [r for r in _validate.RECIPES if _has_backward(r)]
    return f"recipe {recipe} is inference-only and has no backward; train with one of {', '.join(trainable)}"


def _require_backward(recipe: str) -> None:
    if not _has_backward(recipe):
        raise NotImplementedError(_inference_only_message(recipe))


# ---- backward on the device -----------------------------------------------------


def _uses_device_backward(q: torch.Tensor, dims: _validate.Dims, opt) -> bool:
    if q.device.type != "cuda" or not _ext.cuda_built() or not hasattr(_ext, "backward_device"):
        return False
    return _ext.device_backward_supported(_device_shape(dims), opt) and _is_sm90(q.device.index)


class _Packing(NamedTuple):
    """Packed sequences of a backward call: device int32 cu_seqlens of the queries and of the keys,
    and the numbers of query tokens (the LSE's row pitch) and key tokens, which size the device
    call's packed layout. Tensors are then (tokens, H, D)."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    total_q: int
    total_k: int

    @property
    def tokens(self) -> tuple:
        return (self.total_q, self.total_k)


def _backward_device_call(d_o, q, k, v, o, lse, dims: _validate.Dims, s: _host.Settings, opt, deterministic: bool,
                          kept: Optional[torch.Tensor] = None, packing: Optional[_Packing] = None):
    """dQ, dK, dV in q's dtype, enqueued on the current stream; every tensor already of one element type.

    kept: the forward's block of Q's and K's operands (q and k are then not read).
    packing: packed sequences (the sequences' rows come from its cu_seqlens, batch strides unused).
    """
    if packing is None:
        def strides(x):
            return _bshd_strides(x, s.layout)
        cu = (0, 0, 0, 0)
    else:
        def strides(x):
            return (0, x.stride(0), x.stride(1))
        cu = (packing.cu_q.data_ptr(), packing.cu_k.data_ptr(), packing.total_q, packing.total_k)
    shape = _device_shape(dims)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=q.dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    workspace = torch.empty(_ext.device_backward_workspace_bytes(shape, deterministic, opt.recipe, kept is not None,
                                                                 packing.tokens if packing else (0, 0)),
                            dtype=torch.uint8, device=q.device)
    _ext.backward_device(
        shape,
        _DEVICE_ELEMENTS[q.dtype],
        q.data_ptr(),
        strides(q),
        k.data_ptr(),
        strides(k),
        v.data_ptr(),
        strides(v),
        o.data_ptr(),
        strides(o),
        d_o.data_ptr(),
        strides(d_o),
        lse.data_ptr(),
        dq.data_ptr(),
        strides(dq),
        dk.data_ptr(),
        strides(dk),
        dv.data_ptr(),
        strides(dv),
        workspace.data_ptr(),
        workspace.numel(),
        opt,
        deterministic,
        _current_stream(q.device),
        kept.data_ptr() if kept is not None else 0,
        kept.numel() if kept is not None else 0,
        *cu,
    )
    return dq, dk, dv


def _lse_term_inputs(d_lse: torch.Tensor, like_o: torch.Tensor, layout: str):
    """O and dO, in O's layout, with rowsum(dO ⊙ O) = −dLSE: one-hot in channel 0."""
    o = torch.zeros_like(like_o)
    d_o = torch.zeros_like(like_o)
    channel0 = (..., 0)
    o[channel0] = 1.0
    # d_lse is (B, Hq, Sq); channel 0 of a (B, S, H, D) tensor is (B, S, H). Packed: (Hq, tokens)
    # and (tokens, H).
    d_o[channel0] = -(d_lse.transpose(-2, -1) if layout == "bshd" else d_lse).to(like_o.dtype)
    return o, d_o


def _smooth_k_lse_dq(d_lse: torch.Tensor, lse: torch.Tensor, k_mean: torch.Tensor, dims: _validate.Dims,
                     s: _host.Settings, packing: Optional[_Packing] = None) -> torch.Tensor:
    """The part of the LSE term's dQ that the backward, working on the smoothed K, leaves out.

    With smooth_k the scores are recomputed from K − k̄, so the backward returns
    scale·dS·(K − k̄); for the O term that is scale·dS·K, since rows of dS sum
    to zero, but the LSE term's rows sum to dLSE_i: dQ_i lacks scale·dLSE_i·k̄.
    A row that sees no key has LSE = −inf whatever Q holds and dS = 0: its row
    sums to 0, not dLSE_i, so it gets no term (lse, the forward's, tells which;
    the mean of a sequence without keys, 0 / 0, is never read into a result).
    (dK needs nothing: there the mean's own gradient cancels the LSE shift's.)
    k_mean: (B, Hkv, D) float32 (_k_mean). Packed sequences: d_lse and lse (Hq, tokens), the
    result (tokens, Hq, D), each token's row from its own sequence's mean.
    """
    k_mean = k_mean.repeat_interleave(dims.Hq // dims.Hkv, dim=1)  # query head h reads key head h // group
    scale = s.scale if s.scale > 0 else dims.D**-0.5
    d_lse = d_lse.to(torch.float32)
    if packing is not None:
        per_query = k_mean[_sequence_of_token(packing.cu_q, packing.total_q)]
        term, blind = d_lse.transpose(0, 1)[..., None] * per_query * scale, lse.transpose(0, 1)
    else:
        pattern = "bhi,bhd->bihd" if s.layout == "bshd" else "bhi,bhd->bhid"
        term = torch.einsum(pattern, d_lse, k_mean) * scale
        blind = lse.transpose(1, 2) if s.layout == "bshd" else lse  # LSE in the result's order of axes
    return torch.where(torch.isneginf(blind)[..., None], 0.0, term)


def _sequence_of_token(cu: torch.Tensor, tokens: int) -> torch.Tensor:
    """The packed sequence each of `tokens` token rows belongs to (on cu's device, no host wait)."""
    return torch.searchsorted(cu[1:], torch.arange(tokens, dtype=cu.dtype, device=cu.device), right=True)


def _k_mean(k: torch.Tensor, kept: Optional[torch.Tensor], dims: _validate.Dims, s: _host.Settings,
            packing: Optional[_Packing] = None) -> torch.Tensor:
    """K's mean over the sequence, (B, Hkv, D) float32: the one the forward smoothed K by where it
    kept it. Packed sequences (k (tokens, Hkv, D)): each sequence's own."""
    if kept is not None:
        at = _ext.device_saved_k_mean_offset(_device_shape(dims), _host.options(s).recipe,
                                             packing.tokens if packing else (0, 0))
        return kept[at:at + 4 * dims.B * dims.Hkv * dims.D].view(torch.float32).view(dims.B, dims.Hkv, dims.D)
    # The quantizer's mean: a double sum over the sequence, / S in double, rounded to float. Its
    # sum runs in 128-token chunks in ascending order, this one in torch's order: the same value
    # wherever the double sum is exact, as it is for 16-bit inputs whose magnitudes span less
    # than about 2^40 (53 bits of double against 8 or 11 of each value and log2 S of carries).
    if packing is not None:
        lens = (packing.cu_k[1:] - packing.cu_k[:-1]).to(torch.float64)
        sums = torch.zeros((dims.B, dims.Hkv, dims.D), dtype=torch.float64, device=k.device)
        sums.index_add_(0, _sequence_of_token(packing.cu_k, k.shape[0]), k.to(torch.float64))
        return (sums / lens[:, None, None]).to(torch.float32)
    seq = 1 if s.layout == "bshd" else 2
    return (k.to(torch.float64).sum(dim=seq) / k.shape[seq]).to(torch.float32)


def _backward_device(d_o, d_lse, q, k, v, o, lse, dims, s: _host.Settings, opt, deterministic: bool,
                     kept: Optional[torch.Tensor] = None, packing: Optional[_Packing] = None):
    dtype = q.dtype
    element = torch.float32 if dtype == torch.float64 else dtype  # the kernels read fp32, fp16 and bf16
    q, k, v, o, d_o = (x.to(element) for x in (q, k, v, o, d_o))
    if d_o.stride(-1) != 1 or 0 in d_o.stride():  # e.g. the expanded gradient of a sum
        d_o = d_o.contiguous()
    with _on_device(q.device):
        dq, dk, dv = _backward_device_call(d_o, q, k, v, o, lse.contiguous(), dims, s, opt, deterministic, kept,
                                           packing)
        if d_lse is not None:
            o_term, d_o_term = _lse_term_inputs(d_lse, o, s.layout)
            dq_term, dk_term, _ = _backward_device_call(
                d_o_term, q, k, torch.zeros_like(v), o_term, lse.contiguous(), dims, s, opt, deterministic, kept,
                packing
            )
            dq_term = dq_term.float()
            if s.smooth_k:
                dq_term = dq_term + _smooth_k_lse_dq(d_lse, lse, _k_mean(k, kept, dims, s, packing), dims, s,
                                                     packing)
            # Summed in fp32, rounded once to the gradients' type.
            dq, dk = (dq.float() + dq_term).to(element), (dk.float() + dk_term.float()).to(element)
    return tuple(x.to(dtype) for x in (dq, dk, dv))


# ---- backward on the host -------------------------------------------------------


def _host_grads(q, k, v, o, lse, d_o, s: _host.Settings, opt):
    """One call of _ext.backward on fp32 host copies; gradients as float32 arrays in the caller's layout."""
    bshd = [_host._to_bshd_f32(host_array(x), s.layout) for x in (q, k, v, o, d_o)]
    lse_h = np.ascontiguousarray(host_array(lse))
    dq, dk, dv, _executor = _ext.backward(bshd[0], bshd[1], bshd[2], bshd[3], lse_h, bshd[4], opt)
    if s.layout == "bhsd":
        dq, dk, dv = (x.transpose(0, 2, 1, 3) for x in (dq, dk, dv))
    # Contiguous in the caller's layout, as the fake implementation promises.
    return tuple(np.ascontiguousarray(x) for x in (dq, dk, dv))


def _backward_host(d_o, d_lse, q, k, v, o, lse, dims, s: _host.Settings, opt):
    if not hasattr(_ext, "backward"):
        raise NotImplementedError(f"backward of recipe {s.recipe} is not available: this build of fp4attn has no _ext.backward")
    _warn_host_copy(q, dims, s, "backward")
    dq, dk, dv = _host_grads(q, k, v, o, lse, d_o, s, opt)
    if d_lse is not None and bool(d_lse.any()):  # this path synchronises anyway
        o_term, d_o_term = _lse_term_inputs(d_lse.to(torch.float32), o.to(torch.float32), s.layout)
        dq_term, dk_term, _ = _host_grads(q, k, torch.zeros_like(v), o_term, lse, d_o_term, s, opt)
        if s.smooth_k:
            dq_term = dq_term + host_array(_smooth_k_lse_dq(d_lse, lse, _k_mean(k, None, dims, s), dims, s))
        dq, dk = dq + dq_term, dk + dk_term
    return tuple(torch.from_numpy(x).to(device=q.device, dtype=q.dtype) for x in (dq, dk, dv))


# ---- the backward op and the autograd registration ------------------------------


def _attention_backward_impl(
    d_o: torch.Tensor,
    d_lse: Optional[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    qkv_layout: str,
    mask_kind: str,
    softmax_scale: float,
    recipe: str,
    smooth_k: bool,
    direct_p: bool,
    gqa: bool,
    arg_names: str,
    target: str,
    window_left: int,
    window_right: int,
    deterministic: Optional[bool] = True,
    kept: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of the attention op, given dO, dLSE (None: zero) and what the forward saved.

    deterministic: the device backward's mode; None picks the faster for the
    call (one_pass_faster). kept: the forward's third output when it kept Q's
    and K's operands; q and k are then stand-ins that carry only shape, dtype
    and device.
    """
    s = _host.Settings(qkv_layout, mask_kind, softmax_scale, recipe, smooth_k, direct_p, gqa, arg_names, target,
                       window_left, window_right)
    _require_backward(recipe)
    return _backward_checked(d_o, d_lse, q, k, v, o, lse, s, _host.check(q, k, v, s), deterministic, kept)


def _backward_checked(d_o, d_lse, q, k, v, o, lse, s: _host.Settings, dims: _validate.Dims,
                      deterministic: Optional[bool], kept: Optional[torch.Tensor]):
    """_attention_backward_impl after its checks of q, k and v (dims: their sizes)."""
    opt = _host.options(s)
    if kept is not None and kept.numel() == 0:
        kept = None
    if _uses_device_backward(q, dims, opt):
        if deterministic is None:
            deterministic = not one_pass_faster(dims, s.mask, s.window_left, s.window_right)
        return _backward_device(d_o, d_lse, q, k, v, o, lse, dims, s, opt, deterministic, kept)
    if kept is not None:
        raise RuntimeError("the forward kept Q's and K's operands for a device backward this call cannot run")
    return _backward_host(d_o, d_lse, q, k, v, o, lse, dims, s, opt)


_attention_backward_op = torch.library.custom_op(_BACKWARD_OP, _attention_backward_impl, mutates_args=())


@_attention_backward_op.register_fake
def _attention_backward_fake(d_o, d_lse, q, k, v, o, lse, qkv_layout, mask_kind, softmax_scale, recipe, smooth_k,
                             direct_p, gqa, arg_names, target, window_left, window_right, deterministic=True,
                             kept=None):
    _require_backward(recipe)
    return q.new_empty(q.shape), k.new_empty(k.shape, dtype=q.dtype), v.new_empty(v.shape, dtype=q.dtype)


def _stand_in(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of `shape` and `dtype` on `device` over D elements (strides 0 but for D): for the
    backward's checks where the forward kept the operands instead of the tensor itself. Nothing
    reads or writes its elements, so one per (shape, dtype, device) serves every call."""
    try:
        return _stand_in_of(tuple(shape), dtype, device)
    except TypeError:  # symbolic sizes under tracing
        return _new_stand_in(shape, dtype, device)


def _new_stand_in(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(shape[-1], dtype=dtype, device=device).as_strided(shape, (0,) * (len(shape) - 1) + (1,))


_stand_in_of = functools.lru_cache(maxsize=64)(_new_stand_in)


def _dims_of(q_shape, k_shape, layout: str) -> _validate.Dims:
    """The sizes of a call whose q and k (of these shapes) have passed the forward's checks."""
    if layout == "bhsd":
        return _validate.Dims(B=q_shape[0], Sq=q_shape[2], Sk=k_shape[2], Hq=q_shape[1], Hkv=k_shape[1], D=q_shape[3])
    return _validate.Dims(B=q_shape[0], Sq=q_shape[1], Sk=k_shape[1], Hq=q_shape[2], Hkv=k_shape[2], D=q_shape[3])


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    o, lse, kept = output
    ctx.settings = tuple(inputs[_SETTINGS_ARGS])
    ctx.lse_returned = inputs[_LSE_RETURNED_ARG] if len(inputs) > _LSE_RETURNED_ARG else True
    ctx.deterministic_backward = bool(inputs[_DETERMINISTIC_ARG]) if len(inputs) > _DETERMINISTIC_ARG else False
    ctx.kept_operands = kept.numel() > 0
    # No gradient flows into the kept operands; and an output the loss does
    # not use comes to the backward as None, not as zeros made for it (for
    # the kept block, a fill of about as many bytes as q and k each step).
    ctx.mark_non_differentiable(kept)
    ctx.set_materialize_grads(False)
    if ctx.kept_operands:
        # Q's and K's codes, scales and transposed copies stand for q and k (about as many bytes).
        ctx.q_meta, ctx.k_meta = (q.shape, q.dtype), (k.shape, k.dtype)
        ctx.save_for_backward(v, o, lse, kept)
    else:
        ctx.save_for_backward(q, k, v, o, lse)


def _backward(ctx, grad_o, grad_lse, _grad_kept=None):
    s = _host.Settings(*ctx.settings)
    _require_backward(s.recipe)  # before anything runs, also when torch.compile traces it
    if ctx.kept_operands:
        v, o, lse, kept = ctx.saved_tensors
        q = k = None
    else:
        (q, k, v, o, lse), kept = ctx.saved_tensors, None
    # The LSE can only carry a gradient when the caller was handed it; O's is
    # None when the loss uses the LSE alone.
    d_lse = grad_lse if ctx.lse_returned else None
    if grad_o is None:
        grad_o = torch.zeros_like(o)
    eager = _eager_call((grad_o, d_lse, q, k, v, o, lse, kept))
    if ctx.kept_operands:
        # Shared stand-ins only eagerly: a trace must not capture a real tensor, nor a fake one be kept.
        make = _stand_in if eager else _new_stand_in
        q, k = (make(shape, dtype, v.device) for shape, dtype in (ctx.q_meta, ctx.k_meta))
    deterministic = _deterministic_backward(ctx.deterministic_backward)
    if eager:
        # The forward checked q, k and v, and autograd gives grad_o o's shape, dtype and device.
        dq, dk, dv = _backward_checked(grad_o, d_lse, q, k, v, o, lse, s, _dims_of(q.shape, k.shape, s.layout),
                                       deterministic, kept)
    else:
        dq, dk, dv = _attention_backward_op(grad_o, d_lse, q, k, v, o, lse, *s, deterministic, kept)
    return (dq, dk, dv) + (None,) * (len(ctx.settings) + 3)


_attention_op.register_autograd(_backward, setup_context=_setup_context)


# ---- the eager path ---------------------------------------------------------------
# The custom ops are what torch.compile, torch.export and tensor subclasses
# need. Run eagerly, their dispatch (schema binding, the autograd wrapper,
# the output alias checks) costs the host more than a small attention call
# takes on the GPU: on the H200's host a forward took 111 µs through the op
# and 81 directly, 239 and 146 with autograd recording, forward + backward
# 943 and 677 (B = 1, S = 512, 32 heads, D = 128; perf log h1). Plain tensors
# outside any tracing, mode or transform take the same implementation and
# backward directly.


_functorch_stack = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)


def _eager_call(args) -> bool:
    """Whether `args` (an op's arguments) may bypass the custom op: plain tensors, nothing tracing them."""
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return False
    if _functorch_stack is None or _functorch_stack() is not None:  # vmap, grad, ... (or unknown: the op)
        return False
    # A loop rather than all() over a generator, the exact type first: a µs less a call.
    tensor = torch.Tensor
    for x in args:
        if type(x) is not tensor and isinstance(x, tensor):
            return False
    return True


class _AttentionFunction(torch.autograd.Function):
    """The forward op's autograd, without the op: the same implementation, context and backward.

    forward takes ctx itself: with a separate setup_context, Function.apply
    binds the arguments through inspect.signature on every call (about 15 µs).
    Functorch transforms, which need the separate form, take the op instead
    (_eager_call).
    """

    @staticmethod
    def forward(ctx, *args):
        output = _attention_impl(*args)
        _setup_context(ctx, args, output)
        return output

    @staticmethod
    def backward(ctx, grad_o, grad_lse, grad_kept):
        return _backward(ctx, grad_o, grad_lse, grad_kept)


def _call_attention(*args):
    """(O, LSE, kept) of the forward op's arguments: through the op, or eagerly where _eager_call allows."""
    if not _eager_call(args):
        return _attention_op(*args)
    if torch.is_grad_enabled() and any(x.requires_grad for x in args[:3]):
        return _AttentionFunction.apply(*args)
    return _attention_impl(*args)


# Head dims the sm90 kernels are not instantiated for and the library accepts
# (the multiples of 8 from 8 to 248 but 64 and 128), read once, so that nothing is asked of the library
# while torch.compile traces a call at the kernels' own head dims.
_NARROW_HEAD_DIMS = tuple(d for d in range(8, 257, 8) if _ext.sm90_head_dim_for(d) != d)


@torch.compiler.assume_constant_result
def _narrow_head_dim_plans(device_index: int, s: _host.Settings, differentiable: bool) -> tuple:
    """For each narrow head dim d, the wider one the device path pads a CUDA call to (0: none needed or possible).

    The sm90 kernels exist for D = 64 and 128, the FP8 forward's also for 256
    (recipes fp8, mxfp4 and mxfp4_train). Recipe fp8's forward reads
    the narrower head dims as they are; the other recipes and the backward run on the
    next kernel with zero channels appended to q, k and v, which changes no bit
    of O's D columns, the LSE or the gradients
    (src/dispatch/head_dim_padding.hpp; the host entry point does the same for
    CPU tensors). Depends on the device and the options alone (probe shapes,
    as in _kept_bytes), so torch.compile takes the answer as a constant; the
    op validates the real call.
    """
    if not _ext.cuda_built() or not _is_sm90(device_index):
        return tuple((d, 0) for d in _NARROW_HEAD_DIMS)
    opt = _host.options(s)
    backward = differentiable and _ext.recipe_has_backward(opt.recipe)

    def device_runs(d):
        shape = _device_shape(_validate.Dims(B=1, Sq=_TOKEN_BLOCK, Sk=_TOKEN_BLOCK, Hq=1, Hkv=1, D=d))
        if not _ext.device_forward_supported(shape, opt):
            return False
        return not backward or (hasattr(_ext, "backward_device") and _ext.device_backward_supported(shape, opt))

    def plan(d):
        d_run = _ext.sm90_head_dim_for(d)
        return 0 if device_runs(d) or d_run in (0, d) or not device_runs(d_run) else d_run

    return tuple((d, plan(d)) for d in _NARROW_HEAD_DIMS)


def _padded_head_dim(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: _host.Settings,
                     differentiable: bool) -> tuple[int, int]:
    """(D, the wider head dim the device path runs this call on) as plain ints, or (0, 0): no padding.

    Compares D with the narrow head dims rather than reading it, so that a
    head dim torch.compile made symbolic still picks a constant plan.
    """
    if q.device.type != "cuda" or any(x.dim() != 4 for x in (q, k, v)):
        return 0, 0
    d = q.shape[-1]
    if d not in _NARROW_HEAD_DIMS or k.shape[-1] != d or v.shape[-1] != d:
        return 0, 0  # nothing to pad, or a mismatch that the op names
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    for narrow, d_run in _narrow_head_dim_plans(index, s, differentiable):
        if d == narrow:
            return (narrow, d_run) if d_run else (0, 0)
    return 0, 0


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: _host.Settings, lse_returned: bool = True,
              deterministic: bool = False):
    """(O, LSE) through the custom op; O has q's shape, dtype and device.

    lse_returned=False promises that the caller drops the LSE, so the backward
    skips the LSE's gradient term (see the module docstring). deterministic=True
    makes this call's backward take the two deterministic passes. A call that
    autograd will differentiate asks the forward to keep Q's and K's operands.
    A head dim the kernels lack (8 … 120, 136 … 248) is padded with zero channels where
    the call needs it (_padded_head_dim): one copy of q, k and v and one of O,
    differentiable. A CUDA batch above DEVICE_MAX_BATCH entries runs as several calls.
    """
    batch, most = q.shape[0], _ext.DEVICE_MAX_BATCH
    if q.device.type == "cuda" and batch > most:
        # One device call's grids hold at most DEVICE_MAX_BATCH batch entries (window attention
        # over many images reaches it): larger batches run as calls on views, O and LSE joined.
        # One split each, whose gradient autograd concatenates (summing those of several slices
        # would turn -0 into +0).
        parts = [attention(*views, s, lse_returned, deterministic)
                 for views in zip(q.split(most), k.split(most), v.split(most))]
        return torch.cat([o for o, _ in parts]), torch.cat([lse for _, lse in parts])
    keep = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    d, d_run = _padded_head_dim(q, k, v, s, keep)
    if not d_run:
        o, lse, _kept = _call_attention(q, k, v, *s, lse_returned, keep, deterministic)
        return o, lse
    if s.scale == 0.0:  # 1/sqrt(D) of the unpadded D, rounded as the library rounds it (float32)
        s = s._replace(scale=float(np.float32(1.0) / np.sqrt(np.float32(d))))
    padded = (_append_zero_channels(x, d, d_run) for x in (q, k, v))
    o, lse, _kept = _call_attention(*padded, *s, lse_returned, keep, deterministic)
    return o[..., :d].contiguous(), lse


def _append_zero_channels(x: torch.Tensor, d: int, d_run: int) -> torch.Tensor:
    """x (4-D, its d channels last) with zero channels appended up to d_run, in x's own memory order.

    F.pad writes a tensor contiguous in x's logical order: for the (B, H, S, D)
    views of (B, S, H, D) memory that models pass, a transposing copy. Here
    the outer dims keep their order in memory and only the new channels are
    zeroed: with O's copy, 1.40 → 1.09–1.19 ms per call at D = 96 (B·S = 32k,
    32 heads) on the H200. Differentiable (the gradient is the first d channels).
    """
    order = sorted(range(3), key=lambda i: x.stride(i), reverse=True) + [3]
    in_memory_order = x.permute(order)
    out = in_memory_order.new_empty(tuple(in_memory_order.shape[:3]) + (d_run,))
    out[..., d:] = 0
    out[..., :d] = in_memory_order
    return out.permute([order.index(i) for i in range(4)])


# ---- packed sequences (flash_attn_varlen_func) on the device -------------------------


def _device_cu_seqlens(cu, lens: Sequence[int], device: torch.device, name: str) -> torch.Tensor:
    """The kernels' int32 cu_seqlens on `device`: a CUDA tensor there as it is (converted on the
    device if it is int64), anything else built from the checked lengths and copied from pinned
    host memory without waiting (once per lengths and stream: _host_cu_seqlens_on). A CUDA graph
    would replay that copy from host memory freed after capture, so under capture cu_seqlens must
    already be on the device."""
    if isinstance(cu, torch.Tensor) and cu.device == device:
        if cu.dtype == torch.int32 and cu.is_contiguous():
            return cu  # what .to(torch.int32).contiguous() gives, without its two dispatches
        return cu.to(torch.int32).contiguous()
    if torch.cuda.is_current_stream_capturing():
        raise ValueError(f"{name}: must be a tensor on {device} while a CUDA graph is captured, got "
                         f"{cu.device if isinstance(cu, torch.Tensor) else type(cu).__name__}")
    return _host_cu_seqlens_on(tuple(lens), device, _current_stream(device))


@functools.lru_cache(maxsize=64)
def _host_cu_seqlens_on(lens: tuple, device: torch.device, stream: int) -> torch.Tensor:
    """The int32 offsets of `lens` on `device`, copied on `stream` (its raw handle). Kept by value:
    the kernels only read it, and a later call on the same stream is ordered after the copy (on
    another stream it is not, so the stream is part of the key). A model's layers pass the same
    host cu_seqlens to each call: a tensor, a cumsum, a pinned buffer and a copy per call
    otherwise."""
    host = torch.tensor([0, *lens], dtype=torch.int32).cumsum(0, dtype=torch.int32).pin_memory()
    return host.to(device, non_blocking=True)


@functools.lru_cache(maxsize=64)
def _packed_layout(lens_q: tuple, lens_k: tuple, waste, most: int) -> tuple:
    """(longest query, longest key, groups) of a packed call on these lengths: each group of
    _host.packed_groups as (first sequence, count, its query lengths, its key lengths, their
    longest, longest, their tokens, tokens). Kept by value, with the bounds that
    packed_groups reads (_host.PACKED_LAYOUT_WASTE, _ext.DEVICE_MAX_BATCH) in the key: its
    Python loop over the batch costs tens of µs a call, and a model's layers repeat the lengths."""
    groups = []
    for first, n in _host.packed_groups(list(lens_q), list(lens_k)):
        group_q, group_k = lens_q[first:first + n], lens_k[first:first + n]
        groups.append((first, n, group_q, group_k, max(group_q), max(group_k), sum(group_q), sum(group_k)))
    return max(lens_q), max(lens_k), tuple(groups)


def _packed_plan(q: torch.Tensor, k: torch.Tensor, cu_seqlens_q, cu_seqlens_k, lens_q: Sequence[int],
                 lens_k: Sequence[int], s: _host.Settings, lse_returned: bool, differentiable: bool,
                 deterministic: bool = False) -> Optional[list]:
    """The packed device calls that run an eager varlen call, as (first query token, query tokens,
    first key token, key tokens, _PackedCall, or None for a group with nothing to attend), or None
    where the device path does not take the call (see varlen_forward_device)."""
    if q.device.type != "cuda" or s.recipe != "fp8" or s.target != "sm90" or q.dtype not in _DEVICE_ELEMENTS:
        return None
    lens_q, lens_k = tuple(lens_q), tuple(lens_k)
    longest_q, longest_k, groups = _packed_layout(lens_q, lens_k, _host.PACKED_LAYOUT_WASTE, _ext.DEVICE_MAX_BATCH)
    if longest_q == 0 or longest_k == 0:
        return None  # nothing to attend: api.flash_attn_varlen_func's zeros
    dims = _validate.Dims(B=len(lens_q), Sq=longest_q, Sk=longest_k, Hq=q.shape[1], Hkv=k.shape[1], D=q.shape[2])
    opt = _host.options(s)
    if not _uses_device_path(q, dims, opt) or (differentiable and not _uses_device_backward(q, dims, opt)):
        return None
    cu = [_device_cu_seqlens(c, lens, q.device, name)
          for c, lens, name in ((cu_seqlens_q, lens_q, "cu_seqlens_q"), (cu_seqlens_k, lens_k, "cu_seqlens_k"))]
    if len(groups) == 1:
        return [(0, q.shape[0], 0, k.shape[0], _PackedCall(cu, dims, s, opt, lens_q, lens_k, lse_returned,
                                                            deterministic))]
    plan, q0, k0 = [], 0, 0
    for first, n, group_q, group_k, max_q, max_k, tokens_q, tokens_k in groups:
        call = None
        if max_q > 0 and max_k > 0:
            group_dims = _validate.Dims(B=n, Sq=max_q, Sk=max_k, Hq=dims.Hq, Hkv=dims.Hkv, D=dims.D)
            group_cu = [c[first:first + n + 1] - c[first] for c in cu]  # on the device: no wait
            call = _PackedCall(group_cu, group_dims, s, opt, group_q, group_k, lse_returned, deterministic)
        plan.append((q0, tokens_q, k0, tokens_k, call))
        q0, k0 = q0 + tokens_q, k0 + tokens_k
    return plan


def varlen_forward_device(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q, cu_seqlens_k,
                          lens_q: Sequence[int], lens_k: Sequence[int], s: _host.Settings, lse_returned: bool = True,
                          deterministic: bool = False) -> Optional[tuple]:
    """(O (total_q, Hq, D), LSE (Hq, total_q)) of packed sequences in one device call, or None where
    that call cannot run them: recipe fp8's forward on a Hopper GPU, the kernels' head dims read in
    place, some sequence with queries and some with keys, nothing tracing the call; where a
    gradient is wanted, also the device backward. Sequences without queries or without keys take
    no tile of the kernels: one without keys gives O = 0 and LSE = −inf, with zero gradients.

    The quantizer and the kernel take each sequence's own length from cu_seqlens, so every
    sequence's O and LSE are those of a call on it alone, bit for bit (test_varlen.py); so are its
    gradients from the packed backward (_PackedAttention), also one call. The call's operands are
    laid out for (sequences, longest) tokens: where that is far more than the batch holds (one long
    sequence among short ones), the batch runs as a few packed calls (_host.packed_groups).
    lse_returned: whether the caller gets the LSE (only then can it carry a gradient).
    deterministic: the backward takes the two deterministic passes whatever the default.
    """
    if not _eager_call((q, k, v)):
        return None
    # Also for sequences all of one length: as one batched call on views of q, k and v, autograd
    # would fill a zero gradient of each and copy the views' into it (6 % of the step at 8 x 2048,
    # perf log v5).
    differentiable = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    plan = _packed_plan(q, k, cu_seqlens_q, cu_seqlens_k, lens_q, lens_k, s, lse_returned, differentiable,
                        deterministic)
    if plan is None:
        return None

    def run(call, q, k, v):
        return _PackedAttention.apply(q, k, v, call) if differentiable else call.forward(q, k, v)[:2]

    if len(plan) == 1:
        return run(plan[0][4], q, k, v)
    # One split each, so that autograd concatenates the groups' gradients (summing those of several
    # slices would turn -0 into +0: api._token_parts).
    q_parts = q.split([tokens for _, tokens, _, _, _ in plan])
    k_parts, v_parts = (x.split([tokens for _, _, _, tokens, _ in plan]) for x in (k, v))
    from . import api

    outs, lses = [], []
    for (_, _, _, _, call), q_group, k_group, v_group in zip(plan, q_parts, k_parts, v_parts):
        # A group with nothing to attend makes no call: O = 0, LSE = -inf, as for a sequence without keys.
        o, lse = api._no_keys(q_group, q.shape[1], True) if call is None else run(call, q_group, k_group, v_group)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, dim=1)


def _captured_call(q: torch.Tensor, k: torch.Tensor, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                   max_seqlen_k: int, s: _host.Settings, lse_returned: bool, differentiable: bool,
                   deterministic: bool = False) -> "_PackedCall":
    """The one packed call of a varlen call under CUDA graph capture (varlen_forward_captured)."""
    batch = _validate.check_cu_seqlens_form(cu_seqlens_q, "cu_seqlens_q")
    if _validate.check_cu_seqlens_form(cu_seqlens_k, "cu_seqlens_k") != batch:
        raise ValueError(f"cu_seqlens_k: has {cu_seqlens_k.shape[0]} entries (batch size "
                         f"{cu_seqlens_k.shape[0] - 1}) but cu_seqlens_q has {batch + 1}")
    for cu, name in ((cu_seqlens_q, "cu_seqlens_q"), (cu_seqlens_k, "cu_seqlens_k")):
        if not isinstance(cu, torch.Tensor) or cu.device != q.device:
            raise ValueError(f"{name}: must be a tensor on {q.device} while a CUDA graph is captured, got "
                             f"{cu.device if isinstance(cu, torch.Tensor) else type(cu).__name__}")
    longest = []
    for value, name, total in ((max_seqlen_q, "max_seqlen_q", q.shape[0]), (max_seqlen_k, "max_seqlen_k", k.shape[0])):
        value = _validate.check_int(value, name)
        if value < 1:
            raise ValueError(f"{name}: must be at least 1 while a CUDA graph is captured, got {value}")
        longest.append(min(value, total))  # no sequence holds more tokens than the batch
    dims = _validate.Dims(B=batch, Sq=longest[0], Sk=longest[1], Hq=q.shape[1], Hkv=k.shape[1], D=q.shape[2])
    opt = _host.options(s)
    runs = (s.recipe == "fp8" and s.target == "sm90" and q.dtype in _DEVICE_ELEMENTS and batch <= _ext.DEVICE_MAX_BATCH
            and _uses_device_path(q, dims, opt) and (not differentiable or _uses_device_backward(q, dims, opt)))
    if not runs:
        raise ValueError("cu_seqlens_q: a CUDA graph can capture flash_attn_varlen_func only where one packed "
                         f"device call runs it (recipe fp8 on a Hopper GPU, at most {_ext.DEVICE_MAX_BATCH} "
                         "sequences): other calls read cu_seqlens on the host")
    cu = [c.to(torch.int32).contiguous() for c in (cu_seqlens_q, cu_seqlens_k)]
    return _PackedCall(cu, dims, s, opt, None, None, lse_returned, deterministic)


def varlen_forward_captured(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q, cu_seqlens_k,
                            max_seqlen_q: int, max_seqlen_k: int, s: _host.Settings,
                            lse_returned: bool = True, deterministic: bool = False) -> tuple:
    """varlen_forward_device while a CUDA graph is captured, for every replay: cu_seqlens are not read
    on the host (a replay runs with whatever they hold then), so the call is one packed call sized
    by what the host knows (the batch size, the token counts, max_seqlen_q and max_seqlen_k), and
    the device checks cu_seqlens against it (cuda_common::check_packed_sequences): a replay with
    any lengths that fit gives each sequence what a call on it alone gives, and one with lengths
    that do not (a sequence longer than max_seqlen, offsets that decrease or do not end at the
    token count) gives NaN outputs and gradients. Raises ValueError naming the argument where the
    one-call path cannot take the call (it alone reads cu_seqlens on the device)."""
    differentiable = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    if not _eager_call((q, k, v)):
        raise ValueError("cu_seqlens_q: a CUDA graph can capture flash_attn_varlen_func only where one packed "
                         "device call runs it, on plain tensors")
    call = _captured_call(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, s, lse_returned,
                          differentiable, deterministic)
    return _PackedAttention.apply(q, k, v, call) if differentiable else call.forward(q, k, v)[:2]


def varlen_backward_device(d_o: torch.Tensor, d_lse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                           v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, cu_seqlens_q, cu_seqlens_k,
                           max_seqlen_q: int, max_seqlen_k: int, s: _host.Settings,
                           deterministic: bool = False) -> Optional[tuple]:
    """dQ, dK, dV of an eager varlen call that the packed device calls run, from its O and LSE and
    without autograd (the backward op of the compiled call), or None where they do not run it. Each
    call's backward quantizes Q and K again where the eager call's forward kept them: the same codes.
    deterministic: the two deterministic passes whatever the default."""
    if q.device.type != "cuda":
        return None
    if torch.cuda.is_current_stream_capturing():
        call = _captured_call(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, s, d_lse is not None,
                              True, deterministic)
        plan = [(0, q.shape[0], 0, k.shape[0], call)]
    else:
        lens_q = _validate.checked_sequences(cu_seqlens_q, "cu_seqlens_q", q.shape[0], "q").lengths
        lens_k = _validate.checked_sequences(cu_seqlens_k, "cu_seqlens_k", k.shape[0], "k").lengths
        plan = _packed_plan(q, k, cu_seqlens_q, cu_seqlens_k, lens_q, lens_k, s, d_lse is not None, True,
                            deterministic)
    if plan is None:
        return None
    dq, dk, dv = (torch.zeros(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
    for q0, q_tokens, k0, k_tokens, call in plan:
        if call is None:
            continue
        rows, keys = slice(q0, q0 + q_tokens), slice(k0, k0 + k_tokens)
        grads = call.backward(q[rows], k[keys], v[keys], o[rows], lse[:, rows], d_o[rows],
                              None if d_lse is None else d_lse[:, rows])
        for full, part, span in zip((dq, dk, dv), grads, (rows, keys, keys)):
            full[span] = part
    return dq, dk, dv


class _PackedCall:
    """One varlen call on the device path: its forward in one launch, its backward in one call.
    lens_q, lens_k: the sequences' lengths as the host read them, or None (a captured call);
    deterministic: the call asked for the two deterministic passes."""

    def __init__(self, cu: list, dims: _validate.Dims, s: _host.Settings, opt, lens_q: list, lens_k: list,
                 lse_returned: bool, deterministic: bool = False):
        self.cu, self.dims, self.s, self.opt = cu, dims, s, opt
        self.lens_q, self.lens_k, self.lse_returned = lens_q, lens_k, lse_returned
        self.deterministic = deterministic

    def forward(self, q, k, v, keep: bool = False):
        """(O, LSE, kept): with `keep`, kept holds Q's and K's operands for the backward (else empty)."""
        dims, opt = self.dims, self.opt
        shape = _device_shape(dims)
        total_q, total_k = q.shape[0], k.shape[0]
        # (B, S, H) strides with the batch stride unused: the sequences' rows come from cu_seqlens.
        packed = [(0, x.stride(0), x.stride(1)) for x in (q, k, v)]
        with _on_device(q.device):
            o = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
            lse = torch.empty((dims.Hq, total_q), dtype=torch.float32, device=q.device)
            # The operands take the packed layout, sized by the tokens in all.
            tokens = (total_q, total_k)
            workspace = torch.empty(_ext.device_workspace_bytes(shape, opt.recipe, tokens), dtype=torch.uint8,
                                    device=q.device)
            kept = torch.empty(_ext.device_saved_bytes(shape, opt.recipe, tokens) if keep else 0, dtype=torch.uint8,
                               device=q.device)
            _ext.forward_device(shape, _DEVICE_ELEMENTS[q.dtype], q.data_ptr(), packed[0], k.data_ptr(), packed[1],
                                v.data_ptr(), packed[2], o.data_ptr(), (0, o.stride(0), o.stride(1)), lse.data_ptr(),
                                workspace.data_ptr(), workspace.numel(), opt, _current_stream(q.device),
                                saved=kept.data_ptr() if keep else 0, saved_bytes=kept.numel(),
                                cu_seqlens_q=self.cu[0].data_ptr(), cu_seqlens_k=self.cu[1].data_ptr(),
                                lse_pitch=total_q, k_tokens=total_k)
        return o.to(q.dtype), lse, kept

    def backward(self, q, k, v, o, lse, d_o, d_lse, kept: Optional[torch.Tensor] = None):
        """dQ, dK, dV of every sequence in one device call (a second for an LSE gradient), each
        sequence's those of a call on it alone. kept: the forward's (q and k are then not read)."""
        if d_o is None:
            d_o = torch.zeros_like(o)
        if not self.lse_returned:
            d_lse = None
        deterministic = _deterministic_backward(self.deterministic)
        if deterministic is None and self.lens_q is None:
            deterministic = True  # lengths unknown to the host: the two passes, right for any of them
        elif deterministic is None:
            deterministic = not _ext.device_backward_one_pass_faster_packed(
                self.lens_q, self.lens_k, self.dims.D, _ext.MaskKind.__members__[self.s.mask], self.s.window_left,
                self.s.window_right)
        packing = _Packing(self.cu[0], self.cu[1], q.shape[0], k.shape[0])
        return _backward_device(d_o, d_lse, q, k, v, o, lse, self.dims, self.s, self.opt, deterministic, kept,
                                packing)


class _PackedAttention(torch.autograd.Function):
    """Autograd of a _PackedCall: O and LSE from its one forward launch, gradients from its backward."""

    @staticmethod
    def forward(ctx, q, k, v, call):
        # The forward keeps Q's and K's operands for the backward, which then reads neither q nor k:
        # they are not saved (stand-ins carry their shapes), as in the batched path.
        o, lse, kept = call.forward(q, k, v, keep=True)
        ctx.call = call
        ctx.q_k_meta = ((q.shape, q.dtype), (k.shape, k.dtype), q.device)
        ctx.save_for_backward(v, o, lse, kept)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        v, o, lse, kept = ctx.saved_tensors
        (q_shape, q_dtype), (k_shape, k_dtype), device = ctx.q_k_meta
        q, k = _stand_in(q_shape, q_dtype, device), _stand_in(k_shape, k_dtype, device)
        return ctx.call.backward(q, k, v, o, lse, grad_o, grad_lse, kept) + (None,)


# ---- flash_attn_varlen_func under torch.compile --------------------------------
# The eager varlen call reads cu_seqlens on the host (its runs, groups and checks
# depend on the lengths), which a trace cannot do. Traced, the call is one op whose
# implementation is that eager call, run when the graph runs. Its backward op runs
# the packed device calls' backward where they ran the call (quantizing Q and K
# again, where the eager call keeps the forward's codes), else the eager call again
# with autograd, at the cost of one more forward; either way every value is the
# eager call's, bit for bit.

_VARLEN_OP = "fp4attn::varlen_attention"
_VARLEN_BACKWARD_OP = "fp4attn::varlen_attention_backward"


def _varlen_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                 cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, qkv_layout: str, mask_kind: str,
                 softmax_scale: float, recipe: str, smooth_k: bool, direct_p: bool, gqa: bool, arg_names: str,
                 target: str, window_left: int, window_right: int,
                 lse_returned: bool, deterministic_backward: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(O (total_q, Hq, D), LSE (Hq, total_q)) of flash_attn_varlen_func's eager call
    (deterministic_backward: what the backward op is given)."""
    from . import api

    s = _host.Settings(qkv_layout, mask_kind, softmax_scale, recipe, smooth_k, direct_p, gqa, arg_names, target,
                       window_left, window_right)
    with torch.no_grad():
        o, lse = api.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, s,
                                    lse_returned)
    return o, lse


_varlen_op = torch.library.custom_op(_VARLEN_OP, _varlen_impl, mutates_args=())


@_varlen_op.register_fake
def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, qkv_layout, mask_kind,
                 softmax_scale, recipe, smooth_k, direct_p, gqa, arg_names, target, window_left, window_right,
                 lse_returned, deterministic_backward=False):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@contextlib.contextmanager
def _autograd_inside_op():
    """Autograd inside a custom op's implementation, which runs below it (its dispatch keys excluded)."""
    lift = getattr(torch._C, "_SetExcludeDispatchKeyGuard", None)
    if lift is None:
        raise RuntimeError(f"fp4attn: the backward of flash_attn_varlen_func under torch.compile needs "
                           f"torch._C._SetExcludeDispatchKeyGuard, which torch {torch.__version__} lacks")
    keys = (torch._C.DispatchKey.AutogradFunctionality, torch._C.DispatchKey.ADInplaceOrView)
    with contextlib.ExitStack() as stack:
        for key in keys:
            stack.enter_context(lift(key, False))
        stack.enter_context(torch.enable_grad())
        yield


def _varlen_backward_impl(d_o: torch.Tensor, d_lse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                          cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, qkv_layout: str,
                          mask_kind: str, softmax_scale: float, recipe: str, smooth_k: bool, direct_p: bool, gqa: bool,
                          arg_names: str, target: str, window_left: int, window_right: int,
                          deterministic_backward: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of the eager call for dO and dLSE (None: the caller never held the LSE), given the
    forward's O and LSE: from the packed device calls' backward where they run the call, else by
    running the eager call again with autograd. deterministic_backward: the call's
    deterministic=True."""
    from . import api

    s = _host.Settings(qkv_layout, mask_kind, softmax_scale, recipe, smooth_k, direct_p, gqa, arg_names, target,
                       window_left, window_right)
    _require_backward(recipe)
    grads = varlen_backward_device(d_o, d_lse, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                   max_seqlen_k, s, deterministic_backward)
    if grads is not None:
        return grads
    with _autograd_inside_op():
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        o, lse = api.varlen_forward(*leaves, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, s,
                                    d_lse is not None, deterministic_backward)
        outputs, grads = ((o, lse), (d_o, d_lse)) if d_lse is not None else ((o,), (d_o,))
        got = torch.autograd.grad(outputs, leaves, grads, allow_unused=True)
    # Contiguous, as the fake implementation promises (the leaves may be strided views).
    return tuple(torch.zeros(x.shape, dtype=x.dtype, device=x.device) if g is None else g.contiguous()
                 for x, g in zip((q, k, v), got))


_varlen_backward_op = torch.library.custom_op(_VARLEN_BACKWARD_OP, _varlen_backward_impl, mutates_args=())


@_varlen_backward_op.register_fake
def _varlen_backward_fake(d_o, d_lse, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          qkv_layout, mask_kind, softmax_scale, recipe, smooth_k, direct_p, gqa, arg_names, target,
                          window_left, window_right, deterministic_backward=False):
    _require_backward(recipe)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _varlen_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:5], *output)  # q, k, v, both cu_seqlens, O and the LSE
    ctx.rest = tuple(inputs[5:])  # max_seqlen_q, max_seqlen_k, the settings, lse_returned, deterministic_backward
    ctx.set_materialize_grads(False)


def _varlen_backward(ctx, grad_o, grad_lse):
    q, k, v, cu_q, cu_k, o, lse = ctx.saved_tensors
    n = 2 + len(_host.Settings._fields)  # max_seqlen_q, max_seqlen_k and the settings
    sizes_and_settings, lse_returned = ctx.rest[:n], ctx.rest[n]
    deterministic = bool(ctx.rest[n + 1]) if len(ctx.rest) > n + 1 else False
    if grad_o is None:  # the loss used the LSE alone
        grad_o = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    d_lse = grad_lse if lse_returned else None
    dq, dk, dv = _varlen_backward_op(grad_o, d_lse, q, k, v, o, lse, cu_q, cu_k, *sizes_and_settings, deterministic)
    return (dq, dk, dv) + (None,) * (len(ctx.rest) + 2)


_varlen_op.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)


def varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
              max_seqlen_k, s: _host.Settings, lse_returned: bool, deterministic: bool = False) -> tuple:
    """flash_attn_varlen_func's (O, LSE) through the op that torch.compile traces (q, k, v checked)."""
    for cu, name in ((cu_seqlens_q, "cu_seqlens_q"), (cu_seqlens_k, "cu_seqlens_k")):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name}: expected a 1-D integer tensor while torch.compile traces the call, got "
                            f"{type(cu).__name__}")
    for value, name in ((max_seqlen_q, "max_seqlen_q"), (max_seqlen_k, "max_seqlen_k")):
        if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
            raise ValueError(f"{name}: expected an int, got {type(value).__name__}")
    return _varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *s, lse_returned,
                      bool(deterministic))
