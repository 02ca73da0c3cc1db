"""Random problems through the NumPy API (the CPU emulator) against fp64.

The draws of fuzz_device.py (which compares the GPU with the emulator): odd
and tile-edge lengths, Sq != Sk, GQA ratios up to 7, head dims 8 … 256,
bf16 / fp16 / fp32, the bhsd layout or a strided view, every recipe, causal,
smooth_k and Direct-P on or off; for the training recipes also dQ, dK, dV.
Held to conftest's calibrated bounds, which are for normal data at the
default softmax scale: the draws keep those two and vary the rest. An error
in how a shape is read, masked or padded lands far outside them.
"""

import numpy as np
import pytest

import fp4attn
from conftest import BOUNDS, GRAD_BOUNDS
from fp64_reference import attention_backward_bshd, attention_bshd, cosine, rel_l2
from random_problems import TRAINABLE, draw, emulator_options

CASES = 100
GRAD_CASES = 24
MAX_WORK = 2e8  # B · Hq · Sq · Sk · D of a draw: a fraction of a second each on two cores


def _draws():
    rng = np.random.default_rng(20261201)
    return [draw(rng, MAX_WORK) for _ in range(CASES)]


def _training_draws():
    rng = np.random.default_rng(20261202)
    cases = []
    while len(cases) < GRAD_CASES:
        c = draw(rng, MAX_WORK / 3)
        if c["recipe"] in TRAINABLE:
            cases.append(c)
    return cases


def _id(c):
    return "{recipe}_B{B}_Hq{Hq}_Hkv{Hkv}_Sq{Sq}_Sk{Sk}_D{D}_{dtype}_{layout}".format(**c) + (
        "_causal" if c["causal"] else "") + ("_window{}_{}".format(*c["window"]) if max(c["window"]) >= 0 else "")


def _element_type(name):
    if name == "bf16":
        return pytest.importorskip("ml_dtypes").bfloat16
    return {"f16": np.float16, "f32": np.float32}[name]


def _placed(x, layout):
    """x (B, S, H, D) as the call receives it: bshd, bhsd, or a bshd view into a wider buffer."""
    if layout == "bhsd":
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    if layout == "strided":
        wide = np.zeros(x.shape[:3] + (2 * x.shape[3],), dtype=x.dtype)
        wide[..., : x.shape[3]] = x
        return wide[..., : x.shape[3]]
    return x


@pytest.mark.parametrize("c", _draws(), ids=_id)
def test_random_problem_matches_fp64(c):
    g = np.random.default_rng(c["data_seed"])
    dtype = _element_type(c["dtype"])
    q = g.standard_normal((c["B"], c["Sq"], c["Hq"], c["D"])).astype(np.float32).astype(dtype)
    k = (g.standard_normal((c["B"], c["Sk"], c["Hkv"], c["D"])) + 0.5).astype(np.float32).astype(dtype)
    v = g.standard_normal((c["B"], c["Sk"], c["Hkv"], c["D"])).astype(np.float32).astype(dtype)
    layout = "bhsd" if c["layout"] == "bhsd" else "bshd"
    o, lse = fp4attn.attention(*(_placed(x, c["layout"]) for x in (q, k, v)), causal=c["causal"], layout=layout,
                               recipe=c["recipe"], smooth_k=c["smooth_k"], direct_p=c["direct_p"], return_lse=True,
                               window=tuple(c["window"]))
    if layout == "bhsd":
        o = o.transpose(0, 2, 1, 3)
    assert o.shape == q.shape and lse.shape == (c["B"], c["Hq"], c["Sq"])
    o_ref, lse_ref = attention_bshd(*(x.astype(np.float64) for x in (q, k, v)),
                                    mask="bottom_right" if c["causal"] else "none", window=c["window"])
    seen = np.isfinite(lse_ref)
    np.testing.assert_array_equal(np.isfinite(lse), seen)  # −inf exactly on rows that see no key
    np.testing.assert_array_equal(o[~seen.transpose(0, 2, 1)], 0.0)  # and O = 0 there
    if not seen.any():
        return
    bounds = BOUNDS[c["recipe"]]
    assert rel_l2(o, o_ref) < bounds.rel_l2
    assert 1 - cosine(o, o_ref) < bounds.one_minus_cos
    assert np.abs(lse[seen] - lse_ref[seen]).max() < bounds.lse


@pytest.mark.parametrize("c", _training_draws(), ids=_id)
def test_random_problem_gradients_match_fp64(c):
    # The emulator's backward (fp4attn._ext, fp32 (B, S, H, D) arrays) on the
    # forward's O and LSE, against the fp64 gradients.
    g = np.random.default_rng(c["data_seed"])
    q = g.standard_normal((c["B"], c["Sq"], c["Hq"], c["D"])).astype(np.float32)
    k = (g.standard_normal((c["B"], c["Sk"], c["Hkv"], c["D"])) + 0.5).astype(np.float32)
    v = g.standard_normal((c["B"], c["Sk"], c["Hkv"], c["D"])).astype(np.float32)
    d_o = g.standard_normal(q.shape).astype(np.float32)
    opt = emulator_options(c, None)
    o, lse, _ = fp4attn._ext.forward(q, k, v, opt, fp4attn._ext.Executor.emulator)
    got = fp4attn._ext.backward(q, k, v, o, lse, d_o, opt, fp4attn._ext.Executor.emulator)[:3]
    want = attention_backward_bshd(q, k, v, d_o, mask="bottom_right" if c["causal"] else "none", window=c["window"])
    bounds = GRAD_BOUNDS[c["recipe"]]
    for name, a, e in zip(("dq", "dk", "dv"), got, want):
        assert np.isfinite(a).all(), name
        # With one visible key per row dS is 0 in exact arithmetic: dQ and dK
        # are then rounding noise, which no relative bound describes.
        if np.linalg.norm(e) <= 1e-6 * np.linalg.norm(want[2]):
            continue
        assert rel_l2(a, e) < bounds.rel_l2, (name, rel_l2(a, e))
        assert 1 - cosine(a, e) < bounds.one_minus_cos, (name, 1 - cosine(a, e))
