#!/usr/bin/env python3
"""Read bandwidth of plain torch reductions and a device copy on the GPU, at the
sizes the quantizers' statistics passes read (134 MB: B·S = 32k, H = 16, D =
128, bf16), and larger. What a read-only pass of that size can reach here,
beside the quantizers' amax and mean passes (src/cuda/quantize/NOTES-fp4.md).

Each case alternates two inputs and takes the median of --reps CUDA-event
timings after warm-up. TB/s counts the bytes read (a copy: read + write).
"""
import argparse
import datetime
import json
import os

import torch


def median_ms(fn, reps, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes-mb", default="134,268,1024")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for mb in map(int, args.sizes_mb.split(",")):
        n = mb * 2**20 // 2
        xs = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        rows2048 = [x.view(-1, 2048) for x in xs]
        y = torch.empty_like(xs[0])
        turn = [0]

        def pick(seq):
            turn[0] ^= 1
            return seq[turn[0]]
        cases = (("sum", lambda: pick(xs).sum(dtype=torch.float32), 2 * n),
                 ("column sums (rows of 2048)", lambda: pick(rows2048).sum(dim=0, dtype=torch.float32), 2 * n),
                 ("copy", lambda: y.copy_(pick(xs)), 4 * n))
        for name, fn, nbytes in cases:
            ms = median_ms(fn, args.reps)
            rows.append(dict(size_mb=mb, case=name, us=round(ms * 1e3, 1), tbps=round(nbytes / ms / 1e9, 2)))
            print(f"{mb:5d} MB {name:28s} {ms * 1e3:8.1f} us {nbytes / ms / 1e9:6.2f} TB/s", flush=True)
        del xs, rows2048, y
        torch.cuda.empty_cache()
    cmd = "python3 bench/read_bandwidth.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                                        if k != "out")
    result = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), commit=args.commit,
                  command=cmd, rows=rows)
    with open(os.path.join(args.out, "read-bandwidth.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
