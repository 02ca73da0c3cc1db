#!/usr/bin/env python3
"""What the packed forward's query blocks past a sequence's end cost: one packed batch on
FlashAttention-3's E4M3 inputs (no quantizer in the call) run with max_seqlen_q = max_seqlen_k
at the batch's longest length and above it. The grid spans max_seqlen's query blocks for every
sequence, so each step up adds blocks that return at once; the forward kernel's device time
(torch.profiler, mean of --calls calls) against the count of those blocks gives their cost.

    python3 dev/varlen_grid/empty_ctas.py --out OUT.json [--case encoder_64_short] [--commit C]
"""
import argparse
import datetime
import json
import math
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from bench_varlen import case_batch  # noqa: E402

import fp4attn  # noqa: E402


def kernel_us(fn, calls):
    """Mean device µs a call of each kernel whose name holds 'forward', over `calls` calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.count >= calls:
            out[e.key[:60]] = round(e.device_time_total / calls, 2) if hasattr(e, "device_time_total") \
                else round(e.cuda_time_total / calls, 2)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", default="encoder_64_short")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    c = case_batch(args.case)
    name, lens, hq, hkv, d, causal, cu = c[:7]
    (q8, dq), (k8, dk), (v8, dv) = c.e4m3
    top = max(lens)
    # Up to 1024: the launcher's choice of kernel (one consumer where the longest ≤ 1024 at D = 64) stays.
    tops = [top] + [m for m in (640, 768, 896, 1024) if m > top]
    rows = []
    for r in range(args.rounds):
        for m in tops:
            fn = lambda: fp4attn.flash_attn_varlen_func(q8, k8, v8, cu, cu, m, m, causal=causal,  # noqa: E731
                                                         q_descale=dq, k_descale=dk, v_descale=dv)
            with torch.inference_mode():
                us = kernel_us(fn, args.calls)
            tiles = {t: sum(math.ceil(x / t) for x in lens) for t in (64, 128)}
            row = dict(round=r, max_seqlen=m, grid_tiles_per_head={t: len(lens) * math.ceil(m / t) for t in (64, 128)},
                       nonempty_tiles_per_head=tiles, kernels_us=us)
            print(r, m, us, flush=True)
            rows.append(row)
    with open(args.out, "w") as f:
        json.dump(dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), commit=args.commit,
                       command="python3 dev/varlen_grid/empty_ctas.py " + " ".join(sys.argv[1:]), case=name,
                       lengths=lens, Hq=hq, Hkv=hkv, D=d, causal=causal, torch=torch.__version__, rows=rows),
                  f, indent=1)


if __name__ == "__main__":
    main()
