"""Sliding-window attention (FlashAttention's window_size): forward and
gradients against the fp64 reference written out in NumPy, the bounds
separating windowed from unwindowed answers, the device path against the host
path, and packed sequences against each sequence's own call.

Query i sees keys i + d - left .. i + d + right with d = Sk - Sq (0 for the
top-left mask), -1 for no bound on a side.
"""

import warnings

import numpy as np
import pytest

import fp4attn
from conftest import BOUNDS, GRAD_BOUNDS, make_qkv, needs_device_backward
from fp64_reference import attention_backward_bshd, attention_bshd, cosine, rel_l2, visible

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")
HAS_CUDA = torch is not None and torch.cuda.is_available()
needs_sm90 = pytest.mark.skipif(
    not (HAS_CUDA and fp4attn.backend_info()["sm90_available"]),
    reason="needs the sm90 executor and a compute-capability 9.0 GPU",
)
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])

# (causal, window_size, B, Sq, Sk, Hq, Hkv, D): windows narrower than the
# 128-key tile and wider, one-sided and two-sided, Sq != Sk both ways (the
# diagonal offset), GQA; the last case has rows that see no key.
CASES = [
    (True, (40, -1), 1, 300, 300, 2, 2, 64),
    (True, (150, 0), 1, 200, 333, 4, 2, 128),
    (False, (30, 20), 2, 160, 256, 2, 1, 64),
    (False, (0, 130), 1, 300, 200, 2, 2, 64),
    (False, (-1, 5), 1, 96, 250, 2, 2, 128),
    (True, (20, -1), 1, 260, 100, 2, 1, 64),
]


def ids(case):
    causal, (left, right), B, Sq, Sk, Hq, Hkv, D = case
    return f"{'causal' if causal else 'none'}-w{left}_{right}-Sq{Sq}-Sk{Sk}-D{D}"


def reference_forward(q, k, v, causal, window):
    return attention_bshd(q, k, v, mask="bottom_right" if causal else "none", window=window)


def seen_rows(causal, window, Sq, Sk):
    """Rows with at least one visible key (the others have O = 0 and LSE = -inf)."""
    return visible("bottom_right" if causal else "none", Sq, Sk, window).any(axis=1)


@pytest.mark.parametrize("recipe", ["fp8", "mxfp4", "mxfp4_train", "nvfp4"])
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_forward_matches_fp64_reference(rng, recipe, case):
    causal, window, B, Sq, Sk, Hq, Hkv, D = case
    q, k, v = make_qkv(rng, B, Sq, Sk, Hq, Hkv, D)
    o, lse = fp4attn.flash_attn_func(q, k, v, causal=causal, window_size=window, recipe=recipe,
                                     return_attn_probs=True)[:2]
    ref_o, ref_lse = reference_forward(q, k, v, causal, window)
    bounds = BOUNDS[recipe]
    assert 1 - cosine(o, ref_o) < bounds.one_minus_cos
    assert rel_l2(o, ref_o) < bounds.rel_l2
    seen = seen_rows(causal, window, Sq, Sk)
    assert np.all(np.isneginf(lse[:, :, ~seen])) and np.all(o[:, ~seen] == 0)
    assert np.abs(lse[:, :, seen] - ref_lse[:, :, seen]).max() < bounds.lse


def test_bounds_reject_the_unwindowed_answer(rng):
    # The forward bounds above tell a window from its absence (and from the other side's bound).
    causal, window, B, Sq, Sk, Hq, Hkv, D = CASES[2]
    q, k, v = make_qkv(rng, B, Sq, Sk, Hq, Hkv, D)
    o = fp4attn.flash_attn_func(q, k, v, causal=causal, window_size=window)
    bounds = BOUNDS["fp8"]
    for other in ((-1, -1), (window[0], -1), (-1, window[1])):
        ref_o, _ = reference_forward(q, k, v, causal, other)
        assert 1 - cosine(o, ref_o) > bounds.one_minus_cos, other


def test_flash_attn_causal_sets_the_right_bound_to_zero(rng):
    # FlashAttention: causal=True means window_size[1] = 0, whatever was passed.
    q, k, v = make_qkv(rng, 1, 100, 140, 2, 2, 64)
    a = fp4attn.flash_attn_func(q, k, v, causal=True, window_size=(30, 7))
    b = fp4attn.flash_attn_func(q, k, v, causal=True, window_size=(30, 0))
    c = fp4attn.attention(q, k, v, causal=True, window=(30, -1))
    assert np.array_equal(a, b) and np.array_equal(a, c)


def test_window_covering_every_key_is_no_window(rng):
    # Bounds past every key change nothing: the same bits as the call without a window.
    q, k, v = make_qkv(rng, 1, 130, 270, 2, 1, 64)
    for causal in (False, True):
        plain = fp4attn.attention(q, k, v, causal=causal, return_lse=True)
        wide = fp4attn.attention(q, k, v, causal=causal, window=(400, -1 if causal else 400), return_lse=True)
        for x, y in zip(plain, wide):
            assert np.array_equal(x, y)


@needs_torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", tuple(GRAD_BOUNDS))
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_gradients_match_fp64_reference(rng, device, recipe, case):
    causal, window, B, Sq, Sk, Hq, Hkv, D = case
    arrays = make_qkv(rng, B, Sq, Sk, Hq, Hkv, D)
    q, k, v = (torch.from_numpy(x).to(device).requires_grad_() for x in arrays)
    d_o = torch.from_numpy(rng.standard_normal(q.shape).astype(np.float32)).to(device)
    fp4attn.flash_attn_func(q, k, v, causal=causal, window_size=window, recipe=recipe).backward(d_o)
    want = attention_backward_bshd(*arrays, d_o.cpu().numpy(), mask="bottom_right" if causal else "none",
                                   window=window)
    bounds = GRAD_BOUNDS[recipe]
    for name, x, e in zip(("dq", "dk", "dv"), (q, k, v), want):
        g = x.grad.double().cpu().numpy()
        assert np.isfinite(g).all(), name
        assert 1 - cosine(g, e) < bounds.one_minus_cos, (name, 1 - cosine(g, e))
        assert rel_l2(g, e) < bounds.rel_l2, (name, rel_l2(g, e))
    if causal and Sq > Sk:  # rows that see no key get no gradient
        seen = seen_rows(causal, window, Sq, Sk)
        assert torch.all(q.grad[:, torch.from_numpy(~seen).to(device)] == 0)


@needs_sm90
@pytest.mark.parametrize("recipe", ["fp8", "mxfp4", "mxfp4_train", "nvfp4"])
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_device_path_matches_host_path(rng, recipe, case):
    # The kernels (CUDA tensors, zero-copy, no host copy) against the host entry point on the same inputs.
    causal, window, B, Sq, Sk, Hq, Hkv, D = case
    q, k, v = (torch.from_numpy(x).to("cuda", torch.bfloat16) for x in make_qkv(rng, B, Sq, Sk, Hq, Hkv, D))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a host copy warns: the call must stay on the device
        got = fp4attn.attention(q, k, v, causal=causal, window=window, recipe=recipe, return_lse=True)
    want = fp4attn.attention(*(x.cpu() for x in (q, k, v)), causal=causal, window=window, recipe=recipe,
                             return_lse=True)
    for g, e in zip(got, want):
        torch.testing.assert_close(g.cpu(), e, rtol=0, atol=1e-6)


@needs_device_backward
@pytest.mark.parametrize("recipe", tuple(GRAD_BOUNDS))
@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_device_backward_matches_the_emulator(rng, monkeypatch, recipe, deterministic, case):
    # Both backward modes against the emulator's model of each (dQ's dS scale blocks).
    causal, window, B, Sq, Sk, Hq, Hkv, D = case
    monkeypatch.setattr(fp4attn.torch_ops, "DETERMINISTIC_BACKWARD", deterministic)
    arrays = make_qkv(rng, B, Sq, Sk, Hq, Hkv, D)
    q, k, v = (torch.from_numpy(x).cuda().requires_grad_() for x in arrays)
    d_o = torch.from_numpy(rng.standard_normal(q.shape).astype(np.float32)).cuda()
    out, lse = fp4attn.attention(q, k, v, causal=causal, window=window, recipe=recipe, return_lse=True)
    out.backward(d_o)
    s = fp4attn._host.make_settings(layout="bshd", mask="causal" if causal else "none", scale=None,
                                    scale_name="scale", recipe=recipe, smooth_k=True, direct_p=True, gqa=True,
                                    names=("q", "k", "v"), window=window)
    opts = fp4attn._host.options(s)
    opts.dq_ds_rows = 64 if deterministic else 128
    host = [np.ascontiguousarray(x.detach().float().cpu().numpy()) for x in (q, k, v, out, lse, d_o)]
    expected = fp4attn._ext.backward(*host, opts, fp4attn._ext.Executor.emulator)[:3]
    max_rel_l2, min_cosine = {"fp8": (3e-2, 0.99985), "mxfp4_train": (3.5e-2, 0.99978)}[recipe]
    for name, x, e in zip(("dq", "dk", "dv"), (q, k, v), expected):
        g = x.grad.double().cpu().numpy()
        assert rel_l2(g, e) <= max_rel_l2, (name, rel_l2(g, e))
        assert cosine(g, e) >= min_cosine, (name, cosine(g, e))


@pytest.mark.parametrize("device", DEVICES if torch is not None else ["numpy"])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_sequences_are_their_own_calls(rng, device, causal):
    # Each sequence's window sits on its own diagonal: the packed call gives each sequence what a
    # call on it alone gives, bit for bit (on a Hopper GPU recipe fp8's one packed device call).
    lens_q, lens_k = [70, 300, 1, 129], [200, 300, 50, 129]
    window = (60, -1) if causal else (45, 90)
    hq, hkv, d = 4, 2, 64
    q = rng.standard_normal((sum(lens_q), hq, d)).astype(np.float32)
    k = (rng.standard_normal((sum(lens_k), hkv, d)) + 0.5).astype(np.float32)
    v = rng.standard_normal((sum(lens_k), hkv, d)).astype(np.float32)
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (lens_q, lens_k))
    if device != "numpy":
        q, k, v, cu_q, cu_k = (torch.from_numpy(x).to(device) for x in (q, k, v, cu_q, cu_k))
    o, lse = fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                            window_size=window, return_attn_probs=True)[:2]
    for i in range(len(lens_q)):
        qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        oi, lsei = fp4attn.flash_attn_func(q[qs][None], k[ks][None], v[ks][None], causal=causal,
                                           window_size=window, return_attn_probs=True)[:2]
        if device == "numpy":
            assert np.array_equal(o[qs], oi[0]) and np.array_equal(lse[:, qs], lsei[0])
        else:
            assert torch.equal(o[qs], oi[0]) and torch.equal(lse[:, qs], lsei[0])
