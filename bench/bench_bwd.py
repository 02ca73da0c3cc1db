#!/usr/bin/env python3
"""Forward+backward benchmark of the sm90 kernels (recipes fp8 and mxfp4_train,
--recipes) against cuDNN BF16 SDPA and FlashAttention-2 BF16 (PyTorch
sdpa_kernel backends), in one process (DESIGN §8).

Ours runs through libfp4attn_capi.so (ctypes, bench/capi_bwd.cpp), from bf16
inputs with every quantization included (mxfp4_train: the MXFP4 quantizer and
the fold into E4M3 too), Direct-P on, in both modes (row key "deterministic":
two passes, or one pass whose dK/dV kernel also sums dQ; --one-pass 0 (or its old
name --atomic 0) skips the latter):
  op fwdbwd  device forward (quantizer + kernel) then device backward
             (quantizers, transposes, row statistics, dQ and dK/dV kernels)
  op bwd     the device backward alone
The SDPA backends run the same two ops through autograd (bwd: autograd.grad on
a kept graph). FLOPs: forward 4·B·H·S²·D (causal: unmasked pairs only),
backward 2.5×, forward+backward 3.5×.

Timing: CUDA events around each call, warm-up first, median of --reps runs,
two input sets alternated so that consecutive runs never find their inputs
in L2 (each set is larger than the 60 MB L2 at every grid point).
"""
import argparse
import ctypes
import datetime
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from capi_lib import time_ms

L2_BYTES = 60 * 2**20
TOKENS = 32768  # B·S of the standard grid
GRID_HD = [(16, 128), (32, 64)]
GRID_S = [1024, 2048, 4096, 8192, 16384]
DTYPE_BF16 = 2
INPUT_SETS = 2
RECIPE_CODES = {"fp8": 0, "mxfp4_train": 3}  # fp4attn::Recipe's values
FWD_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}


def load_bwd_lib(path):
    lib = ctypes.CDLL(path)
    ll3, ll6 = ctypes.c_longlong * 3, ctypes.c_longlong * 6
    vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    lib.fp4attn_bwd_last_error.restype = ctypes.c_char_p
    lib.fp4attn_bwd_forward_workspace_bytes.restype = ll
    lib.fp4attn_bwd_forward_workspace_bytes.argtypes = [ll6, i]
    lib.fp4attn_bwd_workspace_bytes.restype = ll
    lib.fp4attn_bwd_workspace_bytes.argtypes = [ll6, i]
    lib.fp4attn_bwd_forward.argtypes = [ll6, i, i, i, i, vp, ll3, vp, ll3, vp, ll3, vp, ll3, vp, vp, ll, vp]
    lib.fp4attn_bwd_backward.argtypes = ([ll6, i, i, i, i] + [vp, ll3] * 5 + [vp] + [vp, ll3] * 3 + [vp, ll, i, vp])
    if hasattr(lib, "fp4attn_bwd_saved_bytes"):  # libraries from before the saved operands lack these
        lib.fp4attn_bwd_saved_bytes.restype = ll
        lib.fp4attn_bwd_saved_bytes.argtypes = [ll6, i]
        lib.fp4attn_bwd_forward_saved.argtypes = [ll6, i, i, i, i, vp, ll3, vp, ll3, vp, ll3, vp, ll3, vp, vp, ll, vp,
                                                  ll, vp]
        lib.fp4attn_bwd_backward_saved.argtypes = ([ll6, i, i, i, i] + [vp, ll3] * 5 + [vp] + [vp, ll3] * 3 +
                                                   [vp, ll, i, vp, ll, vp])
    return lib, ll3, ll6


def flops(B, H, S, D, causal, op):
    pairs = S * (S + 1) / 2 if causal else S * S
    return FWD_FACTOR[op] * 4.0 * B * H * D * pairs


class Ours:
    """Our device forward and backward on `sets`. saved=True: as in training through the torch op, the
    forward keeps Q's and K's operands (recipe fp8) and the backward reads them; where the library or the
    recipe keeps none, the backward quantizes q and k itself."""

    def __init__(self, lib, ll3, ll6, sets, B, H, S, D, causal, recipe="fp8", saved=True):
        self.lib, self.ll3, self.sets = lib, ll3, sets
        self.shape = ll6(B, S, S, H, H, D)
        self.recipe = RECIPE_CODES[recipe]
        self.mask = 1 if causal else 0
        self.stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        fwd_ws = lib.fp4attn_bwd_forward_workspace_bytes(self.shape, self.recipe)
        bwd_ws = lib.fp4attn_bwd_workspace_bytes(self.shape, self.recipe)
        if fwd_ws < 0 or bwd_ws < 0:
            raise RuntimeError(lib.fp4attn_bwd_last_error().decode())
        self.fwd_ws = torch.empty(fwd_ws, device="cuda", dtype=torch.uint8)
        self.bwd_ws = torch.empty(bwd_ws, device="cuda", dtype=torch.uint8)
        kept = lib.fp4attn_bwd_saved_bytes(self.shape, self.recipe) if saved and hasattr(
            lib, "fp4attn_bwd_saved_bytes") else 0
        if kept < 0:
            raise RuntimeError(lib.fp4attn_bwd_last_error().decode())
        self.saved = [torch.empty(kept, device="cuda", dtype=torch.uint8) for _ in sets] if kept > 0 else None
        self.o = [torch.empty(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in sets]
        self.lse = [torch.empty(B, H, S, device="cuda", dtype=torch.float32) for _ in sets]
        self.grads = [torch.empty(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        for n in range(len(sets)):
            self.forward(n)

    def st(self, t):
        return self.ll3(t.stride(0), t.stride(1), t.stride(2))

    def check(self, rc):
        if rc != 0:
            raise RuntimeError(self.lib.fp4attn_bwd_last_error().decode())

    def forward(self, i):
        n = i % len(self.sets)
        q, k, v, _ = self.sets[n]
        args = (self.shape, self.recipe, self.mask, 1, DTYPE_BF16, q.data_ptr(), self.st(q), k.data_ptr(), self.st(k),
                v.data_ptr(), self.st(v), self.o[n].data_ptr(), self.st(self.o[n]), self.lse[n].data_ptr(),
                self.fwd_ws.data_ptr(), self.fwd_ws.numel())
        if self.saved is None:
            self.check(self.lib.fp4attn_bwd_forward(*args, self.stream))
        else:
            self.check(self.lib.fp4attn_bwd_forward_saved(*args, self.saved[n].data_ptr(), self.saved[n].numel(),
                                                          self.stream))

    def backward(self, i, deterministic=True):
        n = i % len(self.sets)
        q, k, v, d_o = self.sets[n]
        dq, dk, dv = self.grads
        args = (self.shape, self.recipe, self.mask, 1, DTYPE_BF16, q.data_ptr(), self.st(q), k.data_ptr(), self.st(k),
                v.data_ptr(), self.st(v), self.o[n].data_ptr(), self.st(self.o[n]), d_o.data_ptr(), self.st(d_o),
                self.lse[n].data_ptr(), dq.data_ptr(), self.st(dq), dk.data_ptr(), self.st(dk), dv.data_ptr(),
                self.st(dv), self.bwd_ws.data_ptr(), self.bwd_ws.numel(), int(deterministic))
        if self.saved is None:
            self.check(self.lib.fp4attn_bwd_backward(*args, self.stream))
        else:
            self.check(self.lib.fp4attn_bwd_backward_saved(*args, self.saved[n].data_ptr(), self.saved[n].numel(),
                                                           self.stream))

    def fwdbwd(self, i, deterministic=True):
        self.forward(i)
        self.backward(i, deterministic)


class Sdpa:
    """One backend's forward+backward through autograd, and its backward alone on kept graphs."""

    def __init__(self, backend, sets, causal):
        self.backend, self.sets, self.causal = backend, sets, causal
        self.leaves = [tuple(t.detach().clone().requires_grad_(True) for t in s[:3]) for s in sets]
        self.graphs = [self.run_forward(n) for n in range(len(sets))]

    def run_forward(self, n):
        q, k, v = self.leaves[n]
        with sdpa_kernel(self.backend):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=self.causal)

    def fwdbwd(self, i):
        n = i % len(self.sets)
        out = self.run_forward(n)
        with sdpa_kernel(self.backend):
            torch.autograd.grad(out, self.leaves[n], self.sets[n][3].transpose(1, 2))

    def backward(self, i, deterministic=True):
        n = i % len(self.sets)
        with sdpa_kernel(self.backend):
            return torch.autograd.grad(self.graphs[n], self.leaves[n], self.sets[n][3].transpose(1, 2),
                                       retain_graph=True)


def profile_kernels(fn, reps):
    """CUDA time per kernel of fn over reps calls (torch.profiler), printed as a table."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            fn(i)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70), flush=True)


def rel_l2(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default="bench-bwd", help="basename of the .json and .log written to --out")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seqs", default=",".join(map(str, GRID_S)))
    ap.add_argument("--dims", default=",".join(str(d) for _, d in GRID_HD), help="head dims to run (subset of the grid)")
    ap.add_argument("--causal", default="0,1", help="mask settings to run: 0 noncausal, 1 causal (bottom-right)")
    ap.add_argument("--recipes", default="fp8", help="our recipes to run: fp8, mxfp4_train or both, comma-separated")
    ap.add_argument("--one-pass", "--atomic", dest="one_pass", type=int, default=1,
                    help="also time the one-pass mode (deterministic=False) (1) or not (0)")
    ap.add_argument("--saved", type=int, default=1,
                    help="1: the forward keeps Q's and K's operands for the backward, as training through the torch "
                         "op does (recipe fp8); 0: the backward quantizes q and k again")
    ap.add_argument("--profile", action="store_true",
                    help="also print each kernel's share of our backward (torch.profiler), first grid point only")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib, ll3, ll6 = load_bwd_lib(args.lib)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    gpu = torch.cuda.get_device_name()
    rows, log = [], []

    def add(op, impl, recipe, direct_p, causal, B, H, S, D, ms, deterministic=True, saved=None):
        tf = flops(B, H, S, D, causal, op) / (ms * 1e-3) / 1e12
        rows.append(dict(op=op, impl=impl, recipe=recipe, direct_p=direct_p, causal=causal, B=B, H=H, Hkv=H, Sq=S,
                         Sk=S, D=D, ms=round(ms, 4), tflops=round(tf, 1), gbps=None, deterministic=deterministic))
        if saved is not None:
            rows[-1]["saved_operands"] = saved
        return tf

    dims = set(map(int, args.dims.split(",")))
    recipes = args.recipes.split(",")
    for recipe in recipes:
        if recipe not in RECIPE_CODES:
            raise SystemExit(f"--recipes: {recipe} is not one of {', '.join(RECIPE_CODES)}")
    for H, D in [(h, d) for h, d in GRID_HD if d in dims]:
        for S in map(int, args.seqs.split(",")):
            B = TOKENS // S
            sets = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                    for _ in range(INPUT_SETS)]
            assert 4 * sets[0][0].numel() * 2 > L2_BYTES
            for causal in map(bool, map(int, args.causal.split(","))):
                r, err = {}, {}
                for recipe in recipes:
                    ours = Ours(lib, ll3, ll6, sets, B, H, S, D, causal, recipe, bool(args.saved))
                    kept = ours.saved is not None
                    r[recipe] = add("fwdbwd", "fp4attn", recipe, True, causal, B, H, S, D,
                                    time_ms(ours.fwdbwd, args.reps, args.warmup), saved=kept)
                    r[recipe + "_bwd"] = add("bwd", "fp4attn", recipe, True, causal, B, H, S, D,
                                             time_ms(ours.backward, args.reps, args.warmup), saved=kept)
                    if args.one_pass:
                        r[recipe + "_nd"] = add("fwdbwd", "fp4attn", recipe, True, causal, B, H, S, D,
                                                time_ms(lambda i: ours.fwdbwd(i, False), args.reps, args.warmup),
                                                False)
                        r[recipe + "_nd_bwd"] = add("bwd", "fp4attn", recipe, True, causal, B, H, S, D,
                                                    time_ms(lambda i: ours.backward(i, False), args.reps,
                                                            args.warmup), False)
                    if args.profile:
                        profile_kernels(ours.backward, args.reps)
                        if args.one_pass:
                            profile_kernels(lambda i: ours.backward(i, False), args.reps)
                        args.profile = False
                    ours.fwdbwd(0)
                    grads = [g.clone() for g in ours.grads]
                    grads_nd = None
                    if args.one_pass:
                        ours.fwdbwd(0, False)
                        grads_nd = ours.grads[0].clone()
                    err[recipe] = (grads, grads_nd)
                    del ours
                for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
                    impl = f"{name}_bf16"
                    ref = Sdpa(backend, sets, causal)
                    r[name] = add("fwdbwd", impl, "bf16", False, causal, B, H, S, D,
                                  time_ms(ref.fwdbwd, args.reps, args.warmup))
                    r[name + "_bwd"] = add("bwd", impl, "bf16", False, causal, B, H, S, D,
                                           time_ms(ref.backward, args.reps, args.warmup))
                    if name == "cudnn":
                        # Sanity: our gradients against cuDNN's on the same inputs (recipe error, not a test).
                        want = ref.backward(0)
                        for recipe, (grads, grads_nd) in err.items():
                            err[recipe] = ([rel_l2(g, w) for g, w in zip(grads, want)],
                                           None if grads_nd is None else rel_l2(grads_nd, want[0]))
                    del ref
                for recipe in recipes:
                    e, e_nd = err[recipe]
                    nd = (f" (one pass {r[recipe + '_nd']:6.1f}, x{r[recipe + '_nd'] / r['cudnn']:.2f})"
                          if args.one_pass else "")
                    nd_bwd = f" ({r[recipe + '_nd_bwd']:6.1f})" if args.one_pass else ""
                    nd_err = f" ({e_nd:.3f})" if e_nd is not None else ""
                    line = (f"{recipe:11s} D={D:3d} H={H:2d} S={S:5d} B={B:2d} causal={int(causal)}  fwd+bwd: ours "
                            f"{r[recipe]:6.1f}{nd}  cudnn {r['cudnn']:6.1f}  fa2 {r['fa2']:6.1f} TF/s  "
                            f"x{r[recipe] / r['cudnn']:.2f} cuDNN x{r[recipe] / r['fa2']:.2f} FA2  |  "
                            f"bwd: ours {r[recipe + '_bwd']:6.1f}{nd_bwd}  cudnn {r['cudnn_bwd']:6.1f}  "
                            f"fa2 {r['fa2_bwd']:6.1f}  |  relL2 vs cudnn dq {e[0]:.3f}{nd_err} dk {e[1]:.3f} "
                            f"dv {e[2]:.3f}")
                    print(line, flush=True)
                    log.append(line)
            del sets
            torch.cuda.empty_cache()

    cmd = "python3 bench/bench_bwd.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                                    if k not in ("out", "lib"))
    result = dict(date=args.date, gpu=gpu, commit=args.commit, command=cmd, rows=rows)
    with open(os.path.join(args.out, args.name + ".json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, args.name + ".log"), "w") as f:
        f.write("\n".join(log) + "\n")


if __name__ == "__main__":
    main()
