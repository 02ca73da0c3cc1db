#!/usr/bin/env python3
"""How fast does the H200's power control pull the SM clock down, for this
library's kernel and for cuDNN BF16? A burst benchmark (10–30 calls) lasts
10–50 ms; if one implementation reaches the card's power limit inside that
window and the other does not, short bursts and sustained runs rank them
differently.

From an idle card, each implementation runs back to back for --ms
milliseconds, then the card idles --idle-ms; nvidia-smi samples the SM clock
and the instantaneous power every --sample-ms. Every call's end is timed with
CUDA events, so the rate can be read against the time since the run began.
Read-only: the card's settings are not touched.

    python3 bench/power_ramp.py --lib build/libfp4attn_capi.so --out OUT [--shape 128:4096:0]
"""
import argparse
import datetime
import json
import os
import subprocess
import time

import torch
from torch.nn.attention import SDPBackend

from bench_fwd import Ours, flops, grid_problem, sdpa
from capi_lib import load_lib

FIELDS = "timestamp,clocks.sm,power.draw.instant,temperature.gpu"
OLD_FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu"  # drivers without the instantaneous reading


def query_fields():
    ok = subprocess.run(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv"], capture_output=True).returncode == 0
    return FIELDS if ok else OLD_FIELDS


def run_for(fn, ms):
    """Calls fn back to back for `ms`; returns (host start, per-call (end offset ms, duration ms))."""
    torch.cuda.synchronize()
    t0 = time.time()
    calls, i = [], 0
    while (time.time() - t0) * 1e3 < ms:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(i)
        end.record()
        calls.append((start, end))
        i += 1
        if len(calls) % 4 == 0:
            end.synchronize()
    torch.cuda.synchronize()
    first = calls[0][0]
    return t0, [(round(first.elapsed_time(e), 3), round(s.elapsed_time(e), 4)) for s, e in calls]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="128:4096:0", help="D:S:causal, B = 32768 // S, H = 2048 // D")
    ap.add_argument("--ms", type=float, default=400.0)
    ap.add_argument("--idle-ms", type=float, default=1500.0)
    ap.add_argument("--sample-ms", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib, ll3 = load_lib(args.lib)
    B, H, S, D, causal = grid_problem(args.shape)
    g = torch.Generator(device="cuda").manual_seed(1)
    sets = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            for _ in range(2)]
    ours = Ours(lib, ll3, sets, B, H, S, D, causal)
    ours.set_direct_p(True)
    impls = {"fp4attn": ours.attend, "cudnn_bf16": sdpa(SDPBackend.CUDNN_ATTENTION, sets, causal)}
    for fn in impls.values():  # compile, plan, warm caches
        for i in range(3):
            fn(i)
    torch.cuda.synchronize()
    fl = flops(B, H, S, D, causal)
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={query_fields()}", "--format=csv,noheader,nounits",
                            "-lms", str(args.sample_ms)], stdout=subprocess.PIPE, text=True)
    time.sleep(args.idle_ms / 1e3)
    runs = []
    for rep in range(args.repeats):
        for name, fn in impls.items():
            t0, calls = run_for(fn, args.ms)
            runs.append(dict(impl=name, repeat=rep, host_start=t0, calls=calls))
            time.sleep(args.idle_ms / 1e3)
    smi.terminate()
    samples = []
    for line in smi.communicate()[0].splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            stamp = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append(dict(t=stamp, sm_mhz=int(parts[1]), power_w=float(parts[2]), temp_c=int(parts[3])))
        except (ValueError, IndexError):
            continue
    # Per run: TFLOP/s of the calls ending in successive 10 ms windows, and the
    # samples taken during the run (time relative to its start).
    summary = []
    for r in runs:
        windows = {}
        for end_ms, dur in r["calls"]:
            windows.setdefault(int(end_ms // 10), []).append(dur)
        rate = {10 * k: round(fl / (sum(v) / len(v) * 1e-3) / 1e12, 1) for k, v in sorted(windows.items())}
        during = [dict(t_ms=round((s["t"] - r["host_start"]) * 1e3, 1), sm_mhz=s["sm_mhz"], power_w=s["power_w"])
                  for s in samples if r["host_start"] <= s["t"] <= r["host_start"] + args.ms / 1e3 + 0.05]
        summary.append(dict(impl=r["impl"], repeat=r["repeat"], tflops_by_10ms=rate, samples=during))
        first = [v for k, v in rate.items() if k < 20]
        late = [v for k, v in rate.items() if k >= args.ms - 100]
        print(f"{r['impl']:10s} rep {r['repeat']}: first 20 ms {sum(first) / max(len(first), 1):7.1f} TFLOP/s, "
              f"last 100 ms {sum(late) / max(len(late), 1):7.1f}; SM clock "
              + " ".join(f"{d['t_ms']:.0f}:{d['sm_mhz']}" for d in during[::max(1, len(during) // 12)]))
    with open(os.path.join(args.out, "power-ramp.json"), "w") as f:
        json.dump(dict(date=args.date, gpu=torch.cuda.get_device_name(), commit=args.commit,
                       command="python3 bench/power_ramp.py " + " ".join(
                           f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("lib", "out")),
                       B=B, H=H, S=S, D=D, causal=causal, runs=summary), f, indent=1)
    ours.close()


if __name__ == "__main__":
    main()
