"""One training run of the GPT study: a fixed seed, data order and step count; one attention.

    python3 examples/train_gpt/train.py --attention fp4p_sim --steps 200 --out /tmp/runs

Attentions:
  bf16              PyTorch SDPA in bf16 (the baseline)
  fp8               fp4attn recipe fp8 through fp4attn.flash_attn_func: the sm90
                    kernels, forward and backward; where this build has no backward
                    kernel, the kernel's forward with the simulated fp8 backward
  mxfp4_train       fp4attn recipe mxfp4_train the same way (FP4 Q/K, FP8 V and P,
                    FP8 gradients on the sm90 kernels)
  fp8_sim           simulated_attention.py's recipe fp8
  mxfp4_train_sim   simulated recipe mxfp4_train (FP4 Q/K, FP8 V and P, FP8 gradients)
  fp4p_sim          simulated FP4-P training (MXFP4 Q/K/V/P forward, FP4 P in the backward too)
Writes <out>/<attention>.json (losses, tokens/s, setup).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import gpt  # noqa: E402
import simulated_attention as sim  # noqa: E402

ATTENTIONS = ("bf16", "fp8", "mxfp4_train", "fp8_sim", "mxfp4_train_sim", "fp4p_sim")
KERNEL_RECIPES = ("fp8", "mxfp4_train")
SEED = 1234


def kernel_attention(recipe: str, cfg: gpt.GPTConfig, batch: int):
    """fp4attn's sm90 kernels for `recipe`, and a description saying whether the backward is the kernel or simulated."""
    import fp4attn
    from fp4attn import _ext, _host

    s = _host.make_settings(layout="bshd", mask=_host.MASK_BOTTOM_RIGHT, scale=None, scale_name="scale",
                            recipe=recipe, smooth_k=True, direct_p=True, gqa=True, names=("q", "k", "v"))
    shape = (batch, cfg.context, cfg.context, cfg.heads, cfg.heads, cfg.head_dim)
    if not (_ext.cuda_built() and _ext.sm90_available() and _ext.device_forward_supported(shape, _host.options(s))):
        raise RuntimeError(f"attention {recipe}: needs fp4attn's sm90 forward kernel (a Hopper GPU and a CUDA build)")
    hybrid = lambda q, k, v: sim.LibraryForwardSimulatedBackward.apply(q, k, v, True, recipe)  # noqa: E731
    if not (hasattr(_ext, "backward_device") and _ext.device_backward_supported(shape, _host.options(s))):
        return hybrid, {"forward": "fp4attn sm90 kernel",
                        "backward": f"simulated {recipe} backward (this build has no backward kernel)",
                        "simulated": True}
    library = lambda q, k, v: fp4attn.flash_attn_func(q, k, v, causal=True, recipe=recipe)  # noqa: E731
    try:
        agreement = kernel_vs_simulated_backward(library, hybrid, cfg)
    except RuntimeError as e:  # e.g. the kernel refuses the call: the study goes on with the simulated backward
        return hybrid, {"forward": "fp4attn sm90 kernel", "simulated": True,
                        "backward": f"simulated {recipe} backward (the backward kernel failed: {e})"}
    description = {"forward": "fp4attn sm90 kernel", "backward": "fp4attn sm90 kernel", "simulated": False,
                   "backward_kernel_vs_simulation": agreement}
    if agreement["worst_rel_l2"] > KERNEL_AGREEMENT_LIMIT:
        description.update(backward=f"simulated {recipe} backward (the kernel's gradients disagreed with the "
                                    "simulation)", simulated=True)
        return hybrid, description
    return library, description


# The simulation and the emulator agree to rel L2 0.03 on gradients (check_simulation.py);
# a kernel further off than this from the simulation is not trusted for the study.
KERNEL_AGREEMENT_LIMIT = 0.15


def kernel_vs_simulated_backward(library, hybrid, cfg: gpt.GPTConfig) -> dict:
    """Gradients of the kernel backward and of the simulated one (same kernel forward) on one training-sized head set."""
    g = torch.Generator(device="cuda").manual_seed(SEED)
    shape = (2, cfg.context, cfg.heads, cfg.head_dim)
    q, k, v, d_o = (torch.randn(shape, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4))
    out = {}
    for name, fn in (("kernel", library), ("simulated", hybrid)):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        fn(*leaves).backward(d_o)
        out[name] = [x.grad.float() for x in leaves]
    rel = {n: float((a - b).norm() / b.norm()) for n, a, b in zip(("dq", "dk", "dv"), out["kernel"], out["simulated"])}
    return {"shape_bshd": list(shape), "rel_l2": rel, "worst_rel_l2": max(rel.values())}


def make_attention(name: str, cfg: gpt.GPTConfig, batch: int):
    if name == "bf16":
        return gpt.sdpa_bf16, {"forward": "torch SDPA bf16", "backward": "torch SDPA bf16", "simulated": False}
    if name in KERNEL_RECIPES:
        return kernel_attention(name, cfg, batch)
    recipe = name.removesuffix("_sim")
    if recipe not in sim.SIM_RECIPES:
        raise ValueError(f"attention: unknown {name!r}; use one of {', '.join(ATTENTIONS)}")
    fn = lambda q, k, v: sim.simulated_attention(q, k, v, recipe, causal=True)  # noqa: E731
    return fn, {"forward": f"simulated {recipe}", "backward": f"simulated {recipe}", "simulated": True}


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def evaluate(model, tokens, offsets, context: int, batch: int) -> float:
    model.eval()
    total = 0.0
    chunks = [offsets[i : i + batch] for i in range(0, len(offsets), batch)]
    for chunk in chunks:
        x, y = corpus.windows(tokens, chunk, context)
        with torch.autocast(tokens.device.type, dtype=torch.bfloat16):
            total += model(x, y).float().item() * len(chunk)
    model.train()
    return total / len(offsets)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def finite_or_none(x: float):
    return x if math.isfinite(x) else None


def gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "none"


def commit_of_tree() -> str:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def train(attention: str, steps: int, out_dir: str | None, *, batch: int = 8, lr: float = 1e-3, eval_every: int = 25,
          val_sequences: int = 32, cfg: gpt.GPTConfig = gpt.GPTConfig(), data: corpus.Corpus | None = None,
          commit: str | None = None, command: str | None = None, timed_from: int = 3) -> dict:
    """Trains one model; returns the record and, given out_dir, writes it to <out_dir>/<attention>.json."""
    torch.backends.cuda.matmul.allow_tf32 = False  # the simulation's fp32 products stay fp32
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: smoke tests of the simulated runs only
    data = data or corpus.load()
    attn, description = make_attention(attention, cfg, batch)
    torch.manual_seed(SEED)
    model = gpt.GPT(cfg, attn).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), fused=device == "cuda")
    train_tokens = torch.from_numpy(data.train.copy()).to(device)
    val_tokens = torch.from_numpy(data.val.copy()).to(device)
    offsets = corpus.train_offsets(data, steps, batch, cfg.context, SEED)
    val_offs = corpus.val_offsets(data, val_sequences, cfg.context)
    warmup = max(1, steps // 20)

    losses = torch.zeros(steps, device=device)
    val_curve = []
    train_seconds = 0.0
    sync()
    segment_start = time.perf_counter()
    for step in range(steps):
        if step == timed_from:  # compilation, autotuning and allocator warm-up stay out of tokens/s
            sync()
            segment_start = time.perf_counter()
        x, y = corpus.windows(train_tokens, offsets[step], cfg.context)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        opt.step()
        losses[step] = loss.detach()
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            sync()
            if step >= timed_from:
                train_seconds += time.perf_counter() - segment_start
            val_curve.append([step + 1, finite_or_none(evaluate(model, val_tokens, val_offs, cfg.context, batch))])
            print(f"{attention}: step {step + 1}/{steps} train {loss.item():.4f} val {val_curve[-1][1]}", flush=True)
            segment_start = time.perf_counter()

    # The same weights seen through bf16 SDPA: separates forward error from what was learnt.
    for block in model.blocks:
        block.attention = gpt.sdpa_bf16
    val_bf16 = evaluate(model, val_tokens, val_offs, cfg.context, batch)

    train_curve = [finite_or_none(float(x)) for x in losses.cpu().tolist()]
    tail = [x for x in train_curve[-10:] if x is not None]
    tokens_per_step = batch * cfg.context
    record = {
        "date": datetime.date.today().isoformat(),
        "gpu": gpu_name(),
        "commit": commit or commit_of_tree(),
        "command": command or " ".join(sys.argv),
        "attention": attention,
        "implementation": description,
        "config": cfg.as_dict(),
        "batch": batch,
        "tokens_per_step": tokens_per_step,
        "steps": steps,
        "seed": SEED,
        "optimizer": {"name": "AdamW", "lr": lr, "betas": [0.9, 0.95], "weight_decay": 0.1, "warmup": warmup,
                      "schedule": "cosine to 0.1 x peak", "grad_clip": 1.0, "autocast": "bf16"},
        "corpus": data.describe(),
        "val_tokens": val_sequences * cfg.context,
        "train_loss": train_curve,
        "val_loss": val_curve,
        "final_train_loss": sum(tail) / len(tail) if len(tail) == 10 else None,
        "final_val_loss": val_curve[-1][1],
        "final_val_loss_bf16_attention": finite_or_none(val_bf16),
        "train_seconds_timed": train_seconds,
        "timed_steps": steps - timed_from,
        "tokens_per_s": (steps - timed_from) * tokens_per_step / train_seconds if train_seconds > 0 else None,
        "tokens_per_s_note": "simulated attention: the speed of this PyTorch model, not of any kernel"
        if description["simulated"] else "measured with the implementations named above",
    }
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"{attention}.json"), "w") as f:
            json.dump(record, f, indent=1)
    del model, opt
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attention", choices=ATTENTIONS, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()
    train(args.attention, args.steps, args.out, batch=args.batch, commit=args.commit)


if __name__ == "__main__":
    main()
