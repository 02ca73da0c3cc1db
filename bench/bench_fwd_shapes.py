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
sets alternated where one set fits in the 60 MB L2.
"""
import argparse
import datetime
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench_fwd import Ours, flops, rel_l2
from capi_lib import load_lib, time_ms

# (name, B, Hq, Hkv, S, D, causal)
SHAPES = [
    ("video DiT, 24 heads", 1, 24, 24, 17550, 128, False),
    ("video DiT, 40 heads", 1, 40, 40, 32760, 128, False),
    ("LLM prefill GQA 32/8", 1, 32, 8, 8192, 128, True),
    ("LLM prefill GQA 32/8, batch", 4, 32, 8, 2000, 128, True),
    ("ViT-L/14 336px", 64, 16, 16, 577, 64, False),
    ("short batch", 16, 16, 16, 1000, 128, False),
]


def sdpa_runner(backend, sets, causal, gqa):
    """SDPA on (B, H, S, D) views; gqa: 'native' (enable_gqa) or 'repeat' (K, V repeated beforehand)."""
    def run(i):
        q, k, v = sets[i % len(sets)]
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa == "native")
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--commit", default="")
    ap.add_argument("--only", default="", help="comma-separated substrings: run the shapes whose name holds one")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib, ll3 = load_lib(args.lib)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    rows, log = [], []
    only = [w for w in args.only.split(",") if w]
    for name, B, Hq, Hkv, S, D, causal in SHAPES:
        if only and not any(w in name for w in only):
            continue
        n_sets = 2 if 2 * B * S * (Hq + 2 * Hkv) * D < 60 * 2**20 else 1
        bshd = [(torch.randn(B, S, Hq, D, device="cuda", dtype=torch.bfloat16),
                 torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16),
                 torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16)) for _ in range(n_sets)]
        fl = flops(B, Hq, S, D, causal)
        tf = lambda ms: fl / (ms * 1e-3) / 1e12
        ours = Ours(lib, ll3, bshd, B, Hq, S, D, causal, Hkv=Hkv)
        ms_fwd = time_ms(ours.attend, args.reps, args.warmup)
        ms_e2e = time_ms(ours.e2e, args.reps, args.warmup)
        ms_quant = time_ms(ours.quantize, args.reps, args.warmup)
        base = dict(causal=causal, B=B, H=Hq, Hkv=Hkv, Sq=S, Sk=S, D=D, shape=name)
        rows.append(dict(op="fwd", impl="fp4attn", recipe="fp8", direct_p=True, ms=round(ms_fwd, 4),
                         tflops=round(tf(ms_fwd), 1), **base))
        rows.append(dict(op="fwd_e2e", impl="fp4attn", recipe="fp8", direct_p=True, ms=round(ms_e2e, 4),
                         tflops=round(tf(ms_e2e), 1), **base))
        rows.append(dict(op="quantize", impl="fp4attn", recipe="fp8", direct_p=True, ms=round(ms_quant, 4),
                         tflops=None, **base))
        bhsd = [tuple(t.transpose(1, 2) for t in s) for s in bshd]
        ref, ms_base = None, {}
        for impl, backend in (("cudnn_bf16", SDPBackend.CUDNN_ATTENTION), ("fa2_bf16", SDPBackend.FLASH_ATTENTION)):
            gqa, sets = "native", bhsd
            run = sdpa_runner(backend, sets, causal, gqa)
            try:
                out = run(0)
            except RuntimeError:
                if Hq == Hkv:
                    raise
                gqa = "repeat"
                sets = [(q, k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)) for q, k, v in bhsd]
                run = sdpa_runner(backend, sets, causal, gqa)
                out = run(0)
            if ref is None:
                ref = out.transpose(1, 2)
            ms_base[impl] = time_ms(run, args.reps, args.warmup)
            rows.append(dict(op="fwd", impl=impl, recipe="bf16", ms=round(ms_base[impl], 4),
                             tflops=round(tf(ms_base[impl]), 1), gqa=gqa if Hq != Hkv else None, **base))
            del sets, run, out
        ours.e2e(0)
        torch.cuda.synchronize()
        err = rel_l2(ours.o, ref)
        rows[-5]["rel_l2_vs_cudnn"] = rows[-4]["rel_l2_vs_cudnn"] = round(err, 5)
        line = (f"{name:30s} B={B:2d} Hq={Hq:2d} Hkv={Hkv:2d} S={S:5d} D={D:3d} causal={int(causal)}  "
                f"fp8 {tf(ms_fwd):6.1f}  e2e {tf(ms_e2e):6.1f}  cudnn {tf(ms_base['cudnn_bf16']):6.1f}  "
                f"fa2 {tf(ms_base['fa2_bf16']):6.1f} TF/s  x{ms_base['cudnn_bf16'] / ms_fwd:.2f} cudnn "
                f"(e2e x{ms_base['cudnn_bf16'] / ms_e2e:.2f})  quantize {ms_quant:.3f} ms  relL2 {err:.4f}")
        print(line, flush=True)
        log.append(line)
        ours.close()
        del bshd, bhsd, ref
        torch.cuda.empty_cache()
    cmd = "python3 bench/bench_fwd_shapes.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k not in ("out", "lib"))
    result = dict(date=args.date, gpu=torch.cuda.get_device_name(), commit=args.commit, command=cmd,
                  note="recipe fp8 on model-shaped problems; rows with gqa='repeat' ran the baseline on K and V "
                       "repeated to Hq heads (the backend refused enable_gqa).", rows=rows)
    with open(os.path.join(args.out, "bench-fwd-shapes.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "bench-fwd-shapes.log"), "w") as f:
        f.write("\n".join(log) + "\n")


if __name__ == "__main__":
    main()
