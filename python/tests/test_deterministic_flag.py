"""FlashAttention's deterministic flag: deterministic=True makes that call's
backward take the two deterministic passes, whatever the default
(fp4attn.torch_ops.DETERMINISTIC_BACKWARD, torch's deterministic algorithms,
or the faster mode for the problem); False leaves the default.

The mode reaches the device backward as an argument (torch_ops._backward_device).
Here a recorder stands in for it, so that every path can be checked on any
machine: eager, compiled, the packed forms and the varlen functions. On a
Hopper GPU the real backward runs with the mode recorded, and the gradients of
a call asking for determinism are those of the two passes bit for bit.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fp4attn  # noqa: E402  (after the skip: without torch this module is not collected)
from conftest import make_qkv, needs_device_backward  # noqa: E402

# _backward_device(d_o, d_lse, q, k, v, o, lse, dims, s, opt, deterministic, kept, packing=None)
_MODE_ARG = 10


def tensors(rng, B, Sq, Sk, Hq, Hkv, D, device="cpu"):
    q, k, v = (torch.from_numpy(x).to(device).requires_grad_() for x in make_qkv(rng, B, Sq, Sk, Hq, Hkv, D))
    return q, k, v


@pytest.fixture
def modes(monkeypatch):
    """The mode of every device backward that runs, with the device backward recorded instead of run:
    zero gradients, and CPU calls sent to it as if a Hopper GPU ran them."""
    seen = []

    def recorder(*args, **kwargs):
        seen.append(args[_MODE_ARG])
        q, k, v = args[2:5]
        return tuple(torch.zeros(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))

    monkeypatch.setattr(fp4attn.torch_ops, "_uses_device_backward", lambda *args: True)
    monkeypatch.setattr(fp4attn.torch_ops, "_backward_device", recorder)
    # One pass by default, so that a True can only come from the call.
    monkeypatch.setattr(fp4attn.torch_ops, "DETERMINISTIC_BACKWARD", False)
    return seen


@pytest.mark.parametrize("deterministic", [False, True])
def test_flash_attn_func_passes_the_flag_to_its_backward(rng, modes, deterministic):
    q, k, v = tensors(rng, 1, 40, 70, 2, 1, 64)
    fp4attn.flash_attn_func(q, k, v, causal=True, deterministic=deterministic).sum().backward()
    # The packed forms pass it on too.
    qkv = torch.stack([x.detach() for x in tensors(rng, 1, 40, 40, 2, 2, 64)], dim=2).requires_grad_()
    fp4attn.flash_attn_qkvpacked_func(qkv, 0.0, None, False, (-1, -1), 0.0, None, deterministic).sum().backward()
    assert modes == [deterministic, deterministic]


def test_the_flag_outlives_later_calls(rng, modes):
    # The mode belongs to the call that built the graph, not to whichever call ran last.
    q, k, v = tensors(rng, 1, 40, 70, 2, 1, 64)
    asked = fp4attn.flash_attn_func(q, k, v, deterministic=True)
    plain = fp4attn.flash_attn_func(q, k, v)
    (asked.sum() + 2 * plain.sum()).backward()
    assert sorted(modes) == [False, True]


def test_compiled_call_passes_the_flag(rng, modes):
    q, k, v = tensors(rng, 1, 40, 70, 2, 1, 64)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(q, k, v):
        return fp4attn.flash_attn_func(q, k, v, causal=True, deterministic=True).sum()

    step(q, k, v).backward()
    assert modes == [True]


@pytest.mark.parametrize("deterministic", [False, True])
def test_varlen_passes_the_flag(rng, modes, deterministic):
    # Two sequences of other lengths: on the host each runs as a call of its own.
    lens = [30, 50]
    q, k, v = tensors(rng, 1, sum(lens), sum(lens), 2, 1, 64)
    q, k, v = (x.detach()[0].requires_grad_() for x in (q, k, v))
    cu = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32)
    fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True,
                                   deterministic=deterministic).sum().backward()
    assert modes == [deterministic] * len(lens)


def test_compiled_varlen_passes_the_flag(rng, modes):
    lens = [30, 50]
    q, k, v = tensors(rng, 1, sum(lens), sum(lens), 2, 1, 64)
    q, k, v = (x.detach()[0].requires_grad_() for x in (q, k, v))
    cu = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(q, k, v):
        return fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True,
                                              deterministic=True).sum()

    step(q, k, v).backward()
    assert modes == [True] * len(lens)


@needs_device_backward
def test_device_backward_takes_the_two_passes_when_asked(rng, monkeypatch):
    # D = 64 with rows that see over 1 000 keys: the one pass by default.
    q, k, v = tensors(rng, 2, 300, 1400, 4, 2, 64, "cuda")
    q, k, v = (x.detach().to(torch.bfloat16).requires_grad_() for x in (q, k, v))
    d_o = torch.randn(q.shape, dtype=q.dtype, device=q.device)
    seen = []
    real = fp4attn.torch_ops._backward_device
    monkeypatch.setattr(fp4attn.torch_ops, "_backward_device", lambda *a: seen.append(a[_MODE_ARG]) or real(*a))

    def run(**kwargs):
        for x in (q, k, v):
            x.grad = None
        fp4attn.flash_attn_func(q, k, v, causal=True, **kwargs).backward(d_o)
        return [x.grad.float().cpu().numpy() for x in (q, k, v)]

    default = run()
    asked = run(deterministic=True)
    again = run(deterministic=True)
    monkeypatch.setattr(fp4attn.torch_ops, "DETERMINISTIC_BACKWARD", True)
    two_pass = run()
    assert seen == [False, True, True, True]
    for a, b, c in zip(asked, again, two_pass):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    assert not np.array_equal(default[0], two_pass[0])  # the modes differ in dQ (its dS scales)
