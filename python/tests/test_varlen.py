"""flash_attn_varlen_func: sequences of different lengths packed along the
tokens. Every sequence's output and LSE are bit for bit those of a call on
that sequence alone (on the CPU emulator with NumPy arrays, and through the
torch layer on the CPU and, where there is one, the GPU); its errors name the
argument."""

import itertools
import math

import numpy as np
import pytest

import fp4attn
from conftest import K_OFFSET


def packed(rng, lens_q, lens_k, hq, hkv, d, dtype=np.float32):
    """q (total_q, Hq, D), k and v (total_k, Hkv, D) and both cu_seqlens (int32)."""
    cu_q = np.cumsum([0] + list(lens_q)).astype(np.int32)
    cu_k = np.cumsum([0] + list(lens_k)).astype(np.int32)
    q = rng.standard_normal((cu_q[-1], hq, d)).astype(dtype)
    k = (rng.standard_normal((cu_k[-1], hkv, d)) + K_OFFSET).astype(dtype)
    v = rng.standard_normal((cu_k[-1], hkv, d)).astype(dtype)
    return q, k, v, cu_q, cu_k


# Repeated lengths (one batched call), a sequence without queries, one
# without keys, Sq != Sk, and lengths that are and are not multiples of 128.
LENS_Q = [5, 130, 130, 0, 7, 64, 64]
LENS_K = [9, 130, 130, 3, 0, 200, 200]


def per_sequence(q, k, v, cu_q, cu_k, causal, **kw):
    """(O rows, LSE (Hq, rows)) of each sequence with queries and keys, by one flash_attn_func call each."""
    for i in range(len(cu_q) - 1):
        a, b, c, d = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        if b > a and d > c:
            o, lse, _ = fp4attn.flash_attn_func(q[None, a:b], k[None, c:d], v[None, c:d], causal=causal,
                                                return_attn_probs=True, **kw)
            yield i, slice(a, b), o[0], lse[0]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("recipe", ["fp8", "mxfp4"])
def test_each_sequence_is_its_own_call(rng, causal, recipe):
    q, k, v, cu_q, cu_k = packed(rng, LENS_Q, LENS_K, 4, 2, 64)
    o, lse, probs = fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LENS_Q), max(LENS_K), causal=causal,
                                                   return_attn_probs=True, recipe=recipe)
    assert probs is None and o.shape == q.shape and lse.shape == (4, q.shape[0]) and lse.dtype == np.float32
    seen = 0
    for _, rows, o_one, lse_one in per_sequence(q, k, v, cu_q, cu_k, causal, recipe=recipe):
        np.testing.assert_array_equal(o[rows], o_one)
        np.testing.assert_array_equal(lse[:, rows], lse_one)
        seen += 1
    assert seen == 5
    # The sequence with queries and no keys: O = 0, LSE = -inf, as a fully masked row.
    rows = slice(cu_q[4], cu_q[5])
    assert (o[rows] == 0).all() and np.isneginf(lse[:, rows]).all()
    # Without the per-sequence masks the packed tokens would attend to each other.
    whole = fp4attn.flash_attn_func(q[None], k[None], v[None], causal=causal, recipe=recipe)[0]
    assert not np.array_equal(whole[cu_q[1]:cu_q[3]], o[cu_q[1]:cu_q[3]])


def test_equal_lengths_are_the_batched_call(rng):
    q, k, v, cu_q, cu_k = packed(rng, [96] * 3, [160] * 3, 4, 4, 64)
    o = fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 96, 160, softmax_scale=0.2, causal=True)
    batched = fp4attn.flash_attn_func(*(x.reshape(3, -1, *x.shape[1:]) for x in (q, k, v)), softmax_scale=0.2,
                                      causal=True)
    np.testing.assert_array_equal(o, batched.reshape(o.shape))


def test_no_query_tokens(rng):
    q, k, v, cu_q, cu_k = packed(rng, [0, 0], [4, 0], 2, 2, 64)
    o, lse, _ = fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 0, 4, return_attn_probs=True)
    assert o.shape == (0, 2, 64) and lse.shape == (2, 0)


def raises(error, name):
    return pytest.raises(error, match=rf"^{name}: ")


def test_packed_functions_are_the_varlen_call_on_their_parts(rng):
    # flash_attn_varlen_qkvpacked_func / _kvpacked_func: flash_attn_varlen_func on the stacked
    # tensors' parts, bit for bit; a stacked tensor of another shape is refused by name.
    q, k, v, cu, _ = packed(rng, [5, 130, 64], [5, 130, 64], 2, 2, 64)
    qkv = np.stack([q, k, v], axis=1)  # (total, 3, H, D)
    want = fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, 130, 130, causal=True, return_attn_probs=True)
    got = fp4attn.flash_attn_varlen_qkvpacked_func(qkv, cu, 130, causal=True, return_attn_probs=True)
    for g, w in zip(got[:2], want[:2]):
        np.testing.assert_array_equal(g, w)
    q, k, v, cu_q, cu_k = packed(rng, LENS_Q, LENS_K, 4, 2, 64)
    kv = np.stack([k, v], axis=1)  # (total_k, 2, Hkv, D)
    np.testing.assert_array_equal(fp4attn.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 130, 200, 0.0, 0.2),
                                  fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 130, 200, softmax_scale=0.2))
    with raises(ValueError, "qkv"):
        fp4attn.flash_attn_varlen_qkvpacked_func(qkv[:, :2], cu, 130)
    with raises(ValueError, "kv"):
        fp4attn.flash_attn_varlen_kvpacked_func(q, kv[None], cu_q, cu_k, 130, 200)


def test_errors_name_the_argument(rng):
    q, k, v, cu_q, cu_k = packed(rng, [5, 7], [9, 3], 2, 2, 64)
    call = fp4attn.flash_attn_varlen_func
    with raises(TypeError, "cu_seqlens_q"):
        call(q, k, v, cu_q.astype(np.float32), cu_k, 7, 9)
    with raises(ValueError, "cu_seqlens_q"):
        call(q, k, v, cu_q[None], cu_k, 7, 9)
    with raises(ValueError, "cu_seqlens_k"):
        call(q, k, v, cu_q, cu_k + 1, 7, 9)  # does not start at 0
    with raises(ValueError, "cu_seqlens_k"):
        call(q, k, v, cu_q, np.array([0, 9, 8, 12], np.int32), 7, 9)  # decreasing (and one entry too many)
    with raises(ValueError, "cu_seqlens_q"):
        call(q, k, v, np.array([0, 5, 11], np.int32), cu_k, 7, 9)  # ends short of q's 12 tokens
    with raises(ValueError, "cu_seqlens_k"):
        call(q, k, v, cu_q, cu_k[:2], 7, 9)  # entries differ from cu_seqlens_q's
    with raises(ValueError, "max_seqlen_q"):
        call(q, k, v, cu_q, cu_k, 6, 9)
    with raises(TypeError, "max_seqlen_k"):
        call(q, k, v, cu_q, cu_k, 7, 9.0)
    with raises(ValueError, "q"):
        call(q[None], k, v, cu_q, cu_k, 7, 9)
    with raises(ValueError, "v"):
        call(q, k, v[:-1], cu_q, cu_k, 7, 9)
    with raises(ValueError, "block_table"):
        call(q, k, v, cu_q, cu_k, 7, 9, block_table=np.zeros((2, 1), np.int32))
    with raises(ValueError, "window_size"):
        call(q, k, v, cu_q, cu_k, 7, 9, window_size=(8, -3))
    with raises(TypeError, "k"):
        call(q, k.astype(np.float64), v, cu_q, cu_k, 7, 9)


def test_empty_input_is_not_a_layout_error():
    # An empty array has no meaningful strides (NumPy reports 0): a call without queries
    # gives empty O and LSE (as torch's SDPA), with no complaint about its layout.
    o, lse = fp4attn.attention(np.zeros((1, 0, 2, 64), np.float32), *(np.ones((1, 4, 2, 64), np.float32),) * 2,
                               return_lse=True)
    assert o.shape == (1, 0, 2, 64) and lse.shape == (1, 2, 0)


try:
    import torch
except ImportError:
    torch = None
DEVICES = ["cpu"] + (["cuda"] if torch is not None and torch.cuda.is_available() else [])


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("device", DEVICES)
def test_torch_gradient_zeros_keep_their_sign(rng, device):
    # Gradients below f16's range round to signed zeros. Each sequence's must be
    # those of its own call bit for bit, signs of zero included: autograd would
    # sum the gradients of several views of q, k and v into the leaves', and
    # (+0) + (-0) = +0, so every path reads the packed tensors through one split.
    lens_q, lens_k = [5, 300, 300, 0, 7, 128], [9, 300, 300, 3, 0, 200]  # runs, and sequences without tokens
    arrays = packed(rng, lens_q, lens_k, 4, 2, 64)
    q, k, v = (torch.from_numpy(x).to(device=device, dtype=torch.float16).requires_grad_() for x in arrays[:3])
    cu_q, cu_k = (torch.from_numpy(x).to(device) for x in arrays[3:])
    o = fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 300, 300, causal=True)
    # dO on f16's subnormals: the gradients' smallest entries round to signed zeros.
    d_o = (torch.randn(o.shape, generator=torch.Generator().manual_seed(2)) * 2e-7).to(device, torch.float16)
    o.backward(d_o)
    signed = 0
    for i in range(len(lens_q)):
        a, b, c, e = (int(x) for x in (cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]))
        if b == a or e == c:
            continue
        one = [x.detach()[r].unsqueeze(0).clone().requires_grad_() for x, r in ((q, slice(a, b)), (k, slice(c, e)),
                                                                               (v, slice(c, e)))]
        fp4attn.flash_attn_func(*one, causal=True).backward(d_o[a:b].unsqueeze(0))
        for name, got, want in (("dq", q.grad[a:b], one[0].grad[0]), ("dk", k.grad[c:e], one[1].grad[0]),
                                ("dv", v.grad[c:e], one[2].grad[0])):
            assert torch.equal(torch.signbit(got), torch.signbit(want)), (i, name)
            signed += int(torch.signbit(want).sum())
    assert signed > 0  # the check above saw negative zeros


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("device", DEVICES)
def test_torch_batch_without_a_sequence_to_attend_has_zero_gradients(rng, device):
    # No sequence has both queries and keys: O = 0 and LSE = -inf, and the
    # output is still connected to q, k and v (zero gradients, as SDPA gives
    # where nothing is attended), so a training step's backward runs.
    arrays = packed(rng, [12, 3, 0], [0, 0, 5], 2, 1, 64)
    q, k, v = (torch.from_numpy(x).to(device).requires_grad_() for x in arrays[:3])
    cu_q, cu_k = (torch.from_numpy(x).to(device) for x in arrays[3:])
    o, lse, _ = fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 12, 5, return_attn_probs=True)
    assert torch.equal(o, torch.zeros_like(o)) and bool((lse == -math.inf).all())
    o.backward(torch.ones_like(o))
    for name, x in (("q", q), ("k", k), ("v", v)):
        assert x.grad is not None and torch.equal(x.grad, torch.zeros_like(x)), name
    with torch.no_grad():  # nothing to connect without gradients
        assert fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 12, 5).grad_fn is None


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_torch_each_sequence_is_its_own_call(rng, monkeypatch, device, causal):
    # Forward and gradients: each sequence's as from its own call (on the GPU
    # the device path, with cu_seqlens as CUDA int32 tensors, as FlashAttention takes them).
    # The gradients in the two deterministic passes: by default the packed call
    # picks its backward mode for the whole batch, and at D = 64 the one pass
    # (dQ summed in varying order, dS scaled per 128 x 128 pair) where a short
    # sequence alone takes the two.
    from fp4attn import torch_ops

    monkeypatch.setattr(torch_ops, "DETERMINISTIC_BACKWARD", True)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    lens_q, lens_k = [5, 300, 300, 0, 7, 128], [9, 300, 300, 3, 0, 200]
    arrays = packed(rng, lens_q, lens_k, 4, 2, 64)
    q, k, v = (torch.from_numpy(x).to(device=device, dtype=dtype).requires_grad_() for x in arrays[:3])
    cu_q, cu_k = (torch.from_numpy(x).to(device) for x in arrays[3:])
    o, lse, _ = fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 300, 300, causal=causal, return_attn_probs=True)
    assert o.dtype == dtype and o.device == q.device and lse.shape == (4, q.shape[0])
    d_o = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)
    o.backward(d_o)
    got = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    expected = [torch.zeros_like(x) for x in (q, k, v)]
    cq, ck = arrays[3], arrays[4]
    for i, rows, o_one, lse_one in per_sequence(q, k, v, cq, ck, causal):
        assert torch.equal(o[rows], o_one) and torch.equal(lse[:, rows], lse_one)
        keys = slice(ck[i], ck[i + 1])
        o_one.backward(d_o[rows])
        for e, x, span in zip(expected, (q, k, v), (rows, keys, keys)):
            e[span] = x.grad[span]
            x.grad = None
    for name, g, e in zip(("dq", "dk", "dv"), got, expected):
        assert torch.equal(g, e), name


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_call_is_the_eager_call(rng, monkeypatch, device):
    # torch.compile(fullgraph=True) traces flash_attn_varlen_func as one op that
    # reads cu_seqlens when it runs: O, LSE and the gradients (a loss on O and
    # the LSE) are the eager call's bit for bit, and other lengths in the same
    # tensors run the same graph with their own results.
    from fp4attn import torch_ops

    monkeypatch.setattr(torch_ops, "DETERMINISTIC_BACKWARD", True)
    torch._dynamo.reset()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    lens = [5, 130, 0, 64]
    arrays = packed(rng, lens, lens, 4, 2, 64)
    fp4attn.flash_attn_varlen_func(*arrays, 130, 130)  # NumPy calls first, as in a process that mixes both
    q, k, v = (torch.from_numpy(x).to(device=device, dtype=dtype) for x in arrays[:3])
    cu = torch.from_numpy(arrays[3]).to(device)

    def step(q, k, v, cu, d_o, d_lse):
        o, lse, _ = fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, 130, 130, causal=True, return_attn_probs=True)
        return (o.float() * d_o).sum() + (torch.where(lse.isinf(), 0.0, lse) * d_lse).sum(), o, lse

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    g = torch.Generator().manual_seed(0)
    d_o = torch.randn(q.shape, generator=g).to(device)
    d_lse = torch.randn((4, q.shape[0]), generator=g).to(device)
    for lengths in (lens, [70, 0, 64, 65]):  # the second: new lengths, same token count
        cu.copy_(torch.tensor(np.cumsum([0] + lengths), dtype=torch.int32))
        results = []
        for fn in (step, compiled):
            leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
            # The second lengths run the first lengths' graph: nothing is recompiled for them.
            stance = "fail_on_recompile" if lengths is not lens else "default"
            with torch.compiler.set_stance(stance):
                loss, o, lse = fn(*leaves, cu, d_o, d_lse)
            loss.backward()
            results.append((o, lse, *(x.grad for x in leaves)))
        for name, want, got in zip(("o", "lse", "dq", "dk", "dv"), *results):
            assert torch.equal(want, got), (name, lengths)
    # cu_seqlens that are no tensor: the eager call's error, naming the argument.
    with pytest.raises(TypeError, match="cu_seqlens_q: expected a 1-D integer"):
        torch.compile(lambda q: fp4attn.flash_attn_varlen_func(q, k, v, [0, 264], [0, 264], 264, 264))(q)


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_call_in_cuda_graphs(rng, monkeypatch):
    # torch.compile(mode="reduce-overhead") records the op in a CUDA graph: its forward and
    # backward then take the captured path (nothing read on the host), and replays with other
    # lengths in the same cu_seqlens give the eager call's O and gradients (two passes both).
    from fp4attn import torch_ops

    monkeypatch.setattr(torch_ops, "DETERMINISTIC_BACKWARD", True)
    torch._dynamo.reset()
    lens = [5, 300, 129, 1000]
    arrays = packed(rng, lens, lens, 4, 2, 128)
    q, k, v = (torch.from_numpy(x).to("cuda", torch.bfloat16) for x in arrays[:3])
    cu = torch.from_numpy(arrays[3]).cuda()
    d_o = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to("cuda", torch.bfloat16)

    def call(q, k, v, cu):
        return fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, 1000, 1000, causal=True)

    def step(fn):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        o = fn(*leaves, cu)
        o.backward(d_o)
        return [o.detach().clone()] + [x.grad.clone() for x in leaves]  # a replay reuses its outputs' memory

    compiled = torch.compile(call, fullgraph=True, mode="reduce-overhead")
    for lengths in (lens, lens, lens, [700, 1, 333, 400], [0, 1000, 434, 0]):  # warm-up, record, replays
        cu.copy_(torch.tensor(np.cumsum([0] + lengths), dtype=torch.int32))
        for name, a, b in zip(("o", "dq", "dk", "dv"), step(compiled), step(call)):
            assert torch.equal(a, b), (name, lengths)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_varlen_op_registration(rng):
    from fp4attn import _host

    arrays = packed(rng, [5, 30, 0], [9, 30, 3], 4, 2, 64)
    q, k, v, cu_q, cu_k = (torch.from_numpy(x) for x in arrays)
    s = _host.make_settings(layout="bshd", mask=_host.MASK_BOTTOM_RIGHT, scale=None, scale_name="softmax_scale",
                            recipe="fp8", smooth_k=True, direct_p=True, gqa=True, names=("q", "k", "v"))
    for x in (q, k, v):
        x.requires_grad_()
    torch.library.opcheck(torch.ops.fp4attn.varlen_attention.default, (q, k, v, cu_q, cu_k, 30, 30, *s, True))


def test_packed_groups_bound_the_layout():
    # A packed call's grids span (sequences x longest) tiles: consecutive
    # groups keep that within PACKED_LAYOUT_WASTE times the group's tokens
    # (plus a tile per sequence), each as long as the bound allows.
    from fp4attn import _host

    def waste_ok(lens):
        return len(lens) * max(lens) <= _host.PACKED_LAYOUT_WASTE * sum(lens) + 128 * len(lens)

    gen = np.random.default_rng(7)
    batches = [([2048] * 8, [2048] * 8), ([131072] + [1000] * 100, [131072] + [1000] * 100),
               ([5, 300, 129, 128, 700], [9, 300, 3, 200, 700])]
    for _ in range(50):
        n = int(gen.integers(1, 40))
        lens_q = [int(x) for x in gen.integers(1, 20000, size=n)]
        batches.append((lens_q, lens_q if gen.random() < 0.5 else [int(x) for x in gen.integers(1, 20000, size=n)]))
    for lens_q, lens_k in batches:
        groups = _host.packed_groups(lens_q, lens_k)
        assert [f for f, _ in groups] == list(itertools.accumulate((n for _, n in groups[:-1]), initial=0))
        assert sum(n for _, n in groups) == len(lens_q)
        for first, n in groups:
            group = slice(first, first + n)
            assert waste_ok(lens_q[group]) and waste_ok(lens_k[group]), (lens_q, lens_k, groups)
            if first + n < len(lens_q):  # the next sequence would break the bound
                grown = slice(first, first + n + 1)
                assert not (waste_ok(lens_q[grown]) and waste_ok(lens_k[grown])), (lens_q, lens_k, groups)
    assert _host.packed_groups([2048] * 8, [2048] * 8) == [(0, 8)]
    assert _host.packed_groups([3000, 5, 7, 9, 130], [3000, 5, 7, 9, 130]) == [(0, 4), (4, 1)]
    assert len(_host.packed_groups([131072] + [1000] * 100, [131072] + [1000] * 100)) == 2
    # One device call's grids hold at most DEVICE_MAX_BATCH sequences.
    most = fp4attn._ext.DEVICE_MAX_BATCH
    assert _host.packed_groups([1] * (most + 5), [2] * (most + 5)) == [(0, most), (most, 5)]


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,hq,hkv,dtype,qkv_packed", [(128, 4, 2, "bfloat16", False), (64, 4, 4, "float16", True),
                                                       (72, 2, 1, "bfloat16", False)])
def test_device_call_is_each_sequence(rng, causal, d, hq, hkv, dtype, qkv_packed):
    # Without autograd, recipe fp8 on a Hopper GPU runs all sequences in one
    # call whose quantizer and kernel read the packed tensors: still each
    # sequence's own bits. Lengths on and off the 128-token tiles, Sq > Sk
    # (causal rows that see no key), and q, k, v as views of one packed QKV
    # projection (row stride 3·H·D).
    from fp4attn import _host, torch_ops

    lens_q = [5, 300, 300, 129, 7, 128, 1000]
    lens_k = lens_q if qkv_packed else [9, 300, 300, 3, 2, 200, 1000]
    arrays = packed(rng, lens_q, lens_k, hq, hkv, d)
    q, k, v = (torch.from_numpy(x).to("cuda", getattr(torch, dtype)) for x in arrays[:3])
    cu_q, cu_k = (torch.from_numpy(x).cuda() for x in arrays[3:])
    if qkv_packed:  # self-attention from one (total, 3, H, D) projection
        qkv = torch.stack((q, k, v), dim=1)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    settings = _host.make_settings(layout="bshd", mask=_host.MASK_BOTTOM_RIGHT if causal else _host.MASK_NONE,
                                   scale=None, scale_name="softmax_scale", recipe="fp8", smooth_k=True, direct_p=True,
                                   gqa=True, names=("q", "k", "v"))
    with torch.no_grad():
        o, lse, _ = fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1000, 1000, causal=causal,
                                                   return_attn_probs=True)
        one_call = torch_ops.varlen_forward_device(q, k, v, cu_q, cu_k, lens_q, lens_k, settings)
        if fp4attn.backend_info()["sm90_available"]:
            assert one_call is not None
        seen = 0
        for _, rows, o_one, lse_one in per_sequence(q, k, v, arrays[3], arrays[4], causal):
            assert torch.equal(o[rows], o_one), rows
            assert torch.equal(lse[:, rows], lse_one), rows
            seen += 1
    assert seen == len(lens_q)


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("seed", range(6))
def test_device_call_on_random_batches(seed):
    # Random batches for the one-call path: 1 to 24 sequences of 1 to 700
    # tokens (queries and keys drawn apart, repeats likely), head dims the
    # kernels read in place, GQA, causal or not, bf16 or fp16, the softmax
    # scale given or not. Every sequence's O and LSE against its own call.
    gen = np.random.default_rng(1000 + seed)
    batch = int(gen.integers(1, 25))
    lens_q = [int(x) for x in gen.choice([1, 7, 128, 129, 300, int(gen.integers(1, 701))], size=batch)]
    lens_k = lens_q if gen.random() < 0.5 else [int(x) for x in gen.integers(1, 701, size=batch)]
    d = int(gen.choice([64, 128, 72, 96]))
    hkv = int(gen.choice([1, 2, 4]))
    hq = hkv * int(gen.choice([1, 2, 4]))
    causal = bool(gen.random() < 0.5)
    dtype = getattr(torch, str(gen.choice(["bfloat16", "float16"])))
    scale = None if gen.random() < 0.5 else float(gen.uniform(0.05, 0.2))
    arrays = packed(gen, lens_q, lens_k, hq, hkv, d)
    q, k, v = (torch.from_numpy(x).to("cuda", dtype) for x in arrays[:3])
    cu_q, cu_k = (torch.from_numpy(x).cuda() for x in arrays[3:])
    with torch.no_grad():
        o, lse, _ = fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                                   softmax_scale=scale, return_attn_probs=True)
        seen = 0
        for _, rows, o_one, lse_one in per_sequence(q, k, v, arrays[3], arrays[4], causal, softmax_scale=scale):
            assert torch.equal(o[rows], o_one), (rows, lens_q, lens_k, d, hq, hkv, causal, dtype, scale)
            assert torch.equal(lse[:, rows], lse_one), (rows, lens_q, lens_k, d, hq, hkv, causal, dtype, scale)
            seen += 1
    assert seen == batch


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("seed", range(6))
def test_device_gradients_on_random_batches(seed, monkeypatch):
    # Random batches for the packed backward: 2 to 24 sequences of 1 to 700
    # tokens (queries and keys drawn apart), the backward kernels' head dims,
    # GQA, causal or not, bf16 or fp16, the softmax scale given or not, a
    # loss on O alone or on O and the LSE. dQ, dK, dV of every sequence
    # against its own call, bit for bit (the two passes).
    from fp4attn import torch_ops

    monkeypatch.setattr(torch_ops, "DETERMINISTIC_BACKWARD", True)
    gen = np.random.default_rng(2000 + seed)
    batch = int(gen.integers(2, 25))
    lens_q = [int(x) for x in gen.choice([1, 7, 128, 129, 300, int(gen.integers(1, 701))], size=batch)]
    lens_k = lens_q if gen.random() < 0.5 else [int(x) for x in gen.integers(1, 701, size=batch)]
    d = int(gen.choice([64, 128]))
    hkv = int(gen.choice([1, 2, 4]))
    hq = hkv * int(gen.choice([1, 2, 4]))
    causal = bool(gen.random() < 0.5)
    dtype = getattr(torch, str(gen.choice(["bfloat16", "float16"])))
    kw = dict(causal=causal, softmax_scale=None if gen.random() < 0.5 else float(gen.uniform(0.05, 0.2)))
    lse_loss = bool(gen.random() < 0.5)
    draw = (lens_q, lens_k, d, hq, hkv, dtype, kw, lse_loss)
    arrays = packed(gen, lens_q, lens_k, hq, hkv, d)
    q, k, v = (torch.from_numpy(x).to("cuda", dtype).requires_grad_() for x in arrays[:3])
    cu_q, cu_k = (torch.from_numpy(x).cuda() for x in arrays[3:])
    o, lse, _ = fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                               return_attn_probs=True, **kw)
    one_group = len(fp4attn._host.packed_groups(lens_q, lens_k)) == 1
    assert type(o.grad_fn).__name__ == ("_PackedAttentionBackward" if one_group else "CatBackward0"), draw
    g = torch.Generator().manual_seed(seed)
    d_o = torch.randn(o.shape, generator=g).to("cuda", o.dtype)
    d_lse = torch.randn(lse.shape, generator=g).to("cuda")
    torch.autograd.backward((o, lse) if lse_loss else o, (d_o, d_lse) if lse_loss else d_o)
    got = [x.grad for x in (q, k, v)]
    cq, ck = arrays[3], arrays[4]
    for i in range(batch):
        rows, keys = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        one = [x[span].detach()[None].requires_grad_() for x, span in ((q, rows), (k, keys), (v, keys))]
        o1, lse1, _ = fp4attn.flash_attn_func(*one, return_attn_probs=True, **kw)
        assert torch.equal(o[rows], o1[0]) and torch.equal(lse[:, rows], lse1[0]), (i, draw)
        if lse_loss:
            torch.autograd.backward((o1, lse1), (d_o[None, rows], d_lse[None, :, rows]))
        else:
            o1.backward(d_o[None, rows])
        for name, grad, x, span in zip(("dq", "dk", "dv"), got, one, (rows, keys, keys)):
            assert torch.equal(grad[span], x.grad[0]), (name, i, draw)


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("causal", [False, True])
def test_device_groups_are_each_sequences(causal):
    # One long sequence among short ones runs as two packed groups: O, LSE
    # and the gradients (a loss on O and the LSE) are still every
    # sequence's own call's, bit for bit.
    from fp4attn import _host

    lens = [3000, 5, 7, 9, 130]
    assert len(_host.packed_groups(lens, lens)) == 2
    arrays = packed(np.random.default_rng(5), lens, lens, 4, 2, 128)
    q, k, v = (torch.from_numpy(x).to("cuda", torch.bfloat16).requires_grad_() for x in arrays[:3])
    cu = torch.from_numpy(arrays[3]).cuda()
    o, lse, _ = fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, 3000, 3000, causal=causal, return_attn_probs=True)
    g = torch.Generator().manual_seed(9)
    d_o, d_lse = torch.randn(o.shape, generator=g).to("cuda", o.dtype), torch.randn(lse.shape, generator=g).cuda()
    torch.autograd.backward((o, lse), (d_o, d_lse))
    bounds = arrays[3]
    for i in range(len(lens)):
        rows = slice(bounds[i], bounds[i + 1])
        one = [x[rows].detach()[None].requires_grad_() for x in (q, k, v)]
        o1, lse1, _ = fp4attn.flash_attn_func(*one, causal=causal, return_attn_probs=True)
        assert torch.equal(o[rows], o1[0]) and torch.equal(lse[:, rows], lse1[0]), i
        torch.autograd.backward((o1, lse1), (d_o[None, rows], d_lse[None, :, rows]))
        for name, x, x1 in zip(("dq", "dk", "dv"), (q, k, v), one):
            assert torch.equal(x.grad[rows], x1.grad[0]), (name, i)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("scale", [None, 0.3])
def test_packed_lse_terms_are_each_sequences(rng, scale):
    # The packed backward's LSE gradient: O and dO of the second device call
    # (_lse_term_inputs, one-hot in channel 0) and, with smooth_k, the dQ part
    # from each sequence's own K mean, against the batched call's pieces on
    # every sequence alone (host torch; the device call itself is
    # test_device_call_gradients_are_each_sequences).
    from fp4attn import _host, _validate, torch_ops

    lens_q, lens_k = [5, 30, 30, 12, 7], [9, 30, 30, 3, 2]
    hq, hkv, d = 4, 2, 64
    q, k, _, cu_q, cu_k = (torch.from_numpy(x) for x in packed(rng, lens_q, lens_k, hq, hkv, d))
    k = k.to(torch.bfloat16)
    g = torch.Generator().manual_seed(4)
    d_lse = torch.randn((hq, q.shape[0]), generator=g)
    lse = torch.randn((hq, q.shape[0]), generator=g)
    lse[lse < -1.0] = -math.inf  # rows that see no key: no term
    s = _host.make_settings(layout="bshd", mask=_host.MASK_NONE, scale=scale, scale_name="softmax_scale",
                            recipe="fp8", smooth_k=True, direct_p=True, gqa=True, names=("q", "k", "v"))
    dims = _validate.Dims(B=len(lens_q), Sq=max(lens_q), Sk=max(lens_k), Hq=hq, Hkv=hkv, D=d)
    packing = torch_ops._Packing(cu_q, cu_k, q.shape[0], k.shape[0])
    dq_term = torch_ops._smooth_k_lse_dq(d_lse, lse, torch_ops._k_mean(k, None, dims, s, packing), dims, s,
                                         packing)
    o_term, d_o_term = torch_ops._lse_term_inputs(d_lse, q, s.layout)
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        rows, keys = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        one = _validate.Dims(B=1, Sq=lq, Sk=lk, Hq=hq, Hkv=hkv, D=d)
        d_lse_one, lse_one = d_lse[None, :, rows], lse[None, :, rows]
        k_one = k[None, keys]
        expected = torch_ops._smooth_k_lse_dq(d_lse_one, lse_one, torch_ops._k_mean(k_one, None, one, s), one, s)[0]
        assert torch.equal(dq_term[rows], expected), i
        assert not dq_term[rows].transpose(0, 1)[torch.isneginf(lse_one[0])].any(), i
        o_one, d_o_one = torch_ops._lse_term_inputs(d_lse_one, q[None, rows], s.layout)
        assert torch.equal(o_term[rows], o_one[0]) and torch.equal(d_o_term[rows], d_o_one[0]), i


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,lse_loss", [("bfloat16", True), ("float16", True), ("bfloat16", False)])
def test_device_call_gradients_are_each_sequences(rng, causal, dtype, lse_loss):
    # With autograd, recipe fp8's forward and backward each run in one device
    # call, the forward keeping Q's and K's operands (the smooth_k mean among
    # them) for the backward. O, LSE and dQ, dK, dV (the loss using O, or O
    # and the LSE) are bit for bit those of batched calls on each run of
    # equal lengths.
    from fp4attn import _host

    lens_q = [5, 300, 300, 129, 7, 128]
    lens_k = [9, 300, 300, 3, 2, 200]
    arrays = packed(rng, lens_q, lens_k, 4, 2, 128)
    q, k, v = (torch.from_numpy(x).to("cuda", getattr(torch, dtype)).requires_grad_() for x in arrays[:3])
    cu_q, cu_k = (torch.from_numpy(x).cuda() for x in arrays[3:])
    o, lse, _ = fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 300, 300, causal=causal, return_attn_probs=True)
    if fp4attn.backend_info()["sm90_available"]:
        assert type(o.grad_fn).__name__ == "_PackedAttentionBackward"
    gen = torch.Generator().manual_seed(2)
    d_o = torch.randn(o.shape, generator=gen).to("cuda", o.dtype)
    d_lse = torch.randn(lse.shape, generator=gen).to("cuda") if lse_loss else torch.zeros(lse.shape, device="cuda")
    torch.autograd.backward((o, lse) if lse_loss else o, (d_o, d_lse) if lse_loss else d_o)
    got = [x.grad.clone() for x in (q, k, v)]
    expected = [torch.zeros_like(x) for x in (q, k, v)]
    cq, ck = arrays[3], arrays[4]
    # Consecutive equal lengths batched, as the per-run path (no packed call) would run them.
    for first, n in _host.equal_length_runs(lens_q, lens_k):
        rows, keys = slice(cq[first], cq[first + n]), slice(ck[first], ck[first + n])
        for x in (q, k, v):
            x.grad = None
        qs, ks, vs = (x[span].unflatten(0, (n, -1)) for x, span in ((q, rows), (k, keys), (v, keys)))
        o_run, lse_run, _ = fp4attn.flash_attn_func(qs, ks, vs, causal=causal, return_attn_probs=True)
        assert torch.equal(o[rows], o_run.flatten(0, 1)), rows
        assert torch.equal(lse[:, rows], lse_run.transpose(0, 1).flatten(1)), rows
        d_o_run = d_o[rows].unflatten(0, (n, -1))
        if lse_loss:
            torch.autograd.backward((o_run, lse_run), (d_o_run, d_lse[:, rows].unflatten(1, (n, -1)).transpose(0, 1)))
        else:
            o_run.backward(d_o_run)
        for e, x, span in zip(expected, (q, k, v), (rows, keys, keys)):
            e[span] = x.grad[span]
    differing = [name for name, g, e in zip(("dq", "dk", "dv"), got, expected) if not torch.equal(g, e)]
    assert not differing, differing
    rows_12, keys_12 = slice(5, 605), slice(9, 609)
    # One length only (sequences 1 and 2): the packed call too, with the batched call's gradients.
    two = torch.tensor([0, 300, 600], dtype=torch.int32, device="cuda")
    leaves = [x[span].detach().requires_grad_() for x, span in ((q, rows_12), (k, keys_12), (v, keys_12))]
    one_run = fp4attn.flash_attn_varlen_func(*leaves, two, two, 300, 300, causal=causal)
    assert type(one_run.grad_fn).__name__ == "_PackedAttentionBackward"
    one_run.backward(d_o[rows_12])
    batched = [x.detach().unflatten(0, (2, 300)).requires_grad_() for x in leaves]
    fp4attn.flash_attn_func(*batched, causal=causal).backward(d_o[rows_12].unflatten(0, (2, 300)))
    for name, a, b in zip(("dq", "dk", "dv"), leaves, batched):
        assert torch.equal(a.grad, b.grad.flatten(0, 1)), name


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,lens_q,lens_k,groups", [
    (64, [5, 0, 300, 129, 7, 0, 64], [9, 40, 300, 0, 2, 0, 200], 1),
    (128, [5, 0, 300, 129, 7, 0, 64], [9, 40, 300, 0, 2, 0, 200], 1),
    (128, [3000, 5, 7, 9, 0, 0], [3000, 5, 7, 9, 3, 384], 2),  # a packed group without queries
    (128, [3000, 5, 7, 9, 40, 6], [3000, 5, 7, 9, 0, 0], 2),  # a packed group without keys
])
def test_device_call_takes_sequences_without_tokens(rng, monkeypatch, causal, d, lens_q, lens_k, groups):
    # Sequences without queries or without keys take no tile of the kernels, so
    # an eager batch holding them runs as the one packed call too (or as packed
    # groups, one of which may hold nothing to attend). A sequence without keys
    # gives O = 0, LSE = -inf and dQ = 0 (a finite dLSE there included); one
    # without queries gives dK = dV = 0; every other sequence's O, LSE and
    # gradients are those of its own call, bit for bit (the two passes: the one
    # pass's dQ order varies).
    from fp4attn import _host, torch_ops

    monkeypatch.setattr(torch_ops, "DETERMINISTIC_BACKWARD", True)
    assert len(_host.packed_groups(lens_q, lens_k)) == groups
    arrays = packed(rng, lens_q, lens_k, 4, 2, d)
    q, k, v = (torch.from_numpy(x).to("cuda", torch.bfloat16).requires_grad_() for x in arrays[:3])
    cu_q, cu_k = (torch.from_numpy(x).cuda() for x in arrays[3:])
    o, lse, _ = fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                               return_attn_probs=True)
    if fp4attn.backend_info()["sm90_available"]:
        assert type(o.grad_fn).__name__ == ("_PackedAttentionBackward" if groups == 1 else "CatBackward0")
    gen = torch.Generator().manual_seed(3)
    d_o = torch.randn(o.shape, generator=gen).to("cuda", o.dtype)
    d_lse = torch.randn(lse.shape, generator=gen).cuda()
    torch.autograd.backward((o, lse), (d_o, d_lse))
    cq, ck = arrays[3], arrays[4]
    for i in range(len(lens_q)):
        rows, keys = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        if lens_q[i] == 0:
            assert not k.grad[keys].any() and not v.grad[keys].any(), i
        elif lens_k[i] == 0:
            assert not o[rows].any() and bool(torch.isneginf(lse[:, rows]).all()) and not q.grad[rows].any(), i
        else:
            one = [x[span].detach()[None].requires_grad_() for x, span in ((q, rows), (k, keys), (v, keys))]
            o1, lse1, _ = fp4attn.flash_attn_func(*one, causal=causal, return_attn_probs=True)
            assert torch.equal(o[rows], o1[0]) and torch.equal(lse[:, rows], lse1[0]), i
            torch.autograd.backward((o1, lse1), (d_o[None, rows], d_lse[None, :, rows]))
            for name, x, x1, span in zip(("dq", "dk", "dv"), (q, k, v), one, (rows, keys, keys)):
                assert torch.equal(x.grad[span], x1.grad[0]), (name, i)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_cu_seqlens_are_read_again_after_a_change(rng):
    # Entries read to the host are kept per tensor while its version counter
    # stands; an in-place write makes the next call read (and check) them again.
    from fp4attn import _validate

    arrays = packed(rng, [5, 9], [5, 9], 2, 2, 64)
    q, k, v = (torch.from_numpy(x) for x in arrays[:3])
    cu = torch.from_numpy(arrays[3].copy())
    fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9)
    assert _validate._HOST_INTS[id(cu)][3] == (0, 5, 14)
    cu[2] = 15
    with pytest.raises(ValueError, match="cu_seqlens_q: ends at 15"):
        fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9)
    cu[2] = 14
    cu[1] = 10
    with pytest.raises(ValueError, match="max_seqlen_q: 9 is below the longest sequence.s 10"):
        fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9)
    key = id(cu)
    del cu
    assert key not in _validate._HOST_INTS
    with torch.inference_mode():  # no version counter: read on every call, nothing kept
        cu = torch.from_numpy(arrays[3]).clone()
        fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9)
        assert id(cu) not in _validate._HOST_INTS


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_kept_lengths_follow_the_tensor(rng):
    # An unchanged cu_seqlens tensor's checked offsets and lengths are kept and
    # handed out again (one object); an in-place write to other valid lengths
    # runs those lengths, another token count is checked again, and an
    # inference tensor is read and checked on every call.
    from fp4attn import _validate

    arrays = packed(rng, [5, 9], [5, 9], 2, 2, 64)
    q, k, v = (torch.from_numpy(x) for x in arrays[:3])
    cu = torch.from_numpy(arrays[3].copy())
    kept = _validate.checked_sequences(cu, "cu_seqlens_q", 14, "q")
    assert kept == ((0, 5, 14), (5, 9), 9)
    assert _validate.checked_sequences(cu, "cu_seqlens_q", 14, "q") is kept
    before = fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9)
    with pytest.raises(ValueError, match="^cu_seqlens_q: ends at 14, but q holds 13 tokens"):
        fp4attn.flash_attn_varlen_func(q[:-1], k, v, cu, cu, 9, 9)
    cu[1] = 9  # lengths (9, 5): still valid, so only the kept entries could tell them apart
    assert _validate.checked_sequences(cu, "cu_seqlens_q", 14, "q") == ((0, 9, 14), (9, 5), 9)
    after = fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9)
    fresh = torch.tensor([0, 9, 14], dtype=torch.int32)
    assert torch.equal(after, fp4attn.flash_attn_varlen_func(q, k, v, fresh, fresh, 9, 9))
    assert not torch.equal(after, before)
    with torch.inference_mode():  # no version counter: nothing kept, every call reads the entries
        cu = torch.from_numpy(arrays[3]).clone()
        first = _validate.checked_sequences(cu, "cu_seqlens_q", 14, "q")
        assert _validate.checked_sequences(cu, "cu_seqlens_q", 14, "q") is not first
        cu[1] = 9
        assert _validate.checked_sequences(cu, "cu_seqlens_q", 14, "q").lengths == (9, 5)
        assert torch.equal(fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9), after)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_packed_layout_is_packed_groups_under_its_bounds(monkeypatch):
    # The packed path keeps each batch's groups by its lengths and the bounds
    # that _host.packed_groups reads (passed as the plan passes them): the same
    # groups, and other bounds form other ones.
    from fp4attn import _ext, _host, torch_ops

    lens_q, lens_k = (3000, 5, 7, 9, 0, 0), (3000, 5, 7, 9, 3, 384)

    def groups():
        layout = torch_ops._packed_layout(lens_q, lens_k, _host.PACKED_LAYOUT_WASTE, _ext.DEVICE_MAX_BATCH)
        return [group[:2] for group in layout[2]]

    longest_q, longest_k, layout = torch_ops._packed_layout(lens_q, lens_k, _host.PACKED_LAYOUT_WASTE,
                                                            _ext.DEVICE_MAX_BATCH)
    assert (longest_q, longest_k) == (3000, 3000)
    assert layout[1][2:] == ((0, 0), (3, 384), 0, 384, 0, 387)
    seen = []
    for bound, value in ((None, None), ("PACKED_LAYOUT_WASTE", float("inf")), ("DEVICE_MAX_BATCH", 4)):
        if bound is not None:
            monkeypatch.setattr(_host if bound == "PACKED_LAYOUT_WASTE" else _ext, bound, value)
        assert groups() == _host.packed_groups(list(lens_q), list(lens_k)), bound
        seen.append(groups())
    assert seen[:2] == [[(0, 4), (4, 2)], [(0, 6)]] and seen[2] != seen[1]


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cu_device", ["cuda", "cpu"])
def test_device_plan_follows_the_lengths_and_the_bound(rng, monkeypatch, cu_device):
    # The packed plan keeps what it formed for a batch's lengths (its groups;
    # the device copy of host cu_seqlens, per stream): an in-place write to
    # other lengths runs those, and another PACKED_LAYOUT_WASTE forms other groups.
    from fp4attn import _host, _validate, torch_ops

    lens, new = [3000, 5, 7, 9, 130], [130, 9, 7, 5, 3000]
    arrays = packed(rng, lens, lens, 4, 2, 128)
    q, k, v = (torch.from_numpy(x).to("cuda", torch.bfloat16) for x in arrays[:3])
    cu = torch.from_numpy(arrays[3].copy()).to(cu_device)
    settings = _host.make_settings(layout="bshd", mask=_host.MASK_NONE, scale=None, scale_name="softmax_scale",
                                   recipe="fp8", smooth_k=True, direct_p=True, gqa=True, names=("q", "k", "v"))
    with torch.no_grad():
        fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, 3000, 3000)
        cu.copy_(torch.tensor(np.cumsum([0] + new), dtype=cu.dtype))
        fresh = torch.tensor(np.cumsum([0] + new), dtype=torch.int32, device=cu_device)
        assert torch.equal(fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, 3000, 3000),
                           fp4attn.flash_attn_varlen_func(q, k, v, fresh, fresh, 3000, 3000))
        lengths = _validate.checked_sequences(cu, "cu_seqlens_q", q.shape[0], "q").lengths
        assert lengths == tuple(new)
        if fp4attn.backend_info()["sm90_available"]:
            plan = torch_ops._packed_plan(q, k, cu, cu, lengths, lengths, settings, False, False)
            assert [(q0, tokens) for q0, tokens, *_ in plan] == [(0, 151), (151, 3000)]
            monkeypatch.setattr(_host, "PACKED_LAYOUT_WASTE", float("inf"))
            assert len(torch_ops._packed_plan(q, k, cu, cu, lengths, lengths, settings, False, False)) == 1
    if cu_device == "cpu":  # one device copy per lengths and stream
        on_device = torch_ops._device_cu_seqlens(cu, lengths, q.device, "cu_seqlens_q")
        assert torch_ops._device_cu_seqlens(cu, lengths, q.device, "cu_seqlens_q") is on_device
        assert on_device.tolist() == cu.tolist()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            assert torch_ops._device_cu_seqlens(cu, lengths, q.device, "cu_seqlens_q") is not on_device


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cu_device", ["cuda", "cpu"])
def test_device_call_does_not_wait_for_the_device(rng, cu_device):
    # After the first call has read a CUDA cu_seqlens (CPU ones are never
    # waited on), the one-call path queues its work without synchronizing.
    lens = [5, 300, 129, 1000]
    arrays = packed(rng, lens, lens, 4, 2, 128)
    q, k, v = (torch.from_numpy(x).to("cuda", torch.bfloat16) for x in arrays[:3])
    cu = torch.from_numpy(arrays[3]).to(cu_device)
    with torch.no_grad():
        first = fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, 1000, 1000)
        torch.cuda.set_sync_debug_mode("error")
        try:
            again = fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, 1000, 1000)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(first, again)


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_call_in_a_cuda_graph(rng):
    # Under capture cu_seqlens are not read on the host (no warm-up call needed):
    # every replay runs on what they hold then. New lengths that fit the call
    # (the same tokens, none past max_seqlen; sequences without queries or keys
    # among them) give what an eager call on them gives, bit for bit; lengths
    # that do not fit give NaN, not numbers. CPU cu_seqlens and calls that the
    # one packed call cannot take are refused under capture, by name.
    from fp4attn import _validate

    lens = [5, 300, 129, 1000]
    q, k, v, cu_q_host, cu_k_host = (torch.from_numpy(x) for x in packed(rng, lens, lens, 4, 2, 128))
    q, k, v = (x.to("cuda", torch.bfloat16) for x in (q, k, v))
    cu_q, cu_k = cu_q_host.cuda(), cu_k_host.cuda()  # fresh: never read on the host
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # a warm-up on other (host) cu_seqlens: the kernels are loaded
            fp4attn.flash_attn_varlen_func(q, k, v, cu_q_host, cu_k_host, 1000, 1000, causal=True)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            out, lse, _ = fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1000, 1000, causal=True,
                                                         return_attn_probs=True)
        assert id(cu_q) not in _validate._HOST_INTS and id(cu_k) not in _validate._HOST_INTS
        for lens_q, lens_k in (([5, 300, 129, 1000], [5, 300, 129, 1000]),
                               ([700, 1, 333, 400], [700, 1, 333, 400]),
                               ([700, 0, 334, 400], [699, 2, 333, 400]),  # a sequence without queries
                               ([700, 1, 333, 400], [701, 0, 333, 400])):  # one without keys: O = 0, LSE = -inf
            new_q = torch.tensor(np.cumsum([0] + lens_q), dtype=torch.int32)
            new_k = torch.tensor(np.cumsum([0] + lens_k), dtype=torch.int32)
            cu_q.copy_(new_q), cu_k.copy_(new_k)
            for x in (q, k, v):
                x.copy_(torch.randn_like(x))
            graph.replay()
            torch.cuda.synchronize()
            want, want_lse, _ = fp4attn.flash_attn_varlen_func(q, k, v, new_q, new_k, max(lens_q), max(lens_k),
                                                               causal=True, return_attn_probs=True)
            assert torch.equal(out, want), (lens_q, lens_k)
            assert torch.equal(lse, want_lse), (lens_q, lens_k)
        for bad_q, bad_k in (([0, 1100, 1101, 1200, 1434], [0, 5, 305, 434, 1434]),  # 1100 queries > 1000
                             ([0, 5, 305, 434, 1434], [0, 305, 5, 434, 1434]),  # decreasing
                             ([0, 5, 305, 434, 1433], [0, 5, 305, 434, 1434])):  # not all of q's tokens
            cu_q.copy_(torch.tensor(bad_q)), cu_k.copy_(torch.tensor(bad_k))
            graph.replay()
            torch.cuda.synchronize()
            assert bool(out.float().isnan().all()) and bool(lse.isnan().all()), (bad_q, bad_k)
        with pytest.raises(ValueError, match="cu_seqlens_q: must be a tensor on cuda"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                fp4attn.flash_attn_varlen_func(q, k, v, cu_q_host, cu_k_host, 1000, 1000)
        with pytest.raises(ValueError, match="cu_seqlens_q: a CUDA graph can capture flash_attn_varlen_func only"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1000, 1000, recipe="mxfp4")


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_training_step_in_a_cuda_graph_takes_new_lengths(rng):
    # Forward and backward captured together; a replay with other lengths in
    # cu_seqlens gives the gradients of an eager step on those lengths, bit for
    # bit (both run the two deterministic passes at D = 128).
    lens = [5, 300, 129, 1000]
    q, k, v, cu_host, _ = (torch.from_numpy(x) for x in packed(rng, lens, lens, 4, 2, 128))
    leaves = [x.to("cuda", torch.bfloat16).requires_grad_() for x in (q, k, v)]
    d_o = torch.randn(leaves[0].shape, device="cuda", dtype=torch.bfloat16)
    cu = cu_host.cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch's graph docs ask
        fp4attn.flash_attn_varlen_func(*leaves, cu, cu, 1000, 1000, causal=True).backward(d_o)
    torch.cuda.current_stream().wait_stream(side)
    for x in leaves:
        x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp4attn.flash_attn_varlen_func(*leaves, cu, cu, 1000, 1000, causal=True).backward(d_o)
    grads = [x.grad for x in leaves]
    new_cu = torch.tensor(np.cumsum([0, 700, 1, 333, 400]), dtype=torch.int32)
    cu.copy_(new_cu)
    with torch.no_grad():
        for x in leaves:
            x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    fresh = [x.detach().clone().requires_grad_() for x in leaves]
    fp4attn.flash_attn_varlen_func(*fresh, new_cu, new_cu, 700, 700, causal=True).backward(d_o)
    for name, got, want in zip(("dq", "dk", "dv"), grads, fresh):
        assert torch.equal(got, want.grad), name
