"""A/B of several builds of libfp4attn_capi.so in one process (forward kernel versions).

    python3 bench/ab_fwd_builds.py --names v6,v8 --libs A/libfp4attn_capi.so,B/libfp4attn_capi.so --out OUT

Recipe fp8 with Direct-P from pre-quantized inputs (bench_fwd.py's plan; --recipe picks an
MX recipe through bench_fwd_mx.py's plan, or nvfp4 through bench_fwd_nvfp4.py's, instead), B·S =
32k tokens, H · D = 2048 (H = 16 at D = 128). Builds and cuDNN BF16 are timed
in interleaved rounds (10 timed calls after 2 warm-up calls each), so that the
GPU's drift between rounds hits every build alike. The builds' order turns by
one place each round: a build timed first in its round ran 1–2 % slow even
after the settle calls (perf log v13b), and rotation spreads that over all of
them (use a multiple of the number of builds as --rounds). A figure is the TFLOP/s of
the median round, `spread` is (max − min) / median over the rounds, and
`paired_vs_first` the median over rounds of each build's speed relative to the
first build's in the same round (the comparison that drift disturbs least). Inputs are
random, two sets rotated. With --seconds N each build and cuDNN run back to back for N
seconds instead (clock_under_load.sampled): the card reaches its power limit, and the
rows also carry each one's median SM clock. Writes OUT/ab.json and prints one line
per case.
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
import bench_fwd_mx  # noqa: E402
import bench_fwd_nvfp4  # noqa: E402
from bench_fwd import Ours, flops, sdpa  # noqa: E402
from capi_lib import load_lib, time_ms  # noqa: E402
from clock_under_load import sampled  # noqa: E402

CASES = [(128, 4096, False), (128, 16384, False), (128, 16384, True), (64, 16384, False)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--names", required=True, help="comma-separated build names")
    ap.add_argument("--libs", required=True, help="comma-separated libfp4attn_capi.so paths, one per name")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--settle", type=int, default=20,
                    help="untimed calls of the round's first build at the start of each round: after cuDNN's calls the "
                         "clock needs them, or the build timed first in a round runs a few per cent slow")
    ap.add_argument("--seconds", type=float, default=0.0,
                    help="sustained mode: time each build and cuDNN by back-to-back calls for this many seconds "
                         "while nvidia-smi samples the SM clock (the card sits at its power limit); 0: bursts of "
                         "10 calls")
    ap.add_argument("--cases", default=None,
                    help="D:S:causal triples, comma-separated (e.g. 128:4096:0,64:16384:1); default: CASES")
    ap.add_argument("--recipe", default="fp8", choices=["fp8", "mxfp4", "mxfp4_train", "nvfp4"],
                    help="the MX recipes run through bench_fwd_mx.py's plan (MX operands "
                         "folded before the kernel, which is what is timed), nvfp4 through "
                         "bench_fwd_nvfp4.py's (operands expanded to BF16 before the kernel)")
    args = ap.parse_args()
    names, paths = args.names.split(","), args.libs.split(",")
    if len(names) != len(paths):
        raise SystemExit("--names and --libs need the same number of entries")
    libs = [load_lib(p) for p in paths]
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    rows = []
    cases = CASES
    if args.cases:
        cases = [(int(d), int(s), bool(int(c))) for d, s, c in (t.split(":") for t in args.cases.split(","))]
    for D, S, causal in cases:
        H = 2048 // D  # the grid's H·D = 2048
        B = 32768 // S
        sets = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)) for _ in range(2)]
        if args.recipe == "fp8":
            ours = [Ours(lib, ll3, sets, B, H, S, D, causal) for lib, ll3 in libs]
            for o in ours:
                o.set_direct_p(True)
        elif args.recipe == "nvfp4":
            for lib, _ in libs:
                bench_fwd_nvfp4.declare(lib)
            ours = [bench_fwd_nvfp4.Runner(lib, ll3, sets, B, H, S, D, causal) for lib, ll3 in libs]
        else:
            for lib, _ in libs:
                bench_fwd_mx.declare_mx(lib)
            ours = [bench_fwd_mx.Runner(lib, ll3, sets, B, S, S, args.recipe, H=H, D=D, causal=causal)
                    for lib, ll3 in libs]
        cudnn = sdpa(SDPBackend.CUDNN_ATTENTION, sets, causal)
        times = {n: [] for n in names + ["cudnn"]}
        clocks = {n: [] for n in names + ["cudnn"]}

        def timed(name, fn):
            if args.seconds <= 0:
                return time_ms(fn, 10, 2)
            ms, samples = sampled(fn, args.seconds)
            clocks[name].append(statistics.median(s["sm_mhz"] for s in samples) if samples else float("nan"))
            return ms

        for r in range(args.rounds):
            order = [(r + i) % len(names) for i in range(len(names))]
            for _ in range(args.settle):
                ours[order[0]].attend(0)
            for i in order:
                times[names[i]].append(timed(names[i], ours[i].attend))
            times["cudnn"].append(timed("cudnn", cudnn))
        f = flops(B, H, S, D, causal)
        row = {k: f / (statistics.median(v) * 1e-3) / 1e12 for k, v in times.items()}
        # Paired: each build's speed over the first build's in the same round,
        # median over rounds; drift between rounds cancels in the ratio.
        paired = {n: statistics.median(t0 / t for t0, t in zip(times[names[0]], times[n])) for n in names[1:]}
        row.update(D=D, S=S, causal=causal, paired_vs_first=paired,
                   spread={k: (max(v) - min(v)) / statistics.median(v) for k, v in times.items()})
        if args.seconds > 0:
            row["sm_mhz_median"] = {k: statistics.median(v) for k, v in clocks.items()}
        rows.append(row)
        print(f"D={D} S={S} causal={int(causal)}  " + "  ".join(f"{k} {row[k]:.1f}" for k in times) + "  | " +
              "  ".join(f"{k}/cudnn {row[k] / row['cudnn']:.3f}" for k in names) + "  | paired " +
              "  ".join(f"{k}/{names[0]} {v:.3f}" for k, v in paired.items()), flush=True)
        for o in ours:
            o.close()
        del sets, ours
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ab.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "command": " ".join(sys.argv), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
