"""Tables (Markdown, on stdout) and plots (PNG) from the JSON that study.py writes.

    python3 report.py [--results results/accuracy-study.json] [--plots ../../docs]

The tables are the ones in docs/accuracy-study.md; the plots are written next to it.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

import metrics

HERE = Path(__file__).resolve().parent
DEFAULT_RESULTS = HERE / "results" / "accuracy-study.json"
DEFAULT_PLOTS = HERE.parent.parent / "docs"
LAYER_PLOT = "accuracy-study-layers.png"
SUMMARY_PLOT = "accuracy-study-summary.png"
RECIPES = ("fp8", "mxfp4", "nvfp4", "mxfp4_train")
ON_OFF = (True, False)
TARGETS = ("sm90", "sm100")
# The setting the headline tables and plots use; the others are compared with it.
MAIN_TARGET = "sm90"
PLOT_DPI = 120
# Labelled ticks of the per-layer plot's log axis (one decade holds every line).
LAYER_PLOT_TICKS = (0.02, 0.03, 0.05, 0.1, 0.2, 0.3)
RECIPE_COLORS = {"fp8": "tab:blue", "mxfp4": "tab:red", "nvfp4": "tab:green", "mxfp4_train": "tab:purple"}


def on_off(flag: bool) -> str:
    return "on" if flag else "off"


def fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}e}"


def cos_fmt(x: float) -> str:
    return f"{x:.5f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def select(rows: list[dict], **match) -> list[dict]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def one(rows: list[dict], **match) -> dict:
    found = select(rows, **match)
    if len(found) != 1:
        raise KeyError(f"{len(found)} rows match {match}")
    return found[0]


def emulator(recipe: str, direct_p: bool, smooth_k: bool, target: str) -> dict:
    return {"path": "emulator", "recipe": recipe, "direct_p": direct_p, "smooth_k": smooth_k, "target": target}


def inputs_only(recipe: str, smooth_k: bool) -> dict:
    return {"path": "inputs_only", "recipe": recipe, "smooth_k": smooth_k}


# ---- (a) synthetic -------------------------------------------------------------------------------


def synthetic_tables(doc: dict) -> str:
    rows = doc["synthetic"]["rows"]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    out = []

    # How each variant departs from Gaussian data.
    stats = []
    for v in variants:
        rs = select(rows, variant=v, **emulator("fp8", True, True, MAIN_TARGET))
        stats.append(
            [
                v,
                f"{np.mean([r['row_peak'] for r in rs]):.3f}",
                f"{np.mean([r['k_mean_over_spread'] for r in rs]):.2f}",
                f"{np.mean([r['k_max_channel_over_median'] for r in rs]):.2f}",
            ]
        )
    out.append(table(["variant", "mean row max of P", "K mean / spread", "K max channel / median"], stats))

    # Ablation: mean rel L2 over seeds and head dims, per variant and recipe.
    header = ["variant", "smooth_k"] + [f"{r}" for r in RECIPES] + [f"{r} inputs only" for r in RECIPES]
    abl = []
    for v, sk in itertools.product(variants, ON_OFF):
        line = [v, on_off(sk)]
        line += [fmt(np.mean([r["rel_l2"] for r in select(rows, variant=v, **emulator(rc, True, sk, MAIN_TARGET))])) for rc in RECIPES]
        line += [fmt(np.mean([r["rel_l2"] for r in select(rows, variant=v, **inputs_only(rc, sk))])) for rc in RECIPES]
        abl.append(line)
    out.append(table(header, abl))

    # The video-like variant over the whole grid: mean and worst over seeds and head dims.
    full = []
    for rc, dp, sk in itertools.product(RECIPES, ON_OFF, ON_OFF):
        line = [rc, on_off(dp), on_off(sk)]
        for t in TARGETS:
            rs = select(rows, variant="video_like", **emulator(rc, dp, sk, t))
            line += [
                cos_fmt(np.mean([r["cosine"] for r in rs])),
                fmt(np.mean([r["rel_l2"] for r in rs])),
                fmt(max(r["rel_l2"] for r in rs)),
                fmt(max(r["max_abs"] for r in rs)),
            ]
        full.append(line)
    header = ["recipe", "Direct-P", "smooth_k"]
    for t in TARGETS:
        header += [f"{t} cos (mean)", f"{t} rel L2 (mean)", f"{t} rel L2 (worst)", f"{t} max abs (worst)"]
    out.append(table(header, full))
    return "\n\n".join(out)


# ---- (b, c) per layer ----------------------------------------------------------------------------


def layer_tables(doc: dict) -> str:
    rows = doc["layers"]
    layers = sorted({r["layer"] for r in rows if r["layer"] != "all"})
    out = []

    # What the captured tensors look like.
    stats = []
    for i in layers:
        r = one(rows, layer=i, **emulator("fp8", True, True, MAIN_TARGET))
        stats.append(
            [
                str(i),
                f"{r['row_peak']:.3f}",
                f"{r['q_mean_over_spread']:.2f}",
                f"{r['k_mean_over_spread']:.2f}",
                f"{r['q_max_channel_over_median']:.2f}",
                f"{r['k_max_channel_over_median']:.2f}",
            ]
        )
    out.append(
        table(["layer", "mean row max of P", "Q mean / spread", "K mean / spread", "Q max ch. / median", "K max ch. / median"], stats)
    )

    # smooth_k on K itself and on O. mxfp4_train stores K as mxfp4 does.
    k_recipes = ("fp8", "mxfp4", "nvfp4")
    header = ["layer"]
    for rc in k_recipes:
        header += [f"{rc} K error, smooth_k on / off", f"{rc} O rel L2, smooth_k on / off"]
    smooth = []
    for i in layers:
        line = [str(i)]
        for rc in k_recipes:
            k_on, k_off = (one(rows, layer=i, **inputs_only(rc, sk))["k_error"] for sk in ON_OFF)
            o_on, o_off = (one(rows, layer=i, **emulator(rc, True, sk, MAIN_TARGET))["rel_l2"] for sk in ON_OFF)
            line += [f"{k_on:.3e} / {k_off:.3e}", f"{o_on:.3e} / {o_off:.3e}"]
        smooth.append(line)
    out.append(table(header, smooth))

    # Per layer, main target, Direct-P on, both smooth_k.
    header = ["layer", "smooth_k"] + [f"{rc} cos" for rc in RECIPES] + [f"{rc} rel L2" for rc in RECIPES] + [f"{rc} max abs" for rc in RECIPES]
    per = []
    for i, sk in itertools.product(layers + ["all"], ON_OFF):
        rs = [one(rows, layer=i, **emulator(rc, True, sk, MAIN_TARGET)) for rc in RECIPES]
        per.append(
            [str(i), on_off(sk)] + [cos_fmt(r["cosine"]) for r in rs] + [fmt(r["rel_l2"]) for r in rs] + [fmt(r["max_abs"]) for r in rs]
        )
    out.append(table(header, per))

    # All layers at once, the whole grid, both targets, and the inputs-only share.
    header = ["recipe", "Direct-P", "smooth_k"]
    for t in TARGETS:
        header += [f"{t} cos", f"{t} rel L2", f"{t} max abs"]
    header += ["inputs only rel L2"]
    full = []
    for rc, dp, sk in itertools.product(RECIPES, ON_OFF, ON_OFF):
        line = [rc, on_off(dp), on_off(sk)]
        for t in TARGETS:
            r = one(rows, layer="all", **emulator(rc, dp, sk, t))
            line += [cos_fmt(r["cosine"]), fmt(r["rel_l2"]), fmt(r["max_abs"])]
        line.append(fmt(one(rows, layer="all", **inputs_only(rc, sk))["rel_l2"]))
        full.append(line)
    out.append(table(header, full))
    return "\n\n".join(out)


def target_and_direct_p_deltas(doc: dict) -> str:
    """Largest change of rel L2 between the targets and between Direct-P on and off, per recipe."""
    groups = {"synthetic": doc["synthetic"]["rows"], "MiniLM layers": doc["layers"]}
    lines = []
    for name, rows in groups.items():
        for rc in RECIPES:
            by_key = {
                (r.get("variant"), r.get("D"), r.get("seed"), r.get("layer"), r["direct_p"], r["smooth_k"], r["target"]): r["rel_l2"]
                for r in select(rows, path="emulator", recipe=rc)
            }
            d_target = max(abs(v - by_key[k[:6] + ("sm100",)]) / v for k, v in by_key.items() if k[6] == "sm90")
            d_dp = max(abs(v - by_key[k[:4] + (False,) + k[5:]]) / v for k, v in by_key.items() if k[4])
            lines.append([name, rc, f"{d_target:.1e}", f"{d_dp:.1e}"])
    return table(["inputs", "recipe", "max relative change of rel L2, sm90 vs sm100", "same, Direct-P on vs off"], lines)


# ---- (d) end to end ------------------------------------------------------------------------------


def end_to_end_table(doc: dict) -> str:
    rows = doc["end_to_end"]
    other = next(t for t in TARGETS if t != MAIN_TARGET)
    header = [
        "recipe",
        "Direct-P",
        "smooth_k",
        "sentences cos mean",
        "sentences cos min",
        "GPL-3 windows cos mean",
        "GPL-3 windows cos min",
        f"sentences / windows cos mean, {other}",
        "top-1 same",
        f"top-{metrics.TOP_K} order same",
        "partner is nearest",
        "Spearman mean",
        "Spearman min",
    ]
    base = one(rows, recipe="fp32")
    out = [["fp32 (original)", "–", "–", "1", "1", "1", "1", "1 / 1", "100 %", "100 %", f"{100 * base['partner_is_nearest']:.0f} %", "1", "1"]]
    for rc, dp, sk in itertools.product(RECIPES, ON_OFF, ON_OFF):
        match = {"recipe": rc, "direct_p": dp, "smooth_k": sk}
        s = one(rows, inputs="sentences", target=MAIN_TARGET, **match)
        w = one(rows, inputs="gpl3_windows", target=MAIN_TARGET, **match)
        s_other = one(rows, inputs="sentences", target=other, **match)
        w_other = one(rows, inputs="gpl3_windows", target=other, **match)
        out.append(
            [rc, on_off(dp), on_off(sk)]
            + [cos_fmt(s["emb_cos_mean"]), cos_fmt(s["emb_cos_min"]), cos_fmt(w["emb_cos_mean"]), cos_fmt(w["emb_cos_min"])]
            + [f"{cos_fmt(s_other['emb_cos_mean'])} / {cos_fmt(w_other['emb_cos_mean'])}"]
            + [f"{100 * s[k]:.0f} %" for k in ("top1_same", "topk_same", "partner_is_nearest")]
            + [f"{s['spearman_mean']:.4f}", f"{s['spearman_min']:.4f}"]
        )
    return table(header, out)


# ---- plots ---------------------------------------------------------------------------------------


def windows_label(doc: dict) -> str:
    w = doc["model"]["windows"]
    return f"{w['count']} GPL-3 windows of {w['tokens']} tokens"


def plot_layers(doc: dict, path: Path) -> None:
    rows = doc["layers"]
    layers = sorted({r["layer"] for r in rows if r["layer"] != "all"})
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    for rc in RECIPES:
        for sk, style in ((True, "-o"), (False, "--s")):
            y = [one(rows, layer=i, **emulator(rc, True, sk, MAIN_TARGET))["rel_l2"] for i in layers]
            ax.plot(layers, y, style, color=RECIPE_COLORS[rc], label=f"{rc}, smooth_k {on_off(sk)}", markersize=4)
        y = [one(rows, layer=i, **inputs_only(rc, True))["rel_l2"] for i in layers]
        ax.plot(layers, y, ":", color=RECIPE_COLORS[rc], alpha=0.7, label=f"{rc}, inputs only (smooth_k on)")
    ax.set_yscale("log")
    ax.set_yticks(LAYER_PLOT_TICKS, [f"{t:g}" for t in LAYER_PLOT_TICKS])
    ax.set_xlabel("layer of all-MiniLM-L6-v2")
    ax.set_ylabel("relative L2 error of O vs float64")
    ax.set_title(f"Attention output error per layer ({windows_label(doc)}; {MAIN_TARGET}, Direct-P on)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)


def plot_summary(doc: dict, path: Path) -> None:
    syn = doc["synthetic"]["rows"]
    variants = list(dict.fromkeys(r["variant"] for r in syn))
    e2e = doc["end_to_end"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    bars = len(RECIPES) * len(ON_OFF)
    width = 0.8 / bars
    x = np.arange(len(variants))
    problems = len(select(syn, variant=variants[0], **emulator(RECIPES[0], True, True, MAIN_TARGET)))
    for j, (rc, sk) in enumerate(itertools.product(RECIPES, ON_OFF)):
        y = [np.mean([r["rel_l2"] for r in select(syn, variant=v, **emulator(rc, True, sk, MAIN_TARGET))]) for v in variants]
        left.bar(
            x + (j - (bars - 1) / 2) * width,
            y,
            width,
            color=RECIPE_COLORS[rc],
            alpha=1.0 if sk else 0.45,
            hatch="" if sk else "//",
            label=f"{rc}, smooth_k {on_off(sk)}",
        )
    left.set_xticks(x, variants, fontsize=8)
    left.set_ylabel(f"relative L2 error of O (mean of {problems} problems)")
    left.set_title("(a) synthetic inputs, features added left to right", fontsize=9)
    left.legend(fontsize=6, ncol=2)
    left.grid(True, axis="y", alpha=0.3)

    labels, y_sent, y_win, colors = [], [], [], []
    for rc, sk in itertools.product(RECIPES, ON_OFF):
        match = {"recipe": rc, "direct_p": True, "smooth_k": sk, "target": MAIN_TARGET}
        labels.append(f"{rc}\nsk {on_off(sk)}")
        y_sent.append(1.0 - one(e2e, inputs="sentences", **match)["emb_cos_mean"])
        y_win.append(1.0 - one(e2e, inputs="gpl3_windows", **match)["emb_cos_mean"])
        colors.append(RECIPE_COLORS[rc])
    xs = np.arange(len(labels))
    right.bar(xs - 0.2, y_sent, 0.4, color=colors)
    right.bar(xs + 0.2, y_win, 0.4, color=colors, alpha=0.45, hatch="//")
    right.set_yscale("log")
    right.set_xticks(xs, labels, fontsize=6)
    right.set_ylabel("1 − cosine(embedding, fp32 embedding), mean")
    right.set_title(f"(d) all-MiniLM-L6-v2 end to end, every layer replaced ({MAIN_TARGET}, Direct-P on)", fontsize=9)
    # Legend swatches in grey: the bar colours stand for the recipes, as on the left.
    right.legend(
        handles=[
            Patch(facecolor="grey", label=f"{doc['model']['sentences']} sentences"),
            Patch(facecolor="grey", alpha=0.45, hatch="//", label=f"{windows_label(doc)}"),
        ],
        fontsize=7,
    )
    right.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--plots", type=Path, default=DEFAULT_PLOTS, help="folder for the PNG files")
    args = parser.parse_args()
    doc = json.loads(args.results.read_text())

    sections = {
        "(a) synthetic": synthetic_tables(doc),
        "(b, c) all-MiniLM-L6-v2 layers": layer_tables(doc),
        "sm90 vs sm100, Direct-P on vs off": target_and_direct_p_deltas(doc),
        f"(d) end to end ({MAIN_TARGET}; retrieval columns on the sentences)": end_to_end_table(doc),
    }
    print(f"<!-- report.py on {args.results.name}: date {doc['date']}, commit {doc['commit']}, {doc['seconds']} s -->")
    for title, body in sections.items():
        print(f"\n### {title}\n\n{body}")
    plot_layers(doc, args.plots / LAYER_PLOT)
    plot_summary(doc, args.plots / SUMMARY_PLOT)


if __name__ == "__main__":
    main()
