#!/usr/bin/env python3
"""Inference forward through the torch layer, from bf16 tensors to a bf16 O,
as a model calls it: fp4attn.sdpa against torch SDPA with the cuDNN and
FlashAttention-2 backends, on the same tensors in the same process.

Everything a call does is timed: the Python checks, the workspace and output
allocations, the quantizer and the attention kernel (op "fwd_torch"). The
inputs are (B, H, S, D) views of (B, S, H, D) memory, as a model's projections
give them; the fp8 recipe is also timed on contiguous (B, H, S, D) tensors
(`fp8_bhsd_memory`), whose rows the quantizer reads with another stride, and
through flash_attn_func on the (B, S, H, D) tensors themselves
(`fp8_flash_attn_func`, O in that memory too), and on FlashAttention-3's FP8
inputs (`fp8_e4m3_inputs`: the same tensors quantized to float8_e4m3fn once,
outside the timing, with one descale per batch entry and kv head; the call
runs the kernel on them with no quantizer pass, as a model whose projections
emit FP8 gets it). Every output is compared with
fp64 on its first 512 queries (rel_l2_vs_fp64), so that a fast wrong answer
shows; --kernels 1 (the default) adds each kernel's time per call. The
variants and the baselines alternate over --rounds rounds (rotated order); a
figure is the median round of --reps calls queued back to back (--queued 1),
as an inference loop whose host runs ahead of the GPU.
host_gap_us is the GPU's idle time per call when every call waits for the one
before (the host's share of a lone call). Needs the fp4attn package
importable (e.g. built with `pip install --no-build-isolation .`).

    python3 bench/bench_torch_fwd.py --out OUT [--cases 128:4096:0,128:8192:0:32:8]

A case is D:S:causal, optionally :Hq:Hkv (default 16 heads at D = 128 and 32
at D = 64, B · S = 32k tokens). --consumers 1,2 adds the fp8 rows with the
forward kernel's consumer count forced (A/B of the kernels, same process).
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
from capi_lib import host_gap_us, kernel_breakdown, time_ms, with_consumers  # noqa: E402

import fp4attn  # noqa: E402

TOKENS = 32768  # B·S, as the other grids
DEFAULT_CASES = ("128:4096:0,128:8192:0,128:16384:0,128:4096:1,128:16384:1,64:4096:0,64:16384:0,128:1024:0,"
                 "128:8192:0:32:8")


def parse_case(text):
    parts = [int(p) for p in text.split(":")]
    if len(parts) not in (3, 5):
        raise SystemExit(f"--cases: '{text}' is not D:S:causal or D:S:causal:Hq:Hkv")
    D, S, causal = parts[:3]
    Hq, Hkv = parts[3:] if len(parts) == 5 else ((16, 16) if D == 128 else (32, 32))
    return D, S, bool(causal), Hq, Hkv


def bshd_views(B, S, H, D):
    """A (B, H, S, D) view of (B, S, H, D) memory: what q.view(B, S, H, D).transpose(1, 2) gives a model."""
    return torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)


def e4m3_inputs(x, Hkv):
    """FlashAttention-3's FP8 form of a (B, S, H, D) tensor: float8_e4m3fn codes and a float32
    descale per (batch entry, kv head), amax / 448 over the head group's values."""
    B, S, H, D = x.shape
    grouped = x.float().view(B, S, Hkv, H // Hkv, D)
    descale = (grouped.abs().amax(dim=(1, 3, 4)) / 448.0).clamp_min(1e-30)  # (B, Hkv)
    codes = (grouped / descale[:, None, :, None, None]).view(B, S, H, D).to(torch.float8_e4m3fn)
    return codes, descale.contiguous()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--recipes", default="fp8,mxfp4,nvfp4", help="recipes timed on the bshd-memory views")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--queued", type=int, default=1)
    ap.add_argument("--commit", default="")
    ap.add_argument("--duplicate", action="store_true",
                    help="time recipe fp8 a second time at another place in the rotation (the place's effect)")
    ap.add_argument("--kernels", type=int, default=1, help="1: also each kernel's time per call (torch.profiler)")
    ap.add_argument("--consumers", default="",
                    help="e.g. 1,2: also fp8 and fp8_e4m3_inputs with the forward kernel's consumer warpgroups "
                         "forced to each count (fp8_c1, ...; FP4ATTN_FWD_CONSUMERS), beside the launcher's choice")
    args = ap.parse_args()
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    recipes = args.recipes.split(",")
    rows = []
    for D, S, causal, Hq, Hkv in (parse_case(c) for c in args.cases.split(",")):
        B = max(1, TOKENS // S)
        q = bshd_views(B, S, Hq, D)
        k, v = bshd_views(B, S, Hkv, D), bshd_views(B, S, Hkv, D)
        qc, kc, vc = (x.contiguous() for x in (q, k, v))  # (B, H, S, D) memory
        qb, kb, vb = (x.transpose(1, 2) for x in (q, k, v))  # the (B, S, H, D) tensors behind the views
        gqa = Hq != Hkv
        # The recipes with a backward never keep operands here: inference mode.
        impls = {r: (lambda i, r=r: fp4attn.sdpa(q, k, v, is_causal=causal, enable_gqa=gqa, recipe=r))
                 for r in recipes}
        if "fp8" in recipes:
            impls["fp8_bhsd_memory"] = lambda i: fp4attn.sdpa(qc, kc, vc, is_causal=causal, enable_gqa=gqa)
            # FlashAttention's call on the (B, S, H, D) tensors themselves: O in (B, S, H, D) memory too.
            impls["fp8_flash_attn_func"] = lambda i: fp4attn.flash_attn_func(qb, kb, vb, causal=causal).transpose(1, 2)
            if args.duplicate:
                impls["fp8_again"] = impls["fp8"]
            (q8, dq), (k8, dk), (v8, dv) = (e4m3_inputs(x, Hkv) for x in (qb, kb, vb))
            impls["fp8_e4m3_inputs"] = lambda i: fp4attn.flash_attn_func(
                q8, k8, v8, causal=causal, q_descale=dq, k_descale=dk, v_descale=dv).transpose(1, 2)
            for n in (int(c) for c in args.consumers.split(",") if c):
                impls[f"fp8_c{n}"] = with_consumers(impls["fp8"], n)
                impls[f"fp8_e4m3_inputs_c{n}"] = with_consumers(impls["fp8_e4m3_inputs"], n)
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
            def run(i, backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            impls[name] = run
        with torch.inference_mode():
            skipped = {}
            for n in list(impls):
                try:
                    impls[n](0)
                except RuntimeError as e:  # e.g. a backend without this case (cuDNN and GQA in some versions)
                    skipped[n] = str(e).splitlines()[0][:200]
                    del impls[n]
            times = {n: [] for n in impls}
            # Every output against fp64 on its first 512 queries of batch entry 0, so that a fast wrong
            # answer shows. Causal masks are top-left aligned here: those queries see no key past 512.
            keys = min(S, 512) if causal else S
            ref = F.scaled_dot_product_attention(q[:1, :, :512].double(), k[:1, :, :keys].double(),
                                                 v[:1, :, :keys].double(), is_causal=causal, enable_gqa=gqa)
            rel_l2 = {n: float((fn(0)[:1, :, :512].double() - ref).norm() / ref.norm()) for n, fn in impls.items()}
            del ref
            for rnd in range(args.rounds):
                names = list(impls)
                for n in names[rnd % len(names):] + names[:rnd % len(names)]:
                    times[n].append(time_ms(impls[n], args.reps, 2, queued=bool(args.queued)))
            gaps = {n: round(host_gap_us(impls[n], args.reps), 1) for n in ("fp8", "cudnn") if n in impls}
            kernels = ({n: kernel_breakdown(fn) for n, fn in impls.items()} if args.kernels else None)
        pairs = S * (S + 1) / 2 if causal else S * S
        flop = 4.0 * B * Hq * D * pairs
        ms = {n: statistics.median(t) for n, t in times.items()}
        row = dict(op="fwd_torch", D=D, S=S, B=B, Hq=Hq, Hkv=Hkv, causal=causal, queued=bool(args.queued),
                   ms={n: round(t, 4) for n, t in ms.items()},
                   tflops={n: round(flop / (t * 1e-3) / 1e12, 1) for n, t in ms.items()},
                   paired_vs_cudnn=({n: round(statistics.median(c / a for a, c in zip(times[n], times["cudnn"])), 3)
                                     for n in impls} if "cudnn" in impls else None),
                   skipped=skipped,
                   host_gap_us=gaps, kernels_us=kernels, rel_l2_vs_fp64={n: round(e, 5) for n, e in rel_l2.items()})
        rows.append(row)
        t = row["tflops"]
        print(f"D={D} S={S} B={B} H={Hq}/{Hkv} causal={int(causal)}  TFLOP/s " +
              "  ".join(f"{n} {t[n]:.1f}" for n in impls) + "  | vs cudnn " +
              "  ".join(f"{n} {v:.3f}" for n, v in (row["paired_vs_cudnn"] or {}).items() if n != "cudnn") +
              f"  | host gap us {gaps}", flush=True)
        for n in (kernels or {}):
            if n not in ("cudnn", "fa2"):
                print(f"    {n:16s} " + "  ".join(f"{k.split('<')[0].split('(')[0][-40:]} {t}"
                                               for k, t in kernels[n].items()), flush=True)
        del q, k, v, qc, kc, vc, qb, kb, vb, impls
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    result = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), commit=args.commit,
                  torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
                  command="python3 bench/bench_torch_fwd.py " + " ".join(sys.argv[1:]), rows=rows)
    with open(os.path.join(args.out, "bench-torch-fwd.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
