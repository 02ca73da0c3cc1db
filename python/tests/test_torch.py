"""The torch layer: drop-in agreement with torch's SDPA, the custom op's
registration (fake kernel, torch.compile without graph breaks), and the
backward error. Runs only where torch is installed; the CUDA cases only on a GPU."""

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


def test_custom_op_registration():
    q, k, v = make_bhsd(4, 1, 2, 2, 32, 48, 64, "cpu")
    args = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), "bshd", "causal", 0.0, "fp8", True, True, True, "q,k,v", "sm90")
    torch.library.opcheck(torch.ops.fp4attn.attention.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    q, k, v = make_bhsd(5, 1, 2, 2, 64, 64, 64, device)

    def block(q, k, v):
        return fp4attn.sdpa(q, k, v, is_causal=True) * 2.0

    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(q, k, v), block(q, k, v), rtol=0, atol=0)


@pytest.mark.parametrize("recipe,message", [("fp8", "backward of recipe fp8 is not available yet"), ("mxfp4", "inference-only")])
def test_backward_raises_clearly(recipe, message):
    q, k, v = (x.requires_grad_() for x in make_bhsd(6, 1, 2, 2, 32, 32, 64, "cpu"))
    out = fp4attn.sdpa(q, k, v, recipe=recipe)
    with pytest.raises(NotImplementedError, match=message):
        out.sum().backward()


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
