"""Shared test data and the calibrated error bounds of the Python suite.

Bounds: twice the worst error the emulator showed over 12 seeds of the
problems below (numbers printed by `python python/tests/calibrate_bounds.py`
with the package on PYTHONPATH), compared with the fp64 NumPy reference on the
unquantized inputs, i.e. the whole recipe error. Worst cases measured:
  fp8          1-cos 1.57e-3  rel L2 0.056  |dLSE| 0.114
  mxfp4        1-cos 4.11e-2  rel L2 0.313  |dLSE| 0.854
  nvfp4        1-cos 2.12e-2  rel L2 0.211  |dLSE| 0.492
  mxfp4_train  1-cos 1.78e-2  rel L2 0.189  |dLSE| 0.854
"""

import zlib
from typing import NamedTuple

import numpy as np
import pytest



def _device_backward_available() -> bool:
    """Whether the sm90 backward kernels run here: torch with CUDA, a compute-capability 9.0 GPU and
    a build that has them."""
    try:
        import torch
    except ImportError:
        return False
    import fp4attn

    return (torch.cuda.is_available() and fp4attn.backend_info()["sm90_available"]
            and hasattr(fp4attn._ext, "backward_device"))


needs_device_backward = pytest.mark.skipif(
    not _device_backward_available(), reason="needs the sm90 backward kernel and a compute-capability 9.0 GPU"
)

class Bounds(NamedTuple):
    one_minus_cos: float
    rel_l2: float
    lse: float  # max |LSE - LSE_ref| over rows with a visible key


BOUNDS = {
    "fp8": Bounds(3.5e-3, 0.12, 0.25),
    "mxfp4": Bounds(8.5e-2, 0.65, 1.75),
    "nvfp4": Bounds(4.5e-2, 0.43, 1.0),
    "mxfp4_train": Bounds(3.7e-2, 0.38, 1.75),
}


class GradBounds(NamedTuple):
    rel_l2: float
    one_minus_cos: float


# The emulator's calibrated backward bounds (tests/test_emulator_backward.cpp,
# kBackwardBounds, smooth_k and Direct-P on, E4M3 dS; docs/accuracy.md): twice
# the worst 1 − cos and rel L2 over dQ, dK, dV against the fp64 reference on
# the unquantized inputs.
GRAD_BOUNDS = {"fp8": GradBounds(2.36e-01, 1.39e-02), "mxfp4_train": GradBounds(9.20e-01, 1.94e-01)}

# (B, Sq, Sk, Hq, Hkv, D): GQA, equal lengths with odd sizes, MQA with Sk > the
# 128-key tile; head dims 64, 32, 128.
SHAPES = [(1, 48, 80, 4, 2, 64), (2, 33, 33, 2, 2, 32), (1, 64, 200, 2, 1, 128)]

# Keys carry a common offset, as real keys do; smooth_k exists for it.
K_OFFSET = 0.5


def make_qkv(rng, B, Sq, Sk, Hq, Hkv, D, k_offset=K_OFFSET):
    """Random (B, S, H, D) float32 q, k, v."""
    q = rng.standard_normal((B, Sq, Hq, D)).astype(np.float32)
    k = (rng.standard_normal((B, Sk, Hkv, D)) + k_offset).astype(np.float32)
    v = rng.standard_normal((B, Sk, Hkv, D)).astype(np.float32)
    return q, k, v


@pytest.fixture
def rng(request):
    # A fresh, reproducible stream per test: the seed follows from the test's name.
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
