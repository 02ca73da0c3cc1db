"""fp4attn.attention, flash_attn_func and sdpa on NumPy arrays (CPU emulator):
known answers first, then random problems against the fp64 reference, then
the semantics users rely on (mask alignment, GQA, layouts, LSE, array types)."""

import itertools

import numpy as np
import pytest

import fp4attn
from conftest import BOUNDS, SHAPES, make_qkv
from fp64_reference import attention_bshd, cosine, rel_l2


def assert_close_to_reference(o, lse, o_ref, lse_ref, recipe, lse_factor=1.0):
    """lse_factor: LSE errors grow with the softmax scale; the bounds hold for 1/sqrt(D)."""
    bounds = BOUNDS[recipe]
    assert 1 - cosine(o, o_ref) < bounds.one_minus_cos
    assert rel_l2(o, o_ref) < bounds.rel_l2
    seen = np.isfinite(lse_ref)
    np.testing.assert_array_equal(np.isfinite(lse), seen)  # -inf exactly where no key is visible
    assert np.abs(lse - lse_ref)[seen].max() < bounds.lse * lse_factor


def to_bhsd(x):
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3))


# ---- known answers


@pytest.mark.parametrize("recipe", fp4attn.RECIPES)
def test_equal_keys_and_unit_values_give_one(rng, recipe):
    # Every key equal: each row's scores are equal, P is uniform and exactly
    # representable in every P format, so O = mean(V) = 1 exactly and
    # LSE = scale·q·k + ln Sk (up to Q's quantization).
    B, Sq, Sk, H, D = 1, 40, 72, 2, 64
    q = rng.standard_normal((B, Sq, H, D)).astype(np.float32)
    k = np.full((B, Sk, H, D), 0.5, dtype=np.float32)
    v = np.ones((B, Sk, H, D), dtype=np.float32)
    o, lse = fp4attn.attention(q, k, v, recipe=recipe, return_lse=True)
    np.testing.assert_array_equal(o, np.ones_like(o))
    lse_expected = (q.astype(np.float64) @ np.full(D, 0.5)).transpose(0, 2, 1) / np.sqrt(D) + np.log(Sk)
    assert np.abs(lse - lse_expected).max() < BOUNDS[recipe].lse


def test_fully_masked_rows_give_zero_and_minus_inf(rng):
    # Bottom-right causal with Sq > Sk: the first Sq - Sk queries see no key.
    q, k, v = make_qkv(rng, 1, 50, 20, 2, 2, 32)
    o, lse = fp4attn.attention(q, k, v, causal=True, return_lse=True)
    hidden = 50 - 20
    np.testing.assert_array_equal(o[:, :hidden], 0.0)
    assert np.all(lse[:, :, :hidden] == -np.inf)
    assert np.all(np.isfinite(lse[:, :, hidden:]))
    assert np.abs(o[:, hidden:]).max() > 0


# ---- random problems against the fp64 reference


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}_Sq{}_Sk{}_Hq{}_Hkv{}_D{}".format(*s))
@pytest.mark.parametrize("recipe", fp4attn.RECIPES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_matches_fp64_reference(rng, shape, recipe, causal):
    q, k, v = make_qkv(rng, *shape)
    o_ref, lse_ref = attention_bshd(q, k, v, "bottom_right" if causal else "none")
    for direct_p, smooth_k in itertools.product((True, False), repeat=2):
        o, lse = fp4attn.attention(
            q, k, v, causal=causal, recipe=recipe, direct_p=direct_p, smooth_k=smooth_k, return_lse=True
        )
        assert o.dtype == np.float32 and o.shape == q.shape
        assert lse.dtype == np.float32 and lse.shape == (shape[0], shape[3], shape[1])
        assert_close_to_reference(o, lse, o_ref, lse_ref, recipe)


@pytest.mark.parametrize("recipe", fp4attn.RECIPES)
def test_sm100_target_matches_fp64_reference(rng, recipe):
    q, k, v = make_qkv(rng, *SHAPES[0])
    o_ref, lse_ref = attention_bshd(q, k, v)
    o, lse = fp4attn.attention(q, k, v, recipe=recipe, target="sm100", return_lse=True)
    assert_close_to_reference(o, lse, o_ref, lse_ref, recipe)


def test_outputs_are_bf16_values(rng):
    q, k, v = make_qkv(rng, *SHAPES[0])
    o = fp4attn.attention(q, k, v)
    low_bits = o.view(np.uint32) & 0xFFFF  # bf16 keeps the top 16 bits of a float32
    assert np.all(low_bits == 0)


def test_explicit_scale_is_used(rng):
    q, k, v = make_qkv(rng, *SHAPES[0])
    scale = 0.3  # far from 1/sqrt(64) = 0.125, so using the default would fail
    o, lse = fp4attn.attention(q, k, v, scale=scale, return_lse=True)
    o_ref, lse_ref = attention_bshd(q, k, v, scale=scale)
    assert_close_to_reference(o, lse, o_ref, lse_ref, "fp8", lse_factor=scale * np.sqrt(q.shape[-1]))


@pytest.mark.parametrize("recipe", fp4attn.RECIPES)
def test_smooth_k_keeps_the_true_lse(rng, recipe):
    # With a large common key offset, smooth_k shifts every score row by
    # scale·q·k̄; the returned LSE must add it back. Without that the two LSEs
    # would differ by |scale·q·k̄|, several units here.
    gap_bound = {"fp8": 0.14, "mxfp4": 0.7, "nvfp4": 0.55, "mxfp4_train": 0.85}[recipe]  # 2x the worst of 8 seeds
    q, k, v = make_qkv(rng, 1, 48, 80, 2, 2, 64, k_offset=3.0)
    o_on, lse_on = fp4attn.attention(q, k, v, recipe=recipe, smooth_k=True, return_lse=True)
    o_off, lse_off = fp4attn.attention(q, k, v, recipe=recipe, smooth_k=False, return_lse=True)
    assert np.abs(lse_on - lse_off).max() < gap_bound
    o_ref, _ = attention_bshd(q, k, v)
    assert 1 - cosine(o_on, o_ref) < BOUNDS[recipe].one_minus_cos


# ---- mask alignment: FlashAttention bottom-right, SDPA top-left


@pytest.mark.parametrize("sq,sk", [(40, 96), (96, 40)])
def test_sdpa_top_left_and_flash_bottom_right(rng, sq, sk):
    q, k, v = make_qkv(rng, 1, sq, sk, 2, 2, 64)
    flash = fp4attn.flash_attn_func(q, k, v, causal=True)
    sdpa = fp4attn.sdpa(to_bhsd(q), to_bhsd(k), to_bhsd(v), is_causal=True).transpose(0, 2, 1, 3)
    bottom_right, _ = attention_bshd(q, k, v, "bottom_right")
    top_left, _ = attention_bshd(q, k, v, "top_left")
    bound = BOUNDS["fp8"].one_minus_cos
    assert 1 - cosine(flash, bottom_right) < bound
    assert 1 - cosine(sdpa, top_left) < bound
    # The two alignments differ by far more than the recipe error, so a swapped
    # alignment cannot pass the checks above.
    assert 1 - cosine(flash, top_left) > 10 * bound
    assert 1 - cosine(sdpa, bottom_right) > 10 * bound


def test_alignments_agree_when_lengths_are_equal(rng):
    q, k, v = make_qkv(rng, 1, 64, 64, 2, 2, 64)
    flash = fp4attn.flash_attn_func(q, k, v, causal=True)
    sdpa = fp4attn.sdpa(to_bhsd(q), to_bhsd(k), to_bhsd(v), is_causal=True)
    np.testing.assert_array_equal(to_bhsd(flash), sdpa)


# ---- API semantics


def test_entry_points_agree_exactly(rng):
    q, k, v = make_qkv(rng, 1, 40, 72, 4, 2, 64)
    o, lse = fp4attn.attention(q, k, v, scale=0.2, recipe="nvfp4", return_lse=True)
    flash_o, flash_lse, probs = fp4attn.flash_attn_func(q, k, v, softmax_scale=0.2, return_attn_probs=True, recipe="nvfp4")
    np.testing.assert_array_equal(o, flash_o)
    np.testing.assert_array_equal(lse, flash_lse)
    assert probs is None
    sdpa = fp4attn.sdpa(to_bhsd(q), to_bhsd(k), to_bhsd(v), scale=0.2, enable_gqa=True, recipe="nvfp4")
    np.testing.assert_array_equal(to_bhsd(o), sdpa)
    np.testing.assert_array_equal(fp4attn.flash_attn_func(q, k, v, softmax_scale=0.2, recipe="nvfp4"), o)


def test_bhsd_layout_is_a_transpose_of_bshd(rng):
    q, k, v = make_qkv(rng, 2, 33, 50, 2, 1, 32)
    o, lse = fp4attn.attention(q, k, v, causal=True, return_lse=True)
    o_t, lse_t = fp4attn.attention(to_bhsd(q), to_bhsd(k), to_bhsd(v), causal=True, layout="bhsd", return_lse=True)
    assert o_t.flags.c_contiguous
    np.testing.assert_array_equal(to_bhsd(o), o_t)
    np.testing.assert_array_equal(lse, lse_t)


@pytest.mark.parametrize("hkv", [2, 1], ids=["gqa", "mqa"])
def test_grouped_query_attention_equals_repeated_heads(rng, hkv):
    q, k, v = make_qkv(rng, 1, 40, 72, 4, hkv, 64)
    o, lse = fp4attn.attention(q, k, v, return_lse=True)
    group = 4 // hkv
    o_rep, lse_rep = fp4attn.attention(q, np.repeat(k, group, axis=2), np.repeat(v, group, axis=2), return_lse=True)
    np.testing.assert_array_equal(o, o_rep)
    np.testing.assert_array_equal(lse, lse_rep)
    o_ref, lse_ref = attention_bshd(q, k, v)
    assert_close_to_reference(o, lse, o_ref, lse_ref, "fp8")


def test_return_lse_only_adds_the_lse(rng):
    q, k, v = make_qkv(rng, *SHAPES[1])
    o = fp4attn.attention(q, k, v)
    o2, lse = fp4attn.attention(q, k, v, return_lse=True)
    assert isinstance(o, np.ndarray)
    np.testing.assert_array_equal(o, o2)


# ---- array types


class DLPackOnly:
    """An array that offers only the DLPack protocol, as CuPy or JAX arrays do."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class ArrayProtocolOnly:
    def __init__(self, a):
        self._a = a

    def __array__(self, dtype=None, copy=None):
        return self._a if dtype is None else self._a.astype(dtype)


@pytest.mark.parametrize("wrap", [DLPackOnly, ArrayProtocolOnly], ids=["dlpack", "array_protocol"])
def test_accepts_dlpack_and_array_protocol(rng, wrap):
    q, k, v = make_qkv(rng, *SHAPES[0])
    expected = fp4attn.attention(q, k, v)
    np.testing.assert_array_equal(fp4attn.attention(wrap(q), wrap(k), wrap(v)), expected)


def test_strided_inputs_give_the_same_result(rng):
    q, k, v = make_qkv(rng, 1, 80, 96, 2, 2, 64)
    # Every other token: outer strides change, D stays contiguous.
    expected = fp4attn.attention(q[:, ::2].copy(), k[:, ::2].copy(), v[:, ::2].copy())
    np.testing.assert_array_equal(fp4attn.attention(q[:, ::2], k[:, ::2], v[:, ::2]), expected)


@pytest.mark.parametrize("recipe", fp4attn.RECIPES)
@pytest.mark.parametrize("D", [8, 24, 40, 72, 200])
def test_head_dims_of_eight(rng, recipe, D):
    # Odd multiples of 8 (40 and 72 occur in diffusion models) run with zero
    # channels appended: within the recipe's bounds of fp64, and bit for bit
    # the call padded to the next multiple of 16 with the unpadded D's scale.
    q, k, v = make_qkv(rng, 1, 70, 150, 2, 1, D)
    o, lse = fp4attn.attention(q, k, v, causal=True, recipe=recipe, return_lse=True)
    o_ref, lse_ref = attention_bshd(q, k, v, "bottom_right")
    assert_close_to_reference(o, lse, o_ref, lse_ref, recipe)
    wide = D + D % 16
    padded = [np.concatenate([x, np.zeros(x.shape[:3] + (wide - D,), np.float32)], axis=3) for x in (q, k, v)]
    scale = float(np.float32(1.0) / np.sqrt(np.float32(D)))  # 1/sqrt(D) as the library rounds it
    o_p, lse_p = fp4attn.attention(*padded, causal=True, recipe=recipe, scale=scale, return_lse=True)
    np.testing.assert_array_equal(o, o_p[..., :D])
    np.testing.assert_array_equal(lse, lse_p)


@pytest.mark.parametrize("dtype", ["float16", "float64", "bfloat16"])
def test_other_float_dtypes(rng, dtype):
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    q, k, v = (x.astype(dtype) for x in make_qkv(rng, *SHAPES[0]))
    o = fp4attn.attention(q, k, v)
    assert o.dtype == np.float32
    o_ref, _ = attention_bshd(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    assert 1 - cosine(o, o_ref) < BOUNDS["fp8"].one_minus_cos


def test_backend_info():
    info = fp4attn.backend_info()
    assert info["version"] == fp4attn.__version__
    assert isinstance(info["cuda_built"], bool) and isinstance(info["device"], str) and info["device"]


def test_positional_arguments_mean_what_they_mean_in_torch_and_flash_attention(rng):
    # sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) and
    # flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, ...), as PyTorch and FlashAttention order them.
    q, k, v = make_qkv(rng, 1, 40, 70, 4, 2, 64)
    by_name = fp4attn.flash_attn_func(q, k, v, softmax_scale=0.2, causal=True)
    np.testing.assert_array_equal(fp4attn.flash_attn_func(q, k, v, 0.0, 0.2, True), by_name)
    qb, kb, vb = to_bhsd(q), to_bhsd(k), to_bhsd(v)
    by_name = fp4attn.sdpa(qb, kb, vb, is_causal=True, scale=0.2, enable_gqa=True)
    np.testing.assert_array_equal(fp4attn.sdpa(qb, kb, vb, None, 0.0, True, 0.2, True), by_name)


def test_calls_without_tokens_give_what_sdpa_gives(rng):
    # No keys: O = 0 and LSE = -inf (rows that see no key); no queries or no batch entries: empty
    # O and LSE. Everything else about such a call is still checked, and named.
    q, k, v = make_qkv(rng, 2, 5, 7, 4, 2, 64)
    o, lse = fp4attn.attention(q, k[:, :0], v[:, :0], return_lse=True)
    assert o.shape == q.shape and not o.any() and lse.shape == (2, 4, 5) and np.all(lse == -np.inf)
    o, lse = fp4attn.attention(q[:, :0], k, v, causal=True, return_lse=True)
    assert o.shape == (2, 0, 4, 64) and lse.shape == (2, 4, 0)
    o, lse = fp4attn.attention(q[:0], k[:0], v[:0], return_lse=True)
    assert o.shape == (0, 5, 4, 64) and lse.shape == (0, 4, 5)
    o = fp4attn.sdpa(to_bhsd(q)[:, :, :0], to_bhsd(k), to_bhsd(v), enable_gqa=True)
    assert o.shape == (2, 4, 0, 64)
    with pytest.raises(ValueError, match=r"^D: "):
        fp4attn.attention(q[:, :0, :, :12], k[..., :12], v[..., :12])
    with pytest.raises(ValueError, match=r"^Hq: "):
        fp4attn.attention(q[:, :0], k[:, :, :1].repeat(3, axis=2), v[:, :, :1].repeat(3, axis=2))
    with pytest.raises(ValueError, match=r"^recipe: "):
        fp4attn.attention(q, k[:, :0], v[:, :0], recipe="int8")


def test_flash_attn_packed_functions_are_flash_attn_func_on_their_parts(rng):
    # FlashAttention's qkvpacked / kvpacked functions: the same call on the stacked tensors' parts,
    # bit for bit, with the same positional parameters; a stacked tensor of another shape is refused
    # by name.
    q, k, v = make_qkv(rng, 2, 70, 70, 4, 4, 64)
    qkv = np.stack([q, k, v], axis=2)  # (B, S, 3, H, D)
    want = fp4attn.flash_attn_func(q, k, v, 0.0, 0.2, True, return_attn_probs=True)
    got = fp4attn.flash_attn_qkvpacked_func(qkv, 0.0, 0.2, True, return_attn_probs=True)
    for g, w in zip(got[:2], want[:2]):
        np.testing.assert_array_equal(g, w)
    assert got[2] is None
    q, k, v = make_qkv(rng, 1, 40, 90, 4, 2, 64)  # GQA
    kv = np.stack([k, v], axis=2)  # (B, S, 2, Hkv, D)
    np.testing.assert_array_equal(fp4attn.flash_attn_kvpacked_func(q, kv, causal=True, recipe="mxfp4"),
                                  fp4attn.flash_attn_func(q, k, v, causal=True, recipe="mxfp4"))
    with pytest.raises(ValueError, match=r"^qkv: expected a 5-D \(B, S, 3, H, D\)"):
        fp4attn.flash_attn_qkvpacked_func(qkv[:, :, :2])
    with pytest.raises(ValueError, match=r"^kv: expected a 5-D"):
        fp4attn.flash_attn_kvpacked_func(q, k)
    with pytest.raises(TypeError, match=r"^qkv: "):
        fp4attn.flash_attn_qkvpacked_func("not an array")


def test_backward_mode_rule_counts_the_keys_rows_see():
    # The host rule behind the torch layer's default backward mode: the one pass
    # at D = 64 where query rows see at least 256 keys on average (causal rows
    # see fewer: bottom-right or top-left aligned), the two passes elsewhere.
    ext = fp4attn._ext

    def faster(sq, sk, mask, d=64):
        return ext.device_backward_one_pass_faster((2, sq, sk, 4, 2, d), ext.MaskKind.__members__[mask])

    assert faster(1024, 1024, "none")
    assert not faster(255, 255, "none")
    assert not faster(1024, 1024, "none", d=128)
    assert faster(512, 512, "causal")  # 256.5 keys a row
    assert not faster(510, 510, "causal")  # 255.5
    assert not faster(510, 510, "causal_top_left")
    assert faster(300, 1400, "causal")  # bottom-right: rows see 1101 .. 1400 keys
    assert not faster(300, 1400, "causal_top_left")  # top-left: 1 .. 300
    assert not faster(4096, 128, "causal")  # bottom-right, Sk < Sq: most rows see none
