#!/usr/bin/env python3
"""SM clock, power and throttle reasons while one forward implementation runs
back to back (recipe fp8 with Direct-P, or with exp2 P by --direct-p 0, from
pre-quantized inputs; cuDNN BF16 SDPA), sampled by nvidia-smi every 100 ms. Read-only: it queries the card and
changes none of its settings.

    python3 bench/clock_under_load.py --lib build/libfp4attn_capi.so --out OUT [--seconds 8]

Why: long calls of the FP8 kernel measured lower and more spread out than
short ones (S = 16k against 8k in one process). If the card lowers its clock
under the FP8 kernel's load and not under cuDNN's, the ratio at long
sequences carries that. Writes OUT/clock-under-load.json and prints one line
per run: median SM clock, median power, the throttle reasons seen, and the
run's TFLOP/s from CUDA events over the same loop.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import time

import torch
from torch.nn.attention import SDPBackend

from bench_fwd import Ours, flops, sdpa
from capi_lib import load_lib

FIELDS = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"
OLD_FIELDS = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"  # drivers before the rename


def sm_clock():
    """The SM clock now, in MHz, as nvidia-smi reads it (None if it cannot)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.strip()
    return int(out) if out.isdigit() else None


def query_fields():
    ok = subprocess.run(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv"], capture_output=True).returncode == 0
    return FIELDS if ok else OLD_FIELDS


def sampled(fn, seconds):
    """Runs fn(i) back to back for `seconds` with nvidia-smi sampling; returns (ms per call, samples)."""
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={query_fields()}", "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    try:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0, calls = time.time(), 0
        start.record()
        while time.time() - t0 < seconds:
            for _ in range(8):
                fn(calls)
                calls += 1
            torch.cuda.synchronize()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / calls
    finally:
        smi.terminate()
    out, _ = smi.communicate()
    rows = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            rows.append(dict(sm_mhz=float(parts[0]), watts=float(parts[1]), temp_c=float(parts[2]), reasons=parts[3]))
        except (ValueError, IndexError):
            continue
    return ms, rows[2:]  # the first samples predate the load


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--cases", default="128:16384:0,128:4096:0", help="D:S:causal triples")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--commit", default="")
    ap.add_argument("--direct-p", type=int, default=1, choices=(0, 1),
                    help="0: recipe fp8 with P by exp2 and a rounding convert (the comparison path)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib, ll3 = load_lib(args.lib)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    rows = []
    for D, S, causal in [(int(d), int(s), bool(int(c))) for d, s, c in (t.split(":") for t in args.cases.split(","))]:
        H = 16 if D == 128 else 32
        B = 32768 // S
        sets = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)) for _ in range(2)]
        ours = Ours(lib, ll3, sets, B, H, S, D, causal)
        ours.set_direct_p(bool(args.direct_p))
        for impl, fn in (("fp4attn_fp8", ours.attend), ("cudnn_bf16", sdpa(SDPBackend.CUDNN_ATTENTION, sets, causal)),
                         ("fp4attn_fp8_again", ours.attend)):
            for i in range(10):
                fn(i)
            torch.cuda.synchronize()
            ms, samples = sampled(fn, args.seconds)
            tf = flops(B, H, S, D, causal) / (ms * 1e-3) / 1e12
            clk = statistics.median(s["sm_mhz"] for s in samples) if samples else float("nan")
            watts = statistics.median(s["watts"] for s in samples) if samples else float("nan")
            reasons = sorted({s["reasons"] for s in samples})
            rows.append(dict(impl=impl, D=D, S=S, B=B, H=H, causal=causal, direct_p=bool(args.direct_p),
                             ms=round(ms, 4), tflops=round(tf, 1),
                             sm_mhz_median=clk, sm_mhz_min=min((s["sm_mhz"] for s in samples), default=None),
                             watts_median=watts, temp_c_max=max((s["temp_c"] for s in samples), default=None),
                             reasons=reasons, samples=len(samples)))
            print(f"D={D} S={S:5d} causal={int(causal)} {impl:18s} {tf:7.1f} TF/s  SM {clk:6.0f} MHz "
                  f"(min {rows[-1]['sm_mhz_min']})  {watts:5.0f} W  max {rows[-1]['temp_c_max']} C  reasons {reasons}",
                  flush=True)
        ours.close()
        del sets
        torch.cuda.empty_cache()
    cmd = "python3 bench/clock_under_load.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k not in ("out", "lib"))
    with open(os.path.join(args.out, "clock-under-load.json"), "w") as f:
        json.dump(dict(date=args.date, gpu=torch.cuda.get_device_name(), commit=args.commit, command=cmd,
                       note="nvidia-smi samples every 100 ms during back-to-back calls; reasons are "
                            "clocks_event_reasons.active bit masks as nvidia-smi prints them", rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
