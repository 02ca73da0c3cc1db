#!/usr/bin/env python3
"""Probe: does the FP8 quantizer gain from L2 when a call is split into chunks
of the batch (or of the heads) small enough that K and V, read first for their
statistics, are still in L2 when the codes read them again?

Each chunk is a call of its own through libfp4attn_capi.so (statistics,
finalize, codes) on a slice of the same bf16 tensors (q[b0:b1] or
q[:, :, h0:h1], the strides of the whole), writing into a plan of the chunk's
size. Quantization is per batch entry and head, so a chunk's codes are the
whole call's; only the order of the memory traffic changes. The whole call is
timed beside it in the same process, rounds rotated.

Timing: CUDA events around the chunk calls, queued back to back (the host's
issue cost of more launches is reported separately, from unqueued runs).
"""
import argparse
import ctypes
import datetime
import json
import os
import statistics

import torch

from capi_lib import check, load_lib, time_ms

DTYPE_BF16 = 2
INPUT_SETS = 2

# (B, S, H, D)
CASES = [(8, 4096, 16, 128), (32, 1024, 16, 128), (4, 8192, 16, 128), (8, 4096, 16, 64), (1, 17550, 24, 128)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lib, ll3 = load_lib(args.lib)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    rows = []
    for B, S, H, D in CASES:
        sets = []
        for _ in range(INPUT_SETS):
            q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            k += 4 * torch.randn(D, device="cuda", dtype=torch.bfloat16)
            sets.append((q, k, v))
        kv_mb = 2 * B * S * H * D * 2 / 2**20
        # Splits: whole; batch chunks of 1, 2 entries; head chunks of 4, 8.
        splits = [("whole", B, H)]
        for c in (1, 2):
            if c < B:
                splits.append((f"batch{c}", c, H))
        for hc in (4, 8):
            if hc < H:
                splits.append((f"heads{hc}", 1 if B == 1 else B, hc))
        for smooth_k in (True, False):
            timers = {}
            plans_all = []
            for name, cb, ch in splits:
                plans = [lib.fp4attn_plan_create(cb, ch, ch, S, S, D, 0, 1, int(smooth_k), 0.0) for _ in sets]
                if not all(plans):
                    raise RuntimeError(lib.fp4attn_last_error().decode())
                plans_all += plans
                if name.startswith("heads"):
                    chunks = [(slice(None), slice(h0, h0 + ch)) for h0 in range(0, H, ch)]
                else:
                    chunks = [(slice(b0, b0 + cb), slice(None)) for b0 in range(0, B, cb)]

                def run(i, plans=plans, chunks=chunks):
                    q, k, v = sets[i % INPUT_SETS]
                    st = lambda t: ll3(t.stride(0), t.stride(1), t.stride(2))
                    for bs, hs in chunks:
                        qs, ks, vs = q[bs, :, hs], k[bs, :, hs], v[bs, :, hs]
                        check(lib, lib.fp4attn_quantize(plans[i % INPUT_SETS], qs.data_ptr(), ks.data_ptr(),
                                                        vs.data_ptr(), DTYPE_BF16, st(qs), st(ks), st(vs), stream))
                timers[name] = (run, len(chunks))
            got = {name: [] for name in timers}
            host = {name: [] for name in timers}
            for _ in range(args.rounds):
                for name, (run, _) in timers.items():
                    got[name].append(time_ms(run, args.reps, args.warmup, queued=True))
                    host[name].append(time_ms(run, args.reps, args.warmup))
            check(lib, lib.fp4attn_check_finite(plans_all[0], stream))
            whole = statistics.median(got["whole"])
            for name, (run, n) in timers.items():
                ms = statistics.median(got[name])
                rows.append(dict(op="quantize", impl="fp4attn", recipe="fp8", B=B, Sq=S, Sk=S, H=H, Hkv=H, D=D,
                                 smooth_k=smooth_k, split=name, calls=n, kv_mb=round(kv_mb, 1),
                                 ms_queued=round(ms, 4), ms_unqueued=round(statistics.median(host[name]), 4),
                                 rounds_queued=[round(x, 4) for x in got[name]], vs_whole=round(ms / whole, 3)))
                print(f"B={B:2d} S={S:5d} H={H} D={D} smooth_k={int(smooth_k)} {name:8s} calls={n:3d} "
                      f"{ms * 1e3:7.1f} us queued ({ms / whole:.3f} of whole), "
                      f"{statistics.median(host[name]) * 1e3:7.1f} us unqueued", flush=True)
            for p in plans_all:
                lib.fp4attn_plan_destroy(p)
        del sets
        torch.cuda.empty_cache()
    cmd = "python3 bench/quantize_chunk_probe.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k not in ("out", "lib"))
    result = dict(date=args.date, gpu=torch.cuda.get_device_name(), commit=args.commit, command=cmd, rows=rows)
    with open(os.path.join(args.out, "quantize-chunk-probe.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
