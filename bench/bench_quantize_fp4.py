#!/usr/bin/env python3
"""Bandwidth of the GPU FP4 quantizer (recipes mxfp4, nvfp4 and mxfp4_train's
Q and K; bf16 inputs shaped like the forward grid) through
libfp4attn_capi.so, against a device-to-device copy measured in the same
process.

Bytes counted are the fewest the quantizer must move: the input read once;
codes, scale codes, NVFP4's tensor scale and smooth_k's mean written once.
NVFP4 and smooth_k read their input a second time (the tensor amax, the
mean); 'pass_bytes' adds that read, and pct_of_copy_passes compares the time
with what a copy needs for the bytes of both passes.

Timing as in bench_quantize.py: CUDA events, warm-up, median of --reps runs,
two input sets alternated (each larger than L2). Each case is timed twice:
one call between two events ('ms', what a lone call costs, host launch
latency included: the GPU idles until the launch arrives), and --chain calls
back to back between two events, per call ('ms_chain': the kernels'
throughput when launches queue ahead, as in a model's step).
"""
import argparse
import ctypes
import datetime
import json
import os

import torch

from capi_lib import kernel_breakdown, time_ms

TOKENS = 32768           # B·S, as the forward grid
L2_BYTES = 60 * 2**20
INPUT_SETS = 2
DTYPE_BF16 = 2
COPY_BYTES = 2**30       # device-to-device copy for the bandwidth ceiling
NOMINAL_TBPS = 4.8       # H200 HBM3e, nominal
OPERANDS = {"q": 0, "k": 1, "v": 2}
FORMATS = {"mxfp4": 1, "nvfp4": 2}
BLOCK = {"mxfp4": 32, "nvfp4": 16}
TOKEN_PAD = 32           # kFp4TokenPad: V's sequence padding

# (name, recipe tags, operand, format, smooth_k, v_transposed)
CASES = [
    ("q", "mxfp4,mxfp4_train", "q", "mxfp4", 0, 1),
    ("k", "mxfp4,mxfp4_train", "k", "mxfp4", 0, 1),
    ("k smooth_k", "mxfp4,mxfp4_train", "k", "mxfp4", 1, 1),
    ("v transposed", "mxfp4", "v", "mxfp4", 0, 1),
    ("v", "mxfp4", "v", "mxfp4", 0, 0),
    ("q", "nvfp4", "q", "nvfp4", 0, 1),
    ("k", "nvfp4", "k", "nvfp4", 0, 1),
    ("k smooth_k", "nvfp4", "k", "nvfp4", 1, 1),
    ("v transposed", "nvfp4", "v", "nvfp4", 0, 1),
    ("v", "nvfp4", "v", "nvfp4", 0, 0),
]


def load_lib(path):
    lib = ctypes.CDLL(path)
    lib.fp4attn_fp4_last_error.restype = ctypes.c_char_p
    lib.fp4attn_fp4_plan_create.restype = ctypes.c_void_p
    lib.fp4attn_fp4_plan_create.argtypes = [ctypes.c_int] * 9
    lib.fp4attn_fp4_plan_destroy.argtypes = [ctypes.c_void_p]
    ll3 = ctypes.c_longlong * 3
    lib.fp4attn_fp4_quantize.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ll3, ctypes.c_void_p]
    lib.fp4attn_fp4_check_finite.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return lib, ll3


def check(lib, rc):
    if rc != 0:
        raise RuntimeError(lib.fp4attn_fp4_last_error().decode())


def required_bytes(op, fmt, smooth_k, B, S, H, D):
    elems = B * S * H * D
    block = BLOCK[fmt]
    if op == "v":
        padded = -(-S // TOKEN_PAD) * TOKEN_PAD
        codes, scales = B * H * padded * D // 2, B * H * (padded // block) * D
    else:
        codes, scales = elems // 2, elems // block
    extra = (4 if fmt == "nvfp4" else 0) + (4 * B * H * D if smooth_k else 0)
    return 2 * elems + codes + scales + extra


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
    ap.add_argument("--seqs", default="4096")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=TOKENS, help="B·S of each case; B = max(1, tokens // S)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--commit", default="")
    ap.add_argument("--chain", type=int, default=10, help="calls back to back per event pair for ms_chain")
    ap.add_argument("--cases", default="",
                    help="comma-separated '<format> <case>' names to run, e.g. 'nvfp4 q,mxfp4 k smooth_k' "
                         "(default: every case and the q+k+vT sequences)")
    ap.add_argument("--kernels", action="store_true",
                    help="also record each case's kernels, mean µs per call (CUPTI through torch.profiler)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib, ll3 = load_lib(args.lib)
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
            x = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
            x *= torch.exp(1.5 * torch.randn_like(x))  # heavy-tailed magnitudes
            x += 4 * torch.randn(D, device="cuda", dtype=torch.bfloat16)  # the shared offset smooth_k removes
            sets.append(x)
        assert sets[0].numel() * 2 > L2_BYTES
        strides = ll3(*sets[0].stride()[:3])

        def timed(plans):
            def run(i):
                x = sets[i % INPUT_SETS]
                for p in plans:
                    check(lib, lib.fp4attn_fp4_quantize(p, x.data_ptr(), DTYPE_BF16, strides, stream))

            def run_chain(i):
                for k in range(args.chain):
                    run(i * args.chain + k)
            ms = time_ms(run, args.reps, args.warmup)
            ms_chain = time_ms(run_chain, args.reps, args.warmup) / args.chain
            kernels = kernel_breakdown(run) if args.kernels else None
            for p in plans:
                check(lib, lib.fp4attn_fp4_check_finite(p, stream))
            return ms, ms_chain, kernels

        def record(name, recipe, fmt, smooth_k, nbytes, pass_bytes, times, operand, transposed):
            ms, ms_chain, kernels = times
            tbps = nbytes / (ms * 1e-3) / 1e12
            chain_tbps = nbytes / (ms_chain * 1e-3) / 1e12
            pass_tbps = pass_bytes / (ms * 1e-3) / 1e12
            rows.append(dict(op="quantize", impl="fp4attn", recipe=recipe, operand=operand, case=name, format=fmt,
                             v_transposed=bool(transposed) if operand in ("v", "qkv") else None,
                             direct_p=None, causal=False, B=B, H=H, Hkv=H, Sq=S, Sk=S, D=D, ms=round(ms, 4),
                             tflops=None, gbps=round(tbps * 1e3, 1), smooth_k=bool(smooth_k), bytes=nbytes,
                             pass_bytes=pass_bytes, pct_of_copy=round(100 * tbps / ceiling, 1),
                             pct_of_copy_passes=round(100 * pass_tbps / ceiling, 1),
                             pct_of_nominal=round(100 * tbps / NOMINAL_TBPS, 1), chain=args.chain,
                             ms_chain=round(ms_chain, 4), pct_of_copy_chain=round(100 * chain_tbps / ceiling, 1),
                             pct_of_copy_passes_chain=round(100 * pass_bytes / (ms_chain * 1e-3) / 1e12 / ceiling, 1),
                             kernels_us=kernels))
            line = (f"S={S:5d} B={B:2d} {fmt} {name:14s} {ms * 1e3:7.1f} us {tbps * 1e3:6.0f} GB/s "
                    f"{100 * tbps / ceiling:5.1f}% of copy ({100 * pass_tbps / ceiling:5.1f}% counting every pass) "
                    f"{100 * tbps / NOMINAL_TBPS:5.1f}% of {NOMINAL_TBPS} TB/s | chained {ms_chain * 1e3:7.1f} us "
                    f"{100 * chain_tbps / ceiling:5.1f}% of copy")
            print(line, flush=True)
            lines.append(line)
            for kname, us in (kernels or {}).items():
                kline = f"    {us:7.1f} us  {kname[:110]}"
                print(kline, flush=True)
                lines.append(kline)

        elems = B * S * H * D
        plans_by_case = {}
        wanted = {c.strip() for c in args.cases.split(",") if c.strip()}
        for name, recipe, op, fmt, smooth_k, transposed in CASES:
            if wanted and f"{fmt} {name}" not in wanted:
                continue
            plan = lib.fp4attn_fp4_plan_create(OPERANDS[op], FORMATS[fmt], B, S, H, D, smooth_k, transposed, 0)
            if not plan:
                raise RuntimeError(lib.fp4attn_fp4_last_error().decode())
            plans_by_case[(fmt, name)] = plan
            nbytes = required_bytes(op, fmt, smooth_k, B, S, H, D)
            passes = 2 if (fmt == "nvfp4" or smooth_k) else 1
            record(name, recipe, fmt, smooth_k, nbytes, nbytes + (passes - 1) * 2 * elems, timed([plan]), op, transposed)
        # A whole recipe's operands, one after the other: Q, K with smooth_k, Vᵀ.
        for fmt in FORMATS:
            parts = [("q", "q", 0), ("k smooth_k", "k", 1), ("v transposed", "v", 0)]
            if any((fmt, n) not in plans_by_case for n, _, _ in parts):
                continue
            plans = [plans_by_case[(fmt, n)] for n, _, _ in parts]
            nbytes = sum(required_bytes(op, fmt, sk, B, S, H, D) for _, op, sk in parts)
            extra_reads = sum(2 * elems for _, op, sk in parts if fmt == "nvfp4" or sk)
            record("q+k+vT", fmt, fmt, 1, nbytes, nbytes + extra_reads, timed(plans), "qkv", 1)
        for p in plans_by_case.values():
            lib.fp4attn_fp4_plan_destroy(p)
        sets.clear()
        torch.cuda.empty_cache()

    cmd = "python3 bench/bench_quantize_fp4.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k not in ("out", "lib"))
    result = dict(date=args.date, gpu=gpu, commit=args.commit, command=cmd, copy_tbps=round(ceiling, 3),
                  nominal_tbps=NOMINAL_TBPS, rows=rows)
    with open(os.path.join(args.out, "bench-quantize-fp4.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "bench-quantize-fp4.log"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
