#!/usr/bin/env python3
"""Forward benchmark of recipes mxfp4 and mxfp4_train on the sm90 kernel
against the fp8 recipe, cuDNN BF16 SDPA and FlashAttention-2 BF16 (PyTorch
sdpa_kernel backends), in one process (DESIGN §8).

The MX recipes run through bench/capi_mx.cpp: the MXFP4 quantizer, then
either a fold pass into E4M3 (cuda/quantize/fold_mx.hpp) whose bytes the FP8
kernel reads, as many as the fp8 recipe reads (variants mxfp4_train, mxfp4),
or a pass that writes only the fold factors and a kernel that reads the MXFP4
codes and scales and expands them itself (variant mxfp4_in_kernel). Rows
report the kernel's operand bytes (kernel_bytes) and the MXFP4 storage.
  op fwd       the kernel alone on prepared operands
  op fwd_fold  MX only: the fold (or the factors) and the kernel, on kept MXFP4
               operands (what a cache of MXFP4 K and V would run per call)
  op fwd_e2e   quantize + fold (or factors) from bf16, then the kernel

Every variant runs with Direct-P; --direct-p 0 runs them all with P by exp2
instead (the comparison path), so that the two compare in separate processes.

Timing: CUDA events around each call, warm-up first, median of --reps runs,
two input sets alternated so that consecutive runs never find their inputs in L2.
With --seconds N each implementation's forward (op fwd only) instead runs back
to back for N seconds while nvidia-smi samples the SM clock and power
(clock_under_load.sampled): the card at its power limit, as a long job keeps
it; rows then carry the median clock and power of their run.
"""
import argparse
import ctypes
import datetime
import json
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from capi_lib import check, load_lib, time_ms
from clock_under_load import sampled

TOKENS = 32768  # B·S
H, D = 16, 128
GRID_S = [4096, 8192, 16384]
DTYPE_BF16 = 2
INPUT_SETS = 2
RECIPES = {"mxfp4": 1, "mxfp4_train": 3}
# What a row measures: recipe fp8, the MX recipes with the fold pass before the
# kernel, and recipe mxfp4 with the kernel reading MXFP4 and expanding it itself.
VARIANTS = {"fp8": "fp8", "mxfp4_train": "mxfp4_train", "mxfp4": "mxfp4", "mxfp4_in_kernel": "mxfp4"}


def declare_mx(lib):
    lib.fp4attn_mx_last_error.restype = ctypes.c_char_p
    lib.fp4attn_mx_plan_create.restype = ctypes.c_void_p
    lib.fp4attn_mx_plan_create.argtypes = [ctypes.c_int] * 10 + [ctypes.c_float, ctypes.c_int]
    lib.fp4attn_mx_plan_destroy.argtypes = [ctypes.c_void_p]
    lib.fp4attn_mx_kernel_code_bytes.restype = ctypes.c_longlong
    lib.fp4attn_mx_kernel_code_bytes.argtypes = [ctypes.c_void_p]
    ll3 = ctypes.c_longlong * 3
    lib.fp4attn_mx_prepare.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int, ll3, ll3, ll3, ctypes.c_void_p]
    lib.fp4attn_mx_check_finite.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.fp4attn_mx_fold.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.fp4attn_mx_attend.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ll3, ctypes.c_void_p, ctypes.c_void_p]


def mx_check(lib, rc):
    if rc != 0:
        raise RuntimeError(lib.fp4attn_mx_last_error().decode())


def strides(ll3, t):
    return ll3(t.stride(0), t.stride(1), t.stride(2))


class Runner:
    """One plan per input set for one recipe (fp8 through capi.cpp, MX through capi_mx.cpp)."""

    def __init__(self, lib, ll3, sets, B, Sq, Sk, recipe, expand_in_kernel=False, H=H, D=D, causal=False,
                 direct_p=True):
        self.lib, self.ll3, self.sets, self.mx = lib, ll3, sets, recipe != "fp8"
        self.stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.plans = []
        for _ in sets:
            if self.mx:
                p = lib.fp4attn_mx_plan_create(B, H, H, Sq, Sk, D, RECIPES[recipe], int(causal), int(direct_p), 1,
                                               0.0, int(expand_in_kernel))
                if not p:
                    raise RuntimeError(lib.fp4attn_mx_last_error().decode())
            else:
                p = lib.fp4attn_plan_create(B, H, H, Sq, Sk, D, int(causal), int(direct_p), 1, 0.0)
                if not p:
                    raise RuntimeError(lib.fp4attn_last_error().decode())
            self.plans.append(p)
        self.o = torch.empty(B, Sq, H, D, device="cuda", dtype=torch.bfloat16)
        self.lse = torch.empty(B, H, Sq, device="cuda", dtype=torch.float32)
        for i in range(len(sets)):
            self.prepare(i)
        if self.mx:
            mx_check(lib, lib.fp4attn_mx_check_finite(self.plans[0], self.stream))
        else:
            check(lib, lib.fp4attn_check_finite(self.plans[0], self.stream))

    def kernel_bytes(self):
        if self.mx:
            return self.lib.fp4attn_mx_kernel_code_bytes(self.plans[0])
        return None

    def prepare(self, i):
        q, k, v = self.sets[i % len(self.sets)]
        p = self.plans[i % len(self.plans)]
        s = lambda t: strides(self.ll3, t)
        if self.mx:
            mx_check(self.lib, self.lib.fp4attn_mx_prepare(p, q.data_ptr(), k.data_ptr(), v.data_ptr(), DTYPE_BF16,
                                                           s(q), s(k), s(v), self.stream))
        else:
            check(self.lib, self.lib.fp4attn_quantize(p, q.data_ptr(), k.data_ptr(), v.data_ptr(), DTYPE_BF16,
                                                      s(q), s(k), s(v), self.stream))

    def attend(self, i):
        p = self.plans[i % len(self.plans)]
        o, lse = self.o.data_ptr(), self.lse.data_ptr()
        if self.mx:
            mx_check(self.lib, self.lib.fp4attn_mx_attend(p, o, strides(self.ll3, self.o), lse, self.stream))
        else:
            check(self.lib, self.lib.fp4attn_attend(p, o, strides(self.ll3, self.o), lse, self.stream))

    def fold_attend(self, i):
        """MX: the fold (or, in_kernel, the factors) and the kernel, on kept MXFP4 operands."""
        mx_check(self.lib, self.lib.fp4attn_mx_fold(self.plans[i % len(self.plans)], self.stream))
        self.attend(i)

    def e2e(self, i):
        self.prepare(i)
        self.attend(i)

    def close(self):
        for p in self.plans:
            (self.lib.fp4attn_mx_plan_destroy if self.mx else self.lib.fp4attn_plan_destroy)(p)


def sdpa(backend, sets):
    def run(i):
        q, k, v = sets[i % len(sets)]
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return run


def rel_l2(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seqs", default=",".join(map(str, GRID_S)))
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--commit", default="")
    ap.add_argument("--sq", type=int, default=0, help="query length (default: each --seqs length)")
    ap.add_argument("--batch", type=int, default=0, help="batch (default: 32768 tokens / key length)")
    ap.add_argument("--direct-p", type=int, default=1, choices=(0, 1),
                    help="0: every variant with P by exp2 (the comparison path: exp2_cvt, mxfp4_exp2)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated: " + ", ".join(VARIANTS))
    ap.add_argument("--seconds", type=float, default=0.0,
                    help="> 0: time each forward back to back for this long, with the clock sampled (op fwd only)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib, ll3 = load_lib(args.lib)
    declare_mx(lib)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    gpu = torch.cuda.get_device_name()
    rows, log = [], []
    for S in map(int, args.seqs.split(",")):
        Sq = args.sq or S  # keys: S; queries: --sq (a prefill chunk against a long context) or S
        B = args.batch or TOKENS // S
        q_elems, kv_elems = B * Sq * H * D, B * S * H * D
        sets = [(torch.randn(B, Sq, H, D, device="cuda", dtype=torch.bfloat16),
                 torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16),
                 torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)) for _ in range(INPUT_SETS)]
        tf = lambda ms: 4.0 * B * H * D * Sq * S / (ms * 1e-3) / 1e12
        cudnn, fa2 = sdpa(SDPBackend.CUDNN_ATTENTION, sets), sdpa(SDPBackend.FLASH_ATTENTION, sets)
        load = {}  # op fwd's clock and power under --seconds, by row

        def timed_fwd(fn, key):
            if args.seconds <= 0:
                return time_ms(fn, args.reps, args.warmup)
            for i in range(args.warmup):
                fn(i)
            ms, samples = sampled(fn, args.seconds)
            load[key] = dict(sm_mhz=statistics.median(x["sm_mhz"] for x in samples) if samples else None,
                             watts=round(statistics.median(x["watts"] for x in samples), 1) if samples else None)
            return ms

        ms_cudnn = timed_fwd(cudnn, "cudnn_bf16")
        ms_fa2 = timed_fwd(fa2, "fa2_bf16")
        ref = cudnn(0).transpose(1, 2)
        base = dict(causal=False, B=B, H=H, Hkv=H, Sq=Sq, Sk=S, D=D)
        bf16_bytes = (q_elems + 2 * kv_elems) * 2
        rows.append(dict(op="fwd", impl="cudnn_bf16", recipe="bf16", direct_p=False, ms=round(ms_cudnn, 4),
                         tflops=round(tf(ms_cudnn), 1), kernel_bytes=bf16_bytes, **load.get("cudnn_bf16", {}), **base))
        rows.append(dict(op="fwd", impl="fa2_bf16", recipe="bf16", direct_p=False, ms=round(ms_fa2, 4),
                         tflops=round(tf(ms_fa2), 1), kernel_bytes=bf16_bytes, **load.get("fa2_bf16", {}), **base))
        line = [f"Sq={Sq:5d} Sk={S:5d} B={B:2d} cudnn {tf(ms_cudnn):6.1f} fa2 {tf(ms_fa2):6.1f}"]
        for variant in args.variants.split(","):
            recipe = VARIANTS[variant]
            in_kernel = variant == "mxfp4_in_kernel"
            r = Runner(lib, ll3, sets, B, Sq, S, recipe, in_kernel, direct_p=bool(args.direct_p))
            timed = [("fwd", timed_fwd(r.attend, variant))]
            if args.seconds <= 0:
                if r.mx:
                    timed.append(("fwd_fold", time_ms(r.fold_attend, args.reps, args.warmup)))
                timed.append(("fwd_e2e", time_ms(r.e2e, args.reps, args.warmup)))
            r.e2e(0)
            torch.cuda.synchronize()
            err = rel_l2(r.o, ref)
            kb = r.kernel_bytes() or (q_elems + 2 * kv_elems)  # fp8: E4M3 Q, K and Vᵀ (keys padded to 128: none here)
            # MXFP4 storage: half a byte per element plus one E8M0 scale per 32 elements.
            mx_bytes = lambda n: n // 2 + n // 32
            fp4_storage = mx_bytes(q_elems + 2 * kv_elems) if recipe == "mxfp4" else (
                mx_bytes(q_elems + kv_elems) + kv_elems if recipe == "mxfp4_train" else None)
            for op, t in timed:
                rows.append(dict(op=op, impl="fp4attn", recipe=recipe, direct_p=bool(args.direct_p), ms=round(t, 4),
                                 expansion=None if recipe == "fp8" else ("in_kernel" if in_kernel else "fold_pass"),
                                 tflops=round(tf(t), 1), kernel_bytes=kb, fp4_storage_bytes=fp4_storage,
                                 rel_l2_vs_cudnn=round(err, 5), **(load.get(variant, {}) if op == "fwd" else {}),
                                 **base))
            t = dict(timed)
            fold = f", fold+kernel {tf(t['fwd_fold']):6.1f}" if "fwd_fold" in t else ""
            e2e = f", e2e {tf(t['fwd_e2e']):6.1f}" if "fwd_e2e" in t else ""
            clock = f", {load[variant]['sm_mhz']} MHz" if variant in load else ""
            line.append(f"{variant} {tf(t['fwd']):6.1f} (x{ms_cudnn / t['fwd']:.2f} cudnn{fold}{e2e}{clock}, "
                        f"relL2 {err:.4f})")
            r.close()
        print("  ".join(line), flush=True)
        log.append("  ".join(line))
        del sets, ref
        torch.cuda.empty_cache()
    cmd = "python3 bench/bench_fwd_mx.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k not in ("out", "lib"))
    result = dict(date=args.date, gpu=gpu, commit=args.commit, command=cmd,
                  note="MX recipes: MXFP4 quantizer, then either a fold pass into E4M3 that the kernel reads "
                       "(expansion fold_pass; kernel_bytes equal the fp8 recipe's) or a factors-only pass and a "
                       "kernel that reads MXFP4 codes and scales and expands them in its producer warpgroup "
                       "(expansion in_kernel).",
                  rows=rows)
    with open(os.path.join(args.out, "bench-fwd-mx.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "bench-fwd-mx.log"), "w") as f:
        f.write("\n".join(log) + "\n")


if __name__ == "__main__":
    main()
