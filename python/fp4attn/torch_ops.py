"""PyTorch integration: attention as a torch.library custom op.

The op `fp4attn::attention` has a fake (meta) implementation, so
torch.compile(fullgraph=True) keeps it in the graph without running it.

Execution:
* CUDA tensors, when this build has the sm90 executor, the tensors live on a
  compute-capability 9.0 GPU and the executor implements the call (recipe
  fp8, target sm90, D = 64 or 128): the device path. The GPU quantizer reads
  q, k and v where they are (any strides with D contiguous, both layouts, no
  copy), the kernel writes O and LSE into tensors allocated here, and the
  quantized operands live in a workspace tensor from torch's caching
  allocator. Everything is enqueued on the current CUDA stream of the
  tensors' device with no host synchronisation, so the op can be captured in
  a CUDA graph. Non-finite input is not reported on this path (that would
  need a synchronisation); the output is then unspecified.
* Every other call goes through the host entry point: CPU tensors run on the
  emulator (or on the sm90 kernels when this build has them and a Hopper GPU
  is present); other CUDA tensors (FP4 recipes, target sm100, other head
  dims, GPUs other than sm90, CPU-only builds) are COPIED TO THE HOST, run
  there, and the results copied back. That synchronises with the device and
  cannot be captured in a CUDA graph.

Both paths return O with q's shape, dtype and device (the kernels store bf16
values; for other input dtypes O is converted from bf16, on the device for
the device path) and the LSE as float32 (B, Hq, Sq). For the same inputs the
two paths give the same numbers: both quantize with the same GPU quantizer
and run the same kernel.

Backward raises NotImplementedError until the FP8 backward is wired in.
"""

# No `from __future__ import annotations` here: custom_op reads the
# signature's annotations to build the op schema.
import functools

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


def _bshd_strides(x: torch.Tensor, layout: str) -> tuple[int, int, int]:
    """Element strides on B, S and H of x seen as (B, S, H, D)."""
    if layout == "bhsd":
        return x.stride(0), x.stride(2), x.stride(1)
    return x.stride(0), x.stride(1), x.stride(2)


def _device_shape(dims: _validate.Dims) -> tuple[int, int, int, int, int, int]:
    return dims.B, dims.Sq, dims.Sk, dims.Hq, dims.Hkv, dims.D


def _uses_device_path(q: torch.Tensor, dims: _validate.Dims, opt) -> bool:
    """Whether the device path runs this call; raises the host path's errors for an invalid one."""
    if q.device.type != "cuda" or not _ext.cuda_built():
        return False
    # device_forward_supported validates first, so both paths reject the same calls.
    return _ext.device_forward_supported(_device_shape(dims), opt) and _is_sm90(q.device.index)


def _attention_device(q, k, v, dims: _validate.Dims, s: _host.Settings, opt):
    """(O, LSE) computed on q's device, enqueued on its current stream; no copy of q, k, v."""
    if q.dtype == torch.float64:
        q, k, v = (x.float() for x in (q, k, v))
    shape = _device_shape(dims)
    with torch.cuda.device(q.device):
        o = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
        lse = torch.empty((dims.B, dims.Hq, dims.Sq), dtype=torch.float32, device=q.device)
        workspace = torch.empty(_ext.device_workspace_bytes(shape), dtype=torch.uint8, device=q.device)
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
            torch.cuda.current_stream(q.device).cuda_stream,
        )
    return o, lse


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
    dims = _host.check(q, k, v, s)
    opt = _host.options(s)
    if _uses_device_path(q, dims, opt):
        o, lse = _attention_device(q, k, v, dims, s, opt)
        return o.to(q.dtype), lse
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
