"""Host time per call of small attention calls, where the host and not the GPU
sets the pace: fp4attn's flash_attn_func (recipe fp8, from bf16) on its eager
path and through its torch.library custom op (forced, as torch.compile would
run it), without and with autograd (forward, and forward + backward), against
torch's SDPA with cuDNN BF16 and FA2 BF16, all in one process, rounds
interleaved.

    python3 bench/host_overhead.py --out OUT.json [--commit C]

Each figure is the median over rounds of (wall time of N back-to-back calls,
then one synchronisation) / N; the GPU time of one call is printed beside it
(CUDA events around one call after a synchronisation) so that a host-bound
figure shows as such.
"""
import argparse
import datetime
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fp4attn
from fp4attn import torch_ops

CASES = [(1, 128, 16, 64), (1, 512, 32, 128), (4, 1024, 16, 128)]


def per_call_us(fn, n):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def gpu_us(fn):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    eager_call = torch_ops._eager_call
    rows = []
    for B, S, H, D in CASES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        d_o = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        qtg, ktg, vtg = (x.transpose(1, 2) for x in (qg, kg, vg))

        def ours(grad, backward):
            def fn():
                out = fp4attn.flash_attn_func(qg, kg, vg, causal=True) if grad else \
                    fp4attn.flash_attn_func(q, k, v, causal=True)
                if backward:
                    out.backward(d_o)
            return fn

        def sdpa(backend, grad, backward):
            def fn():
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(*((qtg, ktg, vtg) if grad else (qt, kt, vt)),
                                                         is_causal=True)
                if backward:
                    out.backward(d_o.transpose(1, 2))
            return fn

        impls = {}
        for mode, grad, backward in (("fwd", False, False), ("fwd_grad", True, False), ("fwd_bwd", True, True)):
            impls[f"fp8_eager_{mode}"] = (ours(grad, backward), True)
            impls[f"fp8_op_{mode}"] = (ours(grad, backward), False)
            impls[f"cudnn_{mode}"] = (sdpa(SDPBackend.CUDNN_ATTENTION, grad, backward), True)
            impls[f"fa2_{mode}"] = (sdpa(SDPBackend.FLASH_ATTENTION, grad, backward), True)
        host = {n: [] for n in impls}
        gpu = {}
        for rnd in range(args.rounds):
            for n, (fn, eager) in impls.items():
                torch_ops._eager_call = eager_call if eager else (lambda a: False)
                try:
                    host[n].append(per_call_us(fn, args.calls))
                    if rnd == 0:
                        gpu[n] = gpu_us(fn)
                finally:
                    torch_ops._eager_call = eager_call
                for x in (qg, kg, vg):
                    x.grad = None
        row = dict(B=B, S=S, H=H, D=D, causal=True, host_us={n: round(statistics.median(t), 1) for n, t in host.items()},
                   gpu_us_one_call={n: round(t, 1) for n, t in gpu.items()},
                   rounds_us={n: [round(x, 1) for x in t] for n, t in host.items()})
        rows.append(row)
        print(f"B={B} S={S} H={H} D={D}: " + "  ".join(f"{n} {t}" for n, t in row["host_us"].items()), flush=True)
    out = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), commit=args.commit,
               torch=torch.__version__, command="python3 bench/host_overhead.py " + " ".join(sys.argv[1:]), rows=rows)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
