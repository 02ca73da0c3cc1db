"""The torch layer: drop-in agreement with torch's SDPA, the custom op's
registration (fake kernel, torch.compile without graph breaks), and the
backward's errors (gradients are test_autograd.py's). Runs only where torch is installed; the CUDA cases only on a GPU."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import fp4attn  # noqa: E402  (after the skip: without torch this module is not collected)
from conftest import BOUNDS  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def make_bhsd(seed, B, Hq, Hkv, Sq, Sk, D, device, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, generator=g)
    k = torch.randn(B, Hkv, Sk, D, generator=g) + 0.5
    v = torch.randn(B, Hkv, Sk, D, generator=g)
    return tuple(x.to(device=device, dtype=dtype) for x in (q, k, v))


def one_minus_cos(a, b):
    a = a.double().flatten()
    b = b.double().flatten()
    return 1 - float(a @ b / (a.norm() * b.norm()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(64, 64), (40, 96)])
def test_sdpa_matches_torch(device, is_causal, sq, sk):
    q, k, v = make_bhsd(0, 2, 2, 2, sq, sk, 64, device)
    out = fp4attn.sdpa(q, k, v, is_causal=is_causal)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert one_minus_cos(out, F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)) < BOUNDS["fp8"].one_minus_cos


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_gqa_matches_torch(device):
    q, k, v = make_bhsd(1, 1, 4, 2, 48, 80, 64, device)
    out = fp4attn.sdpa(q, k, v, enable_gqa=True)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1))
    assert one_minus_cos(out, ref) < BOUNDS["fp8"].one_minus_cos
    with pytest.raises(ValueError, match="^key: "):
        fp4attn.sdpa(q, k, v)


@pytest.mark.parametrize("device", DEVICES)
def test_calls_without_tokens_give_what_sdpa_gives(device):
    # As torch's SDPA: no keys, O = 0; no queries or no batch entries, empty O; outputs that
    # autograd connects to the inputs, whose gradients are zeros.
    q, k, v = make_bhsd(4, 2, 4, 2, 5, 7, 64, device, torch.bfloat16)
    for qq, kk, vv in ((q, k[:, :, :0], v[:, :, :0]), (q[:, :, :0], k, v), (q[:0], k[:0], v[:0])):
        leaves = [x.detach().clone().requires_grad_() for x in (qq, kk, vv)]
        out = fp4attn.sdpa(*leaves, enable_gqa=True)
        assert out.shape == qq.shape and out.dtype == qq.dtype and not out.any()
        out.float().sum().backward()
        for x in leaves:
            assert x.grad is not None and x.grad.shape == x.shape and not x.grad.any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, d_o_scale", [(torch.bfloat16, 1.0), (torch.float16, 2e-7)])
def test_qkvpacked_gradients_reach_the_packed_tensor(device, dtype, d_o_scale):
    # flash_attn_qkvpacked_func reads q, k and v as views of qkv (in place on the device); the
    # gradient lands in qkv, stacked as the gradients of the same call on separate tensors, bit for
    # bit: with dO on f16's subnormals many gradients round to zeros, whose signs must stay.
    q, k, v = (x.transpose(1, 2) for x in make_bhsd(5, 2, 2, 2, 70, 70, 64, device, dtype))
    d_o = (torch.randn(q.shape, generator=torch.Generator().manual_seed(6)) * d_o_scale).to(device=device, dtype=dtype)
    qkv = torch.stack([q, k, v], dim=2).requires_grad_()
    out = fp4attn.flash_attn_qkvpacked_func(qkv, causal=True)
    out.backward(d_o)
    parts = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    want = fp4attn.flash_attn_func(*parts, causal=True)
    want.backward(d_o)
    assert torch.equal(out, want)
    stacked = torch.stack([x.grad for x in parts], dim=2)
    assert torch.equal(qkv.grad.view(torch.int16), stacked.view(torch.int16))
    if d_o_scale < 1.0:
        assert bool(((stacked == 0) & torch.signbit(stacked)).any())  # the bits above include -0


@pytest.mark.parametrize("device", DEVICES)
def test_flash_attn_func_is_bottom_right(device):
    q, k, v = make_bhsd(2, 1, 2, 2, 40, 96, 64, device)
    bottom_right = torch.ones(40, 96, dtype=torch.bool, device=device).tril(diagonal=96 - 40)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right)
    out, lse, probs = fp4attn.flash_attn_func(
        *(x.transpose(1, 2) for x in (q, k, v)), causal=True, return_attn_probs=True
    )
    assert probs is None and lse.shape == (1, 2, 40) and lse.dtype == torch.float32
    assert one_minus_cos(out.transpose(1, 2), ref) < BOUNDS["fp8"].one_minus_cos


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_in_bf16_out_and_same_as_numpy(device):
    q, k, v = make_bhsd(3, 1, 2, 2, 64, 64, 64, device, torch.bfloat16)
    out = fp4attn.sdpa(q, k, v, recipe="nvfp4")
    assert out.dtype == torch.bfloat16 and out.device == q.device
    # Same core, same numbers: O holds bf16 values, so nothing is lost.
    expected = fp4attn.sdpa(*(x.float().cpu().numpy() for x in (q, k, v)), recipe="nvfp4")
    np.testing.assert_array_equal(out.float().cpu().numpy(), expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["fp8", "mxfp4_train"])
def test_eager_path_is_the_op(device, recipe, monkeypatch):
    # Eager calls on plain tensors skip the custom ops' dispatch; they must
    # give the op's bits, forward and backward, and must not reach the ops.
    from fp4attn import torch_ops

    def run():
        q, k, v = (x.requires_grad_() for x in make_bhsd(5, 2, 4, 2, 100, 160, 64, device, torch.bfloat16))
        o, lse = fp4attn.attention(q, k, v, causal=True, recipe=recipe, layout="bhsd", return_lse=True)
        g = torch.Generator().manual_seed(6)
        (o.float() * torch.randn(o.shape, generator=g).to(device)).sum().add(lse.sum()).backward()
        return o, lse, q.grad, k.grad, v.grad

    def refuse(*args, **kwargs):
        raise AssertionError("the custom op ran on the eager path")

    with monkeypatch.context() as m:
        m.setattr(torch_ops, "_attention_op", refuse)
        m.setattr(torch_ops, "_attention_backward_op", refuse)
        eager = run()
    monkeypatch.setattr(torch_ops, "_eager_call", lambda args: False)
    through_op = run()
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), eager, through_op):
        assert torch.equal(a, b), name
    # Under a dispatch mode (as tracing has) the op runs, not the eager path.
    monkeypatch.undo()
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Seen.ops.add(str(func))
            return func(*args, **(kwargs or {}))

    q, k, v = make_bhsd(5, 1, 2, 2, 32, 32, 64, device)
    with Seen():
        fp4attn.sdpa(q, k, v)
    assert any("fp4attn.attention" in op for op in Seen.ops), Seen.ops


@pytest.mark.parametrize("device", DEVICES)
def test_custom_op_registration(device):
    q, k, v = make_bhsd(4, 1, 2, 2, 32, 48, 64, device)
    # With a sliding window (its left bound 20 keys, its right one the causal diagonal).
    args = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), "bshd", "causal", 0.0, "fp8", True, True, True,
            "q,k,v", "sm90", 20, 0)
    torch.library.opcheck(torch.ops.fp4attn.attention.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    q, k, v = make_bhsd(5, 1, 2, 2, 64, 64, 64, device)

    def block(q, k, v):
        return fp4attn.sdpa(q, k, v, is_causal=True) * 2.0

    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(q, k, v), block(q, k, v), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_with_a_scale_that_changes(device):
    # A scale that differs from call to call becomes a symbolic float to torch.compile; its
    # checks must still trace (they compare it, which a symbolic float allows) and a bad one
    # must still be refused by name.
    q, k, v = make_bhsd(5, 1, 2, 2, 64, 64, 64, device)

    def block(q, k, v, scale):
        return fp4attn.sdpa(q, k, v, scale=scale)

    backend = "inductor" if device == "cuda" else "aot_eager"
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    for scale in (0.1, 0.2, 0.3):
        torch.testing.assert_close(compiled(q, k, v, scale), block(q, k, v, scale), rtol=0, atol=0)
    with pytest.raises(Exception, match="scale: must be a positive finite number"):
        compiled(q, k, v, -0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("D", [32, 72, 80, 96])
def test_compile_fullgraph_at_head_dims_the_kernels_lack(device, D):
    # The padding decision of the device path (torch_ops._narrow_head_dim_plan) is a constant to torch.compile.
    q, k, v = make_bhsd(5, 1, 2, 2, 64, 64, D, device)

    def block(q, k, v):
        return fp4attn.sdpa(q, k, v, is_causal=True) * 2.0

    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(q, k, v), block(q, k, v), rtol=0, atol=0)


@pytest.mark.parametrize("recipe", ["mxfp4", "nvfp4"])
def test_backward_of_inference_recipe_raises_clearly(recipe):
    q, k, v = (x.requires_grad_() for x in make_bhsd(6, 1, 2, 2, 32, 32, 64, "cpu"))
    out = fp4attn.sdpa(q, k, v, recipe=recipe)
    with pytest.raises(NotImplementedError, match=f"recipe {recipe} is inference-only"):
        out.sum().backward()


@pytest.mark.skipif(hasattr(fp4attn._ext, "backward"), reason="this build has the backward")
def test_backward_missing_from_build_raises_clearly():
    q, k, v = (x.requires_grad_() for x in make_bhsd(6, 1, 2, 2, 32, 32, 64, "cpu"))
    with pytest.raises(NotImplementedError, match="backward of recipe fp8 is not available"):
        fp4attn.sdpa(q, k, v).sum().backward()


def test_bad_tensors_name_the_argument():
    q, k, v = make_bhsd(7, 1, 2, 2, 32, 32, 64, "cpu")
    with pytest.raises(TypeError, match="^query: "):
        fp4attn.sdpa(q.to(torch.int32), k, v)
    with pytest.raises(ValueError, match="^key: "):
        fp4attn.sdpa(q, k.transpose(2, 3).contiguous().transpose(2, 3), v)
    with pytest.raises(ValueError, match="^q: "):
        fp4attn.flash_attn_func(q[0], k, v)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tensors_on_different_devices():
    q, k, v = make_bhsd(9, 1, 2, 2, 32, 32, 64, "cpu")
    with pytest.raises(ValueError, match="^value: "):
        fp4attn.sdpa(q, k, v.cuda())


def test_quantize_accepts_tensors():
    x = make_bhsd(8, 1, 2, 2, 32, 32, 64, "cpu", torch.bfloat16)[0]
    t = fp4attn.quantize(x, "mxfp4")
    np.testing.assert_array_equal(t.codes, fp4attn.quantize(x.float().numpy(), "mxfp4").codes)


# ---- The device path: CUDA tensors on the sm90 executor, on the current stream.

needs_sm90 = pytest.mark.skipif(
    not (torch.cuda.is_available() and fp4attn.backend_info()["sm90_available"]),
    reason="needs the sm90 executor and a compute-capability 9.0 GPU",
)


def host_path(fn, *tensors, **kwargs):
    """fn on CPU copies: the host entry point, which runs the same sm90 kernels on this machine."""
    out = fn(*(x.cpu() for x in tensors), **kwargs)
    return out if isinstance(out, tuple) else (out,)


@needs_sm90
@pytest.mark.parametrize("recipe", ["fp8", "mxfp4_train", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_device_path_matches_host_path(recipe, dtype, causal, D):
    # Sq, Sk not multiples of the 128-token tile; GQA; bshd through attention, with the LSE.
    q, k, v = (x.transpose(1, 2) for x in make_bhsd(10, 2, 4, 2, 200, 300, D, "cuda", dtype))
    got = fp4attn.attention(q, k, v, causal=causal, recipe=recipe, return_lse=True)
    expected = host_path(fp4attn.attention, q, k, v, causal=causal, recipe=recipe, return_lse=True)
    assert got[0].dtype == dtype and got[0].device == q.device and got[1].dtype == torch.float32
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu(), e, rtol=0, atol=1e-6)


@needs_sm90
def test_device_path_splits_batches_past_the_grid(monkeypatch):
    # DEVICE_MAX_BATCH + 3 entries (window attention over many images): two device calls, each
    # entry's O, LSE and gradients those of a call on it alone (the C++ entry points refuse the
    # whole batch naming B: test_validate.cpp).
    monkeypatch.setattr(fp4attn.torch_ops, "DETERMINISTIC_BACKWARD", True)
    most = fp4attn._ext.DEVICE_MAX_BATCH
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(most + 3, s, h, 64, generator=gen, device="cuda", dtype=torch.bfloat16)
               for s, h in ((7, 2), (9, 1), (9, 1)))
    d_o = torch.randn(q.shape, generator=gen, device="cuda", dtype=torch.bfloat16)

    def run(q, k, v, d_o):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        o, lse = fp4attn.attention(q, k, v, causal=True, return_lse=True)
        o.backward(d_o)
        return o.detach(), lse.detach(), q.grad, k.grad, v.grad

    whole = run(q, k, v, d_o)
    assert whole[0].shape == q.shape and whole[1].shape == (most + 3, 2, 7)
    for b in (0, most - 1, most, most + 2):
        alone = run(q[b:b + 1], k[b:b + 1], v[b:b + 1], d_o[b:b + 1])
        for name, w, a in zip(("o", "lse", "dq", "dk", "dv"), whole, alone):
            assert torch.equal(w[b:b + 1], a), (name, b)


def narrow_scale(D):
    """1/sqrt(D) as the library rounds it (float32)."""
    return float(np.float32(1.0) / np.sqrt(np.float32(D)))


@needs_sm90
@pytest.mark.parametrize("recipe", ["fp8", "mxfp4_train", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("D", [32, 40, 72, 80, 96])
def test_device_path_pads_head_dims_the_kernels_lack(recipe, D, monkeypatch):
    # D = 32 … 96 (40 and 72 too) run on the D = 64 / 128 kernels with zero channels
    # (recipe fp8's forward by its tensor maps, from code rows at a 16-byte pitch
    # for 40 and 72; the other recipes from padded copies): the same bits as the
    # host path and as an explicitly padded call with the unpadded D's scale, and
    # never a host copy.
    q, k, v = (x.transpose(1, 2) for x in make_bhsd(15, 2, 4, 2, 200, 300, D, "cuda", torch.bfloat16))
    expected = host_path(fp4attn.attention, q, k, v, causal=True, recipe=recipe, return_lse=True)
    d_run = 64 if D <= 64 else 128
    padded = fp4attn.attention(*(F.pad(x, (0, d_run - D)) for x in (q, k, v)), causal=True, recipe=recipe,
                               scale=narrow_scale(D), return_lse=True)

    def no_host_copy(*args, **kwargs):
        raise AssertionError("the call left the device")

    monkeypatch.setattr(fp4attn.torch_ops._host, "attention", no_host_copy)
    got = fp4attn.attention(q, k, v, causal=True, recipe=recipe, return_lse=True)
    assert got[0].shape == q.shape and got[0].is_contiguous() and got[0].dtype == q.dtype
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu(), e, rtol=0, atol=0)
    torch.testing.assert_close(got[0], padded[0][..., :D], rtol=0, atol=0)
    torch.testing.assert_close(got[1], padded[1], rtol=0, atol=0)
    # sdpa's (B, H, S, D) views take the same path.
    o = fp4attn.sdpa(*(x.transpose(1, 2) for x in (q, k, v)), recipe=recipe, enable_gqa=True)
    o_padded = fp4attn.sdpa(*(F.pad(x.transpose(1, 2), (0, d_run - D)) for x in (q, k, v)), recipe=recipe,
                            enable_gqa=True, scale=narrow_scale(D))
    torch.testing.assert_close(o, o_padded[..., :D], rtol=0, atol=0)


@needs_sm90
@pytest.mark.parametrize("recipe", ["fp8", "mxfp4", "mxfp4_train"])
@pytest.mark.parametrize("D", [160, 256])
def test_device_path_runs_forward_above_128(recipe, D, monkeypatch):
    # The FP8 kernel has a 256-wide instance: recipe fp8 reads D = 160 on it
    # with zero channels by TMA, the MX recipes get a padded copy. The same
    # bits as the host path, never a host copy; recipe fp8's gradients come
    # from the host path (no backward kernel above 128).
    q, k, v = (x.transpose(1, 2) for x in make_bhsd(16, 2, 4, 2, 200, 300, D, "cuda", torch.bfloat16))
    expected = host_path(fp4attn.attention, q, k, v, causal=True, recipe=recipe, return_lse=True)
    host_attention = fp4attn.torch_ops._host.attention

    def no_host_copy(*args, **kwargs):
        raise AssertionError("the call left the device")

    monkeypatch.setattr(fp4attn.torch_ops._host, "attention", no_host_copy)
    got = fp4attn.attention(q, k, v, causal=True, recipe=recipe, return_lse=True)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu(), e, rtol=0, atol=0)
    monkeypatch.setattr(fp4attn.torch_ops._host, "attention", host_attention)
    if recipe != "fp8":
        return
    q_ref, k_ref, v_ref = (x.detach().cpu().requires_grad_() for x in (q, k, v))
    fp4attn.attention(q_ref, k_ref, v_ref, causal=True).float().square().sum().backward()
    q_dev, k_dev, v_dev = (x.detach().requires_grad_() for x in (q, k, v))
    fp4attn.attention(q_dev, k_dev, v_dev, causal=True).float().square().sum().backward()
    for g, e in zip((q_dev.grad, k_dev.grad, v_dev.grad), (q_ref.grad, k_ref.grad, v_ref.grad)):
        torch.testing.assert_close(g.cpu(), e, rtol=0, atol=0)


@needs_sm90
@pytest.mark.parametrize("recipe", ["fp8", "mxfp4_train", "mxfp4", "nvfp4"])
def test_device_path_matches_host_path_with_direct_p_off(recipe):
    # The exp2 baseline of every recipe runs on the device path too.
    q, k, v = (x.transpose(1, 2) for x in make_bhsd(14, 2, 4, 2, 200, 300, 128, "cuda", torch.bfloat16))
    got = fp4attn.attention(q, k, v, causal=True, recipe=recipe, direct_p=False, return_lse=True)
    expected = host_path(fp4attn.attention, q, k, v, causal=True, recipe=recipe, direct_p=False, return_lse=True)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu(), e, rtol=0, atol=1e-6)


@needs_sm90
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_device_path_reads_strided_inputs(layout):
    # Views with strides the kernels' own layout never has (a transposed, sliced
    # buffer) are read in place and give what their contiguous copies give.
    q, k, v = make_bhsd(11, 1, 2, 2, 160, 160, 64, "cuda", torch.bfloat16)
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # (B, S, H, D) views of (B, H, S, D) buffers
    wide = torch.zeros(*q.shape[:-1], 2 * q.shape[-1], dtype=q.dtype, device="cuda")
    wide[..., :64] = q
    q_view = wide[..., :64]
    out = fp4attn.attention(q_view, k, v, layout=layout)
    expected = fp4attn.attention(q.contiguous(), k.contiguous(), v.contiguous(), layout=layout)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(out.cpu(), host_path(fp4attn.attention, q, k, v, layout=layout)[0], rtol=0, atol=1e-6)


@needs_sm90
def test_device_path_runs_on_the_current_stream():
    q, k, v = make_bhsd(12, 1, 2, 2, 256, 256, 128, "cuda", torch.bfloat16)
    expected = fp4attn.sdpa(q, k, v, is_causal=True)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fp4attn.sdpa(q, k, v, is_causal=True)
    side.synchronize()  # only the side stream: the result must be there already
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@needs_sm90
@pytest.mark.parametrize("recipe", ["fp8", "mxfp4"])
def test_device_path_does_not_synchronize(recipe):
    q, k, v = make_bhsd(13, 1, 2, 2, 128, 128, 64, "cuda", torch.bfloat16)
    fp4attn.sdpa(q, k, v, recipe=recipe)  # first call: module loading, capability lookups
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _, lse, _ = fp4attn.flash_attn_func(
            *(x.transpose(1, 2) for x in (q, k, v)), causal=True, return_attn_probs=True, recipe=recipe
        )
        out = fp4attn.sdpa(q, k, v, is_causal=True, recipe=recipe)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.shape == q.shape and lse.shape == (1, 2, 128)


@needs_sm90
def test_cuda_graph_capture_and_replay():
    q, k, v = make_bhsd(14, 2, 4, 2, 200, 300, 64, "cuda", torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch's graph docs ask
        fp4attn.sdpa(q, k, v, is_causal=True, enable_gqa=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp4attn.sdpa(q, k, v, is_causal=True, enable_gqa=True)
    graph.replay()
    torch.testing.assert_close(out, fp4attn.sdpa(q, k, v, is_causal=True, enable_gqa=True), rtol=0, atol=0)
    # New inputs in the captured buffers: the replay computes on them.
    new_q, new_k, new_v = make_bhsd(15, 2, 4, 2, 200, 300, 64, "cuda", torch.bfloat16)
    q.copy_(new_q), k.copy_(new_k), v.copy_(new_v)
    graph.replay()
    torch.testing.assert_close(out, fp4attn.sdpa(new_q, new_k, new_v, is_causal=True, enable_gqa=True), rtol=0, atol=0)


@needs_sm90
def test_compile_fullgraph_reduce_overhead():
    # Inductor's CUDA graphs around the op: capture and replay through torch.compile.
    q, k, v = make_bhsd(16, 1, 2, 2, 128, 128, 64, "cuda", torch.bfloat16)

    def block(q, k, v):
        return fp4attn.sdpa(q, k, v, is_causal=True) * 2.0

    compiled = torch.compile(block, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # warm-up, record, replay
        out = compiled(q, k, v).clone()
    torch.testing.assert_close(out, block(q, k, v), rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fallback_to_host_path():
    # Recipe nvfp4 at D = 160 has no sm90 kernel: the op copies to the host, runs there and copies back,
    # and says so.
    q, k, v = make_bhsd(17, 1, 2, 2, 64, 64, 160, "cuda")
    with pytest.warns(RuntimeWarning, match="no GPU kernel for this forward .recipe nvfp4.*copied to the host"):
        out = fp4attn.sdpa(q, k, v, recipe="nvfp4")
    assert out.device == q.device and out.dtype == q.dtype
    torch.testing.assert_close(out.cpu(), fp4attn.sdpa(q.cpu(), k.cpu(), v.cpu(), recipe="nvfp4"), rtol=0, atol=0)
    # A head dim no target supports (not a multiple of 8) is an error, not a host copy.
    with pytest.raises(ValueError, match="^D: "):
        fp4attn.sdpa(*make_bhsd(17, 1, 2, 2, 64, 64, 36, "cuda"))


@pytest.mark.skipif(not fp4attn._ext.cuda_built(), reason="a CPU-only build keeps no operands")
@pytest.mark.parametrize("shape", [(1, 128, 128, 1, 1, 64), (2, 200, 333, 4, 2, 64), (3, 1000, 77, 8, 1, 128),
                                   (1, 1, 1, 1, 1, 128)])
@pytest.mark.parametrize("recipe", ["fp8", "mxfp4_train"])
def test_kept_operand_size_is_the_librarys(shape, recipe):
    # The torch layer sizes the forward's kept-operand block itself (fake
    # tensors may have symbolic sizes); it must be the C++ layout's size.
    from fp4attn import _validate, torch_ops

    dims = _validate.Dims(*shape)
    r = getattr(fp4attn._ext.Recipe, recipe)
    assert torch_ops._kept_size(dims, r) == fp4attn._ext.device_saved_bytes(shape, r)
