#!/usr/bin/env python3
"""Forward benchmark of the sm90 fp8 kernel on model-shaped problems, off the
DESIGN §8 grid: video-diffusion self-attention (long odd sequences, many
heads), LLM prefill with GQA (causal), a ViT (D = 64, short odd sequence, large
batch) and a short-sequence batch. Against cuDNN BF16 and FA2 BF16 SDPA
(PyTorch sdpa_kernel backends) in the same process.

  op fwd      recipe fp8 on pre-quantized inputs (Direct-P)
  op fwd_e2e  GPU quantization from bf16 (smooth_k) plus the kernel
  op quantize the GPU quantization alone (fwd_e2e's first part)

GQA baselines: SDPA with enable_gqa=True where the backend takes it, else K
and V repeated to Hq heads first (the row says which; the repeat is not timed).
Timing as bench_fwd.py: CUDA events, warm-up, median of --reps; two input
sets alternated where one set fits in the 60 MB L2. With --rounds N every
implementation is timed once per round, in turn, so that a drift of the
clock reaches all of them alike; a row's `ms` is the median over the rounds
and `ms_rounds` keeps each round's figure. With --seconds N every
implementation instead runs back to back for N seconds (after the warm-up)
while nvidia-smi samples the SM clock and power (clock_under_load.sampled):
the card reaches its 700 W limit, and each row also carries the median clock
and power of its run. With --cold-ms N every timed burst instead follows N ms
of idle GPU, so that it runs from a cool card at the top clock (bench/
power_ramp.py: the first 50–70 ms after 1.5 s of idle run at 1980 MHz for
both this kernel and cuDNN, then the 700 W limit pulls the clock down). The
two modes compare the implementations at the top clock (cold) and each at
its own clock under the power limit (sustained); interleaved bursts (the
default) run both at the one lower clock that the card's mix of work has set
once it has been busy for 50–70 ms. --impls keeps only some implementations (fwd, fwd_e2e,
quantize, cudnn_bf16, fa2_bf16).

Shape sets (--set):
  models  the model-shaped problems above
  bar     D = 128, noncausal, S >= 4k, batch / heads / lengths off the
          DESIGN §8 grid (odd lengths, few and many heads, GQA, up to 32k):
          where the forward's 1.5x-cuDNN-BF16 bar is checked off the grid,
          with a few causal and D = 64 shapes beside it
"""
import argparse
import datetime
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench_fwd import Ours, flops, rel_l2
from capi_lib import load_lib, time_ms
from clock_under_load import sampled

# (name, B, Hq, Hkv, S, D, causal)
SHAPES = [
    ("video DiT, 24 heads", 1, 24, 24, 17550, 128, False),
    ("video DiT, 40 heads", 1, 40, 40, 32760, 128, False),
    ("LLM prefill GQA 32/8", 1, 32, 8, 8192, 128, True),
    ("LLM prefill GQA 32/8, batch", 4, 32, 8, 2000, 128, True),
    ("ViT-L/14 336px", 64, 16, 16, 577, 64, False),
    ("short batch", 16, 16, 16, 1000, 128, False),
]

BAR_SHAPES = [
    ("bar 1x32 4096", 1, 32, 32, 4096, 128, False),
    ("bar 4x8 4096", 4, 8, 8, 4096, 128, False),
    ("bar 16x16 4096", 16, 16, 16, 4096, 128, False),
    ("bar 1x64 4096", 1, 64, 64, 4096, 128, False),
    ("bar 2x12 5000", 2, 12, 12, 5000, 128, False),
    ("bar 3x20 6144", 3, 20, 20, 6144, 128, False),
    ("bar GQA 32/8 8192", 1, 32, 8, 8192, 128, False),
    ("bar 1x24 12000", 1, 24, 24, 12000, 128, False),
    ("bar 1x40 16384", 1, 40, 40, 16384, 128, False),
    ("bar 1x8 32768", 1, 8, 8, 32768, 128, False),
    ("causal 1x32 8192", 1, 32, 32, 8192, 128, True),
    ("causal 2x16 12000", 2, 16, 16, 12000, 128, True),
    ("d64 2x16 8192", 2, 16, 16, 8192, 64, False),
    ("d64 1x24 17550", 1, 24, 24, 17550, 64, False),
]

SHAPE_SETS = {"models": SHAPES, "bar": BAR_SHAPES}


def sdpa_runner(backend, sets, causal, gqa):
    """SDPA on (B, H, S, D) views; gqa: 'native' (enable_gqa) or 'repeat' (K, V repeated beforehand)."""
    def run(i):
        q, k, v = sets[i % len(sets)]
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa == "native")
    return run


def baseline_runner(backend, bhsd, causal, Hq, Hkv):
    """SDPA runner for one backend, with enable_gqa where it is taken, else K and V repeated to Hq heads."""
    run = sdpa_runner(backend, bhsd, causal, "native")
    try:
        return run, run(0), "native"
    except RuntimeError:
        if Hq == Hkv:
            raise
    sets = [(q, k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)) for q, k, v in bhsd]
    run = sdpa_runner(backend, sets, causal, "repeat")
    return run, run(0), "repeat"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", default="models", choices=sorted(SHAPE_SETS), help="which shapes (see the docstring)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1, help="time every implementation once per round, in turn")
    ap.add_argument("--seconds", type=float, default=0.0,
                    help="sustained mode: back-to-back calls for this many seconds per implementation and round, "
                         "with the SM clock and power sampled; 0: --reps timed calls")
    ap.add_argument("--cold-ms", type=float, default=0.0,
                    help="cold mode: this many ms of idle GPU before every timed burst")
    ap.add_argument("--impls", default="fwd,fwd_e2e,quantize,cudnn_bf16,fa2_bf16",
                    help="comma-separated implementations to time")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--commit", default="")
    ap.add_argument("--only", default="", help="comma-separated substrings: run the shapes whose name holds one")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib, ll3 = load_lib(args.lib)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    rows, log = [], []
    only = [w for w in args.only.split(",") if w]
    for name, B, Hq, Hkv, S, D, causal in SHAPE_SETS[args.set]:
        if only and not any(w in name for w in only):
            continue
        n_sets = 2 if 2 * B * S * (Hq + 2 * Hkv) * D < 60 * 2**20 else 1
        bshd = [(torch.randn(B, S, Hq, D, device="cuda", dtype=torch.bfloat16),
                 torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16),
                 torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16)) for _ in range(n_sets)]
        bhsd = [tuple(t.transpose(1, 2) for t in s) for s in bshd]
        fl = flops(B, Hq, S, D, causal)
        tf = lambda ms: fl / (ms * 1e-3) / 1e12
        ours = Ours(lib, ll3, bshd, B, Hq, S, D, causal, Hkv=Hkv)
        cudnn, ref, gqa_cudnn = baseline_runner(SDPBackend.CUDNN_ATTENTION, bhsd, causal, Hq, Hkv)
        fa2, _, gqa_fa2 = baseline_runner(SDPBackend.FLASH_ATTENTION, bhsd, causal, Hq, Hkv)
        ref = ref.transpose(1, 2)
        runs = {"fwd": ours.attend, "fwd_e2e": ours.e2e, "quantize": ours.quantize, "cudnn_bf16": cudnn,
                "fa2_bf16": fa2}
        runs = {k: fn for k, fn in runs.items() if k in args.impls.split(",")}
        times = {k: [] for k in runs}
        clocks = {k: [] for k in runs}
        for _ in range(args.rounds):
            for k, fn in runs.items():
                if args.seconds <= 0:
                    if args.cold_ms > 0:
                        torch.cuda.synchronize()
                        time.sleep(args.cold_ms / 1e3)
                    times[k].append(time_ms(fn, args.reps, args.warmup))
                    continue
                for i in range(args.warmup):
                    fn(i)
                ms, samples = sampled(fn, args.seconds)
                times[k].append(ms)
                if samples:
                    clocks[k].append((statistics.median(x["sm_mhz"] for x in samples),
                                      statistics.median(x["watts"] for x in samples)))
        med = {k: statistics.median(v) for k, v in times.items()}
        base = dict(causal=causal, B=B, H=Hq, Hkv=Hkv, Sq=S, Sk=S, D=D, shape=name)

        def row(op, impl, recipe, key, **extra):
            if key not in med:
                return
            ms = med[key]
            rows.append(dict(op=op, impl=impl, recipe=recipe, ms=round(ms, 4),
                             tflops=None if op == "quantize" else round(tf(ms), 1),
                             ms_rounds=[round(t, 4) for t in times[key]], **extra, **base))
            if clocks[key]:
                rows[-1].update(sm_mhz=statistics.median(c[0] for c in clocks[key]),
                                watts=statistics.median(c[1] for c in clocks[key]))

        row("fwd", "fp4attn", "fp8", "fwd", direct_p=True)
        row("fwd_e2e", "fp4attn", "fp8", "fwd_e2e", direct_p=True)
        row("quantize", "fp4attn", "fp8", "quantize", direct_p=True)
        row("fwd", "cudnn_bf16", "bf16", "cudnn_bf16", gqa=gqa_cudnn if Hq != Hkv else None)
        row("fwd", "fa2_bf16", "bf16", "fa2_bf16", gqa=gqa_fa2 if Hq != Hkv else None)
        ours.e2e(0)
        torch.cuda.synchronize()
        err = rel_l2(ours.o, ref)
        for r in rows[-len(med):]:
            if r["op"] in ("fwd", "fwd_e2e") and r["impl"] == "fp4attn":
                r["rel_l2_vs_cudnn"] = round(err, 5)
        show = lambda key: f"{tf(med[key]):6.1f}" if key in med else "   -  "
        line = (f"{name:30s} B={B:2d} Hq={Hq:2d} Hkv={Hkv:2d} S={S:5d} D={D:3d} causal={int(causal)}  "
                f"fp8 {show('fwd')}  e2e {show('fwd_e2e')}  cudnn {show('cudnn_bf16')}  fa2 {show('fa2_bf16')} TF/s")
        if "fwd" in med and "cudnn_bf16" in med:
            ratios = [c / f for c, f in zip(times["cudnn_bf16"], times["fwd"])]
            line += f"  x{med['cudnn_bf16'] / med['fwd']:.2f} cudnn (rounds {min(ratios):.2f}..{max(ratios):.2f})"
        if "fwd_e2e" in med and "cudnn_bf16" in med:
            line += f"  e2e x{med['cudnn_bf16'] / med['fwd_e2e']:.2f}"
        if "quantize" in med:
            line += f"  quantize {med['quantize']:.3f} ms"
        line += f"  relL2 {err:.4f}"
        if clocks.get("fwd") and clocks.get("cudnn_bf16"):
            line += f"  MHz fp8 {clocks['fwd'][0][0]:.0f} cudnn {clocks['cudnn_bf16'][0][0]:.0f}"
        print(line, flush=True)
        log.append(line)
        ours.close()
        del bshd, bhsd, ref, runs, cudnn, fa2
        torch.cuda.empty_cache()
    cmd = "python3 bench/bench_fwd_shapes.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k not in ("out", "lib"))
    result = dict(date=args.date, gpu=torch.cuda.get_device_name(), commit=args.commit, command=cmd,
                  note="recipe fp8 on the shape set named in the command; ms is the median over the rounds, "
                       "ms_rounds each round's median of --reps; rows with gqa='repeat' ran the baseline on K "
                       "and V repeated to Hq heads (the backend refused enable_gqa).", rows=rows)
    stem = "bench-fwd-shapes" if args.set == "models" else f"bench-fwd-shapes-{args.set}"
    if args.seconds > 0:
        stem += "-sustained"
    elif args.cold_ms > 0:
        stem += "-cold"
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, stem + ".log"), "w") as f:
        f.write("\n".join(log) + "\n")


if __name__ == "__main__":
    main()
