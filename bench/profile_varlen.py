"""Kernel time of one varlen forward + backward (flash_attn_varlen_func, recipe
fp8, dO random) against torch's packed varlen attention (FA2's varlen
kernel), by the torch profiler: each kernel's device time per step, largest
first, and the step's event-timed wall time and host issue time.

    python3 bench/profile_varlen.py [--case NAME ...] [--forward]

--forward profiles the inference forward instead (no gradients): recipe fp8 from
bf16, recipe fp8 on FP8 inputs with per-sequence descales (bench_varlen.py's
fp8_e4m3_inputs) and torch's varlen attention.

Cases are bench_varlen.py's. Diagnostic output only (no JSON): the figures
that go into results come from bench_varlen.py.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_varlen import CASES, to_e4m3, torch_varlen  # noqa: E402
from capi_lib import kernel_launches, time_ms  # noqa: E402

import fp4attn  # noqa: E402

STEPS = 10


def forward_steps(q, k, v, cu, lens, hq, hkv, causal, varlen_attn) -> dict:
    """The inference forward of each implementation, under torch.inference_mode."""
    bounds = cu.tolist()
    (q8, dq), (k8, dk), (v8, dv) = (to_e4m3(x.detach(), bounds, hkv) for x in (q, k, v))
    top = max(lens)
    calls = {
        "fp8": lambda i: fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, top, top, causal=causal),
        "fp8_e4m3_inputs": lambda i: fp4attn.flash_attn_varlen_func(q8, k8, v8, cu, cu, top, top, causal=causal,
                                                                    q_descale=dq, k_descale=dk, v_descale=dv),
    }
    if varlen_attn is not None:
        kk, vv = (x.detach().repeat_interleave(hq // hkv, dim=1) for x in (k, v))
        window = (-1, 0) if causal else (-1, -1)
        calls["torch_varlen_fa2"] = lambda i: varlen_attn(q, kk, vv, cu, cu, top, top, window_size=window)

    def no_grad(fn):
        def run(i):
            with torch.inference_mode():
                return fn(i)
        return run
    return {n: no_grad(fn) for n, fn in calls.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", help="bench_varlen.py case names (default: all)")
    ap.add_argument("--forward", action="store_true", help="the inference forward (with FP8 inputs too)")
    args = ap.parse_args()
    varlen_attn = torch_varlen()
    for name, lens, hq, hkv, d, causal in CASES:
        if args.case and name not in args.case:
            continue
        total = sum(lens)
        cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
        q = torch.randn(total, hq, d, device="cuda", dtype=torch.bfloat16).requires_grad_()
        k = (torch.randn(total, hkv, d, device="cuda", dtype=torch.bfloat16) + 0.5).requires_grad_()
        v = torch.randn(total, hkv, d, device="cuda", dtype=torch.bfloat16).requires_grad_()
        d_o = torch.randn_like(q)
        steps = {"fp8": lambda i: fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens),
                                                                 causal=causal).backward(d_o)}
        if varlen_attn is not None:
            kk, vv = (x.detach().repeat_interleave(hq // hkv, dim=1).requires_grad_() for x in (k, v))
            window = (-1, 0) if causal else (-1, -1)
            steps["torch_varlen_fa2"] = lambda i: varlen_attn(q, kk, vv, cu, cu, max(lens), max(lens),
                                                              window_size=window).backward(d_o)
        if args.forward:
            steps = forward_steps(q, k, v, cu, lens, hq, hkv, causal, varlen_attn)
        for impl, step in steps.items():
            wall = min(time_ms(step, STEPS, 2, queued=True) for _ in range(3))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(STEPS):
                step(i)
            host_us = (time.perf_counter() - t0) / STEPS * 1e6
            torch.cuda.synchronize()
            table = kernel_launches(step, STEPS)
            print(f"{name} {impl}: step {wall * 1e3:.0f} us (events), host issue {host_us:.0f} us, kernels "
                  f"{sum(us for _, us in table.values()):.0f} us", flush=True)
            for kernel, (launches, us) in list(table.items())[:14]:
                print(f"    {us:8.1f} us  x{launches:g}  {kernel[:90]}")


if __name__ == "__main__":
    main()
