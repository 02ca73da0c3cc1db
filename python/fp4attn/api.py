"""The public attention and quantization functions.

NumPy arrays and other host arrays run through fp4attn._host; torch tensors
through the custom ops of fp4attn.torch_ops (so that torch.compile sees one
op), which run CUDA tensors on the device where the sm90 executor can, and
end in the same host code otherwise.
"""

from __future__ import annotations

import importlib.util

from . import _host, _validate

# The torch layer loads only where torch is installed; the NumPy API never needs it.
if importlib.util.find_spec("torch") is not None:
    from . import torch_ops as _torch_ops
else:
    _torch_ops = None


def _is_torch(x) -> bool:
    return _torch_ops is not None and _torch_ops.is_tensor(x)


def _forward(q, k, v, s: _host.Settings, lse_returned: bool):
    # lse_returned: whether the caller gets the LSE (and so may put it in a loss).
    if _is_torch(q):
        return _torch_ops.attention(q, k, v, s, lse_returned)
    names = s.names.split(",")
    q, k, v = (_host.to_host(x, name) for x, name in zip((q, k, v), names))
    _host.check(q, k, v, s)
    return _host.attention(q, k, v, s)


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
):
    """Low-precision attention, softmax(scale · q kᵀ) v.

    q: (B, Sq, Hq, D), k and v: (B, Sk, Hkv, D) with Hq a multiple of Hkv, or
    the (B, H, S, D) order with layout="bhsd". causal masks bottom-right aligned
    when Sq != Sk (FlashAttention >= 2.1); scale=None means 1/sqrt(D).
    target picks the hardware whose numerics are modelled: "sm90" (FP4
    expanded to E4M3, DESIGN §3.4) or "sm100" (ideal block-scaled FP4; CPU
    emulator only, so it never runs on the GPU).
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
    )
    return_lse = _validate.check_flag(return_lse, "return_lse")
    o, lse = _forward(q, k, v, s, return_lse)
    return (o, lse) if return_lse else o


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
):
    """FlashAttention's flash_attn_func: (B, S, H, D) tensors, causal bottom-right aligned, GQA/MQA.

    The same parameters in the same order, so that positional calls keep
    their meaning. Features fp4attn lacks accept only their "off" value and
    raise ValueError naming the argument otherwise: dropout_p (0.0),
    window_size ((-1, -1)), softcap (0.0), alibi_slopes (None). deterministic
    accepts False: the backward's mode follows torch's deterministic
    algorithms setting (fp4attn.torch_ops.DETERMINISTIC_BACKWARD). With
    return_attn_probs=True it returns (out, softmax_lse, None): the attention
    probabilities are never formed, so the third element is None.
    """
    _validate.check_absent(dropout_p, "dropout_p", 0.0, "attention dropout is not supported")
    _validate.check_absent(window_size, "window_size", (-1, -1), "sliding-window attention is not supported")
    _validate.check_absent(softcap, "softcap", 0.0, "score soft-capping is not supported")
    _validate.check_absent(alibi_slopes, "alibi_slopes", None, "ALiBi is not supported")
    if _validate.check_flag(deterministic, "deterministic"):
        raise ValueError("deterministic: not selectable per call; torch.use_deterministic_algorithms(True) (or "
                         "fp4attn.torch_ops.DETERMINISTIC_BACKWARD = True) makes the backward deterministic")
    s = _host.make_settings(
        layout="bshd",
        mask=_host.MASK_BOTTOM_RIGHT if _validate.check_flag(causal, "causal") else _host.MASK_NONE,
        scale=softmax_scale,
        scale_name="softmax_scale",
        recipe=recipe,
        smooth_k=True,
        direct_p=True,
        gqa=True,
        names=("q", "k", "v"),
    )
    return_attn_probs = _validate.check_flag(return_attn_probs, "return_attn_probs")
    o, lse = _forward(q, k, v, s, return_attn_probs)
    return (o, lse, None) if return_attn_probs else o


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
