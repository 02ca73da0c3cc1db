"""fp4attn.quantize: layouts of codes and scales, round trips, and the codes
against ml_dtypes' casts as an independent oracle."""

import numpy as np
import pytest

import fp4attn

SHAPE = (2, 40, 3, 64)  # (B, S, H, D); S is not a multiple of any scale block
FP8_TOKEN_BLOCK = 16


@pytest.fixture
def x(rng):
    # Spread over several binades, so blocks get different scales.
    return (rng.standard_normal(SHAPE) * np.exp2(rng.integers(-4, 5, size=SHAPE))).astype(np.float32)


def expected_scale_shape(fmt, axis, block):
    B, S, H, D = SHAPE
    s_blocks = -(-S // block)
    if fmt == "fp8_e4m3":
        return (B, H, s_blocks) if axis == "along_d" else (B, H, D)
    return (B, S, H, D // block) if axis == "along_d" else (B, s_blocks, H, D)


def per_element_scale(t):
    """The scale each element was divided by, spread to (B, S, H, D) from the documented scale layout."""
    B, S, H, D = t.shape
    if t.format.name == "fp8_e4m3":
        if t.axis.name == "along_d":
            return np.repeat(t.scales.transpose(0, 2, 1), t.block, axis=1)[:, :S, :, None]
        return t.scales[:, None, :, :]
    if t.axis.name == "along_d":
        scale = np.repeat(t.scales, t.block, axis=-1)
    else:
        scale = np.repeat(t.scales, t.block, axis=1)[:, :S]
    # NVFP4 values are code · block scale / tensor scale.
    return scale / t.tensor_scale if t.format.name == "nvfp4" else scale


@pytest.mark.parametrize("axis", ["along_d", "along_s"])
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "mxfp4", "nvfp4"])
def test_round_trip(x, fmt, axis):
    t = fp4attn.quantize(x, fmt, axis=axis, fp8_token_block=FP8_TOKEN_BLOCK)
    assert t.shape == SHAPE and t.codes.shape == SHAPE and t.codes.dtype == np.uint8
    assert t.scales.shape == expected_scale_shape(fmt, axis, t.block)
    fp4 = fmt != "fp8_e4m3"
    if fp4:
        assert t.codes.max() <= 15  # one E2M1 code per byte
        assert t.scale_codes.shape == t.scales.shape
    else:
        assert t.scale_codes is None
    y = t.dequantize()
    assert y.shape == SHAPE and y.dtype == np.float32
    # Round to nearest: within half a step of the element format, relative
    # 2^-4 for E4M3 and 2^-2 for E2M1, or half the smallest step near zero
    # (E4M3 subnormals 2^-9, E2M1 0.5), in units of the element's scale.
    rel, half_min_step = (0.25, 0.25) if fp4 else (2.0**-4, 2.0**-10)
    scale = per_element_scale(t)
    assert np.all(np.abs(y - x) <= np.maximum(rel * np.abs(x), half_min_step * scale) * (1 + 1e-6))
    relative_l2 = np.linalg.norm(y - x) / np.linalg.norm(x)
    assert relative_l2 < (0.2 if fp4 else 0.05)
    # Dequantized values are representable: quantizing them again changes nothing.
    again = fp4attn.quantize(y, fmt, axis=axis, fp8_token_block=FP8_TOKEN_BLOCK).dequantize()
    np.testing.assert_array_equal(again, y)


def test_fp8_codes_match_ml_dtypes(x):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    t = fp4attn.quantize(x, "fp8_e4m3", fp8_token_block=FP8_TOKEN_BLOCK)
    oracle = (x / per_element_scale(t)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(t.codes, oracle)


def test_mxfp4_codes_match_ml_dtypes(x):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    t = fp4attn.quantize(x, "mxfp4")
    # E8M0: the scale is the power of two 2^(code - 127).
    np.testing.assert_array_equal(t.scales, np.exp2(t.scale_codes.astype(np.float64) - 127))
    oracle = (x / per_element_scale(t)).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    np.testing.assert_array_equal(t.codes, oracle)


def test_views_keep_the_tensor_alive(x):
    codes = fp4attn.quantize(x, "nvfp4").codes
    expected = fp4attn.quantize(x, "nvfp4").codes.copy()
    np.testing.assert_array_equal(codes, expected)


def test_bad_arguments(x):
    with pytest.raises(ValueError, match="^fmt: "):
        fp4attn.quantize(x, "int4")
    with pytest.raises(ValueError, match="^axis: "):
        fp4attn.quantize(x, "mxfp4", axis="along_h")
    with pytest.raises(ValueError, match="^mx_scale_rule: "):
        fp4attn.quantize(x, "mxfp4", mx_scale_rule="floor")
    with pytest.raises(TypeError, match="^fp8_token_block: "):
        fp4attn.quantize(x, "fp8_e4m3", fp8_token_block=1.5)
    with pytest.raises(ValueError, match="^fp8_token_block: "):
        fp4attn.quantize(x, "fp8_e4m3", fp8_token_block=0)
    with pytest.raises(ValueError, match="^x: "):
        fp4attn.quantize(x[..., :48], "mxfp4")  # D not a multiple of the 32-wide block
    with pytest.raises(TypeError, match="^x: "):
        fp4attn.quantize(x.astype(np.int16), "mxfp4")
    bad = x.copy()
    bad[1, 2, 0, 3] = np.inf
    with pytest.raises(ValueError, match="^x: "):
        fp4attn.quantize(bad, "nvfp4")
