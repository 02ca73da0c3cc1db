"""Loss curves of the training study: train loss (smoothed) and validation loss per run.

    python3 examples/train_gpt/plot.py RUNS.json docs/training-loss.png
"""

from __future__ import annotations

import json
import sys

import numpy as np

LABELS = {
    "bf16": "1. BF16 SDPA",
    "bf16_rerun": "BF16 SDPA, same settings, another process (run-to-run spread)",
    "fp8": "2. fp8 (fp4attn kernel)",
    "mxfp4_train": "3. mxfp4_train: FP4 Q/K, FP8 P (fp4attn kernel)",
    "mxfp4_train_sim": "mxfp4_train (simulated)",
    "fp4p_sim": "4. FP4 P: MXFP4 Q/K/V/P (simulated)",
    "fp8_sim": "fp8 (simulated)",
}
STYLES = {"bf16": "k-", "bf16_rerun": "k:", "fp8": "C0-", "mxfp4_train": "C2-", "mxfp4_train_sim": "C2--", "fp4p_sim": "C3-",
          "fp8_sim": "C0--"}
SMOOTH = 10  # steps in the train-loss moving average


def moving_average(values, window: int):
    x = np.array([np.nan if v is None else v for v in values], dtype=float)
    if len(x) < window:
        return np.arange(1, len(x) + 1), x
    kernel = np.ones(window) / window
    return np.arange(window, len(x) + 1), np.convolve(x, kernel, mode="valid")


def plot(records: list[dict], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_train, ax_val, ax_gap) = plt.subplots(1, 3, figsize=(17, 4.8))
    baseline = {s: v for r in records if r["attention"] == "bf16" for s, v in r["val_loss"] if v is not None}
    for r in records:
        name = r["attention"]
        label = LABELS.get(name, name)
        steps, loss = moving_average(r["train_loss"], SMOOTH)
        ax_train.plot(steps, loss, STYLES.get(name, "-"), label=label, lw=1.2)
        val = [(s, v) for s, v in r["val_loss"] if v is not None]
        if val:
            ax_val.plot(*zip(*val), STYLES.get(name, "-"), marker="o", ms=3, label=label, lw=1.2)
        gap = [(s, v - baseline[s]) for s, v in val if s in baseline]
        if gap and name != "bf16":
            ax_gap.plot(*zip(*gap), STYLES.get(name, "-"), marker="o", ms=3, label=label, lw=1.2)
    first = records[0]
    cfg = first["config"]
    title = (f"GPT {cfg['layers']}L d{cfg['d_model']} {cfg['heads']}x{cfg['d_model'] // cfg['heads']}, "
             f"context {cfg['context']}, {first['tokens_per_step']} tokens/step, stdlib bytes")
    ax_train.set_title(f"train loss ({SMOOTH}-step mean)")
    ax_val.set_title("validation loss (held-out files)")
    ax_gap.set_title("validation loss minus BF16's, same step")
    ax_gap.axhline(0.0, color="k", lw=0.8)
    for ax in (ax_train, ax_val, ax_gap):
        ax.set_xlabel("step")
        ax.set_ylabel("nats/byte")
        ax.grid(alpha=0.3)
    # The interesting part is the end; the first steps start near ln 256 = 5.5.
    finals = [v for r in records for _, v in r["val_loss"] if v is not None]
    if finals:
        ax_val.set_ylim(min(finals) - 0.05, min(max(finals), min(finals) + 1.5))
        ax_train.set_ylim(min(finals) - 0.3, min(finals) + 1.5)
    ax_val.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1]) as f:
        records = json.load(f)["runs"]
    plot(records, sys.argv[2])


if __name__ == "__main__":
    main()
