#!/usr/bin/env python3
"""Where does the spread of burst figures between processes come from?

One problem shape, several input sets in one process, each timed in turn for
several rounds, for this library's kernel (recipe fp8, Direct-P, on
pre-quantized inputs) and cuDNN BF16:

  * sets drawn from fixed seeds, so two processes see the same data;
  * one more set that copies the first set's data into a fresh allocation,
    so data and placement can be told apart within one process.

Run it as several processes on one device: if the sets of one process agree
with each other and the processes differ, the spread is the process's (or the
device's) state, not the data or the addresses; if the copy differs from its
original, placement matters; if the seeds differ alike in every process, the
data does.

    python3 bench/variance_probe.py --lib build/libfp4attn_capi.so --out OUT --label p1
"""
import argparse
import datetime
import json
import os
import statistics

import torch
from torch.nn.attention import SDPBackend

from bench_fwd import Ours, flops, grid_problem, sdpa
from capi_lib import host_gap_us, load_lib, time_ms
from clock_under_load import sm_clock


def probe_mhz(cycles=200_000):
    """The SM clock right now: a spin of `cycles` clocks (torch.cuda._sleep) timed by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) * 1e3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", required=True, help="names this process's JSON")
    ap.add_argument("--shape", default="128:4096:0", help="D:S:causal, B = 32768 // S, H = 2048 // D")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--queued", action="store_true",
                    help="queue each burst's calls back to back instead of waiting for each")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib, ll3 = load_lib(args.lib)
    B, H, S, D, causal = grid_problem(args.shape)
    seeds = [int(s) for s in args.seeds.split(",")]
    sets, names = [], []
    for seed in seeds:
        g = torch.Generator(device="cuda").manual_seed(seed)
        sets.append(tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
                          for _ in range(3)))
        names.append(f"seed{seed}")
    sets.append(tuple(t.clone() for t in sets[0]))
    names.append(f"seed{seeds[0]}-copy")
    impls = []
    for name, qkv in zip(names, sets):
        ours = Ours(lib, ll3, [qkv], B, H, S, D, causal)
        ours.set_direct_p(True)
        impls.append((name, "fp4attn", ours.attend, ours))
        impls.append((name, "cudnn_bf16", sdpa(SDPBackend.CUDNN_ATTENTION, [qkv], causal), None))
    fl = flops(B, H, S, D, causal)
    probe_mhz()  # the first spin pays for loading its kernel
    times = {(n, i): [] for n, i, _, _ in impls}
    burst_mhz = {(n, i): [] for n, i, _, _ in impls}  # the SM clock right after each burst
    clocks = []
    for r in range(args.rounds):
        order = impls[2 * (r % len(sets)):] + impls[:2 * (r % len(sets))]
        for name, impl, fn, _ in order:
            times[(name, impl)].append(time_ms(fn, args.reps, args.warmup, queued=args.queued))
            burst_mhz[(name, impl)].append(round(probe_mhz(), 1))
        clocks.append(sm_clock())
    rows = []
    for (name, impl), ts in times.items():
        med = statistics.median(ts)
        rows.append(dict(set=name, impl=impl, ms=round(med, 4), tflops=round(fl / (med * 1e-3) / 1e12, 1),
                         ms_rounds=[round(t, 4) for t in ts], mhz_after_burst=burst_mhz[(name, impl)]))
    for name in names:
        ours_tf = next(r["tflops"] for r in rows if r["set"] == name and r["impl"] == "fp4attn")
        cudnn_tf = next(r["tflops"] for r in rows if r["set"] == name and r["impl"] == "cudnn_bf16")
        mhz = {i: statistics.median(burst_mhz[(name, i)]) for i in ("fp4attn", "cudnn_bf16")}
        print(f"{args.label} {name:12s} fp4attn {ours_tf:7.1f}  cudnn {cudnn_tf:6.1f}  ratio {ours_tf / cudnn_tf:.3f}"
              f"  MHz after bursts: fp4attn {mhz['fp4attn']:.0f} cudnn {mhz['cudnn_bf16']:.0f}")
    gaps = {f"{n}/{i}": round(host_gap_us(fn, 20), 1) for n, i, fn, _ in impls[:2]}
    print(f"{args.label} GPU idle per call when each call waits for the last (us): {gaps}")
    addresses = {n: [hex(t.data_ptr()) for t in qkv] for n, qkv in zip(names, sets)}
    with open(os.path.join(args.out, f"variance-{args.label}.json"), "w") as f:
        json.dump(dict(date=args.date, gpu=torch.cuda.get_device_name(), commit=args.commit,
                       command="python3 bench/variance_probe.py " + " ".join(
                           f"--{k} {v}" for k, v in vars(args).items() if k not in ("lib", "out")),
                       B=B, H=H, S=S, D=D, causal=causal, pid=os.getpid(), sm_clock_after_rounds=clocks,
                       input_addresses=addresses, host_gap_us=gaps, rows=rows), f, indent=1)
    for _, _, _, ours in impls:
        if ours is not None:
            ours.close()


if __name__ == "__main__":
    main()
