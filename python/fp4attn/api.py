"""The public attention and quantization functions.

NumPy arrays and other host arrays run through fp4attn._host; torch tensors
through the custom ops of fp4attn.torch_ops (so that torch.compile sees one
op), which run CUDA tensors on the device where the sm90 executor can, and
end in the same host code otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math

import numpy as np

from . import _host, _validate, e4m3

# The torch layer loads only where torch is installed; the NumPy API never needs it.
if importlib.util.find_spec("torch") is not None:
    from . import torch_e4m3 as _torch_e4m3
    from . import torch_ops as _torch_ops
else:
    _torch_e4m3 = _torch_ops = None


def _is_torch(x) -> bool:
    return _torch_ops is not None and _torch_ops.is_tensor(x)


def _forward(q, k, v, s: _host.Settings, lse_returned: bool, deterministic: bool = False):
    # lse_returned: whether the caller gets the LSE (and so may put it in a loss);
    # deterministic: the backward takes the two deterministic passes whatever the default.
    torch_in = _is_torch(q)
    if not torch_in:
        names = s.names.split(",")
        q, k, v = (_host.to_host(x, name) for x, name in zip((q, k, v), names))
    if _no_tokens(q, k, s):
        return _empty_attention(q, k, v, s, torch_in)
    if torch_in:
        return _torch_ops.attention(q, k, v, s, lse_returned, deterministic)
    _host.check(q, k, v, s)
    return _host.attention(q, k, v, s)


def _no_tokens(q, k, s: _host.Settings) -> bool:
    """Whether a call has no batch entries, no queries or no keys (shapes alone; the rest is checked later)."""
    if len(q.shape) != 4 or len(k.shape) != 4:
        return False
    seq = _validate.seq_axis(s.layout)
    return q.shape[0] == 0 or q.shape[seq] == 0 or k.shape[seq] == 0


def _empty_attention(q, k, v, s: _host.Settings, torch_in: bool):
    """What PyTorch's SDPA gives where there is nothing to attend: O = 0 (empty without queries) and
    LSE = −inf, as for rows that see no key; every other property of the call checked as usual."""
    dims = _host.check(q, k, v, s)
    # The library's rules for heads, head dim and options, on the same call with one token.
    _host.validate_sizes(dataclasses.replace(dims, B=max(dims.B, 1), Sq=max(dims.Sq, 1), Sk=max(dims.Sk, 1)), s)
    lse_shape = (dims.B, dims.Hq, dims.Sq)
    if not torch_in:
        return np.zeros(q.shape, np.float32), np.full(lse_shape, -np.inf, np.float32)
    torch = _torch_ops.torch
    o = _connected(torch.zeros(q.shape, dtype=q.dtype, device=q.device), q, k, v)
    return o, torch.full(lse_shape, -math.inf, dtype=torch.float32, device=q.device)


def _connected(o, q, k, v):
    """o as autograd connects it to q, k and v, with zero gradients (even where they hold non-finite
    values), as SDPA's outputs are when nothing is attended; o itself where no gradient is wanted."""
    torch = _torch_ops.torch
    if not torch.is_grad_enabled() or not any(x.requires_grad for x in (q, k, v)):
        return o
    none = torch.zeros((), dtype=torch.bool, device=o.device)
    zero = torch.zeros((), dtype=o.dtype, device=o.device)
    return o + torch.where(none, q.sum() + k.sum() + v.sum(), zero).to(o.dtype)


def attention(
    q,
    k,
    v,
    *,
    causal=False,
    scale=None,
    recipe="fp8",
    smooth_k=True,
    direct_p=True,
    layout="bshd",
    return_lse=False,
    target="sm90",
    window=(-1, -1),
):
    """Low-precision attention, softmax(scale · q kᵀ) v.

    q: (B, Sq, Hq, D), k and v: (B, Sk, Hkv, D) with Hq a multiple of Hkv, or
    the (B, H, S, D) order with layout="bhsd". causal masks bottom-right aligned
    when Sq != Sk (FlashAttention >= 2.1); scale=None means 1/sqrt(D).
    target picks the hardware whose numerics are modelled: "sm90" (FP4
    expanded to E4M3, DESIGN §3.4) or "sm100" (ideal block-scaled FP4; CPU
    emulator only, so it never runs on the GPU).
    window=(left, right) is a sliding window, FlashAttention's window_size:
    query i sees keys i + d − left … i + d + right, d = Sk − Sq, −1 for no
    bound on that side (with causal the right bound is 0 or −1). Every recipe
    runs it on the sm90 kernels, skipping the key tiles outside every row's
    window.
    Returns O in the input layout, and with return_lse also the natural-log
    LSE of shape (B, Hq, Sq). NumPy inputs give float32 NumPy outputs holding
    bf16 values; torch inputs give tensors of the input's dtype and device,
    differentiable for the recipes with a backward (fp8, mxfp4_train), through
    O and through the returned LSE (fp4attn.torch_ops says how).
    """
    s = _host.make_settings(
        layout=layout,
        mask=_host.MASK_BOTTOM_RIGHT if _validate.check_flag(causal, "causal") else _host.MASK_NONE,
        scale=scale,
        scale_name="scale",
        recipe=recipe,
        smooth_k=smooth_k,
        direct_p=direct_p,
        gqa=True,
        names=("q", "k", "v"),
        target=target,
        window=window,
        window_name="window",
    )
    return_lse = _validate.check_flag(return_lse, "return_lse")
    o, lse = _forward(q, k, v, s, return_lse)
    return (o, lse) if return_lse else o


def _check_flash_attn_extras(dropout_p, softcap, alibi_slopes, deterministic) -> bool:
    """FlashAttention's arguments for features fp4attn lacks (only their "off" value passes), and its
    deterministic flag, checked and returned."""
    _validate.check_absent(dropout_p, "dropout_p", 0.0, "attention dropout is not supported")
    _validate.check_absent(softcap, "softcap", 0.0, "score soft-capping is not supported")
    _validate.check_absent(alibi_slopes, "alibi_slopes", None, "ALiBi is not supported")
    return _validate.check_flag(deterministic, "deterministic")


def _flash_attn_settings(causal, softmax_scale, recipe, window_size, smooth_k: bool = True) -> _host.Settings:
    """FlashAttention's conventions: (B, S, H, D), bottom-right causal mask, GQA, smooth_k (unless turned
    off here) and Direct-P on; window_size's right bound is 0 with causal=True, whatever was passed, as
    FlashAttention sets it."""
    # Arguments of the usual types (a bool, None or a float, a string, a tuple of two ints) are kept
    # by value with their Settings: a model repeats them every call, and their checks and the
    # Settings cost several µs a call. Other types (NumPy scalars, lists) and values that fail are
    # checked every call, and so is a call that torch.compile traces.
    if (not _compiling() and type(causal) is bool and (softmax_scale is None or type(softmax_scale) is float)
            and type(recipe) is str and type(window_size) is tuple and len(window_size) == 2
            and type(window_size[0]) is int and type(window_size[1]) is int):
        return _kept_flash_attn_settings(causal, softmax_scale, recipe, window_size, smooth_k)
    return _checked_flash_attn_settings(causal, softmax_scale, recipe, window_size, smooth_k)


def _compiling() -> bool:
    return _torch_ops is not None and _torch_ops.torch.compiler.is_compiling()


def _checked_flash_attn_settings(causal, softmax_scale, recipe, window_size, smooth_k: bool) -> _host.Settings:
    causal = _validate.check_flag(causal, "causal")
    left, right = _validate.check_window(window_size, "window_size", causal=False)
    return _host.make_settings(
        layout="bshd",
        mask=_host.MASK_BOTTOM_RIGHT if causal else _host.MASK_NONE,
        scale=softmax_scale,
        scale_name="softmax_scale",
        recipe=recipe,
        smooth_k=smooth_k,
        direct_p=True,
        gqa=True,
        names=("q", "k", "v"),
        window=(left, 0 if causal else right),
    )


_kept_flash_attn_settings = functools.lru_cache(maxsize=64, typed=True)(_checked_flash_attn_settings)


def _check_no_descales(descales: tuple, q) -> None:
    for d, name in zip(descales, ("q_descale", "k_descale", "v_descale")):
        if d is not None:
            raise ValueError(f"{name}: applies to float8_e4m3fn inputs only (q is {_validate._dtype_name(q)})")


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    recipe="fp8",
    q_descale=None,
    k_descale=None,
    v_descale=None,
):
    """FlashAttention's flash_attn_func: (B, S, H, D) tensors, causal bottom-right aligned, GQA/MQA.

    The same parameters in the same order, so that positional calls keep
    their meaning. window_size = (left, right) is a sliding window: query i
    sees keys i + Sk − Sq − left … i + Sk − Sq + right, −1 for no bound on
    that side (causal=True makes the right bound 0, as in FlashAttention).
    Features fp4attn lacks accept only their "off" value and
    raise ValueError naming the argument otherwise: dropout_p (0.0),
    softcap (0.0), alibi_slopes (None). deterministic=True makes this
    call's backward take the two deterministic passes (the same bits every
    run); False leaves the mode to torch's deterministic algorithms setting
    and fp4attn.torch_ops.DETERMINISTIC_BACKWARD, else the faster for the
    problem. With
    return_attn_probs=True it returns (out, softmax_lse, None): the attention
    probabilities are never formed, so the third element is None.

    FlashAttention-3's FP8 inputs: q, k and v in float8_e4m3fn with
    q_descale, k_descale, v_descale float32 (B, Hkv) or None (1), the value
    of a code being code × descale. Recipe fp8 then runs on the codes as they
    are (no quantizer pass, no smooth_k) and out is bfloat16; see
    fp4attn.e4m3. The descales apply to float8_e4m3fn inputs only.
    """
    deterministic = _check_flash_attn_extras(dropout_p, softcap, alibi_slopes, deterministic)
    s = _flash_attn_settings(causal, softmax_scale, recipe, window_size)
    return_attn_probs = _validate.check_flag(return_attn_probs, "return_attn_probs")
    descales = (q_descale, k_descale, v_descale)
    if any(e4m3.is_e4m3(x) for x in (q, k, v)):
        s = e4m3.settings(s)
        if _is_torch(q):
            o, lse = _torch_e4m3.forward(q, k, v, descales, s)
        else:
            o, lse = e4m3.numpy_forward(q, k, v, descales, s)
        return (o, lse, None) if return_attn_probs else o
    _check_no_descales(descales, q)
    o, lse = _forward(q, k, v, s, return_attn_probs, deterministic)
    return (o, lse, None) if return_attn_probs else o


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    recipe="fp8",
    q_descale=None,
    k_descale=None,
    v_descale=None,
):
    """FlashAttention's flash_attn_varlen_func: sequences of different lengths packed along the tokens.

    q: (total_q, Hq, D), k and v: (total_k, Hkv, D); sequence i holds query
    tokens cu_seqlens_q[i] … cu_seqlens_q[i + 1] − 1 and key tokens
    cu_seqlens_k[i] … cu_seqlens_k[i + 1] − 1 (1-D int32 or int64, B + 1
    entries from 0 to total). causal is bottom-right aligned per sequence, and
    window_size (flash_attn_func's) bounds each sequence's keys about its own
    diagonal.
    Each sequence's output is bit for bit what attention() gives on that
    sequence alone (quantization is per sequence and head), and so are its
    gradients in the deterministic backward (deterministic=True, or
    torch.use_deterministic_algorithms; signs of zero included: every path
    reads the packed tensors through one split, whose gradient autograd
    concatenates). By default the backward's
    mode is picked per call, for the whole batch here: at D = 64 the one pass,
    whose dQ sums vary in order, where a sequence alone may take the two.
    Recipe fp8 on a Hopper GPU runs every sequence in one forward call and one
    backward call whose quantizers and kernels read the packed tensors
    (torch_ops.varlen_forward_device; sequences without queries or keys
    included; a batch whose longest sequence is far longer than the rest runs
    as a few such calls). Every other call runs consecutive sequences of
    equal lengths as one batched call on views of the packed tensors and
    each other sequence as a call of its own, so there a batch of many
    different lengths pays a call's host cost per sequence. cu_seqlens are
    checked on the host: a CUDA tensor's entries are read there (a wait for
    the device) once and kept while torch's version counter says the tensor
    is unchanged, so a model's layers
    sharing one cu_seqlens wait once; inference tensors (made under
    torch.inference_mode) have no version counter and are read on every
    call, and CPU tensors never wait. Under CUDA graph capture nothing is
    read on the host: the one-call path takes the call, sized by max_seqlen_q
    and max_seqlen_k, and the device checks cu_seqlens at every replay
    (other lengths that fit give what an eager call gives; lengths that do
    not give NaN); other calls are refused under capture. torch.compile
    traces the call as one op (torch_ops.varlen_op) whose implementation is
    the eager call, run when the graph runs. A sequence
    with no keys gives O = 0 and LSE = −inf, as a fully masked row does.
    max_seqlen_q / max_seqlen_k must be at least the longest sequence
    (FlashAttention would drop rows; here it is an error). The other
    arguments are flash_attn_func's; block_table (paged KV caches) accepts
    only None. With return_attn_probs=True it returns (out, softmax_lse,
    None), softmax_lse of shape (Hq, total_q) as FlashAttention's.

    FlashAttention-3's FP8 inputs as in flash_attn_func: q, k and v in
    float8_e4m3fn with q_descale, k_descale, v_descale float32 (B, Hkv) or
    None, one row per sequence; recipe fp8's forward on the codes as they
    are, out bfloat16. On a Hopper GPU every sequence runs in one device call
    (capturable in a CUDA graph, where the device checks cu_seqlens as
    above), elsewhere one call per sequence; see fp4attn.e4m3.
    """
    deterministic = _check_flash_attn_extras(dropout_p, softcap, alibi_slopes, deterministic)
    _validate.check_absent(block_table, "block_table", None, "paged KV caches are not supported")
    descales = (q_descale, k_descale, v_descale)
    if e4m3.is_e4m3(q) or e4m3.is_e4m3(k) or e4m3.is_e4m3(v):
        for x, name in ((q, "q"), (k, "k"), (v, "v")):
            if not hasattr(x, "shape") or len(x.shape) != 3:
                raise ValueError(f"{name}: expected a 3-D (total tokens, heads, D) array, got "
                                 f"{'shape ' + str(tuple(x.shape)) if hasattr(x, 'shape') else type(x).__name__}")
        # smooth_k off from the start: e4m3.settings then has nothing to replace.
        s = e4m3.settings(_flash_attn_settings(causal, softmax_scale, recipe, window_size, smooth_k=False))
        return_attn_probs = _validate.check_flag(return_attn_probs, "return_attn_probs")
        run = _torch_e4m3.varlen_forward if _is_torch(q) else e4m3.numpy_varlen_forward
        o, lse = run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, descales, s)
        return (o, lse, None) if return_attn_probs else o
    _check_no_descales(descales, q)
    torch_in = _is_torch(q)
    if not torch_in:
        q, k, v = (_host.to_host(x, name) for x, name in zip((q, k, v), ("q", "k", "v")))
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        if not hasattr(x, "shape") or len(x.shape) != 3:
            raise ValueError(f"{name}: expected a 3-D (total tokens, heads, D) array, got "
                             f"{'shape ' + str(tuple(x.shape)) if hasattr(x, 'shape') else type(x).__name__}")
    # Dtypes, devices, D's stride and how the shapes agree, before any call runs.
    _validate.check_qkv(*(x[None] for x in (q, k, v)), "bshd")
    s = _flash_attn_settings(causal, softmax_scale, recipe, window_size)
    return_attn_probs = _validate.check_flag(return_attn_probs, "return_attn_probs")
    if torch_in and _torch_ops.torch.compiler.is_compiling():
        # Traced as one op (its lengths are read when it runs, not while it is traced).
        o, lse = _torch_ops.varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, s,
                                      return_attn_probs, deterministic)
    else:
        o, lse = varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, s, return_attn_probs,
                                deterministic)
    return (o, lse, None) if return_attn_probs else o


def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, s: _host.Settings,
                   lse_returned: bool, deterministic: bool = False):
    """(O, LSE) of flash_attn_varlen_func's checked q, k and v (3-D), run eagerly; deterministic: the
    backward takes the two deterministic passes."""
    torch_in = _is_torch(q)
    if torch_in and q.is_cuda and _torch_ops.torch.cuda.is_current_stream_capturing():
        # cu_seqlens stay on the device: every replay runs on what they hold then.
        return _torch_ops.varlen_forward_captured(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                  s, lse_returned, deterministic)
    # An unchanged cu_seqlens tensor's checks and lengths are kept (_validate.checked_sequences).
    cu_q, lens_q, longest_q = _validate.checked_sequences(cu_seqlens_q, "cu_seqlens_q", q.shape[0], "q")
    cu_k, lens_k, longest_k = _validate.checked_sequences(cu_seqlens_k, "cu_seqlens_k", k.shape[0], "k")
    if len(cu_k) != len(cu_q):
        raise ValueError(f"cu_seqlens_k: has {len(cu_k)} entries (batch size {len(cu_k) - 1}) but cu_seqlens_q "
                         f"has {len(cu_q)}")
    _validate.check_max_seqlen(max_seqlen_q, "max_seqlen_q", longest_q)
    _validate.check_max_seqlen(max_seqlen_k, "max_seqlen_k", longest_k)
    if torch_in:  # one device call for all sequences where the device path takes them
        both = _torch_ops.varlen_forward_device(q, k, v, cu_seqlens_q, cu_seqlens_k, lens_q, lens_k, s,
                                                lse_returned, deterministic)
        if both is not None:
            return both
    # One (B, S, H, D) view of q, k and v per run of equal (query, key) lengths.
    as_batch = (lambda x, n: x.unflatten(0, (n, -1))) if torch_in else (lambda x, n: x.reshape(n, -1, *x.shape[1:]))
    hq, d = q.shape[1], q.shape[2]
    runs = _host.equal_length_runs(lens_q, lens_k)
    q_parts = _token_parts(q, [cu_q[i + n] - cu_q[i] for i, n in runs], torch_in)
    k_parts, v_parts = (_token_parts(x, [cu_k[i + n] - cu_k[i] for i, n in runs], torch_in) for x in (k, v))
    outs, lses = [], []
    for (i, n), q_run, k_run, v_run in zip(runs, q_parts, k_parts, v_parts):
        if lens_q[i] > 0 and lens_k[i] == 0:
            o, lse = _no_keys(q_run, hq, torch_in)
            outs.append(o)
            lses.append(lse)
        elif lens_q[i] > 0:
            o, lse = _forward(as_batch(q_run, n), as_batch(k_run, n), as_batch(v_run, n), s, lse_returned,
                              deterministic)
            outs.append(o.reshape(-1, hq, d))
            # (n, Hq, Lq) -> (Hq, n · Lq), the packed token order
            lses.append(lse.swapaxes(0, 1).reshape(hq, -1))
    if not outs:  # no query tokens at all
        outs.append(q.new_empty((0, hq, d)) if torch_in else np.zeros(q.shape, np.float32))
        lses.append(_no_keys(q, hq, torch_in)[1])
    cat = _torch_ops.torch.cat if torch_in else np.concatenate
    out = outs[0] if len(outs) == 1 else cat(outs)
    if torch_in and out.grad_fn is None:  # no sequence with queries and keys: zeros, still connected
        out = _connected(out, q, k, v)
    return out, lses[0] if len(lses) == 1 else cat(lses, 1)


def _unpacked(x, name: str, axis: int, parts: int, layout: str) -> tuple:
    """The `parts` tensors that FlashAttention's packed functions stack along `axis` of x (views: torch
    tensors stay where they are, with their strides; the device quantizers read them in place). A
    torch tensor is cut by one unbind, whose gradient autograd stacks: the sum of several indexings'
    gradients would turn -0 into +0."""
    torch_in = _is_torch(x)
    if not torch_in:
        x = _host.to_host(x, name)
    rank = len(layout.split(","))
    if len(x.shape) != rank or x.shape[axis] != parts:
        raise ValueError(f"{name}: expected a {rank}-D {layout} array, got shape {tuple(x.shape)}")
    if torch_in:
        return x.unbind(axis)
    return tuple(x[(slice(None),) * axis + (i,)] for i in range(parts))


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                              recipe="fp8", q_descale=None, k_descale=None, v_descale=None):
    """FlashAttention's flash_attn_qkvpacked_func: flash_attn_func on q, k, v = qkv[:, :, 0], qkv[:, :, 1],
    qkv[:, :, 2] of a (B, S, 3, H, D) qkv, with its other parameters (errors about the three
    name them q, k and v), the descales of a float8_e4m3fn qkv among them. With torch, gradients
    flow into qkv."""
    q, k, v = _unpacked(qkv, "qkv", 2, 3, "(B, S, 3, H, D)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, recipe=recipe, q_descale=q_descale,
                           k_descale=k_descale, v_descale=v_descale)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                             recipe="fp8", q_descale=None, k_descale=None, v_descale=None):
    """FlashAttention's flash_attn_kvpacked_func: flash_attn_func on q and k, v = kv[:, :, 0], kv[:, :, 1]
    of a (B, S, 2, Hkv, D) kv (float8_e4m3fn with the descales too)."""
    k, v = _unpacked(kv, "kv", 2, 2, "(B, S, 2, Hkv, D)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, recipe=recipe, q_descale=q_descale,
                           k_descale=k_descale, v_descale=v_descale)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, recipe="fp8", q_descale=None, k_descale=None,
                                     v_descale=None):
    """FlashAttention's flash_attn_varlen_qkvpacked_func: flash_attn_varlen_func on q, k, v = qkv[:, 0],
    qkv[:, 1], qkv[:, 2] of a (total, 3, H, D) qkv, cu_seqlens and max_seqlen serving queries and keys
    (float8_e4m3fn with the descales too)."""
    q, k, v = _unpacked(qkv, "qkv", 1, 3, "(total, 3, H, D)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                                  recipe=recipe, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                                    recipe="fp8", q_descale=None, k_descale=None, v_descale=None):
    """FlashAttention's flash_attn_varlen_kvpacked_func: flash_attn_varlen_func on q and k, v = kv[:, 0],
    kv[:, 1] of a (total_k, 2, Hkv, D) kv (float8_e4m3fn with the descales too)."""
    k, v = _unpacked(kv, "kv", 1, 2, "(total_k, 2, Hkv, D)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, recipe=recipe, q_descale=q_descale, k_descale=k_descale,
                                  v_descale=v_descale)


def _token_parts(x, sizes: list, torch_in: bool) -> list:
    """x's consecutive token rows in parts of `sizes` (which cover them all). A torch tensor is cut by
    one split, so that autograd concatenates the parts' gradients: gradients of several slices would
    be summed, and (+0) + (-0) = +0 would change the sign of zeros that a call on one part keeps."""
    if torch_in:
        return x.split(sizes)
    starts = np.cumsum([0] + sizes)
    return [x[a:b] for a, b in zip(starts[:-1], starts[1:])]


def _no_keys(q_rows, hq: int, torch_in: bool):
    """O = 0 and LSE = −inf (Hq, tokens) for query rows whose sequence has no keys."""
    if torch_in:
        torch = _torch_ops.torch
        lse = torch.full((hq, q_rows.shape[0]), -math.inf, dtype=torch.float32, device=q_rows.device)
        return torch.zeros_like(q_rows), lse
    return np.zeros(q_rows.shape, np.float32), np.full((hq, q_rows.shape[0]), -np.inf, np.float32)


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, *,
         recipe="fp8"):
    """PyTorch's scaled_dot_product_attention: (B, H, S, D) tensors, causal top-left aligned.

    The same parameters in the same order, so that positional calls keep
    their meaning. As in PyTorch, key and value may have fewer heads than
    query only with enable_gqa=True. attn_mask accepts only None (is_causal
    gives the causal mask) and dropout_p only 0.0; anything else raises
    ValueError naming the argument.
    """
    _validate.check_absent(attn_mask, "attn_mask", None, "attention masks are not supported (use is_causal)")
    _validate.check_absent(dropout_p, "dropout_p", 0.0, "attention dropout is not supported")
    s = _host.make_settings(
        layout="bhsd",
        mask=_host.MASK_TOP_LEFT if _validate.check_flag(is_causal, "is_causal") else _host.MASK_NONE,
        scale=scale,
        scale_name="scale",
        recipe=recipe,
        smooth_k=True,
        direct_p=True,
        gqa=_validate.check_flag(enable_gqa, "enable_gqa"),
        names=("query", "key", "value"),
    )
    o, _lse = _forward(query, key, value, s, False)
    return o


def quantize(x, fmt, *, axis="along_d", fp8_token_block=128, mx_scale_rule="round_up"):
    """Quantize a (B, S, H, D) array to fp8_e4m3, mxfp4 or nvfp4 (DESIGN §3.2).

    axis="along_d" puts the scale blocks along D (how Q and K are stored),
    "along_s" along the sequence (V). Returns a QuantizedTensor: codes (one per
    byte, FP4 unpacked), scales, scale_codes (None for fp8), tensor_scale and
    dequantize().
    """
    fmt = _validate.check_choice(fmt, _validate.FORMATS, "fmt")
    axis = _validate.check_choice(axis, _validate.BLOCK_AXES, "axis")
    fp8_token_block = _validate.check_int(fp8_token_block, "fp8_token_block")
    mx_scale_rule = _validate.check_choice(mx_scale_rule, _validate.MX_SCALE_RULES, "mx_scale_rule")
    if not _is_torch(x):
        x = _host.to_host(x, "x")
    _validate.check_array(x, "x")
    if _is_torch(x):
        x = _torch_ops.host_array(x)
    return _host.quantize(x, fmt, axis, fp8_token_block, mx_scale_rule)
