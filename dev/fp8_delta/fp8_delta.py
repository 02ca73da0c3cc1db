"""Recipe fp8's backward on peaked attention: where its gradient error comes from.

dS = P ⊙ (dP − Δ). The backward takes Δ = rowsum(dO ⊙ O) in fp32 from the
unquantized dO and the forward's O, while dP = dO_q · V_qᵀ comes from FP8 dO
and V (per-token-block scales along D). Where a row's softmax is nearly one-hot,
dP_j − Δ of its dominant key is a difference of two nearly equal numbers, and
the quantization errors of dO and V that only dP carries become all of dS.

The emulator reads Δ from `o` alone (Σ_d dO·O per row), so a row's Δ can be
set to any value by moving O along dO. This script runs the emulator's
backward (target sm90, bit for bit the GPU's numerics) with the forward's O
(the library's Δ) and with Δ taken three other ways, and compares dQ, dK, dV
with the fp64 gradients (worst of the seeds; the forward's own O and LSE
errors beside them):

  dO_q     Δ = rowsum(dequant(dO_q) ⊙ O): the dO the product dP uses
  P·dP     Δ = Σ_j P_j dP_j / Σ_j P_j with P the fp64 softmax rounded to E4M3
           and dP = dO_q · V_qᵀ in fp64: Δ consistent with dP (the rows of
           dS then sum to about zero, as the exact gradient's do)
  exact    Δ of the fp64 gradient (rowsum(dO ⊙ O_fp64))

    PYTHONPATH=<built package site> python3 dev/fp8_delta/fp8_delta.py
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tests"))
import fp4attn  # noqa: E402
import ml_dtypes  # noqa: E402
from fp64_reference import attention_backward_bshd, attention_bshd, rel_l2  # noqa: E402

TOKEN_BLOCK = 128  # the backward's FP8 token block for dO and V (block_q, block_k)


def settings(recipe: str, causal: bool):
    s = fp4attn._host.make_settings(layout="bshd", mask="causal" if causal else "none", scale=None,
                                    scale_name="scale", recipe=recipe, smooth_k=True, direct_p=True, gqa=True,
                                    names=("q", "k", "v"))
    return fp4attn._host.options(s)


def fp8_rows(x: np.ndarray) -> np.ndarray:
    """x (B, S, H, D) quantized to E4M3 with one scale per (b, h, 128-token block), dequantized."""
    return np.asarray(fp4attn.quantize(x, "fp8_e4m3", fp8_token_block=TOKEN_BLOCK).dequantize(), dtype=np.float64)


def with_delta(o: np.ndarray, d_o: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """O moved along dO so that rowsum(dO ⊙ O) = delta ((B, H, S) → (B, S, H))."""
    target = delta.transpose(0, 2, 1)
    now = np.einsum("bshd,bshd->bsh", d_o.astype(np.float64), o.astype(np.float64))
    norm2 = np.einsum("bshd,bshd->bsh", d_o.astype(np.float64), d_o.astype(np.float64))
    step = np.where(norm2 > 0, (target - now) / np.where(norm2 > 0, norm2, 1.0), 0.0)
    return (o + step[..., None] * d_o).astype(np.float32)


def softmax_p(q, k, causal):
    q, k = q.astype(np.float64), k.astype(np.float64)
    s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(q.shape[-1])
    if causal:
        sq, sk = s.shape[-2:]
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq), s, -np.inf)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(axis=-1, keepdims=True)


def problem(rng, kind: str, B=1, S=512, H=2, D=64):
    q, k, v, d_o = (rng.standard_normal((B, S, H, D)) for _ in range(4))
    k += 0.5
    if kind.startswith("scale"):
        f = float(kind[5:])
        q, k = q * np.sqrt(f), k * np.sqrt(f)  # scores × f
    elif kind == "outliers":
        idx = rng.choice(D, size=max(1, D // 32), replace=False)
        for x in (q, k, v):
            x[..., idx] *= 20.0
    return tuple(x.astype(np.float32) for x in (q, k, v, d_o))


def run(kind: str, recipe: str, causal: bool, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    q, k, v, d_o = problem(rng, kind)
    opt = settings(recipe, causal)
    o, lse, _ = fp4attn._ext.forward(q, k, v, opt, fp4attn._ext.Executor.emulator)
    mask = "bottom_right" if causal else "none"
    ref = attention_backward_bshd(q, k, v, d_o, mask=mask)
    o_exact, lse_exact = attention_bshd(q, k, v, mask=mask)
    forward = (rel_l2(o, o_exact), float(np.abs(lse - lse_exact).max()))

    do_q = fp8_rows(d_o)
    p = softmax_p(q, k, causal).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    dp = np.einsum("bihd,bjhd->bhij", do_q, fp8_rows(v))
    deltas = {
        "library": None,
        "dO_q": np.einsum("bshd,bshd->bhs", do_q, o.astype(np.float64)),
        "P·dP": (p * dp).sum(-1) / p.sum(-1),
        "exact": np.einsum("bshd,bshd->bhs", d_o.astype(np.float64), o_exact),
    }
    out = {}
    for name, delta in deltas.items():
        o_in = o if delta is None else with_delta(o, d_o, delta)
        dq, dk, dv, _ = fp4attn._ext.backward(q, k, v, o_in, lse, d_o, opt, fp4attn._ext.Executor.emulator)
        out[name] = tuple(rel_l2(g, r) for g, r in zip((dq, dk, dv), ref)) + forward
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--kinds", default="plain,scale3,scale10,scale30,outliers")
    ap.add_argument("--recipes", default="fp8,mxfp4_train")
    args = ap.parse_args()
    print("| recipe | inputs | causal | Δ | dQ rel L2 | dK rel L2 | dV rel L2 | forward: O rel L2 | max abs LSE error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for recipe in args.recipes.split(","):
        for kind in args.kinds.split(","):
            for causal in (False, True):
                rows = [run(kind, recipe, causal, seed) for seed in range(args.seeds)]
                for name in rows[0]:
                    worst = np.max([r[name] for r in rows], axis=0)
                    print(f"| {recipe} | {kind} | {'yes' if causal else 'no'} | {name} | "
                          + " | ".join(f"{x:.3g}" for x in worst) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
