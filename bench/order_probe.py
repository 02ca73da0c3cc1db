#!/usr/bin/env python3
"""Does the timing protocol move the ratio to cuDNN? One problem, the same
implementations, timed under several orders in one process.

The grid (bench_fwd.py) times short bursts (5 warm-up + 10 timed calls) in a
fixed order per round: ours (Direct-P), ours (exp2), end to end, quantizer,
cuDNN BF16, FA2 BF16. At D = 128 the H200 runs at its 700 W limit, and a burst
of 10 ms is too short for the card's power control to settle, so a burst may
inherit the clock its predecessor left. Protocols:

  grid      the grid's order, as bench_fwd.py runs it
  reversed  the same implementations in the opposite order
  idle      each burst after 0.3 s of idle GPU (every burst starts cool)
  steady    each burst after 0.5 s of its own calls back to back (every
            burst starts in its own steady state)

Every protocol runs --rounds rounds; the SM clock (nvidia-smi) is read right
after each timed burst. Read-only: the card's settings are not touched.

    python3 bench/order_probe.py --lib build/libfp4attn_capi.so --out OUT [--shapes 128:4096:0,...]
"""
import argparse
import datetime
import json
import os
import statistics
import time

import torch
from torch.nn.attention import SDPBackend

from bench_fwd import INPUT_SETS, Ours, flops, grid_problem, sdpa
from capi_lib import load_lib, time_ms
from clock_under_load import sm_clock


def back_to_back(fn, seconds):
    t0, i = time.time(), 0
    while time.time() - t0 < seconds:
        for _ in range(4):
            fn(i)
            i += 1
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="128:4096:0,128:16384:0", help="D:S:causal, B = 32768 // S, H = 2048 // D")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--protocols", default="grid,reversed,idle,steady")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib, ll3 = load_lib(args.lib)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    rows, log = [], []
    for shape in args.shapes.split(","):
        B, H, S, D, causal = grid_problem(shape)
        sets = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                for _ in range(INPUT_SETS)]
        ours = Ours(lib, ll3, sets, B, H, S, D, causal)
        cudnn, fa2 = sdpa(SDPBackend.CUDNN_ATTENTION, sets, causal), sdpa(SDPBackend.FLASH_ATTENTION, sets, causal)

        def dp(on):
            def run(i):
                ours.set_direct_p(on)
                ours.attend(i)
                ours.set_direct_p(True)  # the end-to-end call after it runs Direct-P
            return run

        impls = {"fwd_dp1": dp(True), "fwd_dp0": dp(False), "e2e": ours.e2e, "quantize": ours.quantize,
                 "cudnn": cudnn, "fa2": fa2}
        orders = {"grid": list(impls), "reversed": list(reversed(impls)), "idle": list(impls),
                  "steady": list(impls)}
        fl = flops(B, H, S, D, causal)
        for proto in args.protocols.split(","):
            times = {k: [] for k in impls}
            clocks = {k: [] for k in impls}
            for _ in range(args.rounds):
                for k in orders[proto]:
                    fn = impls[k]
                    if proto == "idle":
                        torch.cuda.synchronize()
                        time.sleep(0.3)
                    elif proto == "steady":
                        back_to_back(fn, 0.5)
                    times[k].append(time_ms(fn, args.reps, args.warmup))
                    clocks[k].append(sm_clock())
            med = {k: statistics.median(v) for k, v in times.items()}
            tf = {k: fl / (med[k] * 1e-3) / 1e12 for k in impls}
            ratios = [c / o for c, o in zip(times["cudnn"], times["fwd_dp1"])]
            rows.append(dict(D=D, S=S, B=B, H=H, causal=causal, protocol=proto,
                             ms={k: round(v, 4) for k, v in med.items()},
                             ms_rounds={k: [round(t, 4) for t in v] for k, v in times.items()},
                             tflops={k: round(tf[k], 1) for k in impls if k != "quantize"},
                             sm_mhz_after={k: v for k, v in clocks.items()},
                             ratio_dp1_cudnn=round(tf["fwd_dp1"] / tf["cudnn"], 3),
                             ratio_rounds=[round(r, 3) for r in ratios],
                             ratio_e2e_cudnn=round(tf["e2e"] / tf["cudnn"], 3)))
            line = (f"D={D} S={S:5d} causal={int(causal)} {proto:8s} ours {tf['fwd_dp1']:6.1f} "
                    f"({statistics.median(clocks['fwd_dp1'] or [0])} MHz)  cudnn {tf['cudnn']:6.1f} "
                    f"({statistics.median(clocks['cudnn'] or [0])} MHz)  x{tf['fwd_dp1'] / tf['cudnn']:.3f} "
                    f"(rounds {min(ratios):.2f}..{max(ratios):.2f})  e2e x{tf['e2e'] / tf['cudnn']:.3f}  "
                    f"fa2 {tf['fa2']:.1f}")
            print(line, flush=True)
            log.append(line)
        ours.close()
        del sets
        torch.cuda.empty_cache()
    cmd = "python3 bench/order_probe.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k not in ("out", "lib"))
    with open(os.path.join(args.out, "order-probe.json"), "w") as f:
        json.dump(dict(date=args.date, gpu=torch.cuda.get_device_name(), commit=args.commit, command=cmd,
                       rows=rows), f, indent=1)
    with open(os.path.join(args.out, "order-probe.log"), "w") as f:
        f.write("\n".join(log) + "\n")


if __name__ == "__main__":
    main()
