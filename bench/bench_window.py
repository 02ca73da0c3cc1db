#!/usr/bin/env python3
"""Sliding-window (local) causal attention through the torch layer, as a model
with windowed layers calls it: fp4attn.flash_attn_func(window_size=(W, 0)) on
bf16 (B, S, H, D) tensors, quantizer included, forward ("fwd") and forward +
backward ("fwdbwd", dO random, gradients in bf16).

The inference recipes mxfp4 and nvfp4 are timed forward only (they have no
backward). Beside them in the same process:
* flex_bf16: torch's FlexAttention (compiled) with a sliding-window causal
  block mask, the windowed BF16 kernel PyTorch ships;
* cudnn_bf16_masked: SDPA on the cuDNN backend given the window as a boolean
  mask (what an SDPA user writes); recorded as unavailable where the backend
  refuses the mask;
* cudnn_bf16 and fa2_bf16: SDPA's cuDNN and FlashAttention-2 backends on the
  full causal problem (no window: neither takes one), the work the window
  saves.
TFLOP/s count the pairs each call computes: the window's for the windowed
calls, the causal triangle's for the full ones (fwdbwd as 3.5 times the
forward's). Every windowed output is compared with fp64 on the last 256
queries of batch 0 (rel_l2_vs_fp64). Implementations alternate over --rounds
rounds; a figure is the median round of --reps calls queued back to back.

    python3 bench/bench_window.py --out OUT [--cases 128:16384:1024,...] [--commit C]

A case is D:S:W (window left W, right 0, causal), optionally :Hq:Hkv (default
16 heads at D = 128, 32 at D = 64); B · S = 32k tokens.
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
from capi_lib import time_ms  # noqa: E402

import fp4attn  # noqa: E402

TOKENS = 32768
OURS = ("fp8", "mxfp4", "nvfp4")
FORWARD_ONLY = ("mxfp4", "nvfp4")  # inference recipes: no backward
DEFAULT_CASES = "128:8192:1024,128:16384:1024,128:32768:1024,128:16384:4096,128:32768:4096,64:16384:1024"


def parse_case(text):
    parts = [int(p) for p in text.split(":")]
    if len(parts) not in (3, 5):
        raise SystemExit(f"--cases: '{text}' is not D:S:W or D:S:W:Hq:Hkv")
    D, S, W = parts[:3]
    Hq, Hkv = parts[3:] if len(parts) == 5 else ((16, 16) if D == 128 else (32, 32))
    return D, S, W, Hq, Hkv


def pairs(S, W):
    """(query, key) pairs of causal attention with a window of W keys before the diagonal (Sq = Sk = S);
    W < 0: the full causal triangle."""
    if W < 0 or W >= S:
        return S * (S + 1) // 2
    return (W + 1) * (W + 2) // 2 + (S - W - 1) * (W + 1)


def fp64_rows(q, k, v, W, rows=256):
    """fp64 O of batch 0's last `rows` queries, every head, (rows, H, D)."""
    S, Hq, D = q.shape[1:]
    group = Hq // k.shape[2]
    q64 = q[0, S - rows:].double()
    k64 = k[0].double().repeat_interleave(group, dim=1)
    v64 = v[0].double().repeat_interleave(group, dim=1)
    s = torch.einsum("ihd,jhd->hij", q64, k64) / D ** 0.5
    i = torch.arange(S - rows, S, device=q.device)[:, None]
    j = torch.arange(S, device=q.device)[None, :]
    s = s.masked_fill(~((j <= i) & (j >= i - W)), float("-inf"))
    return torch.einsum("hij,jhd->ihd", torch.softmax(s, dim=-1), v64)


def rel_l2(o, ref):
    return float((o.double() - ref).norm() / ref.norm())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    rows = []
    for D, S, W, Hq, Hkv in (parse_case(c) for c in args.cases.split(",")):
        B = max(1, TOKENS // S)
        q = torch.randn(B, S, Hq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16)
        d_o = torch.randn(B, S, Hq, D, device="cuda", dtype=torch.bfloat16)
        qh, kh, vh, d_oh = (x.transpose(1, 2) for x in (q, k, v, d_o))  # (B, H, S, D) views for torch's kernels
        block_mask = create_block_mask(lambda b, h, i, j: (j <= i) & (i - j <= W), B=None, H=None, Q_LEN=S,
                                       KV_LEN=S, device="cuda")
        gqa = Hq != Hkv

        def ours(i):
            return fp4attn.flash_attn_func(q, k, v, causal=True, window_size=(W, 0))

        def inference(recipe):
            def run(i):
                return fp4attn.flash_attn_func(q, k, v, causal=True, window_size=(W, 0), recipe=recipe)
            return run

        def flex_fwd(i):
            return flex(qh, kh, vh, block_mask=block_mask, enable_gqa=gqa)

        def sdpa(backend, mask=None):
            def run(i):
                with sdpa_kernel(backend):
                    if mask is None:
                        return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=gqa)
                    return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=gqa)
            return run

        idx = torch.arange(S, device="cuda")
        window_mask = (idx[None, :] <= idx[:, None]) & (idx[:, None] - idx[None, :] <= W)
        impls = {"fp8": ours, "mxfp4": inference("mxfp4"), "nvfp4": inference("nvfp4"), "flex_bf16": flex_fwd, "cudnn_bf16_masked": sdpa(SDPBackend.CUDNN_ATTENTION, window_mask),
                 "cudnn_bf16": sdpa(SDPBackend.CUDNN_ATTENTION), "fa2_bf16": sdpa(SDPBackend.FLASH_ATTENTION)}

        def with_backward(fn):
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]

            def run(i):
                for x in leaves:
                    x.grad = None
                if fn is ours:
                    o = fp4attn.flash_attn_func(*leaves, causal=True, window_size=(W, 0))
                    o.backward(d_o)
                    return o
                qq, kk, vv = (x.transpose(1, 2) for x in leaves)
                if fn is flex_fwd:
                    o = flex(qq, kk, vv, block_mask=block_mask, enable_gqa=gqa)
                else:
                    with sdpa_kernel(fn.backend):
                        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=fn.mask, is_causal=fn.mask is None,
                                                           enable_gqa=gqa)
                o.backward(d_oh)
                return o
            return run

        for name, backend, mask in (("cudnn_bf16_masked", SDPBackend.CUDNN_ATTENTION, window_mask),
                                    ("cudnn_bf16", SDPBackend.CUDNN_ATTENTION, None),
                                    ("fa2_bf16", SDPBackend.FLASH_ATTENTION, None)):
            impls[name].backend, impls[name].mask = backend, mask

        ref = fp64_rows(q, k, v, W)
        result = {}
        available = {}
        for name, fn in impls.items():
            try:
                o = fn(0)
                torch.cuda.synchronize()
                o_bshd = o if name in OURS else o.transpose(1, 2)
                available[name] = None
                result[name] = {"rel_l2_vs_fp64": rel_l2(o_bshd[0, S - 256:], ref) if "masked" in name or name in
                                OURS + ("flex_bf16",) else None}
            except Exception as e:  # a backend that refuses the call is recorded, not timed
                available[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        times = {n: {"fwd": [], "fwdbwd": []} for n in impls if available[n] is None}
        bwd_fns = {n: with_backward(impls[n]) for n in times if n not in FORWARD_ONLY}
        for r in range(args.rounds):
            order = list(times)
            order = order[r % len(order):] + order[:r % len(order)]
            for n in order:
                times[n]["fwd"].append(time_ms(impls[n], args.reps, 3, queued=True))
                if n in FORWARD_ONLY:
                    continue
                try:
                    times[n]["fwdbwd"].append(time_ms(bwd_fns[n], max(3, args.reps // 2), 2, queued=True))
                except Exception as e:
                    result[n]["fwdbwd_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        for n in times:
            p = pairs(S, -1 if n in ("cudnn_bf16", "fa2_bf16") else W)
            flops = 4.0 * B * Hq * D * p
            for op in ("fwd", "fwdbwd"):
                if not times[n][op]:
                    continue
                ms = statistics.median(times[n][op])
                result[n][f"{op}_ms"] = ms
                result[n][f"{op}_tflops"] = flops * (3.5 if op == "fwdbwd" else 1.0) / ms / 1e9
        row = {"D": D, "S": S, "W": W, "B": B, "Hq": Hq, "Hkv": Hkv, "window_pairs": pairs(S, W),
               "full_causal_pairs": pairs(S, -1), "impls": result, "unavailable": {n: e for n, e in available.items()
                                                                                    if e is not None}}
        rows.append(row)
        line = f"D={D} S={S} W={W} B={B} H={Hq}/{Hkv}:"
        for n, r in result.items():
            if "fwd_ms" in r:
                line += f" {n} {r['fwd_ms']:.3f}/{r.get('fwdbwd_ms', float('nan')):.3f} ms"
        print(line, flush=True)
        del q, k, v, d_o, window_mask
        torch.cuda.empty_cache()
    out = {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(), "commit": args.commit,
           "command": "python3 " + " ".join(sys.argv), "torch": torch.__version__, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print("\n| D | S | W | impl | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | rel L2 vs fp64 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        for n, r in row["impls"].items():
            if "fwd_ms" not in r:
                continue
            rl = r.get("rel_l2_vs_fp64")
            print(f"| {row['D']} | {row['S']} | {row['W']} | {n} | {r['fwd_ms']:.3f} | {r['fwd_tflops']:.0f} | "
                  f"{r.get('fwdbwd_ms', float('nan')):.3f} | {r.get('fwdbwd_tflops', float('nan')):.0f} | "
                  f"{'' if rl is None else f'{rl:.2e}'} |")
        for n, e in row["unavailable"].items():
            print(f"| {row['D']} | {row['S']} | {row['W']} | {n} | unavailable: {e[:80]} | | | | |")


if __name__ == "__main__":
    main()
