#!/usr/bin/env python3
"""Attention's share of a training step through the torch layer: forward and
backward of fp4attn.attention (autograd, recipe fp8, Direct-P, smooth_k, bf16)
against torch SDPA with the cuDNN and FlashAttention-2 backends, on the same
inputs in the same process.

Ours runs as shipped (the forward keeps Q's and K's quantized operands for
the backward) and with that turned off (the backward quantizes q and k
again), so the figure says what keeping them is worth to a torch user; then
a third time with the backward's two deterministic passes forced
(`two_pass`: DETERMINISTIC_BACKWARD = True) and a fourth with the one pass
forced (`one_pass`: False), so that each row says which mode the shipped
rule should pick. The
variants and the baselines alternate over --rounds rounds; a figure is the
median round. peak_mib: the device memory one step takes at its peak beyond
what was allocated before it. Steps are queued back to back (--queued 1, the default), as in
a training loop whose host runs ahead of the GPU; --queued 0 waits for each
step, so the host's time before a step's first kernel counts too. Needs the fp4attn package importable (e.g. built with
`pip install --no-build-isolation .`).

    python3 bench/bench_torch_step.py --out OUT [--cases 128:1024:0,128:4096:1]
"""
import argparse
import datetime
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from capi_lib import host_gap_us, kernel_breakdown, peak_mib, time_ms  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn import _validate, torch_ops  # noqa: E402

TOKENS = 32768  # B·S, as the other grids


def step_ours(q, k, v, d_o, causal):
    for x in (q, k, v):
        x.grad = None
    fp4attn.attention(q, k, v, causal=causal).backward(d_o)


def step_sdpa(backend, q, k, v, d_o, causal):
    for x in (q, k, v):
        x.grad = None
    with sdpa_kernel(backend):
        # SDPA takes (B, H, S, D); the transposes are views.
        F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=causal).backward(
            d_o.transpose(1, 2))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="128:1024:0,128:2048:0,128:4096:1,128:4096:0,64:1024:0,128:16384:0",
                    help="D:S:causal triples")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--queued", type=int, default=1)
    ap.add_argument("--commit", default="")
    ap.add_argument("--kernels", type=int, default=0,
                    help="1: also each kernel's time per step of ours as shipped and cuDNN (torch.profiler)")
    args = ap.parse_args()
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    keep_bytes = torch_ops._kept_bytes
    rows = []
    for D, S, causal in ((int(d), int(s), bool(int(c))) for d, s, c in (t.split(":") for t in args.cases.split(","))):
        H = 16 if D == 128 else 32
        B = TOKENS // S
        q, k, v, d_o = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        for x in (q, k, v):
            x.requires_grad_()

        def without_kept(i):
            torch_ops._kept_bytes = lambda *a: 0
            try:
                step_ours(q, k, v, d_o, causal)
            finally:
                torch_ops._kept_bytes = keep_bytes

        def forced(deterministic):
            def step(i):
                torch_ops.DETERMINISTIC_BACKWARD = deterministic
                try:
                    step_ours(q, k, v, d_o, causal)
                finally:
                    torch_ops.DETERMINISTIC_BACKWARD = None
            return step

        impls = {
            "kept": lambda i: step_ours(q, k, v, d_o, causal),
            "not_kept": without_kept,
            "two_pass": forced(True),
            "one_pass": forced(False),
            "cudnn": lambda i: step_sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, d_o, causal),
            "fa2": lambda i: step_sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, d_o, causal),
        }
        times = {n: [] for n in impls}
        for r in range(args.rounds):
            names = list(impls)
            for n in names[r % len(names):] + names[:r % len(names)]:
                times[n].append(time_ms(impls[n], args.reps, 2, queued=bool(args.queued)))
        # The GPU's idle time per step when each step waits for the previous one:
        # the host's time before a step's first kernel (Python, checks, launches).
        gaps = {n: round(host_gap_us(impls[n], args.reps), 1) for n in ("kept", "cudnn")}
        kernels = {n: kernel_breakdown(impls[n]) for n in ("kept", "cudnn")} if args.kernels else None
        # Device memory a step takes at its peak (its workspaces, what autograd saves, the gradients).
        peaks = peak_mib(impls)
        pairs = S * (S + 1) / 2 if causal else S * S
        flop = 3.5 * 4.0 * B * H * D * pairs
        row = dict(op="fwdbwd_torch", D=D, S=S, B=B, H=H, causal=causal, queued=bool(args.queued),
                   ms={n: round(statistics.median(t), 4) for n, t in times.items()},
                   tflops={n: round(flop / (statistics.median(t) * 1e-3) / 1e12, 1) for n, t in times.items()},
                   host_gap_us=gaps, kernels_us=kernels, peak_mib=peaks,
                   backward=("one pass" if torch_ops.one_pass_faster(
                       _validate.Dims(B=B, Sq=S, Sk=S, Hq=H, Hkv=H, D=D),
                       "causal" if causal else "none") else "two passes"),
                   paired_kept_vs_not=round(statistics.median(b / a for a, b in zip(times["kept"], times["not_kept"])), 4),
                   paired_kept_vs_two_pass=round(
                       statistics.median(b / a for a, b in zip(times["kept"], times["two_pass"])), 4),
                   paired_one_pass_vs_two_pass=round(
                       statistics.median(b / a for a, b in zip(times["one_pass"], times["two_pass"])), 4))
        rows.append(row)
        t = row["tflops"]
        print(f"D={D} S={S} causal={int(causal)}  fwd+bwd TFLOP/s kept {t['kept']:.1f}  not kept {t['not_kept']:.1f}  "
              f"cudnn {t['cudnn']:.1f}  fa2 {t['fa2']:.1f}  | kept/cudnn {t['kept'] / t['cudnn']:.3f}  "
              f"not/cudnn {t['not_kept'] / t['cudnn']:.3f}  | paired kept/not {row['paired_kept_vs_not']:.3f}  "
              f"kept ({row['backward']})/two_pass {row['paired_kept_vs_two_pass']:.3f}  "
              f"one_pass/two_pass {row['paired_one_pass_vs_two_pass']:.3f}  | "
              f"host gap us ours {gaps['kept']} cudnn {gaps['cudnn']}  | peak MiB kept {peaks['kept']} "
              f"not kept {peaks['not_kept']} cudnn {peaks['cudnn']} fa2 {peaks['fa2']}",
              flush=True)
        for name, ks in (kernels or {}).items():
            print(f"    {name:6s} " + "  ".join(f"{k.split('<')[0].split('(')[0][-40:]} {t}" for k, t in ks.items()),
                  flush=True)
        del q, k, v, d_o
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    result = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), commit=args.commit,
                  command="python3 bench/bench_torch_step.py " + " ".join(sys.argv[1:]), rows=rows)
    with open(os.path.join(args.out, "bench-torch-step.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
