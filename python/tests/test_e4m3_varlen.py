"""flash_attn_varlen_func on FlashAttention-3's FP8 inputs: packed float8_e4m3fn q, k, v with
one (Hkv,) row of descales per sequence.

Each sequence's O rows and LSE columns are flash_attn_func's on that sequence alone with its
own descales, bit for bit (sequences without queries or keys included); the packed forms pass
the descales on; bad input is refused by name; the torch layer (eager, compiled, on the device
in one call, under graph capture with the device's checks of cu_seqlens) gives the same bits.
"""

import warnings

import numpy as np
import pytest

import fp4attn
from test_e4m3 import _as_torch, _sm90, _torch  # the torch helpers of the dense suite

ml_dtypes = pytest.importorskip("ml_dtypes")
E4M3 = ml_dtypes.float8_e4m3fn

# Sequence 2 has no keys, sequence 3 no queries; lengths on and off the 128-token tiles.
LENS_Q = [5, 130, 40, 0, 128, 77]
LENS_K = [9, 300, 0, 12, 128, 200]


def packed_problem(rng, Hq, Hkv, D, lens_q=LENS_Q, lens_k=LENS_K):
    def codes(shape, spread):  # clipped to E4M3's largest finite value: ml_dtypes casts beyond it to NaN
        return np.clip(rng.standard_normal(shape) * spread, -448, 448).astype(E4M3)

    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = codes((cu_q[-1], Hq, D), 40)
    k = codes((cu_k[-1], Hkv, D), 40)
    v = codes((cu_k[-1], Hkv, D), 100)
    B = len(lens_q)
    descale = [np.exp2(rng.uniform(lo, hi, (B, Hkv))).astype(np.float32) for lo, hi in ((-8, -4), (-7, -5), (-9, -2))]
    return q, k, v, cu_q, cu_k, descale


def per_sequence(q, k, v, cu_q, cu_k, d, causal):
    """O (total_q, Hq, D) and LSE (Hq, total_q) from one flash_attn_func call per sequence."""
    Hq, D = q.shape[1], q.shape[2]
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        o, lse, _ = fp4attn.flash_attn_func(q[None, rows], k[None, keys], v[None, keys], causal=causal,
                                            q_descale=d[0][b:b + 1], k_descale=d[1][b:b + 1],
                                            v_descale=d[2][b:b + 1], return_attn_probs=True)
        outs.append(o.reshape(-1, Hq, D))
        lses.append(lse.reshape(Hq, -1))
    return np.concatenate(outs), np.concatenate(lses, axis=1)


def varlen(q, k, v, cu_q, cu_k, d, causal=False, **kw):
    return fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LENS_Q), max(LENS_K), causal=causal,
                                          q_descale=d[0], k_descale=d[1], v_descale=d[2], return_attn_probs=True,
                                          **kw)


@pytest.mark.parametrize("causal", [False, True])
def test_each_sequence_is_its_own_call(rng, causal):
    q, k, v, cu_q, cu_k, d = packed_problem(rng, 4, 2, 64)
    o, lse, _ = varlen(q, k, v, cu_q, cu_k, d, causal)
    assert o.shape == q.shape and lse.shape == (4, cu_q[-1])
    want_o, want_lse = per_sequence(q, k, v, cu_q, cu_k, d, causal)
    assert np.array_equal(o, want_o)
    assert np.array_equal(lse, want_lse)
    no_keys = slice(cu_q[2], cu_q[3])
    assert np.all(o[no_keys] == 0) and np.all(lse[:, no_keys] == -np.inf)
    assert np.isfinite(o).all()


def test_each_sequence_takes_its_own_descales(rng):
    q, k, v, cu_q, cu_k, d = packed_problem(rng, 2, 1, 64)
    o, _, _ = varlen(q, k, v, cu_q, cu_k, d)
    swapped = [x.copy() for x in d]
    swapped[2][[0, 1]] = swapped[2][[1, 0]]  # V's descales of sequences 0 and 1 exchanged
    o_swapped, _, _ = varlen(q, k, v, cu_q, cu_k, swapped)
    first_two = slice(0, cu_q[2])
    assert not np.array_equal(o[first_two], o_swapped[first_two])
    assert np.array_equal(o[cu_q[2]:], o_swapped[cu_q[2]:])


def test_packed_forms_take_the_descales(rng):
    lens = [30, 0, 129, 64]
    q, k, v, cu, _, d = packed_problem(rng, 2, 2, 64, lens, lens)
    want = fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True, q_descale=d[0],
                                          k_descale=d[1], v_descale=d[2])
    qkv = np.stack([q, k, v], axis=1)
    got = fp4attn.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True, q_descale=d[0],
                                                   k_descale=d[1], v_descale=d[2])
    assert np.array_equal(got, want)
    got = fp4attn.flash_attn_varlen_kvpacked_func(q, np.stack([k, v], axis=1), cu, cu, max(lens), max(lens),
                                                  causal=True, q_descale=d[0], k_descale=d[1], v_descale=d[2])
    assert np.array_equal(got, want)


def test_batches_without_tokens(rng):
    q, k, v, cu_q, cu_k, d = packed_problem(rng, 2, 1, 64, [0, 0], [3, 4])
    o, lse, _ = fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 0, 4, q_descale=d[0], return_attn_probs=True)
    assert o.shape == (0, 2, 64) and lse.shape == (2, 0)
    q, k, v, cu_q, cu_k, d = packed_problem(rng, 2, 1, 64, [3, 4], [0, 0])
    o, lse, _ = fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 0, return_attn_probs=True)
    assert np.all(o == 0) and np.all(lse == -np.inf)


def test_refuses_bad_input_by_name(rng):
    q, k, v, cu_q, cu_k, d = packed_problem(rng, 4, 2, 64)
    B = len(LENS_Q)

    def call(**kw):
        args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(LENS_Q),
                    max_seqlen_k=max(LENS_K), q_descale=d[0], k_descale=d[1], v_descale=d[2])
        args.update(kw)
        return fp4attn.flash_attn_varlen_func(**args)

    def argument_of(**kw):
        with pytest.raises((ValueError, TypeError)) as e:
            call(**kw)
        return str(e.value).split(":")[0]

    assert argument_of(q_descale=np.ones((B + 1, 2), np.float32)) == "q_descale"
    assert argument_of(v_descale=np.ones((B, 2), np.float64)) == "v_descale"
    assert argument_of(cu_seqlens_k=cu_k[:-1]) == "cu_seqlens_k"
    bad_cu = cu_q.copy()
    bad_cu[-1] += 1
    assert argument_of(cu_seqlens_q=bad_cu) == "cu_seqlens_q"
    assert argument_of(max_seqlen_q=max(LENS_Q) - 1) == "max_seqlen_q"
    assert argument_of(k=k.astype(np.float32)) == "k"
    assert argument_of(q=q[None]) == "q"
    assert argument_of(recipe="mxfp4") == "recipe"
    nan_k = k.copy()
    nan_k[cu_k[5] + 3, 1, 7] = np.nan  # the NaN code, in the last sequence
    assert argument_of(k=nan_k) == "k"
    bad = d[1].copy()
    bad[3, 0] = 0.0  # the descale of the sequence without queries counts too
    with pytest.raises(ValueError, match="k_descale"):
        call(k_descale=bad)
    # Descales belong to float8_e4m3fn inputs.
    f32 = [x.astype(np.float32) for x in (q, k, v)]
    assert argument_of(q=f32[0], k=f32[1], v=f32[2], q_descale=None, v_descale=None) == "k_descale"


# ---- torch ----------------------------------------------------------------------------------------


def test_torch_gives_the_numpy_bits(rng):
    t = _torch()
    q, k, v, cu_q, cu_k, d = packed_problem(rng, 4, 2, 64)
    want_o, want_lse, _ = varlen(q, k, v, cu_q, cu_k, d, True)
    o, lse, _ = varlen(*[_as_torch(t, x) for x in (q, k, v)], t.from_numpy(cu_q), t.from_numpy(cu_k),
                       [t.from_numpy(x) for x in d], True)
    assert o.dtype == t.bfloat16 and lse.dtype == t.float32
    assert np.array_equal(o.float().numpy(), want_o)
    assert np.array_equal(lse.numpy(), want_lse)


def test_kept_checks_of_cu_seqlens_follow_the_tensor(rng):
    """The host keeps a cu_seqlens tensor's checked entries while it is unchanged: a write into it,
    other token counts or another tensor are checked again, and other valid lengths written into it,
    or held by another tensor, run as those lengths."""
    t = _torch()
    q, k, v, cu_q, cu_k, d = packed_problem(rng, 2, 1, 64)
    args = [_as_torch(t, x) for x in (q, k, v)]
    cu_q_t, cu_k_t = t.from_numpy(cu_q.copy()), t.from_numpy(cu_k.copy())
    scales = [t.from_numpy(x) for x in d]

    def call(q=args[0], max_q=max(LENS_Q), cu_seqlens_q=cu_q_t):
        return fp4attn.flash_attn_varlen_func(q, args[1], args[2], cu_seqlens_q, cu_k_t, max_q, max(LENS_K),
                                              q_descale=scales[0], k_descale=scales[1], v_descale=scales[2])

    want = call()
    assert t.equal(call(), want)  # from the kept check
    with pytest.raises(ValueError, match="^max_seqlen_q"):
        call(max_q=max(LENS_Q) - 1)
    with pytest.raises(ValueError, match="^cu_seqlens_q: ends at"):
        call(q=args[0][:-1])  # one token fewer than the offsets say
    cu_q_t[-1] += 1  # an in-place write: the next call reads and checks the entries again
    with pytest.raises(ValueError, match="^cu_seqlens_q"):
        call()
    cu_q_t[-1] -= 1
    assert t.equal(call(), want)
    # Other lengths of the same tokens, valid as the kept ones were: written into the kept tensor,
    # and held by another tensor, they run as those lengths (the bits of a call per sequence).
    lens_q = [130, 5, 40, 0, 77, 128]
    other = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    want_other = per_sequence(q, k, v, other, cu_k, d, False)[0]
    cu_q_t.copy_(t.from_numpy(other))
    assert np.array_equal(call().float().numpy(), want_other)
    fresh = t.from_numpy(cu_q.copy())
    assert t.equal(call(cu_seqlens_q=fresh), want)
    assert np.array_equal(call().float().numpy(), want_other)
    with t.inference_mode():  # no version counter: the entries are read every call
        cu_inference = t.from_numpy(cu_q.copy()).clone()
        assert t.equal(call(cu_seqlens_q=cu_inference), want)
        cu_inference.copy_(t.from_numpy(other))
        assert np.array_equal(call(cu_seqlens_q=cu_inference).float().numpy(), want_other)


def test_device_offsets_are_int32_and_contiguous():
    """cu_seqlens as the device call reads them: an int32 contiguous tensor on the device is passed as
    it is; any other is converted (its own entries, never another tensor's)."""
    t = _torch()
    from fp4attn import torch_e4m3

    cpu = t.device("cpu")
    entries = t.tensor([0, 5, 5, 12], dtype=t.int32)
    assert torch_e4m3._device_ints(entries, cpu) is entries
    for other in (entries.long(), t.tensor([0, 9, 5, 9, 5, 10, 12, 11], dtype=t.int32)[::2]):
        converted = torch_e4m3._device_ints(other, cpu)
        assert converted.dtype == t.int32 and converted.is_contiguous() and converted.tolist() == other.tolist()


def test_kept_settings_follow_the_arguments(rng):
    """The settings of a call are kept by its arguments' values and types: each set of arguments
    gets what checking them anew gives (a value equal to a kept one but of another type, such as
    True for 1, is checked on its own), and a call's bits follow its settings."""
    t = _torch()
    from fp4attn import _host, api, torch_e4m3

    calls = [(False, None, "fp8", (-1, -1)), (True, None, "fp8", (-1, -1)), (False, 0.5, "fp8", (-1, -1)),
             (False, 0.25, "fp8", (-1, -1)), (False, None, "fp8", (1, -1)), (True, None, "fp8", (1, 3)),
             (False, None, "mxfp4", (-1, -1)), (False, None, "fp8", (True, -1)), (1, None, "fp8", (-1, -1)),
             (False, 1, "fp8", (-1, -1)), (False, None, "fp8", [1, -1]), (False, -0.5, "fp8", (-1, -1))]

    def outcome(fn, *args):
        try:
            return fn(*args)
        except (TypeError, ValueError) as e:
            return type(e), str(e)

    for _ in range(2):  # the second round meets what the first one kept
        for args in calls:
            for smooth_k in (True, False):
                assert (outcome(api._flash_attn_settings, *args, smooth_k)
                        == outcome(api._checked_flash_attn_settings, *args, smooth_k)), (args, smooth_k)
    for args in [("none", 0.0, True, -1, -1), ("causal", 0.0, True, -1, -1), ("none", 0.5, True, -1, -1),
                 ("none", 0.0, False, -1, -1), ("none", 0.0, True, 2, 0), ("none", 1.0, True, -1, -1),
                 ("none", 1, True, -1, -1)] * 2:
        s, opt = torch_e4m3._settings_and_options(*args)
        assert s == torch_e4m3._settings(*args) and type(s.scale) is type(args[1]), args
        assert opt is _host.options(s), args
    # The same tensors under other settings: each call gives the bits of the NumPy path's own call.
    q, k, v, cu_q, cu_k, d = packed_problem(rng, 2, 1, 64)
    torch_args = [*(_as_torch(t, x) for x in (q, k, v)), t.from_numpy(cu_q), t.from_numpy(cu_k),
                  [t.from_numpy(x) for x in d]]
    seen = []
    for causal, scale in ((False, None), (True, None), (False, 0.03), (True, 0.03), (False, None)):
        want, _, _ = varlen(q, k, v, cu_q, cu_k, d, causal, softmax_scale=scale)
        got, _, _ = varlen(*torch_args, causal, softmax_scale=scale)
        assert np.array_equal(got.float().numpy(), want), (causal, scale)
        seen.append(want.tobytes())
    assert len(set(seen)) == 4 and seen[0] == seen[-1]


def test_torch_compile_keeps_the_op(rng):
    t = _torch()
    q, k, v, cu_q, cu_k, d = packed_problem(rng, 2, 1, 64)
    args = [_as_torch(t, x) for x in (q, k, v)] + [t.from_numpy(cu_q), t.from_numpy(cu_k)]
    scales = [t.from_numpy(x) for x in d]

    def f(q, k, v, cu_q, cu_k, dq, dk, dv):
        return fp4attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LENS_Q), max(LENS_K), causal=True,
                                              q_descale=dq, k_descale=dk, v_descale=dv)

    eager = f(*args, *scales)
    compiled = t.compile(f, fullgraph=True, backend="eager")(*args, *scales)
    assert t.equal(eager, compiled)


@pytest.mark.parametrize("Hq,Hkv,D,causal", [(8, 2, 128, True), (6, 3, 64, False)])
def test_device_path_is_one_call_with_the_host_bits(rng, Hq, Hkv, D, causal):
    t = _sm90()
    q, k, v, cu_q, cu_k, d = packed_problem(rng, Hq, Hkv, D)
    want_o, want_lse, _ = varlen(q, k, v, cu_q, cu_k, d, causal)  # on this machine: a kernel call per sequence
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a host copy would warn
        o, lse, _ = varlen(*[_as_torch(t, x, "cuda") for x in (q, k, v)], t.from_numpy(cu_q).cuda(),
                           t.from_numpy(cu_k).cuda(), [t.from_numpy(x).cuda() for x in d], causal)
    assert o.is_cuda and o.dtype == t.bfloat16
    assert np.array_equal(o.float().cpu().numpy(), want_o)
    assert np.array_equal(lse.cpu().numpy(), want_lse)


def test_device_path_captures_in_a_graph_and_checks_cu_seqlens_on_the_device(rng):
    t = _sm90()
    q, k, v, cu_q, cu_k, d = packed_problem(rng, 4, 2, 64)
    args = [_as_torch(t, x, "cuda") for x in (q, k, v)]
    scales = [t.from_numpy(x).cuda() for x in d]
    cu_q_dev, cu_k_dev = t.from_numpy(cu_q).cuda(), t.from_numpy(cu_k).cuda()

    def call():
        return fp4attn.flash_attn_varlen_func(*args, cu_q_dev, cu_k_dev, max(LENS_Q), max(LENS_K), causal=True,
                                              q_descale=scales[0], k_descale=scales[1], v_descale=scales[2])

    graph = t.cuda.CUDAGraph()
    stream = t.cuda.Stream()
    with t.cuda.stream(stream):
        call()  # warm-up
        with t.cuda.graph(graph, stream=stream):
            captured = call()
    # Other lengths of the same token counts that fit max_seqlen: what an eager call on them gives.
    lens_q = [40, 5, 130, 0, 128, 77]
    other_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_q_dev.copy_(t.from_numpy(other_q))
    graph.replay()
    t.cuda.synchronize()
    want = fp4attn.flash_attn_varlen_func(*args, cu_q_dev, cu_k_dev, max(LENS_Q), max(LENS_K), causal=True,
                                          q_descale=scales[0], k_descale=scales[1], v_descale=scales[2])
    assert t.equal(captured, want)
    # Lengths that do not fit (a sequence longer than max_seqlen_q): NaN everywhere.
    too_long = np.array([0, 0, 0, 0, 0, 0, cu_q[-1]], np.int32)
    cu_q_dev.copy_(t.from_numpy(too_long))
    graph.replay()
    t.cuda.synchronize()
    assert t.isnan(captured).all()


def test_device_path_turns_bad_values_into_nan(rng):
    t = _sm90()
    q, k, v, cu_q, cu_k, d = packed_problem(rng, 2, 2, 64)
    args = [_as_torch(t, x, "cuda") for x in (q, k, v)]
    scales = [t.from_numpy(x).cuda() for x in d]
    scales[2][3, 1] = float("inf")  # the sequence without queries
    o = fp4attn.flash_attn_varlen_func(*args, t.from_numpy(cu_q).cuda(), t.from_numpy(cu_k).cuda(), max(LENS_Q),
                                       max(LENS_K), q_descale=scales[0], k_descale=scales[1], v_descale=scales[2])
    assert t.isnan(o).all()
