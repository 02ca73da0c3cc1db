"""An interpreter that has called each entry point exits without nanobind's leak report: objects of
the extension kept in the package's caches are let go before the interpreter tears the modules down.
"""

import os
import subprocess
import sys
import textwrap

import pytest

# Each entry point once, with and without packed sequences, from bf16/float and from E4M3 inputs.
_NUMPY_CALLS = """
import numpy as np, ml_dtypes, fp4attn
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 14, 2, 64)).astype(np.float32) for _ in range(3))
cu = np.array([0, 5, 14], np.int32)
d = np.ones((2, 2), np.float32)
e = lambda x: x.astype(ml_dtypes.float8_e4m3fn)
fp4attn.flash_attn_func(q, k, v, causal=True)
fp4attn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 9, 9)
fp4attn.flash_attn_func(e(q), e(k), e(v), q_descale=d[:1], k_descale=d[:1], v_descale=d[:1])
fp4attn.flash_attn_varlen_func(e(q[0]), e(k[0]), e(v[0]), cu, cu, 9, 9, q_descale=d, k_descale=d, v_descale=d)
"""

_TORCH_CALLS = """
import torch, fp4attn
dev = "cuda" if torch.cuda.is_available() else "cpu"
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 14, 2, 64, generator=g).to(dev, torch.bfloat16) for _ in range(3))
cu = torch.tensor([0, 5, 14], dtype=torch.int32, device=dev)
d = torch.ones(2, 2, device=dev)
e = lambda x: x.to(torch.float8_e4m3fn)
fp4attn.flash_attn_func(q, k, v, causal=True)
fp4attn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 9, 9)
fp4attn.flash_attn_func(e(q), e(k), e(v), q_descale=d[:1], k_descale=d[:1], v_descale=d[:1])
fp4attn.flash_attn_varlen_func(e(q[0]), e(k[0]), e(v[0]), cu, cu, 9, 9, q_descale=d, k_descale=d, v_descale=d)
"""


def _exit_report(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code) + "\nprint('calls done')"],
                          capture_output=True, text=True, env=dict(os.environ), timeout=300)


@pytest.mark.parametrize("calls", ["numpy", "torch"])
def test_exit_reports_no_leaks(calls):
    if calls == "numpy":
        pytest.importorskip("ml_dtypes")
        code = _NUMPY_CALLS
    else:
        pytest.importorskip("torch")
        code = _TORCH_CALLS
    run = _exit_report(code)
    assert run.returncode == 0 and "calls done" in run.stdout, run.stderr
    assert "leaked" not in run.stderr, run.stderr
