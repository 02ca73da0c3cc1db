#!/usr/bin/env python3
"""Forward benchmark of recipe nvfp4 on the sm90 BF16 wgmma kernel against
cuDNN BF16 SDPA and FlashAttention-2 BF16 (PyTorch sdpa_kernel backends), in
one process (DESIGN §8). Head dims 128 (H = 16) and 64 (H = 32), B·S = 32k.

Recipe nvfp4 runs through bench/capi_nvfp4.cpp: the NVFP4 quantizer, then the
expansion pre-pass to BF16 (cuda/sm90/fwd/nvfp4_bf16/expand.hpp), then the
kernel, which reads BF16 Q, K and Vᵀ (kernel_bytes: as many as cuDNN's BF16).
  op fwd      the kernel alone on prepared operands, P by Direct-P
              (direct_p true) and by the exp2 baseline (direct_p false)
  op fwd_e2e  quantize + expand from bf16, then the kernel (Direct-P)

Timing: CUDA events around each call, warm-up first, median of --reps runs,
two input sets alternated so that consecutive runs never find their inputs in L2.
"""
import argparse
import ctypes
import datetime
import json
import os

import torch
from torch.nn.attention import SDPBackend

from bench_fwd import sdpa
from capi_lib import time_ms

TOKENS = 32768  # B·S
HEADS = {128: 16, 64: 32}  # DESIGN §8's grid: H = 16 at D = 128, 32 at D = 64
GRID_S = [4096, 8192]
DTYPE_BF16 = 2
INPUT_SETS = 2


def declare(lib):
    lib.fp4attn_nvfp4_last_error.restype = ctypes.c_char_p
    lib.fp4attn_nvfp4_plan_create.restype = ctypes.c_void_p
    lib.fp4attn_nvfp4_plan_create.argtypes = [ctypes.c_int] * 8 + [ctypes.c_float]
    lib.fp4attn_nvfp4_plan_destroy.argtypes = [ctypes.c_void_p]
    lib.fp4attn_nvfp4_plan_set_direct_p.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.fp4attn_nvfp4_kernel_operand_bytes.restype = ctypes.c_longlong
    lib.fp4attn_nvfp4_kernel_operand_bytes.argtypes = [ctypes.c_void_p]
    ll3 = ctypes.c_longlong * 3
    lib.fp4attn_nvfp4_prepare.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int, ll3, ll3, ll3, ctypes.c_void_p]
    lib.fp4attn_nvfp4_check_finite.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.fp4attn_nvfp4_attend.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ll3, ctypes.c_void_p, ctypes.c_void_p]
    return ll3


def check(lib, rc):
    if rc != 0:
        raise RuntimeError(lib.fp4attn_nvfp4_last_error().decode())


class Runner:
    """One plan per input set."""

    def __init__(self, lib, ll3, sets, B, H, S, D, causal):
        self.lib, self.ll3, self.sets = lib, ll3, sets
        self.stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.plans = []
        for _ in sets:
            p = lib.fp4attn_nvfp4_plan_create(B, H, H, S, S, D, int(causal), 1, 0.0)
            if not p:
                raise RuntimeError(lib.fp4attn_nvfp4_last_error().decode())
            self.plans.append(p)
        self.o = torch.empty(B, S, H, D, device="cuda", dtype=torch.bfloat16)
        self.lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
        for i in range(len(sets)):
            self.prepare(i)
        check(lib, lib.fp4attn_nvfp4_check_finite(self.plans[0], self.stream))

    def set_direct_p(self, on):
        for p in self.plans:
            self.lib.fp4attn_nvfp4_plan_set_direct_p(p, int(on))

    def strides(self, t):
        return self.ll3(t.stride(0), t.stride(1), t.stride(2))

    def prepare(self, i):
        q, k, v = self.sets[i % len(self.sets)]
        s = self.strides
        check(self.lib, self.lib.fp4attn_nvfp4_prepare(self.plans[i % len(self.plans)], q.data_ptr(), k.data_ptr(),
                                                       v.data_ptr(), DTYPE_BF16, s(q), s(k), s(v), self.stream))

    def attend(self, i):
        check(self.lib, self.lib.fp4attn_nvfp4_attend(self.plans[i % len(self.plans)], self.o.data_ptr(),
                                                      self.strides(self.o), self.lse.data_ptr(), self.stream))

    def e2e(self, i):
        self.prepare(i)
        self.attend(i)

    def close(self):
        for p in self.plans:
            self.lib.fp4attn_nvfp4_plan_destroy(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seqs", default=",".join(map(str, GRID_S)))
    ap.add_argument("--causal", type=int, default=0)
    ap.add_argument("--dims", default="128")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib = ctypes.CDLL(args.lib)
    ll3 = declare(lib)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    causal = bool(args.causal)
    rows, log = [], []
    for D, S in [(d, s) for d in map(int, args.dims.split(",")) for s in map(int, args.seqs.split(","))]:
        B, H = TOKENS // S, HEADS[D]
        sets = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                for _ in range(INPUT_SETS)]
        flops = 4.0 * B * H * D * S * S / (2 if causal else 1)
        tf = lambda ms: flops / (ms * 1e-3) / 1e12
        ref_fn = sdpa(SDPBackend.CUDNN_ATTENTION, sets, causal)
        ms_cudnn = time_ms(ref_fn, args.reps, args.warmup)
        ms_fa2 = time_ms(sdpa(SDPBackend.FLASH_ATTENTION, sets, causal), args.reps, args.warmup)
        ref = ref_fn(0).transpose(1, 2)
        r = Runner(lib, ll3, sets, B, H, S, D, causal)
        ms = time_ms(r.attend, args.reps, args.warmup)
        ms_e2e = time_ms(r.e2e, args.reps, args.warmup)
        r.e2e(0)
        torch.cuda.synchronize()
        err = ((r.o.float() - ref.float()).norm() / ref.float().norm()).item()
        r.set_direct_p(False)
        ms_exp2 = time_ms(r.attend, args.reps, args.warmup)
        r.attend(0)
        torch.cuda.synchronize()
        err_exp2 = ((r.o.float() - ref.float()).norm() / ref.float().norm()).item()
        r.set_direct_p(True)
        base = dict(causal=causal, B=B, H=H, Hkv=H, Sq=S, Sk=S, D=D)
        rows.append(dict(op="fwd", impl="cudnn_bf16", recipe="bf16", ms=round(ms_cudnn, 4),
                         tflops=round(tf(ms_cudnn), 1), **base))
        rows.append(dict(op="fwd", impl="fa2_bf16", recipe="bf16", ms=round(ms_fa2, 4), tflops=round(tf(ms_fa2), 1),
                         **base))
        for op, dp, t, e in (("fwd", True, ms, err), ("fwd_e2e", True, ms_e2e, err), ("fwd", False, ms_exp2, err_exp2)):
            rows.append(dict(op=op, impl="fp4attn", recipe="nvfp4", direct_p=dp, ms=round(t, 4),
                             tflops=round(tf(t), 1), kernel_bytes=lib.fp4attn_nvfp4_kernel_operand_bytes(r.plans[0]),
                             rel_l2_vs_cudnn=round(e, 5), **base))
        line = (f"D={D:3d} S={S:5d} B={B:2d} H={H} causal={int(causal)} cudnn {tf(ms_cudnn):6.1f} "
                f"fa2 {tf(ms_fa2):6.1f} TFLOP/s  nvfp4 {tf(ms):6.1f} (x{ms_cudnn / ms:.2f} cudnn, "
                f"x{ms_fa2 / ms:.2f} fa2, e2e {tf(ms_e2e):6.1f}, relL2 vs cudnn {err:.4f})  "
                f"exp2 {tf(ms_exp2):6.1f} (x{ms_cudnn / ms_exp2:.2f} cudnn, Direct-P x{ms_exp2 / ms:.2f}, "
                f"relL2 {err_exp2:.4f})")
        print(line, flush=True)
        log.append(line)
        r.close()
        del sets, ref
        torch.cuda.empty_cache()
    cmd = "python3 bench/bench_fwd_nvfp4.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k not in ("out", "lib"))
    result = dict(date=args.date, gpu=torch.cuda.get_device_name(), commit=args.commit, command=cmd,
                  note="nvfp4: NVFP4 quantizer + BF16 expansion pre-pass; the kernel reads BF16 operands.", rows=rows)
    with open(os.path.join(args.out, "bench-fwd-nvfp4.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "bench-fwd-nvfp4.log"), "w") as f:
        f.write("\n".join(log) + "\n")


if __name__ == "__main__":
    main()
