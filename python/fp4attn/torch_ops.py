"""PyTorch integration: attention as a torch.library custom op.

The op `fp4attn::attention` has a fake (meta) implementation, so
torch.compile(fullgraph=True) keeps it in the graph without running it.

Execution, for now, goes through the host entry point: CPU tensors run on the
emulator (or on the sm90 kernels when this build has them and a Hopper GPU is
present); CUDA tensors are COPIED TO THE HOST, run there through the same
entry point (which uses the sm90 kernels on a Hopper GPU), and the results are
copied back. That synchronises with the device, ignores the current stream and
cannot be captured in a CUDA graph; a device-side path that takes the tensors
where they are is the next step.

Backward raises NotImplementedError until the FP8 backward is wired in.
"""

# No `from __future__ import annotations` here: custom_op reads the
# signature's annotations to build the op schema.
import torch

from . import _ext, _host, _validate

_OP = "fp4attn::attention"
# The op's arguments are q, k, v, then the fields of _host.Settings in order.
_RECIPE_ARG = 3 + _host.Settings._fields.index("recipe")


def is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def host_array(x: torch.Tensor):
    """A float32 NumPy array on the host (NumPy has no bfloat16; the core reads fp32 anyway)."""
    return x.detach().to(device="cpu", dtype=torch.float32).numpy()


@torch.library.custom_op(_OP, mutates_args=())
def _attention_op(
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
) -> tuple[torch.Tensor, torch.Tensor]:
    s = _host.Settings(qkv_layout, mask_kind, softmax_scale, recipe, smooth_k, direct_p, gqa, arg_names, target)
    _host.check(q, k, v, s)
    o, lse = _host.attention(host_array(q), host_array(k), host_array(v), s)
    return torch.from_numpy(o).to(device=q.device, dtype=q.dtype), torch.from_numpy(lse).to(device=q.device)


@_attention_op.register_fake
def _attention_fake(q, k, v, qkv_layout, mask_kind, softmax_scale, recipe, smooth_k, direct_p, gqa, arg_names, target):
    # Runs at trace time on fake tensors: the same checks, so compiled code raises the same errors.
    s = _host.Settings(qkv_layout, mask_kind, softmax_scale, recipe, smooth_k, direct_p, gqa, arg_names, target)
    dims = _host.check(q, k, v, s)
    return q.new_empty(q.shape), q.new_empty((dims.B, dims.Hq, dims.Sq), dtype=torch.float32)


def _backward_message(recipe: str) -> str:
    if _ext.recipe_has_backward(_ext.Recipe.__members__[recipe]):
        return f"backward of recipe {recipe} is not available yet"
    trainable = [r for r in _validate.RECIPES if _ext.recipe_has_backward(_ext.Recipe.__members__[r])]
    return f"recipe {recipe} is inference-only and has no backward; train with one of {', '.join(trainable)}"


def _setup_context(ctx, inputs, output):
    ctx.recipe = inputs[_RECIPE_ARG]


def _backward(ctx, grad_o, grad_lse):
    raise NotImplementedError(_backward_message(ctx.recipe))


_attention_op.register_autograd(_backward, setup_context=_setup_context)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: _host.Settings):
    """(O, LSE) through the custom op; O has q's shape, dtype and device."""
    return _attention_op(q, k, v, *s)
