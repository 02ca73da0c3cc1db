"""A/B of several builds of libfp4attn_capi.so in one process (backward kernel versions).

    python3 bench/ab_bwd_builds.py --names base,new --libs A/libfp4attn_capi.so,B/libfp4attn_capi.so --out OUT

Recipe fp8 (or --recipe mxfp4_train) with Direct-P from bf16 inputs (bench_bwd.py's plan: the device
backward with its quantizers, transposes and row statistics, deterministic),
B·S = 32k tokens, H = 16 at D = 128 and 32 at D = 64. Each build runs the
forward once per input set, then its backward is timed (--op fwdbwd: forward
and backward); builds and cuDNN BF16 (autograd; the backward on a kept graph)
are timed in interleaved rounds, the builds' order turning by one place each
round (as ab_fwd_builds.py). --saved picks per build whether the forward
keeps Q's and K's operands for the backward (the same library may appear
twice, with 0 and 1). A figure is the timed op's TFLOP/s in the median round; `paired_vs_first` the
median over rounds of each build's speed over the first build's in the same
round. `grads_equal_first` says whether each build's dQ, dK and dV equal the
first build's bit for bit on the same inputs (a change of schedule alone must
keep them). Writes OUT/ab.json and prints one line per case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_bwd import Ours, Sdpa, flops, load_bwd_lib  # noqa: E402
from capi_lib import time_ms  # noqa: E402

CASES = [(128, 4096, True), (128, 4096, False), (128, 16384, True), (64, 4096, True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--names", required=True, help="comma-separated build names")
    ap.add_argument("--libs", required=True, help="comma-separated libfp4attn_capi.so paths, one per name")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=8, help="timed calls per build and round")
    ap.add_argument("--recipe", default="fp8", help="fp8 or mxfp4_train")
    ap.add_argument("--saved", default=None,
                    help="comma-separated 0/1 per build: whether its forward keeps Q's and K's operands for the "
                         "backward (default 1 for every build; libraries without the entry points keep none)")
    ap.add_argument("--deterministic", default=None,
                    help="comma-separated 0/1 per build: the two deterministic passes (1, the default) or the one pass (0)")
    ap.add_argument("--op", default="bwd", choices=["bwd", "fwdbwd", "fwd"], help="what is timed")
    ap.add_argument("--cases", default=None,
                    help="D:S:causal triples, comma-separated (e.g. 128:4096:1,64:16384:0); default: CASES")
    args = ap.parse_args()
    names, paths = args.names.split(","), args.libs.split(",")
    if len(names) != len(paths):
        raise SystemExit("--names and --libs need the same number of entries")
    libs = [load_bwd_lib(p) for p in paths]
    saved = [bool(int(x)) for x in args.saved.split(",")] if args.saved else [True] * len(libs)
    if len(saved) != len(libs):
        raise SystemExit("--saved needs one entry per build")
    determ = [bool(int(x)) for x in args.deterministic.split(",")] if args.deterministic else [True] * len(libs)
    if len(determ) != len(libs):
        raise SystemExit("--deterministic needs one entry per build")
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    cases = CASES
    if args.cases:
        cases = [(int(d), int(s), bool(int(c))) for d, s, c in (t.split(":") for t in args.cases.split(","))]
    rows = []
    for D, S, causal in cases:
        H = 16 if D == 128 else 32
        B = 32768 // S
        sets = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4)) for _ in range(2)]
        ours = [Ours(lib, ll3, ll6, sets, B, H, S, D, causal, args.recipe, keep)
                for (lib, ll3, ll6), keep in zip(libs, saved)]
        # Same inputs, same forward: the gradients of every build against the first's.
        grads = []
        for o, det in zip(ours, determ):
            o.fwdbwd(0, det)
            torch.cuda.synchronize()
            grads.append([g.clone() for g in o.grads])
        equal = {names[i]: all(torch.equal(a, b) for a, b in zip(grads[0], grads[i])) for i in range(1, len(ours))}
        del grads
        cudnn = Sdpa(SDPBackend.CUDNN_ATTENTION, sets, causal)
        times = {n: [] for n in names + ["cudnn"]}
        for r in range(args.rounds):
            order = [(r + i) % len(names) for i in range(len(names))]
            for i in order:
                o, det = ours[i], determ[i]
                timed = {"fwdbwd": lambda n: o.fwdbwd(n, det), "fwd": o.forward,
                         "bwd": lambda n: o.backward(n, det)}[args.op]
                times[names[i]].append(time_ms(timed, args.reps, 2))
            timed = {"fwdbwd": cudnn.fwdbwd, "fwd": lambda i: cudnn.run_forward(i % len(sets)),
                     "bwd": cudnn.backward}[args.op]
            times["cudnn"].append(time_ms(timed, args.reps, 2))
        f = flops(B, H, S, D, causal, args.op)
        row = {k: f / (statistics.median(v) * 1e-3) / 1e12 for k, v in times.items()}
        paired = {n: statistics.median(t0 / t for t0, t in zip(times[names[0]], times[n])) for n in names[1:]}
        row.update(D=D, S=S, B=B, H=H, causal=causal, op=args.op, recipe=args.recipe,
                   saved_operands={n: o.saved is not None for n, o in zip(names, ours)},
                   deterministic=dict(zip(names, determ)), paired_vs_first=paired, grads_equal_first=equal,
                   spread={k: (max(v) - min(v)) / statistics.median(v) for k, v in times.items()})
        rows.append(row)
        print(f"D={D} S={S} causal={int(causal)}  {args.op} TFLOP/s " + "  ".join(f"{k} {row[k]:.1f}" for k in times) +
              "  | " + "  ".join(f"{k}/cudnn {row[k] / row['cudnn']:.3f}" for k in names) + "  | paired " +
              "  ".join(f"{k}/{names[0]} {v:.3f}" for k, v in paired.items()) + "  | grads equal " +
              "  ".join(f"{k} {v}" for k, v in equal.items()), flush=True)
        del sets, ours, cudnn
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ab.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "command": " ".join(sys.argv), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
