"""Probe: does splitting a recipe-fp8 call into chunks (of the batch, or of the heads
where the batch is small) on two CUDA streams overlap the FP8 quantizer of one chunk
with the attention kernel of another? Every kernel is launched by a whole
fp4attn.attention call on a chunk; the result is bit for bit the single call's
(quantization is per batch and head). cuDNN BF16 SDPA timed beside it.

    PYTHONPATH=<site> python3 bench/stream_overlap_probe.py OUT.json

The chunked calls create their two streams on every call, so on small problems the
host's cost per call, not the GPU, sets their time; read those rows as such.
"""
import json, sys, torch, fp4attn
import torch.nn.functional as F

def timeit(fn, reps=20, warm=3):
    for _ in range(warm): fn()
    torch.cuda.synchronize()
    best = []
    for r in range(3):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        for _ in range(reps): fn()
        b.record(); torch.cuda.synchronize()
        best.append(a.elapsed_time(b) / reps * 1e3)
    return min(best)

def chunks(x, n, axis):
    return torch.chunk(x, n, dim=axis)

def make(n, axis, prio):
    lo, hi = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=-1 if prio else 0)
    streams = [lo, hi]
    def fn(q, k, v):
        cur = torch.cuda.current_stream()
        for s in streams: s.wait_stream(cur)
        outs = []
        for i, (a, b, c) in enumerate(zip(chunks(q, n, axis), chunks(k, n, axis), chunks(v, n, axis))):
            with torch.cuda.stream(streams[i % 2]):
                outs.append(fp4attn.attention(a, b, c, recipe="fp8", causal=CAUSAL))
        for s in streams: cur.wait_stream(s)
        return outs
    return fn

rows = []
cases = [(64, 577, 16, 16, 64, 0), (16, 1000, 16, 16, 128, 0), (8, 4096, 16, 16, 128, 0), (4, 2000, 32, 8, 128, 1),
         (2, 16384, 16, 16, 128, 0), (1, 17550, 24, 24, 128, 0)]
for B, S, Hq, Hkv, D, causal in cases:
    CAUSAL = bool(causal)
    torch.manual_seed(0)
    q = torch.randn(B, S, Hq, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16) + 0.5
    v = torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16)
    flops = 4 * B * Hq * S * S * D / (2 if causal else 1)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    r = {"B": B, "S": S, "Hq": Hq, "Hkv": Hkv, "D": D, "causal": causal}
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        r["cudnn_us"] = timeit(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=CAUSAL, enable_gqa=Hq != Hkv))
    r["fp8_us"] = timeit(lambda: fp4attn.attention(q, k, v, recipe="fp8", causal=CAUSAL))
    axis = 0 if B >= 4 else 2
    for n in (2, 4, 8):
        if (B if axis == 0 else Hkv) % n: continue
        for prio in (0, 1):
            r[f"chunks{n}_prio{prio}_us"] = timeit(lambda: make(n, axis, prio)(q, k, v))
    ref = fp4attn.attention(q, k, v, recipe="fp8", causal=CAUSAL)
    got = torch.cat(make(4 if (B if axis == 0 else Hkv) % 4 == 0 else 2, axis, 1)(q, k, v), dim=axis)
    torch.cuda.synchronize()
    r["bits_equal"] = bool(torch.equal(ref, got))
    r = {a: (round(b, 1) if isinstance(b, float) else b) for a, b in r.items()}
    best = min(v_ for k_, v_ in r.items() if k_.startswith("chunks"))
    r["tflops_fp8"], r["tflops_best_chunked"], r["tflops_cudnn"] = (round(flops / t / 1e6, 1) for t in (r["fp8_us"], best, r["cudnn_us"]))
    print(json.dumps(r), flush=True)
    rows.append(r)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
