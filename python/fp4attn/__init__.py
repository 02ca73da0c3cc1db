"""fp4attn: low-precision (FP8/FP4) FlashAttention with Direct-P.

    import fp4attn
    out = fp4attn.sdpa(q, k, v, is_causal=True)             # PyTorch SDPA layout (B, H, S, D)
    out = fp4attn.flash_attn_func(q, k, v, causal=True)     # FlashAttention layout (B, S, H, D)
    out, lse = fp4attn.attention(q, k, v, recipe="mxfp4", return_lse=True)

Inputs are NumPy arrays, any array with __dlpack__ or __array__, or torch
tensors (then the torch custom op fp4attn::attention runs; see torch_ops).
"""

from . import _ext
from ._ext import QuantizedTensor
from ._validate import FORMATS, RECIPES
from .api import (attention, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                  flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func, quantize,
                  sdpa)

__version__ = "0.1.0"


def backend_info() -> dict:
    """Which executors this build has and which one attention calls will use."""
    return {
        "version": __version__,
        "cuda_built": _ext.cuda_built(),
        "sm90_available": _ext.sm90_available(),
        "device": _ext.device_description(),
    }


__all__ = [
    "FORMATS",
    "RECIPES",
    "QuantizedTensor",
    "attention",
    "backend_info",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "quantize",
    "sdpa",
]
