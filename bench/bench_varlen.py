"""Varlen batches (sequences of different lengths packed along the tokens,
FlashAttention's flash_attn_varlen_func) on the GPU: fp4attn's
flash_attn_varlen_func (recipe fp8, from bf16, quantization included) against
cuDNN BF16 and FA2 BF16 through torch's SDPA, one call per sequence, and
torch's own packed varlen attention (FA2's varlen kernel) where this torch
has it, all in one process.

    python3 bench/bench_varlen.py --out OUT.json [--commit C] [--backward]

fp8 passes the same cu_seqlens tensor on every call, as a model's layers do
(its entries are read to the host once); fp8_new_cu_seqlens a new one each
call (read, and so a wait for the device, on every call). Where fp8 cuts the
batch into packed groups (one long sequence among short ones), fp8_one_call
runs it as one packed call; where a batch has empty slots, fp8_per_run runs
it without the packed call (a call per run of equal lengths). The
per-sequence baselines skip empty slots. --compiled adds fp8_compiled, the
call under torch.compile(fullgraph=True). fp8_e4m3_inputs runs recipe fp8 on
FlashAttention-3's FP8 inputs: q, k, v quantized once, outside the timing, to
float8_e4m3fn with a descale per sequence and kv head (amax / 448), as a
model's FP8 projections would emit them (no quantizer in the call).

A case is a list of sequence lengths (query = key length), heads and head
dim; TFLOP/s count each sequence's pairs (L·(L+1)/2 when causal). peak_mib:
the device memory one call takes at its peak beyond what was allocated
before it.
Every implementation's O is compared with an fp64 reference on one sequence
so that a fast wrong answer shows.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import typing

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from capi_lib import peak_mib, time_ms, with_consumers  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn import _host, torch_ops  # noqa: E402

# (name, lengths, Hq, Hkv, D, causal)
CASES = [
    ("llm_prefill_8_prompts", [1873, 512, 3001, 777, 2048, 1200, 256, 4000], 32, 8, 128, True),
    ("equal_8x2048", [2048] * 8, 32, 8, 128, True),
    ("long_and_short", [16384, 300, 900, 4096], 16, 16, 128, True),
    ("encoder_64_short", [96 + (37 * i) % 500 for i in range(64)], 16, 16, 64, False),
    # One long document among many short ones: fp8 runs it as two packed groups (_host.packed_groups).
    ("one_long_64_short", [32768] + [512] * 64, 32, 8, 128, True),
    # A server's batch with two empty slots: one packed call still (fp8_per_run: the path such
    # batches took before 2026-12-02, a call per run of equal lengths).
    ("llm_prefill_8_prompts_2_empty", [1873, 512, 0, 3001, 777, 2048, 0, 1200, 256, 4000], 32, 8, 128, True),
]


def to_e4m3(x, bounds, hkv):
    """x (total, H, D) as float8_e4m3fn codes and its (B, Hkv) descales: amax / 448 per sequence
    and kv head, a group's query heads sharing theirs (1 for an empty slot)."""
    h = x.shape[1]
    descale = torch.ones(len(bounds) - 1, hkv, device=x.device)
    codes = torch.zeros(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    for b, (s0, s1) in enumerate(zip(bounds, bounds[1:])):
        if s0 == s1:
            continue
        rows = x[s0:s1].float()
        descale[b] = rows.abs().amax(dim=(0, 2)).view(hkv, -1).amax(dim=1).clamp(min=1e-30) / 448
        codes[s0:s1] = (rows / descale[b].repeat_interleave(h // hkv)[None, :, None]).to(torch.float8_e4m3fn)
    return codes, descale


class CaseBatch(typing.NamedTuple):
    """One case's packed bf16 q, k, v (seed 0), cu_seqlens, and the same as E4M3 codes with descales."""
    name: str
    lens: list
    hq: int
    hkv: int
    d: int
    causal: bool
    cu: torch.Tensor
    bounds: list
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    e4m3: tuple  # ((q8, dq), (k8, dk), (v8, dv))


def case_batch(case_name) -> CaseBatch:
    """The named case's batch on the GPU, as the one-case scripts (host_varlen.py, dev/varlen_grid) build it."""
    name, lens, hq, hkv, d, causal = next(c for c in CASES if c[0] == case_name)
    torch.manual_seed(0)
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    bounds = cu.tolist()
    q = torch.randn(sum(lens), hq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lens), hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return CaseBatch(name, lens, hq, hkv, d, causal, cu, bounds, q, k, v,
                     tuple(to_e4m3(x, bounds, hkv) for x in (q, k, v)))


def without_one_call(fn):
    """fn with the packed device call turned off: a call per run of equal lengths."""
    def run(i):
        one_call = torch_ops.varlen_forward_device
        torch_ops.varlen_forward_device = lambda *a, **kw: None
        try:
            return fn(i)
        finally:
            torch_ops.varlen_forward_device = one_call
    return run


def torch_varlen():
    """torch's packed varlen attention, where this torch has one."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def drop_failing(impls, errors=(RuntimeError, TypeError)) -> dict:
    """Runs each implementation once; those that raise leave `impls`, their first error line kept."""
    skipped = {}
    for n in list(impls):
        try:
            impls[n](0)
        except errors as e:
            skipped[n] = str(e).splitlines()[0][:200]
            del impls[n]
    return skipped


def one_call(fn):
    """fn with every batch in one packed call, however long its longest sequence (no groups)."""
    def run(i):
        waste = _host.PACKED_LAYOUT_WASTE
        _host.PACKED_LAYOUT_WASTE = float("inf")
        try:
            return fn(i)
        finally:
            _host.PACKED_LAYOUT_WASTE = waste
    return run


def interleaved_ms(impls, rounds, reps, warmup) -> dict:
    """Milliseconds per call of each implementation, one figure a round, the order rotated each round."""
    times = {n: [] for n in impls}
    for rnd in range(rounds):
        names = list(impls)
        for n in names[rnd % len(names):] + names[:rnd % len(names)]:
            times[n].append(time_ms(impls[n], reps, warmup, queued=True))
    return times


def timing_row(op, name, lens, hq, hkv, d, causal, times, flop, skipped, **extra) -> dict:
    """A result row: the median over rounds, TFLOP/s and the ratio to cuDNN per sequence."""
    ms = {n: statistics.median(t) for n, t in times.items()}
    return dict(op=op, case=name, lengths=lens, Hq=hq, Hkv=hkv, D=d, causal=causal,
                ms={n: round(t, 4) for n, t in ms.items()},
                tflops={n: round(flop / (t * 1e-3) / 1e12, 1) for n, t in ms.items()},
                vs_cudnn={n: round(ms["cudnn_per_sequence"] / t, 3) for n, t in ms.items()}
                if "cudnn_per_sequence" in ms else None,
                skipped=skipped, **extra, rounds_ms={n: [round(x, 4) for x in t] for n, t in times.items()})


def training_row(args, name, lens, hq, hkv, d, causal, q, k, v, cu, bounds, gqa, varlen_attn, mask_kw, flop):
    """Forward + backward (dO random, gradients of q, k and v): fp8 with its one-call forward and
    backward (sequences all of one length: the batched call), fp8 with one call per run of equal
    lengths (the path without the packed calls), cuDNN BF16 per sequence and torch's varlen.
    FLOPs: 3.5 times the forward's (the backward's five products against the forward's two)."""
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
    d_o = torch.randn_like(q)

    def fp8(i):
        fp4attn.flash_attn_varlen_func(qg, kg, vg, cu, cu, max(lens), max(lens), causal=causal).backward(d_o)

    fp8_per_run = without_one_call(fp8)

    def cudnn(i):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            outs = []
            for a, b in zip(bounds, bounds[1:]):
                if a == b:  # an empty slot: nothing to attend
                    continue
                qs, ks, vs = (x[a:b].unsqueeze(0).transpose(1, 2) for x in (qg, kg, vg))
                outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=gqa)
                            .transpose(1, 2)[0])
            torch.cat(outs).backward(d_o)

    impls = {"fp8": fp8, "fp8_per_run": fp8_per_run, "cudnn_per_sequence": cudnn}
    if args.compiled:  # one op under torch.compile, whose backward runs the forward again
        traced = torch.compile(lambda q, k, v: fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens),
                                                                              causal=causal), fullgraph=True)
        impls["fp8_compiled"] = lambda i: traced(qg, kg, vg).backward(d_o)
    if len(_host.packed_groups(lens, lens)) > 1:
        impls["fp8_one_call"] = one_call(fp8)
    if varlen_attn is not None:
        kk, vv = ((x.detach().repeat_interleave(hq // hkv, dim=1) if gqa else x.detach().clone()).requires_grad_()
                  for x in (k, v))
        impls["torch_varlen_fa2"] = lambda i: varlen_attn(qg, kk, vv, cu, cu, max(lens), max(lens),
                                                          **mask_kw).backward(d_o)
    skipped = drop_failing(impls, (RuntimeError, TypeError, NotImplementedError))
    peaks = peak_mib(impls)
    times = interleaved_ms(impls, args.rounds, max(2, args.reps // 2), 1)
    row = timing_row("fwd_bwd_varlen", name, lens, hq, hkv, d, causal, times, flop, skipped, peak_mib=peaks)
    print(f"{name} fwd+bwd: TFLOP/s " + "  ".join(f"{n} {t}" for n, t in row["tflops"].items()) +
          f"  | vs cuDNN {row['vs_cudnn']}  | peak MiB {peaks}  | skipped {list(skipped)}", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--commit", default="")
    ap.add_argument("--backward", action="store_true", help="also forward + backward rows (op fwd_bwd_varlen)")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--consumers", default="",
                    help="e.g. 1,2: also fp8 and fp8_e4m3_inputs with the forward kernel's consumer warpgroups "
                         "forced to each count (fp8_c1, ...; FP4ATTN_FWD_CONSUMERS)")
    ap.add_argument("--compiled", action="store_true",
                    help="also fp8 through torch.compile(fullgraph=True) (fp8_compiled)")
    args = ap.parse_args()
    chosen = [c for c in CASES if not args.cases or c[0] in args.cases.split(",")]
    if not chosen:
        ap.error(f"--cases: none of {args.cases!r} is a case ({', '.join(c[0] for c in CASES)})")
    torch.manual_seed(0)
    varlen_attn = torch_varlen()
    rows = []
    for name, lens, hq, hkv, d, causal in chosen:
        total = sum(lens)
        cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
        bounds = cu.tolist()
        q = torch.randn(total, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(total, hkv, d, device="cuda", dtype=torch.bfloat16) + 0.5
        v = torch.randn(total, hkv, d, device="cuda", dtype=torch.bfloat16)
        gqa = hq != hkv

        def per_sequence(backend):
            def run(i):
                outs = []
                with sdpa_kernel(backend):
                    for a, b in zip(bounds, bounds[1:]):
                        if a == b:  # an empty slot: nothing to attend
                            continue
                        qs, ks, vs = (x[a:b].unsqueeze(0).transpose(1, 2) for x in (q, k, v))
                        outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=gqa)
                                    .transpose(1, 2)[0])
                return torch.cat(outs)
            return run

        impls = {
            "fp8": lambda i: fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal),
            # A new cu_seqlens tensor each call: its entries are read to the host every time (a wait
            # for the device), as in a model's first layer; "fp8" reuses one tensor, as later layers do.
            "fp8_new_cu_seqlens": lambda i: fp4attn.flash_attn_varlen_func(q, k, v, cu.clone(), cu.clone(), max(lens),
                                                                           max(lens), causal=causal),
            "cudnn_per_sequence": per_sequence(SDPBackend.CUDNN_ATTENTION),
            "fa2_per_sequence": per_sequence(SDPBackend.FLASH_ATTENTION),
        }
        if len(_host.packed_groups(lens, lens)) > 1:  # the groups against one call over the whole batch
            impls["fp8_one_call"] = one_call(impls["fp8"])
        if 0 in lens:
            impls["fp8_per_run"] = without_one_call(impls["fp8"])
        if args.compiled:
            traced = torch.compile(lambda q, k, v: fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, max(lens),
                                                                                  max(lens), causal=causal),
                                   fullgraph=True)
            impls["fp8_compiled"] = lambda i, traced=traced: traced(q, k, v)
        (q8, dq), (k8, dk), (v8, dv) = (to_e4m3(x, bounds, hkv) for x in (q, k, v))
        impls["fp8_e4m3_inputs"] = lambda i: fp4attn.flash_attn_varlen_func(
            q8, k8, v8, cu, cu, max(lens), max(lens), causal=causal, q_descale=dq, k_descale=dk, v_descale=dv)
        for n in (int(c) for c in args.consumers.split(",") if c):
            impls[f"fp8_c{n}"] = with_consumers(impls["fp8"], n)
            impls[f"fp8_e4m3_inputs_c{n}"] = with_consumers(impls["fp8_e4m3_inputs"], n)
        if varlen_attn is not None:
            # Its causal flag changed across torch versions: is_causal, later window_size=(-1, 0).
            kk, vv = (x.repeat_interleave(hq // hkv, dim=1) for x in (k, v)) if gqa else (k, v)
            mask_kw = {"is_causal": causal}
            one = torch.tensor([0, 16], device="cuda", dtype=torch.int32)
            try:
                varlen_attn(q[:16], kk[:16], vv[:16], one, one, 16, 16, **mask_kw)
            except TypeError:
                mask_kw = {"window_size": (-1, 0) if causal else (-1, -1)}
            impls["torch_varlen_fa2"] = lambda i: varlen_attn(q, kk, vv, cu, cu, max(lens), max(lens), **mask_kw)
        else:
            mask_kw = None
        with torch.inference_mode():
            skipped = drop_failing(impls)
            # fp64 on the second sequence (its first 512 queries; causal: the keys they see).
            a, b = bounds[1], bounds[1] + min(512, lens[1])
            keys = b if causal else bounds[2]
            ref = F.scaled_dot_product_attention(*(x[s0:s1].unsqueeze(0).transpose(1, 2).double()
                                                   for x, s0, s1 in ((q, a, b), (k, bounds[1], keys),
                                                                     (v, bounds[1], keys))),
                                                 is_causal=causal, enable_gqa=gqa).transpose(1, 2)[0]
            rel_l2 = {n: round(float((fn(0)[a:b].double() - ref).norm() / ref.norm()), 5) for n, fn in impls.items()}
            peaks = peak_mib(impls)
            times = interleaved_ms(impls, args.rounds, args.reps, 2)
        pairs = sum(L * (L + 1) / 2 if causal else L * L for L in lens)
        flop = 4.0 * hq * d * pairs
        if args.backward:
            rows.append(training_row(args, name, lens, hq, hkv, d, causal, q, k, v, cu, bounds, gqa, varlen_attn,
                                     mask_kw, 3.5 * flop))
        row = timing_row("fwd_varlen", name, lens, hq, hkv, d, causal, times, flop, skipped, rel_l2_vs_fp64=rel_l2,
                         peak_mib=peaks)
        rows.append(row)
        print(f"{name}: TFLOP/s " + "  ".join(f"{n} {t}" for n, t in row["tflops"].items()) +
              f"  | vs cuDNN {row['vs_cudnn']}  | peak MiB {peaks}  | rel L2 {rel_l2}  | skipped {list(skipped)}",
              flush=True)
    out = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), commit=args.commit,
               torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
               command="python3 bench/bench_varlen.py " + " ".join(sys.argv[1:]), rows=rows)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
