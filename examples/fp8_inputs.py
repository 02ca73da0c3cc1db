"""FlashAttention-3's FP8 inputs with fp4attn: float8_e4m3fn q, k, v and their descales.

A model whose projections emit FP8 (or that keeps an FP8 KV cache) hands fp4attn the codes
and one float32 descale per batch entry (per sequence, packed) and kv head: the value of a
code is code × descale. This script makes such inputs from bf16 ones (descale = amax / 448
over each head's tokens and channels, a group's query heads sharing their kv head's), calls

* fp4attn.flash_attn_func on a (B, S, H, D) batch, and
* fp4attn.flash_attn_varlen_func on sequences of different lengths packed along the tokens,

and prints each output's relative L2 error against fp64 attention of the bf16 inputs, beside
recipe fp8 called on the bf16 inputs themselves (which quantizes them per 128-token block).

    python3 examples/fp8_inputs.py [--device cuda] [--small]

On a Hopper GPU the calls run the sm90 kernels on the device (no host copies); elsewhere the
CPU emulator (slow: --small keeps the problems small).
"""

import argparse

import torch

import fp4attn

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn value


def quantize_per_head(x: torch.Tensor, hkv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S, H, D) -> float8_e4m3fn codes and (B, Hkv) descales, amax / 448 per batch entry and kv
    head (the H // hkv query heads of a group share one)."""
    B, _, H, _ = x.shape
    amax = x.float().abs().amax(dim=(1, 3)).view(B, hkv, H // hkv).amax(dim=2)
    descale = amax.clamp(min=1e-30) / E4M3_MAX
    codes = (x.float() / descale.repeat_interleave(H // hkv, dim=1)[:, None, :, None]).to(torch.float8_e4m3fn)
    return codes, descale


def quantize_packed(x: torch.Tensor, cu: list, hkv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(total, H, D) packed sequences -> codes and (B, Hkv) descales, one row per sequence (1 for an
    empty one)."""
    codes = torch.zeros(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    descale = torch.ones(len(cu) - 1, hkv, device=x.device)
    for b, (s0, s1) in enumerate(zip(cu, cu[1:])):
        if s1 > s0:
            c, d = quantize_per_head(x[None, s0:s1], hkv)
            codes[s0:s1], descale[b] = c[0], d[0]
    return codes, descale


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """fp64 attention of (B, S, H, D) inputs, GQA by repeating kv heads, causal bottom-right."""
    group = q.shape[2] // k.shape[2]
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    kd, vd = (x.repeat_interleave(group, dim=1) for x in (kd, vd))
    scores = qd @ kd.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        Sq, Sk = q.shape[1], k.shape[1]
        seen = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device).tril(Sk - Sq)
        scores = scores.masked_fill(~seen, float("-inf"))
    return (scores.softmax(-1) @ vd).transpose(1, 2)


def rel_l2(x: torch.Tensor, want: torch.Tensor) -> float:
    return float((x.double() - want).norm() / want.norm())


def run(device: str, small: bool) -> dict:
    """The relative L2 errors of each call against fp64 (also returned, for the test)."""
    torch.manual_seed(0)
    B, S, Hq, Hkv, D = (2, 96, 4, 2, 64) if small else (2, 2048, 16, 4, 128)
    # Activations of different scales (so that a descale given to the wrong tensor shows).
    q = torch.randn(B, S, Hq, D, device=device, dtype=torch.bfloat16) * 0.5
    k = torch.randn(B, S, Hkv, D, device=device, dtype=torch.bfloat16) * 2 + 0.5
    v = torch.randn(B, S, Hkv, D, device=device, dtype=torch.bfloat16) * 8
    want = reference(q, k, v, causal=True)
    (q8, dq), (k8, dk), (v8, dv) = (quantize_per_head(x, Hkv) for x in (q, k, v))
    errors = {
        "flash_attn_func, bf16 inputs": rel_l2(fp4attn.flash_attn_func(q, k, v, causal=True), want),
        "flash_attn_func, FP8 inputs": rel_l2(
            fp4attn.flash_attn_func(q8, k8, v8, causal=True, q_descale=dq, k_descale=dk, v_descale=dv), want),
    }

    lens = [37, 0, 130, 64] if small else [1873, 512, 0, 3001, 777]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    packed = [torch.randn(cu[-1], h, D, device=device, dtype=torch.bfloat16) * scale
              for h, scale in ((Hq, 0.5), (Hkv, 2.0), (Hkv, 8.0))]
    (q8, dq), (k8, dk), (v8, dv) = (quantize_packed(x, cu, Hkv) for x in packed)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    out = fp4attn.flash_attn_varlen_func(q8, k8, v8, cu_t, cu_t, max(lens), max(lens), causal=True, q_descale=dq,
                                         k_descale=dk, v_descale=dv)
    got, ref = [], []
    for s0, s1 in zip(cu, cu[1:]):
        if s1 > s0:
            got.append(out[s0:s1])
            ref.append(reference(*(x[None, s0:s1] for x in packed), causal=True)[0])
    errors["flash_attn_varlen_func, FP8 inputs"] = rel_l2(torch.cat(got), torch.cat(ref))
    return errors


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="small problems (what the CPU emulator runs quickly)")
    args = ap.parse_args(argv)
    errors = run(args.device, args.small)
    for name, err in errors.items():
        print(f"{name:40s} O rel L2 against fp64: {err:.4f}")
    return errors


if __name__ == "__main__":
    main()
