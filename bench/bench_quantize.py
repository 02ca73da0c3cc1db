#!/usr/bin/env python3
"""Bandwidth of the GPU FP8 quantizer (recipe fp8, bf16 inputs, one fused
launch) through libfp4attn_capi.so, against a device-to-device copy measured
in the same process.

Bytes counted are the fewest the quantizer must move: Q, K and V read once;
codes, scales, k_mean and lse_shift written once. The kernel reads K and V a
second time, served partly by L2: what L2 misses shows as lost bandwidth.

Timing as in bench_fwd.py: CUDA events, warm-up, median of --reps runs, two
input sets alternated (each larger than L2). The work order is swept
(lag in kv chunks, CTAs per SM); 'default' is what the library picks.
"""
import argparse
import ctypes
import datetime
import json
import os

import torch

from capi_lib import check, load_lib, time_ms

TOKENS = 32768           # B·S, as the forward grid
L2_BYTES = 60 * 2**20
INPUT_SETS = 2
DTYPE_BF16 = 2           # fp4attn_quantize's code for bf16
TOKEN_BLOCK = 128
COPY_BYTES = 2**30       # device-to-device copy for the bandwidth ceiling
NOMINAL_COPY_TBPS = 4.3  # H200 copy measured here before (read + write)
DEFAULT = (-1, 0)        # (lag_chunks, ctas_per_sm): the library's choice
ALL_STATS_FIRST = 1 << 30  # a lag past every chunk: statistics pass, then quantize pass


def required_bytes(B, S, H, D, smooth_k):
    elems = B * S * H * D
    blocks = B * H * -(-S // TOKEN_BLOCK)
    read = 3 * 2 * elems                          # bf16 Q, K, V
    codes = 3 * elems                             # E4M3 Q, K, Vᵀ (S a multiple of 128: no padding)
    scales = 4 * (2 * blocks + B * H * D)         # Q, K per block; V per channel
    smooth = 4 * (B * H * D + B * H * S) if smooth_k else 0  # k_mean, lse_shift
    return read + codes + scales + smooth


def copy_tbps(reps, warmup):
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda i: dst.copy_(src), reps, warmup)
    return 2 * COPY_BYTES / (ms * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--lags", default=f"0,64,128,256,512,{ALL_STATS_FIRST}", help="kv chunks; swept beside the default")
    ap.add_argument("--ctas", default="0,1", help="CTAs per SM (0: the kernel's own), swept beside the default")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib, ll3 = load_lib(args.lib)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    gpu = torch.cuda.get_device_name()
    ceiling = copy_tbps(args.reps, args.warmup)
    print(f"device-to-device copy: {ceiling:.2f} TB/s (read + write)", flush=True)
    schedules = [DEFAULT] + [(int(l), int(c)) for c in args.ctas.split(",") for l in args.lags.split(",")]
    H, D = args.heads, args.dim
    rows, lines = [], []

    for S in map(int, args.seqs.split(",")):
        B = TOKENS // S
        sets = []
        for _ in range(INPUT_SETS):
            q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            k += 4 * torch.randn(D, device="cuda", dtype=torch.bfloat16)  # the shared offset smooth_k removes
            sets.append((q, k, v))
        assert 3 * sets[0][0].numel() * 2 > L2_BYTES
        for smooth_k in (True, False):
            plans = [lib.fp4attn_plan_create(B, H, H, S, S, D, 0, 1, int(smooth_k), 0.0) for _ in sets]
            if not all(plans):
                raise RuntimeError(lib.fp4attn_last_error().decode())

            def quantize(i):
                q, k, v = sets[i % INPUT_SETS]
                st = lambda t: ll3(t.stride(0), t.stride(1), t.stride(2))
                check(lib, lib.fp4attn_quantize(plans[i % INPUT_SETS], q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                                DTYPE_BF16, st(q), st(k), st(v), stream))

            nbytes = required_bytes(B, S, H, D, smooth_k)
            for lag, ctas in schedules:
                for p in plans:
                    lib.fp4attn_plan_set_quantize_schedule(p, lag, ctas)
                ms = time_ms(quantize, args.reps, args.warmup)
                check(lib, lib.fp4attn_check_finite(plans[0], stream))
                tbps = nbytes / (ms * 1e-3) / 1e12
                name = "default" if (lag, ctas) == DEFAULT else f"lag={lag} ctas/SM={ctas}"
                rows.append(dict(op="quantize", impl="fp4attn", recipe="fp8", direct_p=None, causal=False, B=B, H=H,
                                 Hkv=H, Sq=S, Sk=S, D=D, ms=round(ms, 4), tflops=None, gbps=round(tbps * 1e3, 1),
                                 smooth_k=smooth_k, schedule=name, bytes=nbytes,
                                 pct_of_copy=round(100 * tbps / ceiling, 1)))
                line = (f"S={S:5d} B={B:2d} H={H} D={D} smooth_k={int(smooth_k)} {name:24s} {ms * 1e3:7.1f} us "
                        f"{tbps * 1e3:6.0f} GB/s  {100 * tbps / ceiling:5.1f}% of copy  "
                        f"{100 * tbps / NOMINAL_COPY_TBPS:5.1f}% of {NOMINAL_COPY_TBPS} TB/s")
                print(line, flush=True)
                lines.append(line)
            for p in plans:
                lib.fp4attn_plan_destroy(p)
        del sets
        torch.cuda.empty_cache()

    cmd = "python3 bench/bench_quantize.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k not in ("out", "lib"))
    result = dict(date=args.date, gpu=gpu, commit=args.commit, command=cmd, copy_tbps=round(ceiling, 3), rows=rows)
    with open(os.path.join(args.out, "bench-quantize.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "bench-quantize.log"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("==== quantizer, default schedule")
    for r in rows:
        if r["schedule"] == "default":
            print(f"S={r['Sq']} smooth_k={int(r['smooth_k'])}: {r['ms'] * 1e3:.1f} us, {r['gbps']:.0f} GB/s, "
                  f"{r['pct_of_copy']}% of copy ({ceiling:.2f} TB/s)")
    best = max(rows, key=lambda r: r["gbps"])
    print(f"best: {best['schedule']} S={best['Sq']} smooth_k={int(best['smooth_k'])} {best['gbps']:.0f} GB/s")


if __name__ == "__main__":
    main()
