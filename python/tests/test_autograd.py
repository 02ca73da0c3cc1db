"""Autograd through the torch layer: gradients of attention, flash_attn_func
and sdpa against the fp64 reference, the LSE's gradient, dtypes, layouts,
torch.compile of forward + backward, and on a Hopper GPU the zero-copy device
backward (no synchronisation, deterministic, CUDA graphs).

Bounds: the emulator's calibrated backward recipe bounds (tests/
test_emulator_backward.cpp, kBackwardBounds, smooth_k and Direct-P on, E4M3
dS; docs/accuracy.md): twice the worst 1 − cos and rel L2 over dQ, dK, dV seen
against the fp64 reference on the unquantized inputs. FP8 gradients make
gradcheck meaningless, so none is used.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fp4attn  # noqa: E402  (after the skip: without torch this module is not collected)
from conftest import GRAD_BOUNDS, GradBounds, make_qkv, needs_device_backward  # noqa: E402
from fp64_reference import attention_backward_bshd, cosine, rel_l2  # noqa: E402

TRAINABLE = tuple(GRAD_BOUNDS)

needs_backward = pytest.mark.skipif(not hasattr(fp4attn._ext, "backward"), reason="this build has no _ext.backward")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# (B, Sq, Sk, Hq, Hkv, D): GQA with Sq != Sk, MQA with Sk over the 128-key tile, equal odd lengths.
SHAPES = [(1, 48, 80, 4, 2, 64), (1, 64, 200, 2, 1, 128), (2, 33, 33, 2, 2, 64)]


def problem(rng, shape, device, dtype=torch.float32):
    """q, k, v (B, S, H, D) tensors that require grad, and a random dO, all of `dtype` on `device`."""
    B, Sq, Sk, Hq, Hkv, D = shape
    q, k, v = make_qkv(rng, B, Sq, Sk, Hq, Hkv, D)
    d_o = rng.standard_normal(q.shape).astype(np.float32)
    tensors = [torch.from_numpy(x).to(device=device, dtype=dtype) for x in (q, k, v, d_o)]
    for x in tensors[:3]:
        x.requires_grad_()
    return tensors


def reference(q, k, v, d_o, causal, d_lse=None):
    """fp64 gradients of the values the tensors hold (bf16 inputs are compared with what they round to)."""
    arrays = [x.detach().double().cpu().numpy() for x in (q, k, v, d_o)]
    mask = "bottom_right" if causal else "none"
    return attention_backward_bshd(*arrays, mask=mask, d_lse=None if d_lse is None else d_lse.double().cpu().numpy())


def grads(q, k, v):
    return tuple(x.grad.double().cpu().numpy() for x in (q, k, v))


def assert_within_bf16_rounding(got, want):
    """bf16 gradients whose fp32 sums differ only in their last bits (order, or
    a mean computed another way): each element within one bf16 ulp (2^-8 to
    2^-7 of the value), where its rounding went the other way, plus 1e-5 of the
    largest |value| for the fp32 difference itself (cancellation can make that
    large against a small element)."""
    bound = 2.0 ** -7 * np.abs(want) + 1e-5 * np.abs(want).max()
    assert np.all(np.abs(got - want) <= bound), np.abs(got - want).max()


def within(got, expected, bounds: GradBounds) -> bool:
    return 1 - cosine(got, expected) < bounds.one_minus_cos and rel_l2(got, expected) < bounds.rel_l2


def assert_close_to_reference(got, expected, bounds: GradBounds):
    for name, g, e in zip(("dq", "dk", "dv"), got, expected):
        assert np.isfinite(g).all(), name
        assert 1 - cosine(g, e) < bounds.one_minus_cos, (name, 1 - cosine(g, e))
        assert rel_l2(g, e) < bounds.rel_l2, (name, rel_l2(g, e))


@needs_backward
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", TRAINABLE)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_gradients_match_fp64_reference(rng, device, recipe, causal, shape):
    q, k, v, d_o = problem(rng, shape, device)
    out = fp4attn.flash_attn_func(q, k, v, causal=causal, recipe=recipe)
    out.backward(d_o)
    assert all(x.grad.dtype == x.dtype and x.grad.shape == x.shape for x in (q, k, v))
    assert_close_to_reference(grads(q, k, v), reference(q, k, v, d_o, causal), GRAD_BOUNDS[recipe])


@needs_backward
def test_bounds_reject_wrong_gradients(rng):
    # The metrics separate right from wrong: swapped dK and dV, dQ of the
    # wrong head, or gradients of the wrong mask all fail the bounds.
    shape = SHAPES[0]
    q, k, v, d_o = problem(rng, shape, "cpu")
    fp4attn.flash_attn_func(q, k, v, causal=True).backward(d_o)
    dq, dk, dv = grads(q, k, v)
    ref_dq, ref_dk, ref_dv = reference(q, k, v, d_o, causal=True)
    bounds = GRAD_BOUNDS["fp8"]
    assert within(dk, ref_dk, bounds) and within(dv, ref_dv, bounds) and within(dq, ref_dq, bounds)
    assert not within(dv, ref_dk, bounds) and not within(dk, ref_dv, bounds)
    assert not within(dq[:, :, ::-1], ref_dq, bounds)  # heads reversed
    assert not within(dq, reference(q, k, v, d_o, causal=False)[0], bounds)


@needs_backward
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_gradients_keep_the_input_dtype(rng, device, dtype):
    q, k, v, d_o = problem(rng, SHAPES[0], device, dtype)
    fp4attn.flash_attn_func(q, k, v, causal=True).backward(d_o)
    assert all(x.grad.dtype == dtype and x.grad.device == q.device for x in (q, k, v))
    assert_close_to_reference(grads(q, k, v), reference(q, k, v, d_o, causal=True), GRAD_BOUNDS["fp8"])


@needs_backward
@pytest.mark.parametrize("device", DEVICES)
def test_the_three_entry_points_give_the_same_gradients(rng, device):
    # attention (bshd), flash_attn_func (bshd) and sdpa (bhsd views): one core, one answer.
    q, k, v, d_o = problem(rng, SHAPES[0], device)

    def run(fn):
        for x in (q, k, v):
            x.grad = None
        fn().backward(d_o)
        return grads(q, k, v)

    first = run(lambda: fp4attn.attention(q, k, v, causal=True))
    second = run(lambda: fp4attn.flash_attn_func(q, k, v, causal=True))
    # sdpa's causal mask is top-left aligned: the same as bottom-right only for Sq == Sk.
    square = problem(rng, (1, 64, 64, 4, 2, 64), device)
    q2, k2, v2, d_o2 = square
    fp4attn.sdpa(*(x.transpose(1, 2) for x in (q2, k2, v2)), is_causal=True, enable_gqa=True).backward(
        d_o2.transpose(1, 2)
    )
    from_sdpa = grads(q2, k2, v2)
    for x in (q2, k2, v2):
        x.grad = None
    fp4attn.flash_attn_func(q2, k2, v2, causal=True).backward(d_o2)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(from_sdpa, grads(q2, k2, v2)):
        np.testing.assert_array_equal(a, b)


@needs_backward
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", TRAINABLE)
def test_gradient_through_the_lse(rng, device, recipe):
    q, k, v, d_o = problem(rng, SHAPES[0], device)
    d_lse = torch.from_numpy(rng.standard_normal((1, 4, 48)).astype(np.float32)).to(device)
    out, lse = fp4attn.attention(q, k, v, causal=True, recipe=recipe, return_lse=True)
    ((out * d_o).sum() + (lse * d_lse).sum()).backward()
    expected = reference(q, k, v, d_o, causal=True, d_lse=d_lse)
    assert_close_to_reference(grads(q, k, v), expected, GRAD_BOUNDS[recipe])
    # Without the LSE term dQ would be off by more than fp8's bound (the
    # FP4 Q/K recipe's bound is too wide to tell): the test can fail.
    without = reference(q, k, v, d_o, causal=True)
    assert not within(expected[0], without[0], GRAD_BOUNDS["fp8"])


@needs_backward
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", TRAINABLE)
def test_lse_gradient_of_rows_that_see_no_key(rng, device, recipe):
    # Causal with Sq > Sk, bottom-right aligned: the first Sq − Sk query rows
    # see no key, and their LSE is −inf whatever Q holds. A finite dLSE there
    # must give those rows dQ = 0 (smooth_k's share of the LSE term, scale·dLSE·k̄,
    # belongs only to rows that see keys), and K's mean far from zero makes a
    # wrong term large.
    q, k, v, d_o = problem(rng, (1, 80, 48, 4, 2, 64), device)
    d_lse = torch.from_numpy(rng.standard_normal((1, 4, 80)).astype(np.float32)).to(device)
    out, lse = fp4attn.attention(q, k, v, causal=True, recipe=recipe, return_lse=True)
    blind = 80 - 48
    assert bool(torch.isneginf(lse[..., :blind]).all()) and bool(torch.isfinite(lse[..., blind:]).all())
    torch.autograd.backward((out, lse), (d_o, d_lse))
    assert not q.grad[:, :blind].any()
    assert_close_to_reference(grads(q, k, v), reference(q, k, v, d_o, causal=True, d_lse=d_lse), GRAD_BOUNDS[recipe])


@needs_backward
def test_lse_alone_in_the_loss(rng):
    # dO = 0: only the LSE's term is left (the O term of the gradient vanishes).
    q, k, v, _ = problem(rng, SHAPES[1], "cpu")
    _, lse = fp4attn.attention(q, k, v, return_lse=True)
    lse.sum().backward()
    d_o = torch.zeros(q.shape)
    expected = reference(q, k, v, d_o, causal=False, d_lse=torch.ones(lse.shape))
    assert_close_to_reference(grads(q, k, v)[:2], expected[:2], GRAD_BOUNDS["fp8"])
    assert not v.grad.any()


@needs_backward
@pytest.mark.parametrize("recipe", TRAINABLE)
def test_backward_op_registration(rng, recipe):
    q, k, v, d_o = problem(rng, SHAPES[0], "cpu")
    o, lse = fp4attn.attention(q, k, v, causal=True, recipe=recipe, return_lse=True, window=(30, 0))
    args = (d_o, torch.randn(lse.shape), q.detach(), k.detach(), v.detach(), o.detach(), lse.detach(),
            "bshd", "causal", 0.0, recipe, True, True, True, "q,k,v", "sm90", 30, 0, True)
    torch.library.opcheck(torch.ops.fp4attn.attention_backward.default, args)


@needs_backward
@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_forward_and_backward(rng, device):
    q, k, v, d_o = problem(rng, (1, 128, 128, 2, 2, 64), device, torch.bfloat16)

    def block(q, k, v):
        return fp4attn.sdpa(q, k, v, is_causal=True) * 2.0

    # fullgraph: the forward is one graph; AOTAutograd traces the backward
    # from it, through the backward op's fake implementation.
    # An eager step first, on the same shapes: what the eager path keeps
    # between calls (stand-ins of the kept operands) must not leak into the trace.
    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    qh, kh, vh, d_oh = (x.transpose(1, 2) for x in (q, k, v, d_o))
    block(qh, kh, vh).backward(d_oh)
    for x in (q, k, v):
        x.grad = None
    compiled(qh, kh, vh).backward(d_oh)
    got = tuple(x.grad.clone() for x in (q, k, v))
    for x in (q, k, v):
        x.grad = None
    block(qh, kh, vh).backward(d_oh)
    for g, x in zip(got, (q, k, v)):
        torch.testing.assert_close(g, x.grad, rtol=0, atol=0)


# ---- the device backward: CUDA tensors on the sm90 kernel --------------------------


# The sm90 backward against the emulator, as the GPU suite bounds it (tests/gpu/test_bwd_gpu.cu):
# recipe -> (max rel L2, min cosine).
BOUNDS_VS_EMULATOR = {"fp8": (3e-2, 0.99985), "mxfp4_train": (3.5e-2, 0.99978)}


@needs_device_backward
@pytest.mark.parametrize("recipe", TRAINABLE)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_device_backward_matches_the_emulator(rng, recipe, dtype, causal):
    # Strided views (bshd views of bhsd buffers), GQA, Sq != Sk, lengths off the tile.
    B, Sq, Sk, Hq, Hkv, D = 2, 200, 333, 4, 2, 64
    q, k, v, d_o = (x.detach().transpose(1, 2).contiguous().transpose(1, 2)
                    for x in problem(rng, (B, Sq, Sk, Hq, Hkv, D), "cuda", dtype))
    for x in (q, k, v):
        x.requires_grad_()
    out, lse = fp4attn.attention(q, k, v, causal=causal, recipe=recipe, return_lse=True)
    out.backward(d_o)
    s = fp4attn._host.make_settings(layout="bshd", mask="causal" if causal else "none", scale=None,
                                    scale_name="scale", recipe=recipe, smooth_k=True, direct_p=True, gqa=True,
                                    names=("q", "k", "v"))
    host = [np.ascontiguousarray(x.detach().float().cpu().numpy()) for x in (q, k, v, out, lse, d_o)]
    # The emulator models the mode the device backward took (noncausal here: the one pass, its
    # dQ's dS with one scale per 128 x 128 pair; causal: the two passes, one per 64 query rows).
    opts = fp4attn._host.options(s)
    dims = fp4attn._validate.Dims(B=B, Sq=Sq, Sk=Sk, Hq=Hq, Hkv=Hkv, D=D)
    one_pass = fp4attn.torch_ops.one_pass_faster(dims, "causal" if causal else "none")
    assert one_pass == (not causal)  # both modes are checked
    opts.dq_ds_rows = 128 if one_pass else 64
    expected = fp4attn._ext.backward(*host, opts, fp4attn._ext.Executor.emulator)[:3]
    max_rel_l2, min_cosine = BOUNDS_VS_EMULATOR[recipe]
    for name, got, e in zip(("dq", "dk", "dv"), grads(q, k, v), expected):
        assert rel_l2(got, e) <= max_rel_l2, (name, rel_l2(got, e))
        assert cosine(got, e) >= min_cosine, (name, cosine(got, e))


@needs_device_backward
@pytest.mark.parametrize("recipe", TRAINABLE)
@pytest.mark.parametrize("D", [32, 72, 80, 96])
def test_device_backward_of_padded_head_dims(rng, recipe, D):
    # D = 32 / 72 / 80 / 96 run on the D = 64 / 128 kernels with zero channels appended
    # (torch_ops._padded_head_dim): the gradients are those of an explicitly
    # padded call with the unpadded D's scale, bit for bit, and within the
    # device backward's bounds of the emulator's at D itself.
    q, k, v, d_o = problem(rng, (2, 200, 300, 4, 2, D), "cuda", torch.float32)
    out, lse = fp4attn.attention(q, k, v, causal=True, recipe=recipe, return_lse=True)
    out.backward(d_o)
    got = grads(q, k, v)
    d_run = 64 if D <= 64 else 128
    scale = float(np.float32(1.0) / np.sqrt(np.float32(D)))
    padded = [torch.nn.functional.pad(x.detach(), (0, d_run - D)).requires_grad_() for x in (q, k, v)]
    out_p = fp4attn.attention(*padded, causal=True, recipe=recipe, scale=scale)
    out_p.backward(torch.nn.functional.pad(d_o, (0, d_run - D)))
    for a, b in zip(got, grads(*padded)):
        np.testing.assert_array_equal(a, b[..., :D])
    s = fp4attn._host.make_settings(layout="bshd", mask="causal", scale=None, scale_name="scale", recipe=recipe,
                                    smooth_k=True, direct_p=True, gqa=True, names=("q", "k", "v"))
    host = [np.ascontiguousarray(x.detach().float().cpu().numpy()) for x in (q, k, v, out, lse, d_o)]
    expected = fp4attn._ext.backward(*host, fp4attn._host.options(s), fp4attn._ext.Executor.emulator)[:3]
    max_rel_l2, min_cosine = BOUNDS_VS_EMULATOR[recipe]
    for name, g, e in zip(("dq", "dk", "dv"), got, expected):
        assert rel_l2(g, e) <= max_rel_l2, (name, rel_l2(g, e))
        assert cosine(g, e) >= min_cosine, (name, cosine(g, e))


@needs_device_backward
@pytest.mark.parametrize("recipe", TRAINABLE)
def test_device_backward_is_deterministic_and_does_not_synchronize(rng, recipe):
    q, k, v, d_o = problem(rng, (2, 200, 300, 4, 2, 128), "cuda", torch.bfloat16)
    fp4attn.flash_attn_func(q, k, v, causal=True, recipe=recipe).backward(d_o)  # first call: module loading
    first = grads(q, k, v)
    for x in (q, k, v):
        x.grad = None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fp4attn.flash_attn_func(q, k, v, causal=True, recipe=recipe).backward(d_o)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(first, grads(q, k, v)):
        np.testing.assert_array_equal(a, b)


@needs_device_backward
@pytest.mark.parametrize("recipe", TRAINABLE)
def test_one_pass_dq_where_faster_unless_determinism_is_asked_for(rng, monkeypatch, recipe):
    # At D = 64 with rows that see 256 keys or more on average the backward
    # sums dQ in one pass (order varies) unless torch's deterministic
    # algorithms are on or DETERMINISTIC_BACKWARD says otherwise; a short
    # causal problem takes the two passes. dK and dV are computed the same
    # way in both modes. dQ's dS codes are not: one scale per 128 x 128 pair
    # in the one pass, one per 64-query half in the two passes' dQ kernel, so
    # the two dQ differ by part of the FP8 error (besides the order of the
    # sums), and each is as close to the fp64 gradient as the recipe allows.
    q, k, v, d_o = problem(rng, (2, 300, 1400, 4, 2, 64), "cuda", torch.bfloat16)  # rows see 1101 .. 1400 keys

    def run(q, k, v, d_o):
        for x in (q, k, v):
            x.grad = None
        fp4attn.flash_attn_func(q, k, v, causal=True, recipe=recipe).backward(d_o)
        return grads(q, k, v)

    modes = []  # deterministic, as the device backward ran it
    real = fp4attn.torch_ops._backward_device
    monkeypatch.setattr(fp4attn.torch_ops, "_backward_device", lambda *args: modes.append(args[10]) or real(*args))
    one_pass = run(q, k, v, d_o)
    monkeypatch.setattr(fp4attn.torch_ops, "DETERMINISTIC_BACKWARD", True)
    two_pass = run(q, k, v, d_o)
    monkeypatch.setattr(fp4attn.torch_ops, "DETERMINISTIC_BACKWARD", None)
    torch.use_deterministic_algorithms(True)
    try:
        asked = run(q, k, v, d_o)
    finally:
        torch.use_deterministic_algorithms(False)
    run(*problem(rng, (1, 300, 300, 2, 1, 64), "cuda", torch.bfloat16))  # rows see 1 .. 300 keys
    assert modes == [False, True, True, True]
    np.testing.assert_array_equal(one_pass[1], two_pass[1])
    np.testing.assert_array_equal(one_pass[2], two_pass[2])
    assert rel_l2(one_pass[0], two_pass[0]) < BOUNDS_VS_EMULATOR[recipe][0]
    expected = reference(q, k, v, d_o, causal=True)
    assert_close_to_reference(one_pass, expected, GRAD_BOUNDS[recipe])
    assert_close_to_reference(two_pass, expected, GRAD_BOUNDS[recipe])
    for a, b in zip(asked, two_pass):
        np.testing.assert_array_equal(a, b)


@needs_device_backward
@pytest.mark.parametrize("recipe", TRAINABLE)
def test_cuda_graph_capture_of_forward_and_backward(rng, recipe):
    q, k, v, d_o = problem(rng, (1, 256, 256, 4, 2, 64), "cuda", torch.bfloat16)

    def step():
        for x in (q, k, v):
            x.grad = None
        fp4attn.flash_attn_func(q, k, v, causal=True, recipe=recipe).backward(d_o)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch's graph docs ask
        step()
    torch.cuda.current_stream().wait_stream(side)
    for x in (q, k, v):
        x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp4attn.flash_attn_func(q, k, v, causal=True, recipe=recipe).backward(d_o)
    captured = (q.grad, k.grad, v.grad)
    # New inputs in the captured buffers: the replay computes on them.
    new = problem(rng, (1, 256, 256, 4, 2, 64), "cuda", torch.bfloat16)
    with torch.no_grad():
        for dst, src in zip((q, k, v, d_o), new):
            dst.copy_(src)
    graph.replay()
    replayed = tuple(x.detach().clone() for x in captured)
    for x in (q, k, v):
        x.grad = None
    fp4attn.flash_attn_func(q, k, v, causal=True, recipe=recipe).backward(d_o)
    for got, x in zip(replayed, (q, k, v)):
        torch.testing.assert_close(got, x.grad, rtol=0, atol=0)


def _saved_by_autograd(fn):
    """Runs fn() and returns every tensor autograd saved for the backward meanwhile."""
    saved = []

    def pack(x):
        saved.append(x)
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = fn()
    return out, saved


@needs_device_backward
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("smooth_k", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("recipe", TRAINABLE)
def test_kept_operands_stand_for_q_and_k(rng, monkeypatch, causal, smooth_k, dtype, recipe):
    # On the device the forward keeps what it quantized q and k to (fp8: the
    # codes, scales and transposed copies; mxfp4_train: K's tile fold with its
    # copy, Q's MXFP4 codes) instead of q and k, and the backward on them gives
    # the gradients of the backward that quantizes q and k again, bit for bit.
    # Bit for bit needs dQ summed in a fixed order (three key tiles at D = 64).
    monkeypatch.setattr(fp4attn.torch_ops, "DETERMINISTIC_BACKWARD", True)
    q, k, v, d_o = problem(rng, (2, 200, 333, 4, 2, 64), "cuda", dtype)
    out, saved = _saved_by_autograd(
        lambda: fp4attn.attention(q, k, v, causal=causal, smooth_k=smooth_k, recipe=recipe))
    ptrs = {x.data_ptr() for x in saved}
    assert q.data_ptr() not in ptrs and k.data_ptr() not in ptrs and v.data_ptr() in ptrs
    kept = [x for x in saved if x.dtype == torch.uint8]
    q_bytes = 2 * q.numel() if recipe == "fp8" else q.numel() * 17 // 32
    assert len(kept) == 1 and kept[0].numel() >= q_bytes + 2 * k.numel()
    out.backward(d_o)
    with_kept = grads(q, k, v)
    for x in (q, k, v):
        x.grad = None
    monkeypatch.setattr(fp4attn.torch_ops, "_kept_bytes", lambda *args: 0)
    out, saved = _saved_by_autograd(
        lambda: fp4attn.attention(q, k, v, causal=causal, smooth_k=smooth_k, recipe=recipe))
    assert q.data_ptr() in {x.data_ptr() for x in saved}
    out.backward(d_o)
    for name, a, b in zip(("dq", "dk", "dv"), with_kept, grads(q, k, v)):
        np.testing.assert_array_equal(a, b, err_msg=name)


@needs_device_backward
@pytest.mark.parametrize("recipe", TRAINABLE)
def test_kept_operands_serve_the_lse_gradient(rng, monkeypatch, recipe):
    # The LSE's gradient runs a second backward on the same kept block and, with
    # smooth_k, adds dLSE·k̄ with the mean the forward smoothed K by (the
    # quantizer's, where the other path takes torch's mean of k).
    q, k, v, d_o = problem(rng, (1, 130, 260, 4, 2, 128), "cuda", torch.bfloat16)
    d_lse = torch.randn(1, 4, 130, device="cuda")

    def run():
        o, lse = fp4attn.attention(q, k, v, causal=True, smooth_k=True, return_lse=True, recipe=recipe)
        ((o.float() * d_o.float()).sum() + (lse * d_lse).sum()).backward()
        got = grads(q, k, v)
        for x in (q, k, v):
            x.grad = None
        return got

    with_kept = run()
    monkeypatch.setattr(fp4attn.torch_ops, "_kept_bytes", lambda *args: 0)
    without = run()
    np.testing.assert_array_equal(with_kept[2], without[2])  # dV has no LSE term
    # The smooth_k term's mean of K is the quantizer's with the kept block and
    # torch's without: the same to the last bits of fp32, so bf16 dQ and dK
    # may round the other way (measured rel L2 up to 1.5e-5).
    for a, b in zip(with_kept[:2], without[:2]):
        assert_within_bf16_rounding(a, b)
        assert rel_l2(a, b) < 1e-4
    expected = reference(q, k, v, d_o, causal=True, d_lse=d_lse)
    assert_close_to_reference(with_kept, expected, GRAD_BOUNDS[recipe])


@needs_device_backward
def test_no_operands_kept_without_autograd(rng):
    # Inference (no_grad, or inputs that need no gradient) keeps nothing: the
    # op's third output is empty and the forward writes no transposed copies.
    q, k, v, _ = problem(rng, (1, 128, 128, 2, 2, 64), "cuda", torch.bfloat16)
    args = ("bshd", "none", 0.0, "fp8", True, True, True, "q,k,v", "sm90", -1, -1, True)  # no window; lse_returned
    with torch.no_grad():
        _, _, kept = torch.ops.fp4attn.attention(q, k, v, *args, False)
    assert kept.numel() == 0
    _, _, kept = torch.ops.fp4attn.attention(q, k, v, *args, True)
    assert kept.numel() == fp4attn._ext.device_saved_bytes((1, 128, 128, 2, 2, 64), fp4attn._ext.Recipe.fp8)
    # The kept block is opaque: the bytes between its 256-byte aligned regions
    # are never written nor read, so opcheck's comparison of eager and traced
    # outputs (test_aot_dispatch_dynamic) does not apply to it; the compiled
    # test below covers symbolic sizes instead.
    torch.library.opcheck(torch.ops.fp4attn.attention.default, (q.detach(), k.detach(), v.detach()) + args + (True,),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@needs_device_backward
def test_kept_operands_under_torch_compile_with_symbolic_sizes(rng):
    # dynamic=True: the fake implementation sizes the kept block from symbolic
    # shapes; the compiled step must give eager's gradients bit for bit, for
    # two sequence lengths through one compiled graph.
    def step(q, k, v, d_o):
        out = fp4attn.attention(q, k, v, causal=True)
        out.backward(d_o)
        return out

    compiled = torch.compile(step, dynamic=True, fullgraph=False)
    for sq in (200, 333):
        q, k, v, d_o = problem(rng, (2, sq, sq + 70, 4, 2, 128), "cuda", torch.bfloat16)
        compiled(q, k, v, d_o)
        got = grads(q, k, v)
        for x in (q, k, v):
            x.grad = None
        step(q, k, v, d_o)
        for name, a, b in zip(("dq", "dk", "dv"), got, grads(q, k, v)):
            np.testing.assert_array_equal(a, b, err_msg=f"{name}, Sq = {sq}")
