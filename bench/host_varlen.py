#!/usr/bin/env python3
"""Host time of one eager flash_attn_varlen_func call (recipe fp8 from bf16, and on FP8 inputs with
per-sequence descales) beside torch's FA2 varlen attention and cuDNN BF16 called per sequence, in
one process: the host's cost per call, measured as the wall time of 10 calls issued back to back
after the GPU has drained (the launch queue does not fill in 10 calls), median of --batches.

Rows are appended to --out under --label, so that two trees of the package (PYTHONPATH) run in
alternating processes make an A/B of their Python layers on the same machine:

    PYTHONPATH=<site A> python3 bench/host_varlen.py --out OUT.json --label before
    PYTHONPATH=<site B> python3 bench/host_varlen.py --out OUT.json --label after
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_varlen import case_batch, torch_varlen  # noqa: E402

import fp4attn  # noqa: E402


def host_us(fn, batches: int, calls: int = 10) -> list:
    """Host µs per call of `calls` calls issued back to back from a drained GPU, one figure a batch."""
    for _ in range(3):
        fn()
    per = []
    for _ in range(batches):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return per


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", required=True, help="names this process's rows (e.g. the package's tree)")
    ap.add_argument("--case", default="encoder_64_short", help="a bench_varlen.py case")
    ap.add_argument("--batches", type=int, default=15)
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    c = case_batch(args.case)
    name, lens, hq, hkv, d, causal, cu, bounds, q, k, v = c[:11]
    (q8, dq), (k8, dk), (v8, dv) = c.e4m3
    top = max(lens)
    impls = {
        "fp8": lambda: fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, top, top, causal=causal),
        "fp8_e4m3_inputs": lambda: fp4attn.flash_attn_varlen_func(q8, k8, v8, cu, cu, top, top, causal=causal,
                                                                  q_descale=dq, k_descale=dk, v_descale=dv),
    }
    varlen_attn = torch_varlen()
    if varlen_attn is not None:
        kk, vv = (x.repeat_interleave(hq // hkv, dim=1) for x in (k, v))
        window = (-1, 0) if causal else (-1, -1)
        impls["torch_varlen_fa2"] = lambda: varlen_attn(q, kk, vv, cu, cu, top, top, window_size=window)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for a, b in zip(bounds, bounds[1:]):
                qs, ks, vs = (x[a:b].unsqueeze(0).transpose(1, 2) for x in (q, k, v))
                F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=hq != hkv)
    impls["cudnn_per_sequence"] = cudnn
    with torch.inference_mode():
        per = {n: host_us(fn, args.batches) for n, fn in impls.items()}
    row = dict(label=args.label, case=name, lengths=lens, Hq=hq, Hkv=hkv, D=d, causal=causal,
               host_us_median={n: round(statistics.median(p), 1) for n, p in per.items()},
               host_us_min={n: round(min(p), 1) for n, p in per.items()})
    print(f"{args.label} {name}: host us per call (median) " +
          "  ".join(f"{n} {t}" for n, t in row["host_us_median"].items()), flush=True)
    result = {"rows": []}
    if os.path.exists(args.out):
        with open(args.out) as f:
            result = json.load(f)
    result.update(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), commit=args.commit,
                  torch=torch.__version__, command="python3 bench/host_varlen.py " + " ".join(sys.argv[1:]),
                  host=subprocess.run(["uname", "-n"], capture_output=True, text=True).stdout.strip())
    result["rows"].append(row)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
