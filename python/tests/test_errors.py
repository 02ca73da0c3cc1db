"""Every bad argument raises TypeError or ValueError whose message starts with
the argument's name, as the user spelled it."""

import numpy as np
import pytest

import fp4attn
from conftest import make_qkv


@pytest.fixture
def qkv(rng):
    return make_qkv(rng, 1, 32, 48, 4, 2, 64)


def bhsd(*xs):
    return tuple(np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in xs)


def raises(error, name):
    """pytest.raises for an error whose message starts with `name:`."""
    return pytest.raises(error, match=rf"^{name}: ")


def test_wrong_dtype(qkv):
    q, k, v = qkv
    with raises(TypeError, "q"):
        fp4attn.attention(q.astype(np.int32), k, v)
    with raises(TypeError, "value"):
        fp4attn.sdpa(*bhsd(q, k), bhsd(v)[0].astype(np.complex64), enable_gqa=True)


def test_mixed_dtypes(qkv):
    q, k, v = qkv
    with raises(TypeError, "k"):
        fp4attn.attention(q, k.astype(np.float64), v)


def test_not_an_array(qkv):
    q, k, v = qkv
    with raises(TypeError, "q"):
        fp4attn.attention(q.tolist(), k, v)


def test_wrong_rank(qkv):
    q, k, v = qkv
    with raises(ValueError, "q"):
        fp4attn.attention(q[0], k, v)
    with raises(ValueError, "v"):
        fp4attn.flash_attn_func(q, k, v[..., None])


def test_non_contiguous_head_dim(rng):
    q, k, v = make_qkv(rng, 1, 32, 48, 2, 2, 128)
    with raises(ValueError, "q"):
        fp4attn.attention(q[..., ::2], k[..., ::2].copy(), v[..., ::2].copy())
    with raises(ValueError, "key"):
        query, key, value = bhsd(q[..., :64], k[..., :64], v[..., :64])
        fp4attn.sdpa(query, np.asfortranarray(key), value)


def test_shape_mismatches(qkv, rng):
    q, k, v = qkv
    with raises(ValueError, "v"):
        fp4attn.attention(q, k, v[:, :40])  # v's sequence differs from k's
    with raises(ValueError, "k"):
        fp4attn.attention(q, np.concatenate([k, k]), np.concatenate([v, v]))  # batch
    q32, k32, v32 = make_qkv(rng, 1, 32, 48, 4, 2, 32)
    with raises(ValueError, "k"):
        fp4attn.attention(q, k32, v32)  # head dim


def test_heads_not_a_multiple(rng):
    q, k, v = make_qkv(rng, 1, 32, 48, 4, 3, 64)
    with raises(ValueError, "Hq"):
        fp4attn.attention(q, k, v)


def test_sdpa_needs_enable_gqa_for_fewer_key_heads(qkv):
    query, key, value = bhsd(*qkv)
    with raises(ValueError, "key"):
        fp4attn.sdpa(query, key, value)
    assert fp4attn.sdpa(query, key, value, enable_gqa=True).shape == query.shape


def test_unsupported_head_dim(rng):
    q, k, v = make_qkv(rng, 1, 32, 48, 2, 2, 36)  # no multiple of 8
    with raises(ValueError, "D"):
        fp4attn.attention(q, k, v)


def test_layout(qkv):
    with raises(ValueError, "layout"):
        fp4attn.attention(*qkv, layout="bsdh")
    with raises(TypeError, "layout"):
        fp4attn.attention(*qkv, layout=None)


def test_recipe(qkv):
    with raises(ValueError, "recipe"):
        fp4attn.attention(*qkv, recipe="fp16")
    with raises(TypeError, "recipe"):
        fp4attn.flash_attn_func(*qkv, recipe=8)


def test_target(qkv):
    with raises(ValueError, "target"):
        fp4attn.attention(*qkv, target="sm80")
    with raises(TypeError, "target"):
        fp4attn.attention(*qkv, target=90)


@pytest.mark.parametrize("bad", [-0.1, 0.0, float("nan"), float("inf")])
def test_scale_values(qkv, bad):
    with raises(ValueError, "scale"):
        fp4attn.attention(*qkv, scale=bad)
    with raises(ValueError, "softmax_scale"):
        fp4attn.flash_attn_func(*qkv, softmax_scale=bad)


def test_scale_type(qkv):
    with raises(TypeError, "scale"):
        fp4attn.sdpa(*bhsd(*qkv), scale="0.1", enable_gqa=True)


def test_flags_must_be_bools(qkv):
    with raises(TypeError, "causal"):
        fp4attn.attention(*qkv, causal="yes")
    with raises(TypeError, "smooth_k"):
        fp4attn.attention(*qkv, smooth_k=None)
    with raises(TypeError, "is_causal"):
        fp4attn.sdpa(*bhsd(*qkv), is_causal=1, enable_gqa=True)


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_non_finite_input(qkv, name):
    q, k, v = (x.copy() for x in qkv)
    {"q": q, "k": k, "v": v}[name][0, 3, 1, 5] = np.nan
    with raises(ValueError, name):
        fp4attn.attention(q, k, v)


def test_features_fp4attn_lacks_take_only_their_off_value(qkv):
    # Kept in the signatures so that positional calls mean what they mean in
    # PyTorch and FlashAttention; any other value is refused, never ignored.
    q, k, v = bhsd(*qkv)
    with raises(ValueError, "attn_mask"):
        fp4attn.sdpa(q, k, v, np.zeros((32, 48), dtype=bool), enable_gqa=True)
    with raises(ValueError, "dropout_p"):
        fp4attn.sdpa(q, k, v, None, 0.1, enable_gqa=True)
    with raises(TypeError, "dropout_p"):
        fp4attn.sdpa(q, k, v, dropout_p=True, enable_gqa=True)
    with raises(ValueError, "dropout_p"):
        fp4attn.flash_attn_func(*qkv, 0.1)  # FlashAttention's fourth argument
    with raises(ValueError, "window_size"):
        fp4attn.flash_attn_func(*qkv, window_size=(-2, 0))
    with raises(TypeError, "window_size"):
        fp4attn.flash_attn_func(*qkv, window_size=(4.0, 0))
    with raises(TypeError, "window_size"):
        fp4attn.flash_attn_func(*qkv, window_size=8)
    with raises(ValueError, "window"):
        fp4attn.attention(*qkv, causal=True, window=(8, 3))  # a causal mask ends rows at the diagonal
    with raises(ValueError, "softcap"):
        fp4attn.flash_attn_func(*qkv, softcap=30.0)
    with raises(ValueError, "alibi_slopes"):
        fp4attn.flash_attn_func(*qkv, alibi_slopes=np.ones(4, dtype=np.float32))
    with raises(TypeError, "deterministic"):
        fp4attn.flash_attn_func(*qkv, deterministic=1)
    with raises(TypeError, "deterministic"):
        fp4attn.flash_attn_varlen_func(qkv[0][0], qkv[1][0], qkv[2][0], [0, qkv[0].shape[1]], [0, qkv[1].shape[1]],
                                       qkv[0].shape[1], qkv[1].shape[1], deterministic="yes")
