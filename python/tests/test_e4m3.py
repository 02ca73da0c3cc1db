"""flash_attn_func on FlashAttention-3's FP8 inputs: float8_e4m3fn q, k, v with (B, Hkv) descales.

The result is attention of the values the codes stand for (against fp64 in NumPy), each
descale applies to its own tensor and kv head, bad input is refused by name, and the torch
layer (eager, compiled, on the device, under graph capture) gives the host entry point's bits.
"""

import warnings

import numpy as np
import pytest

import fp4attn
from fp64_reference import attention_bshd, rel_l2

ml_dtypes = pytest.importorskip("ml_dtypes")
E4M3 = ml_dtypes.float8_e4m3fn

# Recipe fp8's only error on exact E4M3 inputs is P's E4M3 rounding: about 2-3 % rel L2 in O
# (tests/test_forward_e4m3.cpp). A descale applied to the wrong head moves O by 20-30 %.
MAX_REL_L2 = 0.04
MAX_LSE = 0.04


def e4m3_problem(rng, B, Sq, Sk, Hq, Hkv, D):
    """Codes of normal values spread over E4M3's range, descales log-uniform and different per head."""
    def codes(shape, spread):  # clipped to E4M3's largest finite value: ml_dtypes casts beyond it to NaN
        return np.clip(rng.standard_normal(shape) * spread, -448, 448).astype(E4M3)

    q = codes((B, Sq, Hq, D), 40)
    k = codes((B, Sk, Hkv, D), 40)
    v = codes((B, Sk, Hkv, D), 100)
    descale = [np.exp2(rng.uniform(lo, hi, (B, Hkv))).astype(np.float32) for lo, hi in ((-8, -4), (-7, -5), (-9, -2))]
    return q, k, v, descale


def values(codes, descale, group):
    """code × its head's descale, in float64 (B, S, H, D)."""
    per_head = np.repeat(descale.astype(np.float64), group, axis=1)  # (B, H)
    return codes.astype(np.float64) * per_head[:, None, :, None]


@pytest.mark.parametrize("shape,causal", [((2, 70, 130, 4, 2, 64), True), ((1, 129, 90, 2, 2, 128), False),
                                          ((1, 40, 300, 3, 1, 48), True)])
def test_is_attention_of_the_descaled_codes(rng, shape, causal):
    B, Sq, Sk, Hq, Hkv, D = shape
    q, k, v, (dq, dk, dv) = e4m3_problem(rng, B, Sq, Sk, Hq, Hkv, D)
    o, lse, _ = fp4attn.flash_attn_func(q, k, v, causal=causal, q_descale=dq, k_descale=dk, v_descale=dv,
                                        return_attn_probs=True)
    assert o.shape == (B, Sq, Hq, D) and lse.shape == (B, Hq, Sq)
    want_o, want_lse = attention_bshd(values(q, dq, Hq // Hkv), values(k, dk, 1), values(v, dv, 1),
                                      "bottom_right" if causal else "none")
    assert rel_l2(o, want_o) <= MAX_REL_L2
    seen = np.isfinite(want_lse)
    assert np.array_equal(np.isfinite(lse), seen)
    assert np.max(np.abs(lse[seen] - want_lse[seen])) <= MAX_LSE


def test_missing_descales_are_one(rng):
    q, k, v, _ = e4m3_problem(rng, 1, 50, 60, 2, 2, 64)
    ones = np.ones((1, 2), np.float32)
    a = fp4attn.flash_attn_func(q, k, v)
    b = fp4attn.flash_attn_func(q, k, v, q_descale=ones, k_descale=ones, v_descale=ones)
    assert np.array_equal(a, b)


def test_packed_forms_take_the_descales(rng):
    q, k, v, (dq, dk, dv) = e4m3_problem(rng, 2, 40, 40, 2, 2, 64)
    want = fp4attn.flash_attn_func(q, k, v, causal=True, q_descale=dq, k_descale=dk, v_descale=dv)
    qkv = np.stack([q, k, v], axis=2)  # (B, S, 3, H, D): strided views of one array
    got = fp4attn.flash_attn_qkvpacked_func(qkv, causal=True, q_descale=dq, k_descale=dk, v_descale=dv)
    assert np.array_equal(got, want)
    got = fp4attn.flash_attn_kvpacked_func(q, np.stack([k, v], axis=2), causal=True, q_descale=dq, k_descale=dk,
                                           v_descale=dv)
    assert np.array_equal(got, want)


def test_empty_calls(rng):
    q, k, v, _ = e4m3_problem(rng, 1, 5, 6, 2, 2, 64)
    o, lse, _ = fp4attn.flash_attn_func(q, k[:, :0], v[:, :0], return_attn_probs=True)
    assert o.shape == (1, 5, 2, 64) and not o.any() and np.all(lse == -np.inf)
    o, lse, _ = fp4attn.flash_attn_func(q[:, :0], k, v, return_attn_probs=True)
    assert o.shape == (1, 0, 2, 64) and lse.shape == (1, 2, 0)


def test_refuses_bad_input_by_name(rng):
    q, k, v, (dq, dk, dv) = e4m3_problem(rng, 1, 40, 50, 2, 1, 64)
    with pytest.raises(ValueError, match="^q_descale"):
        fp4attn.flash_attn_func(q, k, v, q_descale=np.ones((1, 2), np.float32))  # (B, Hq), not (B, Hkv)
    with pytest.raises(TypeError, match="^k_descale"):
        fp4attn.flash_attn_func(q, k, v, k_descale=dk.astype(np.float64))
    with pytest.raises(ValueError, match="^v_descale"):
        fp4attn.flash_attn_func(q, k, v, v_descale=np.zeros_like(dv))
    bad = k.copy()
    bad.view(np.uint8)[0, 3, 0, 5] = 0x7F
    with pytest.raises(ValueError, match=r"^k: holds a NaN code .* \(0, 3, 0, 5\)"):
        fp4attn.flash_attn_func(q, bad, v)
    with pytest.raises(TypeError, match="^v: dtype float32"):
        fp4attn.flash_attn_func(q, k, v.astype(np.float32))
    with pytest.raises(ValueError, match="^recipe"):
        fp4attn.flash_attn_func(q, k, v, recipe="mxfp4")
    with pytest.raises(ValueError, match="^D"):
        narrow = [x[..., :24] for x in (q, k, v)]
        fp4attn.flash_attn_func(*[np.ascontiguousarray(x) for x in narrow])
    with pytest.raises(TypeError, match="^q: dtype float8_e4m3fn is not supported.*"
                                        "flash_attn_func or flash_attn_varlen_func with q_descale"):
        fp4attn.attention(q, k, v)
    with pytest.raises(ValueError, match="^q_descale: applies to float8_e4m3fn inputs only"):
        f = [x.astype(np.float32) for x in (q, k, v)]
        fp4attn.flash_attn_func(*f, q_descale=dq)


# ---- torch ----------------------------------------------------------------------------------------

def _torch():  # imported per test, so that the NumPy tests run without torch
    return pytest.importorskip("torch")


def _as_torch(t, x, device="cpu"):
    return t.from_numpy(np.ascontiguousarray(x).view(np.uint8)).view(t.float8_e4m3fn).to(device)


def test_torch_gives_the_numpy_bits(rng):
    t = _torch()
    q, k, v, d = e4m3_problem(rng, 2, 70, 90, 4, 2, 64)
    want_o, want_lse, _ = fp4attn.flash_attn_func(q, k, v, causal=True, q_descale=d[0], k_descale=d[1],
                                                  v_descale=d[2], return_attn_probs=True)
    o, lse, _ = fp4attn.flash_attn_func(*[_as_torch(t, x) for x in (q, k, v)], causal=True,
                                        q_descale=t.from_numpy(d[0]), k_descale=t.from_numpy(d[1]),
                                        v_descale=t.from_numpy(d[2]), return_attn_probs=True)
    assert o.dtype == t.bfloat16 and lse.dtype == t.float32
    assert np.array_equal(o.float().numpy(), want_o)
    assert np.array_equal(lse.numpy(), want_lse)


def test_torch_compile_keeps_the_op(rng):
    t = _torch()
    q, k, v, d = e4m3_problem(rng, 1, 40, 64, 2, 1, 64)
    args = [_as_torch(t, x) for x in (q, k, v)]
    scales = [t.from_numpy(x) for x in d]

    def f(q, k, v, dq, dk, dv):
        return fp4attn.flash_attn_func(q, k, v, causal=True, q_descale=dq, k_descale=dk, v_descale=dv)

    eager = f(*args, *scales)
    compiled = t.compile(f, fullgraph=True, backend="eager")(*args, *scales)
    assert t.equal(eager, compiled)


def _sm90():
    t = _torch()
    if not (t.cuda.is_available() and fp4attn.backend_info()["sm90_available"]):
        pytest.skip("needs a compute-capability 9.0 GPU")
    return t


def test_device_path_gives_the_host_bits_without_copies(rng):
    t = _sm90()
    q, k, v, d = e4m3_problem(rng, 2, 300, 333, 8, 2, 128)
    want_o, want_lse, _ = fp4attn.flash_attn_func(q, k, v, causal=True, q_descale=d[0], k_descale=d[1],
                                                  v_descale=d[2], return_attn_probs=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a host copy would warn
        args = [_as_torch(t, x, "cuda") for x in (q, k, v)]
        scales = [t.from_numpy(x).cuda() for x in d]
        o, lse, _ = fp4attn.flash_attn_func(*args, causal=True, q_descale=scales[0], k_descale=scales[1],
                                            v_descale=scales[2], return_attn_probs=True)
    assert o.is_cuda and o.dtype == t.bfloat16
    assert np.array_equal(o.float().cpu().numpy(), want_o)
    assert np.array_equal(lse.cpu().numpy(), want_lse)


def test_device_path_reads_strided_views_and_captures_in_a_graph(rng):
    t = _sm90()
    q, k, v, d = e4m3_problem(rng, 1, 200, 260, 4, 2, 64)
    dense = [_as_torch(t, x, "cuda") for x in (q, k, v)]
    scales = [t.from_numpy(x).cuda() for x in d]
    want = fp4attn.flash_attn_func(*dense, q_descale=scales[0], k_descale=scales[1], v_descale=scales[2])
    # Each tensor as a view into a wider buffer: rows 64 codes apart more than D, heads interleaved with junk.
    views = []
    for x in dense:
        B, S, H, D = x.shape
        wide = t.full((B, S, H, 2 * D), 0x7F, dtype=t.uint8, device="cuda").view(t.float8_e4m3fn)  # NaN codes
        wide[..., :D] = x
        views.append(wide[..., :D])
    got = fp4attn.flash_attn_func(*views, q_descale=scales[0], k_descale=scales[1], v_descale=scales[2])
    assert t.equal(got, want)

    graph = t.cuda.CUDAGraph()
    stream = t.cuda.Stream()
    with t.cuda.stream(stream):
        fp4attn.flash_attn_func(*views, q_descale=scales[0], k_descale=scales[1], v_descale=scales[2])  # warm-up
        with t.cuda.graph(graph, stream=stream):
            captured = fp4attn.flash_attn_func(*views, q_descale=scales[0], k_descale=scales[1], v_descale=scales[2])
    graph.replay()
    t.cuda.synchronize()
    assert t.equal(captured, want)


def test_device_path_turns_bad_values_into_nan(rng):
    t = _sm90()
    q, k, v, d = e4m3_problem(rng, 1, 64, 64, 2, 2, 64)
    args = [_as_torch(t, x, "cuda") for x in (q, k, v)]
    scales = [t.from_numpy(x).cuda() for x in d]
    scales[1][0, 1] = -1.0
    o = fp4attn.flash_attn_func(*args, q_descale=scales[0], k_descale=scales[1], v_descale=scales[2])
    assert t.isnan(o).all()
