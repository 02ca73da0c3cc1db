"""Randomized check of packed (varlen) calls on the GPU against per-sequence calls.

flash_attn_varlen_func promises each sequence the bits of a call on it alone:
O, the LSE and, under autograd, dQ, dK and dV. Each case draws a batch of
1 … 12 sequences whose query and key lengths mix empty sequences, a few
tokens, the 128-token tile's edges and lengths up to 3 000 (queries and keys
of one sequence equal or not), heads with GQA / MQA ratios, a head dim the
packed path reads in place, bf16 or f16, causal or not, a sliding window in 3
of 10 cases (from a stream of its own, so seeds keep their other draws), and a
softmax scale;
cu_seqlens on the GPU or the host; half the cases also take gradients, half of
those with a loss on the LSE too (finite dLSE on every row, rows that see no key
included, where the gradient must be zero). It
runs the packed call, then every sequence with queries as its own
flash_attn_func call (or, without keys, the O = 0 / LSE = −inf that a fully
masked row gives), and compares bit for bit. Every fifth case also runs the
packed forward captured in a CUDA graph for other lengths of the same token
counts and replays it on the case's lengths: the replay must give the same
bits. The backward runs the two deterministic passes on both sides
(torch_ops.DETERMINISTIC_BACKWARD), whose gradients the contract fixes.
Gradient elements that are zero in both with opposite signs (+0 against -0)
are also counted apart: they were the one difference the script found,
before the varlen paths read the packed tensors through one split each
(autograd had summed several slices' gradients, and (+0) + (-0) = +0; README,
"Varlen").
About a quarter of the cases whose head dim is a multiple of 16 (again from a
stream of their own) run on FlashAttention-3's FP8 inputs instead: float8_e4m3fn
codes with a random descale per sequence and kv head, forward only, each
sequence against flash_attn_func on its codes and its row of each descale.

    PYTHONPATH=<site> python3 python/tests/fuzz_varlen_device.py --cases 100 --seed 1 --out fuzz-varlen.json

Exit status 1 when any case disagrees; the JSON lists every case with its draw
(--only N reruns one).
"""

import argparse
import math
import sys

import numpy as np
import torch

import fp4attn
import fp4attn.torch_ops
from fuzz_runs import run_cases, write_record
from random_problems import window

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
DEVICE = "cuda"  # the tensors' device ("cpu" runs the same cases on the host path, without graph replays)
HEAD_DIMS = [64, 128, 32, 96, 72, 40, 16, 112]  # what the one-call path reads in place (and its backward takes)
EDGES = [1, 2, 127, 128, 129, 255, 256, 257, 383, 384]


def draw_length(rng: np.random.Generator) -> int:
    kind = rng.random()
    if kind < 0.07:
        return 0
    if kind < 0.25:
        return int(rng.integers(1, 17))
    if kind < 0.45:
        return int(rng.choice(EDGES))
    return int(rng.integers(1, 3001))


def draw(rng: np.random.Generator) -> dict:
    batch = int(rng.integers(1, 13))
    lens_q = [draw_length(rng) for _ in range(batch)]
    same = rng.random() < 0.5
    lens_k = list(lens_q) if same else [draw_length(rng) for _ in range(batch)]
    if sum(lens_q) == 0:
        lens_q[0] = 1
    if sum(lens_k) == 0:
        lens_k[0] = 1
    hkv = int(rng.integers(1, 4))
    c = {
        "lens_q": lens_q,
        "lens_k": lens_k,
        "Hkv": hkv,
        "Hq": hkv * int(rng.choice([1, 2, 3, 4, 7])),
        "D": int(rng.choice(HEAD_DIMS)),
        "dtype": str(rng.choice(list(DTYPES))),
        "causal": bool(rng.random() < 0.5),
        "scale": None if rng.random() < 0.7 else float(rng.uniform(0.02, 0.3)),
        "cu_on_gpu": bool(rng.random() < 0.5),
        "backward": bool(rng.random() < 0.5),
        "data_seed": int(rng.integers(0, 2**31)),
        # Drawn last, so that a seed's other draws are those of the script before it.
        "lse_loss": bool(rng.random() < 0.5),
    }
    # A sliding window, from a stream of its own (the seed's other draws unchanged).
    c["window"] = window(c["data_seed"], c["causal"], max(max(lens_q), max(lens_k)))
    # FP8 inputs with descales, likewise (the kernels read them where D is a multiple of 16).
    c["e4m3"] = bool(c["D"] % 16 == 0 and np.random.default_rng([c["data_seed"], 8]).random() < 0.25)
    return c


def bits_differ(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bits differ (NaN payloads included)."""
    if a.shape != b.shape:
        return max(a.numel(), b.numel())
    view = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return int((a.contiguous().view(view) != b.contiguous().view(view)).sum())


def zero_signs_differ(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements that are +0 in one tensor and -0 in the other (counted by bits_differ too)."""
    if a.shape != b.shape:
        return 0
    return int(((a == 0) & (b == 0) & (torch.signbit(a) != torch.signbit(b))).sum())


def other_lengths(lens: list, longest: int, rng: np.random.Generator) -> list:
    """Lengths of the same sum and count, none past `longest` (what a captured call was sized for)."""
    total, out = sum(lens), []
    for i in range(len(lens) - 1):
        rest = len(lens) - 1 - i
        low, high = max(0, total - rest * longest), min(longest, total)
        out.append(int(rng.integers(low, high + 1)))
        total -= out[-1]
    return out + [total]


def e4m3_operands(c: dict, g: torch.Generator, total_q: int, total_k: int) -> tuple:
    """float8_e4m3fn q, k, v (codes of normal values over E4M3's range) and their (B, Hkv) descales."""
    def codes(rows, heads, spread):
        x = (torch.randn(rows, heads, c["D"], generator=g) * spread).clamp(-448, 448)
        return x.to(torch.float8_e4m3fn).to(DEVICE)

    sequences = len(c["lens_q"])
    qkv = (codes(total_q, c["Hq"], 40), codes(total_k, c["Hkv"], 40), codes(total_k, c["Hkv"], 100))
    descales = tuple(torch.exp2(torch.rand(sequences, c["Hkv"], generator=g) * -6 - 2).to(DEVICE) for _ in range(3))
    return qkv, descales


def run_case(c: dict) -> dict:
    g = torch.Generator().manual_seed(c["data_seed"])
    if c.get("e4m3"):
        return run_e4m3_case(c, g)
    dtype = DTYPES[c["dtype"]]
    cu_q = torch.tensor(np.cumsum([0] + c["lens_q"]), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + c["lens_k"]), dtype=torch.int32)
    total_q, total_k = int(cu_q[-1]), int(cu_k[-1])
    q = torch.randn(total_q, c["Hq"], c["D"], generator=g).to(DEVICE, dtype)
    k = (torch.randn(total_k, c["Hkv"], c["D"], generator=g) + 0.5).to(DEVICE, dtype)
    v = torch.randn(total_k, c["Hkv"], c["D"], generator=g).to(DEVICE, dtype)
    d_o = torch.randn(total_q, c["Hq"], c["D"], generator=g).to(DEVICE, dtype)
    d_lse = torch.randn(c["Hq"], total_q, generator=g).to(DEVICE) if c.get("lse_loss") else None
    max_q, max_k = max(c["lens_q"]), max(c["lens_k"])
    cus = (cu_q.to(DEVICE), cu_k.to(DEVICE)) if c["cu_on_gpu"] else (cu_q, cu_k)
    kw = {"causal": c["causal"], "softmax_scale": c["scale"], "window_size": tuple(c.get("window", (-1, -1)))}
    leaves = [x.clone().requires_grad_(c["backward"]) for x in (q, k, v)]
    out, lse, _ = fp4attn.flash_attn_varlen_func(*leaves, *cus, max_q, max_k, return_attn_probs=True, **kw)
    if c["backward"]:
        torch.autograd.backward((out, lse) if d_lse is not None else out, (d_o, d_lse) if d_lse is not None else d_o)
        for x in leaves:  # an input no sequence reads has no gradient: zeros
            if x.grad is None:
                x.grad = torch.zeros_like(x)
    r = {"o_differ": 0, "lse_differ": 0, "grad_differ": 0, "grad_zero_signs_differ": 0}
    for i in range(len(c["lens_q"])):
        a, b, s, e = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        if b == a:
            continue
        if e == s:  # no keys: O = 0, LSE = -inf, no gradient
            r["o_differ"] += int((out[a:b].float() != 0).sum())
            r["lse_differ"] += int((lse[:, a:b] != float("-inf")).sum())
            if c["backward"]:
                r["grad_differ"] += int((leaves[0].grad[a:b].float() != 0).sum())
            continue
        one = [x.detach()[rows].unsqueeze(0).clone().requires_grad_(c["backward"])
               for x, rows in ((q, slice(a, b)), (k, slice(s, e)), (v, slice(s, e)))]
        o1, lse1, _ = fp4attn.flash_attn_func(*one, return_attn_probs=True, **kw)
        r["o_differ"] += bits_differ(out[a:b], o1[0])
        r["lse_differ"] += bits_differ(lse[:, a:b], lse1[0])
        if c["backward"] and d_lse is not None:
            torch.autograd.backward((o1, lse1), (d_o[a:b].unsqueeze(0), d_lse[:, a:b].unsqueeze(0)))
        elif c["backward"]:
            o1.backward(d_o[a:b].unsqueeze(0))
        if c["backward"]:
            for got, want in ((leaves[0].grad[a:b], one[0].grad[0]), (leaves[1].grad[s:e], one[1].grad[0]),
                              (leaves[2].grad[s:e], one[2].grad[0])):
                signs = zero_signs_differ(got, want)
                r["grad_differ"] += bits_differ(got, want) - signs
                r["grad_zero_signs_differ"] += signs
    if c["backward"]:  # keys of sequences without queries get zero gradients
        for i in range(len(c["lens_q"])):
            if c["lens_q"][i] == 0:
                s, e = int(cu_k[i]), int(cu_k[i + 1])
                r["grad_differ"] += int((leaves[1].grad[s:e].float() != 0).sum())
                r["grad_differ"] += int((leaves[2].grad[s:e].float() != 0).sum())
    if c.get("captured"):
        # Captured for other lengths of the same token counts, replayed on the case's.
        rng = np.random.default_rng(c["data_seed"])
        first_q = torch.tensor(np.cumsum([0] + other_lengths(c["lens_q"], max_q, rng)), dtype=torch.int32).cuda()
        first_k = torch.tensor(np.cumsum([0] + other_lengths(c["lens_k"], max_k, rng)), dtype=torch.int32).cuda()
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad():
            with torch.cuda.graph(graph):
                o_g, lse_g, _ = fp4attn.flash_attn_varlen_func(q, k, v, first_q, first_k, max_q, max_k,
                                                               return_attn_probs=True, **kw)
            first_q.copy_(cu_q), first_k.copy_(cu_k)
            graph.replay()
            torch.cuda.synchronize()
        r["replay_differ"] = bits_differ(o_g, out.detach()) + bits_differ(lse_g, lse)
    r["ok"] = (r["o_differ"] == 0 and r["lse_differ"] == 0 and r["grad_differ"] == 0
               and r["grad_zero_signs_differ"] == 0 and not r.get("replay_differ"))
    return r


def run_e4m3_case(c: dict, g: torch.Generator) -> dict:
    """The packed call on E4M3 inputs against flash_attn_func per sequence (forward only)."""
    cu_q = torch.tensor(np.cumsum([0] + c["lens_q"]), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + c["lens_k"]), dtype=torch.int32)
    (q, k, v), descales = e4m3_operands(c, g, int(cu_q[-1]), int(cu_k[-1]))
    named = dict(zip(("q_descale", "k_descale", "v_descale"), descales))
    max_q, max_k = max(c["lens_q"]), max(c["lens_k"])
    cus = (cu_q.to(DEVICE), cu_k.to(DEVICE)) if c["cu_on_gpu"] else (cu_q, cu_k)
    kw = {"causal": c["causal"], "softmax_scale": c["scale"], "window_size": tuple(c.get("window", (-1, -1)))}
    out, lse, _ = fp4attn.flash_attn_varlen_func(q, k, v, *cus, max_q, max_k, return_attn_probs=True, **named, **kw)
    r = {"o_differ": 0, "lse_differ": 0}
    for i in range(len(c["lens_q"])):
        a, b, s, e = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        if b == a:
            continue
        if e == s:  # no keys: O = 0, LSE = -inf
            r["o_differ"] += int((out[a:b].float() != 0).sum())
            r["lse_differ"] += int((lse[:, a:b] != float("-inf")).sum())
            continue
        rows = {n: d[i:i + 1] for n, d in named.items()}
        o1, lse1, _ = fp4attn.flash_attn_func(q[a:b][None], k[s:e][None], v[s:e][None], return_attn_probs=True,
                                              **rows, **kw)
        r["o_differ"] += bits_differ(out[a:b], o1[0])
        r["lse_differ"] += bits_differ(lse[:, a:b], lse1[0])
    if c.get("captured") and DEVICE == "cuda":
        rng = np.random.default_rng(c["data_seed"])
        first_q = torch.tensor(np.cumsum([0] + other_lengths(c["lens_q"], max_q, rng)), dtype=torch.int32).cuda()
        first_k = torch.tensor(np.cumsum([0] + other_lengths(c["lens_k"], max_k, rng)), dtype=torch.int32).cuda()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o_g, lse_g, _ = fp4attn.flash_attn_varlen_func(q, k, v, first_q, first_k, max_q, max_k,
                                                           return_attn_probs=True, **named, **kw)
        first_q.copy_(cu_q), first_k.copy_(cu_k)
        graph.replay()
        torch.cuda.synchronize()
        r["replay_differ"] = bits_differ(o_g, out) + bits_differ(lse_g, lse)
    r["ok"] = r["o_differ"] == 0 and r["lse_differ"] == 0 and not r.get("replay_differ")
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", type=int, default=None, help="run case N of the seed's draw alone")
    ap.add_argument("--seconds", type=float, default=math.inf, help="stop drawing after this long")
    ap.add_argument("--out", default=None, help="JSON of every case and its result")
    ap.add_argument("--commit", default=None, help="the library's commit, for the JSON")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("fuzz_varlen_device: no CUDA device; nothing to compare")
        return 0
    fp4attn.torch_ops.DETERMINISTIC_BACKWARD = True
    rng = np.random.default_rng(args.seed)
    cases = [draw(rng) for _ in range(args.cases)]
    for i, c in enumerate(cases):
        c["captured"] = i % 5 == 4
    rows, failed, seconds = run_cases(cases, lambda i, c: run_case(c), args.only, args.seconds)
    print(f"fuzz_varlen_device: {len(rows)} cases in {seconds:.0f} s (seed {args.seed}; "
          f"{sum(len(r['lens_q']) for r in rows)} sequences, {sum(r['backward'] for r in rows)} with gradients "
          f"({sum(r['backward'] and r['lse_loss'] for r in rows)} with an LSE loss), "
          f"{sum(bool(r.get('captured')) for r in rows)} replayed from a graph, "
          f"{sum(bool(r.get('e4m3')) for r in rows)} on E4M3 inputs; gradient zeros of the other sign "
          f"in {sum(bool(r.get('grad_zero_signs_differ')) for r in rows)} cases, "
          f"{sum(r.get('grad_zero_signs_differ', 0) for r in rows)} elements), {failed} failed")
    write_record(args.out, args.seed, args.commit, rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
