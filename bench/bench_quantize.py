#!/usr/bin/env python3
"""Bandwidth of the GPU FP8 quantizer (recipe fp8, bf16 inputs) through
libfp4attn_capi.so, against a device-to-device copy measured in the same
process.

Bytes counted are the fewest the quantizer must move: Q, K and V read once;
codes, scales, k_mean and lse_shift written once. The quantizer reads K and V
a second time (their statistics come first), served partly by L2: what L2
misses shows as lost bandwidth.

Timing as in bench_fwd.py: CUDA events, warm-up, median of --reps runs, two
input sets alternated (each larger than L2). --lib takes several libraries
(comma-separated, named by --names): each case times them in turn, --rounds
times, and reports the median of the rounds, so builds compare in one process.
"""
import argparse
import ctypes
import datetime
import json
import os
import statistics

import torch

from capi_lib import check, load_lib, time_ms

TOKENS = 32768           # B·S, as the forward grid
L2_BYTES = 60 * 2**20
INPUT_SETS = 2
DTYPE_BF16 = 2           # fp4attn_quantize's code for bf16
TOKEN_BLOCK = 128
COPY_BYTES = 2**30       # device-to-device copy for the bandwidth ceiling
NOMINAL_COPY_TBPS = 4.3  # H200 copy measured here before (read + write)


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
    ap.add_argument("--tokens", type=int, default=TOKENS, help="B·S of each case; B = max(1, tokens // S)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--names", default="", help="one name per --lib (default: lib0, lib1, ...)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    paths = args.lib.split(",")
    names = args.names.split(",") if args.names else [f"lib{i}" for i in range(len(paths))]
    assert len(names) == len(paths), "--names needs one name per --lib"
    libs = [load_lib(path) for path in paths]
    ll3 = libs[0][1]
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    gpu = torch.cuda.get_device_name()
    ceiling = copy_tbps(args.reps, args.warmup)
    print(f"device-to-device copy: {ceiling:.2f} TB/s (read + write)", flush=True)
    H, D = args.heads, args.dim
    rows, lines = [], []

    for S in map(int, args.seqs.split(",")):
        B = max(1, args.tokens // S)
        sets = []
        for _ in range(INPUT_SETS):
            q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            k += 4 * torch.randn(D, device="cuda", dtype=torch.bfloat16)  # the shared offset smooth_k removes
            sets.append((q, k, v))
        assert 3 * sets[0][0].numel() * 2 > L2_BYTES
        for smooth_k in (True, False):
            plans = []
            for lib, _ in libs:
                plans.append([lib.fp4attn_plan_create(B, H, H, S, S, D, 0, 1, int(smooth_k), 0.0) for _ in sets])
                if not all(plans[-1]):
                    raise RuntimeError(lib.fp4attn_last_error().decode())

            def quantizer(lib, lib_plans):
                def quantize(i):
                    q, k, v = sets[i % INPUT_SETS]
                    st = lambda t: ll3(t.stride(0), t.stride(1), t.stride(2))
                    check(lib, lib.fp4attn_quantize(lib_plans[i % INPUT_SETS], q.data_ptr(), k.data_ptr(),
                                                    v.data_ptr(), DTYPE_BF16, st(q), st(k), st(v), stream))
                return quantize

            nbytes = required_bytes(B, S, H, D, smooth_k)
            rounds = [[] for _ in libs]
            for _ in range(args.rounds):
                for n, ((lib, _), lib_plans) in enumerate(zip(libs, plans)):
                    rounds[n].append(time_ms(quantizer(lib, lib_plans), args.reps, args.warmup))
                    check(lib, lib.fp4attn_check_finite(lib_plans[0], stream))
            for n, ((lib, _), lib_plans) in enumerate(zip(libs, plans)):
                ms = statistics.median(rounds[n])
                tbps = nbytes / (ms * 1e-3) / 1e12
                rows.append(dict(op="quantize", impl="fp4attn", recipe="fp8", direct_p=None, causal=False, B=B, H=H,
                                 Hkv=H, Sq=S, Sk=S, D=D, ms=round(ms, 4), tflops=None, gbps=round(tbps * 1e3, 1),
                                 smooth_k=smooth_k, build=names[n], bytes=nbytes,
                                 rounds_ms=[round(x, 4) for x in rounds[n]],
                                 pct_of_copy=round(100 * tbps / ceiling, 1)))
                line = (f"S={S:5d} B={B:2d} H={H} D={D} smooth_k={int(smooth_k)} {names[n]:12s} {ms * 1e3:7.1f} us "
                        f"{tbps * 1e3:6.0f} GB/s  {100 * tbps / ceiling:5.1f}% of copy  "
                        f"{100 * tbps / NOMINAL_COPY_TBPS:5.1f}% of {NOMINAL_COPY_TBPS} TB/s")
                print(line, flush=True)
                lines.append(line)
                for p in lib_plans:
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
    print(f"==== quantizer ({ceiling:.2f} TB/s copy)")
    for r in rows:
        print(f"S={r['Sq']} smooth_k={int(r['smooth_k'])} {r['build']}: {r['ms'] * 1e3:.1f} us, {r['gbps']:.0f} GB/s, "
              f"{r['pct_of_copy']}% of copy")

if __name__ == "__main__":
    main()
