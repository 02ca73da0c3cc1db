"""A PyTorch model of fp4attn's recipe numerics, fast enough to train with.

The FP4 recipes have no GPU kernels yet (the sm90 kernels take recipe fp8
only) and the C++ emulator is far too slow for training, so the training study
runs these recipes through this simulation. It quantizes exactly as
src/formats/quantize.cpp does and follows the emulator's forward and backward
(DESIGN §2, §3.2, §3.3, §5); what it does differently is listed in
docs/training.md and checked against the emulator by check_simulation.py.

Forward, per (batch, head):
  Q, K (smooth_k: K minus its sequence mean) and V quantized to the recipe's
  formats and dequantized (fp32); S = scale·Q·Kᵀ in fp32; P = the recipe's
  codes of the exponentials relative to the row maximum (E4M3 of 2^(u+8), or
  E2M1 with one E8M0 exponent per 32 keys); O = P·V / rowsum(P), stored as
  bf16; LSE from the same row sum.
Backward (DESIGN §5):
  S recomputed; P = the recipe's codes of 2^(s·log2e − LSE·log2e);
  dP = dO·Vᵀ with dO and V in E4M3 per 128-token block;
  dS = P ⊙ (dP − Delta), Delta = rowsum(dO ⊙ O) from the unquantized dO;
  dS in E4M3 with one fp32 scale per 128×128 tile;
  dV = Pᵀ·dO, dQ = scale·dS·K, dK = scale·dSᵀ·Q (forward's dequantized Q, K).
All products are fp32 (TF32 off); the kernels' tensor cores multiply the same
values exactly but accumulate differently.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
E8M0_BIAS = 127
MX_BLOCK = 32  # MXFP4 elements per E8M0 scale
TOKEN_BLOCK = 128  # FP8 token block of Q, K, dO, V (backward) and the dS tile
FP8_P_OFFSET = 8.0  # FP8 P stores 2^(u + 8), keeping P in (0, 256] (DESIGN §3.3)
LOG2E = 1.4426950408889634
LOG2_6 = math.log2(6.0)


@dataclass(frozen=True)
class SimRecipe:
    """Formats of one simulated recipe: "fp8" (E4M3) or "mxfp4" for each operand."""

    name: str
    qk: str
    v: str
    p: str


SIM_RECIPES = {
    "fp8": SimRecipe("fp8", qk="fp8", v="fp8", p="fp8"),
    "mxfp4_train": SimRecipe("mxfp4_train", qk="mxfp4", v="fp8", p="fp8"),
    # FP4-P training: the mxfp4 inference recipe's forward (Q, K, V, P all
    # MXFP4), with P in FP4 in the backward too.
    "fp4p": SimRecipe("fp4p", qk="mxfp4", v="mxfp4", p="mxfp4"),
}


# ---- element rounding ----------------------------------------------------------


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """E4M3 (fn) round to nearest even, saturating at ±448, as fp32 values."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """E2M1 round to nearest even, saturating at ±6, as fp32 values.

    The grid has one mantissa bit: steps of 0.5 below 2, 1 in [2, 4), 2 in
    [4, 6]; torch.round rounds half to even, which in each binade is the even code.
    """
    a = x.abs()
    q = torch.where(a < 2.0, torch.round(a * 2.0) * 0.5, torch.where(a < 4.0, torch.round(a), torch.round(a * 0.5) * 2.0))
    return torch.copysign(q.clamp(max=E2M1_MAX), x)


def mx_scale_exponent(amax: torch.Tensor) -> torch.Tensor:
    """E8M0 exponent k of the round-up MX rule, 2^k = 2^ceil(log2(amax / 6)), by exact bit arithmetic.

    amax = m·2^e with m in [1, 2): k = e − 2, or e − 1 when m > 1.5
    (quantize.cpp's mx_scale_code). amax = 0 gives the smallest code (k = −127).
    """
    mantissa, exponent = torch.frexp(amax)  # amax = mantissa · 2^exponent, mantissa in [0.5, 1)
    e = exponent.to(torch.int32) - 1
    k = e - 2 + (mantissa * 2.0 > 1.5).to(torch.int32)
    k = torch.where(amax > 0, k, torch.full_like(k, -E8M0_BIAS))
    return k.clamp(-E8M0_BIAS, 127)


def _exp2_int(k: torch.Tensor) -> torch.Tensor:
    return torch.ldexp(torch.ones_like(k, dtype=torch.float32), k)


# ---- block quantizers (dequantized fp32 values) --------------------------------


def _pad_to(x: torch.Tensor, dim: int, multiple: int) -> tuple[torch.Tensor, int]:
    n = x.shape[dim]
    pad = (-n) % multiple
    if pad:
        shape = list(x.shape)
        shape[dim] = pad
        x = torch.cat([x, x.new_zeros(shape)], dim=dim)
    return x, n


def fp8_token_blocks(x: torch.Tensor, block: int = TOKEN_BLOCK) -> torch.Tensor:
    """x (B, H, S, D): E4M3 with one fp32 scale per (b, h, block of tokens), dequantized."""
    xp, n = _pad_to(x, 2, block)
    B, H, S, D = xp.shape
    blocks = xp.reshape(B, H, S // block, block * D)
    scale = blocks.abs().amax(dim=-1, keepdim=True) / E4M3_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # all-zero block: codes 0 under scale 1
    q = round_e4m3(blocks / scale) * scale
    return q.reshape(B, H, S, D)[:, :, :n]


def fp8_per_channel(x: torch.Tensor) -> torch.Tensor:
    """x (B, H, S, D): E4M3 with one fp32 scale per (b, h, channel) over the sequence (V of recipe fp8)."""
    scale = x.abs().amax(dim=2, keepdim=True) / E4M3_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return round_e4m3(x / scale) * scale


def mxfp4(x: torch.Tensor, dim: int) -> torch.Tensor:
    """MXFP4 along `dim` (blocks of 32, E8M0 scales by the round-up rule), dequantized."""
    x = x.movedim(dim, -1)
    xp, n = _pad_to(x, x.dim() - 1, MX_BLOCK)
    blocks = xp.reshape(*xp.shape[:-1], -1, MX_BLOCK)
    k = mx_scale_exponent(blocks.abs().amax(dim=-1, keepdim=True))
    q = round_e2m1(blocks * _exp2_int(-k)) * _exp2_int(k)  # powers of two: exact
    return q.reshape(xp.shape)[..., :n].movedim(-1, dim)


def quantize_qk(x: torch.Tensor, fmt: str) -> torch.Tensor:
    return fp8_token_blocks(x) if fmt == "fp8" else mxfp4(x, dim=3)


def quantize_v(x: torch.Tensor, fmt: str) -> torch.Tensor:
    return fp8_per_channel(x) if fmt == "fp8" else mxfp4(x, dim=2)


def fp8_tiles(x: torch.Tensor, block: int = TOKEN_BLOCK) -> torch.Tensor:
    """x (B, H, Sq, Sk): E4M3 with one fp32 scale per block×block tile (dS), dequantized."""
    xp, nq = _pad_to(x, 2, block)
    xp, nk = _pad_to(xp, 3, block)
    B, H, Sq, Sk = xp.shape
    tiles = xp.reshape(B, H, Sq // block, block, Sk // block, block)
    scale = tiles.abs().amax(dim=(3, 5), keepdim=True) / E4M3_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = round_e4m3(tiles / scale) * scale
    return q.reshape(B, H, Sq, Sk)[:, :, :nq, :nk]


# ---- P codes -----------------------------------------------------------------


def p_fp8(u: torch.Tensor) -> torch.Tensor:
    """E4M3 code values of 2^(u + 8) (masked u = −inf gives 0)."""
    return round_e4m3(torch.exp2(u + FP8_P_OFFSET))


def p_mxfp4(u: torch.Tensor) -> torch.Tensor:
    """Direct-P MXFP4 P of 2^u: per 32 keys E = ceil(u_max − log2 6), element E2M1(2^(u − E)), value q·2^E."""
    up, n = _pad_to(u, u.dim() - 1, MX_BLOCK)
    up = torch.where(torch.arange(up.shape[-1], device=u.device) < n, up, torch.full_like(up, -math.inf))
    blocks = up.reshape(*up.shape[:-1], -1, MX_BLOCK)
    u_max = blocks.amax(dim=-1, keepdim=True)
    e = torch.ceil(u_max - LOG2_6)
    e = torch.where(torch.isfinite(e), e, torch.zeros_like(e))  # a fully masked block: every code is 0
    q = round_e2m1(torch.exp2(blocks - e)) * torch.exp2(e)
    return q.reshape(up.shape)[..., :n]


# ---- attention -----------------------------------------------------------------


def visible(sq: int, sk: int, causal: bool, device) -> torch.Tensor | None:
    """(Sq, Sk) bool, bottom-right aligned causal mask (FlashAttention); None when nothing is masked."""
    if not causal:
        return None
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    return j <= i + (sk - sq)


class _Operands:
    """Dequantized Q and smoothed K of the forward, both (B, H, S, D) fp32, and the K mean."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, recipe: SimRecipe, smooth_k: bool):
        qf, kf = q.float(), k.float()
        self.k_mean = kf.mean(dim=2, keepdim=True) if smooth_k else torch.zeros_like(kf[:, :, :1])
        self.q = quantize_qk(qf, recipe.qk)
        self.k = quantize_qk(kf - self.k_mean, recipe.qk)


def _scores(ops: _Operands, scale: float, mask) -> torch.Tensor:
    s = torch.matmul(ops.q, ops.k.transpose(-1, -2)) * scale
    return s if mask is None else s.masked_fill(~mask, -math.inf)


def _p_values(u: torch.Tensor, fmt: str) -> tuple[torch.Tensor, float]:
    """P values and their log2 offset (FP8 P stands for 2^(u + 8))."""
    return (p_fp8(u), FP8_P_OFFSET) if fmt == "fp8" else (p_mxfp4(u), 0.0)


def to_bhsd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)


def _outside_autocast(fn):
    """The simulation's fp32 arithmetic must not be narrowed by the model's bf16 autocast."""

    @functools.wraps(fn)
    def wrapper(q, *args, **kwargs):
        with torch.autocast(q.device.type, enabled=False):
            return fn(q, *args, **kwargs)

    return wrapper


@_outside_autocast
def simulated_forward(q, k, v, recipe: SimRecipe, causal: bool, scale: float, smooth_k: bool = True):
    """q, k, v (B, H, S, D) with Hq == Hkv. Returns O (B, H, Sq, D, bf16 values in fp32),
    the smoothed-score LSE (B, H, Sq) and the LSE of the original scores (what the library returns)."""
    ops = _Operands(q, k, recipe, smooth_k)
    vq = quantize_v(v.float(), recipe.v)
    mask = visible(q.shape[2], k.shape[2], causal, q.device)
    s = _scores(ops, scale, mask)
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p, offset = _p_values((s - m) * LOG2E, recipe.p)
    del s
    l = p.sum(dim=-1, keepdim=True)
    o = torch.matmul(p, vq) / torch.where(l > 0, l, torch.ones_like(l))
    o = o.to(torch.bfloat16).to(torch.float32)  # the kernels store O as bf16
    lse_smooth = (m + torch.log(l) - offset * math.log(2.0)).squeeze(-1)
    # smooth_k shifts row i by scale·q_i·k̄ (quantized q, as the library has it); add it back.
    correction = (torch.matmul(ops.q, ops.k_mean.transpose(-1, -2)) * scale).squeeze(-1)
    return o, lse_smooth, lse_smooth + correction


@_outside_autocast
def simulated_backward(q, k, v, o, lse_smooth, d_o, recipe: SimRecipe, causal: bool, scale: float, smooth_k: bool = True):
    """dQ, dK, dV (B, H, S, D fp32) by DESIGN §5, P in the recipe's P format; lse_smooth as simulated_forward returns it."""
    ops = _Operands(q, k, recipe, smooth_k)
    mask = visible(q.shape[2], k.shape[2], causal, q.device)
    s = _scores(ops, scale, mask)
    lse = lse_smooth.unsqueeze(-1)
    u = (s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))) * LOG2E
    del s
    p, offset = _p_values(u, recipe.p)
    del u
    p = p * 2.0 ** (-offset)  # FP8 P: the 2^-8 stays outside the codes
    if mask is not None:
        p = p.masked_fill(~torch.isfinite(lse), 0.0)  # rows with no visible key
    d_of = d_o.float()
    d_oq = fp8_token_blocks(d_of)
    vq = fp8_token_blocks(v.float())  # dP reduces over D: V needs token-block scales here
    dp = torch.matmul(d_oq, vq.transpose(-1, -2))
    delta = (d_of * o.float()).sum(dim=-1, keepdim=True)
    ds = fp8_tiles(p * (dp - delta))
    del dp
    dv = torch.matmul(p.transpose(-1, -2), d_oq)
    dq = torch.matmul(ds, ops.k) * scale
    dk = torch.matmul(ds.transpose(-1, -2), ops.q) * scale
    return dq, dk, dv


class SimulatedAttention(torch.autograd.Function):
    """Causal attention on (B, S, H, D) tensors with a recipe's simulated numerics; O in q's dtype."""

    @staticmethod
    def forward(ctx, q, k, v, recipe_name: str, causal: bool):
        recipe = SIM_RECIPES[recipe_name]
        scale = 1.0 / math.sqrt(q.shape[-1])
        qh, kh, vh = (to_bhsd(x) for x in (q, k, v))
        o, lse_smooth, _ = simulated_forward(qh, kh, vh, recipe, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse_smooth)
        ctx.recipe, ctx.causal, ctx.scale = recipe, causal, scale
        return to_bhsd(o).to(q.dtype)

    @staticmethod
    def backward(ctx, d_o):
        q, k, v, o, lse_smooth = ctx.saved_tensors
        dq, dk, dv = simulated_backward(
            to_bhsd(q), to_bhsd(k), to_bhsd(v), o, lse_smooth, to_bhsd(d_o), ctx.recipe, ctx.causal, ctx.scale
        )
        return to_bhsd(dq).to(q.dtype), to_bhsd(dk).to(k.dtype), to_bhsd(dv).to(v.dtype), None, None, None


def simulated_attention(q, k, v, recipe: str, causal: bool = True):
    """(B, S, H, D) in, (B, S, H, D) out, differentiable."""
    return SimulatedAttention.apply(q, k, v, recipe, causal)


class LibraryForwardSimulatedBackward(torch.autograd.Function):
    """fp4attn's forward (the real kernel on a Hopper GPU) with this module's
    backward of the same recipe (fp8 or mxfp4_train), for builds without the
    backward kernel and to check the kernel's gradients. The library's LSE is
    of the original scores; the backward's recomputed scores use the smoothed
    K, so the smooth_k shift is taken back out (with the simulated quantized Q)."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, recipe: str = "fp8"):
        import fp4attn

        o, lse = fp4attn.attention(q.detach(), k.detach(), v.detach(), causal=causal, recipe=recipe, return_lse=True)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        ctx.recipe = recipe
        return o

    @staticmethod
    def backward(ctx, d_o):
        q, k, v, o, lse = ctx.saved_tensors
        recipe = SIM_RECIPES[ctx.recipe]
        scale = 1.0 / math.sqrt(q.shape[-1])
        qh, kh = to_bhsd(q), to_bhsd(k)
        ops = _Operands(qh, kh, recipe, smooth_k=True)
        correction = (torch.matmul(ops.q, ops.k_mean.transpose(-1, -2)) * scale).squeeze(-1)
        dq, dk, dv = simulated_backward(
            qh, kh, to_bhsd(v), to_bhsd(o).float(), lse - correction, to_bhsd(d_o), recipe, ctx.causal, scale
        )
        return to_bhsd(dq).to(q.dtype), to_bhsd(dk).to(k.dtype), to_bhsd(dv).to(v.dtype), None, None
