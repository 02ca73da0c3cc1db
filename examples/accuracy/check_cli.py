"""Reproduces part (b) with the `fp4attn accuracy` CLI on the saved tensors and
checks that it reports the figures the Python package gives for them.

    PYTHONPATH=<fp4attn site> python3 check_cli.py [--cli build/fp4attn]

The CLI runs every recipe with Direct-P on and off and smooth_k on (its
default), for one target per call; both targets are run here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import metrics
import reference
import study
import sweep

REPO = study.HERE.parent.parent
DEFAULT_CLI = REPO / "build" / "fp4attn"
# The CLI's O is the emulator's, bit for bit; its figures and ours differ only
# by how the sums of the metrics are ordered.
TOLERANCE = 1e-6
FIGURES = ("cosine", "rel_l2", "max_abs")


def cli_rows(cli: Path, layer: int, target: str) -> list[dict]:
    files = {name: study.DATA_DIR / f"minilm_gpl3_layer{layer}_{name}.npy" for name in "qkv"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        command = [str(cli), "accuracy"] + [a for n, f in files.items() for a in (f"--{n}", str(f))]
        command += ["--target", target, "--json", str(out)]
        print("$ " + " ".join(str(Path(c).relative_to(REPO)) if c.startswith(str(REPO)) else c for c in command))
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.loads(out.read_text())["rows"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cli", type=Path, default=DEFAULT_CLI)
    args = parser.parse_args()
    worst = 0.0
    for layer in study.SAVED_LAYERS:
        q, k, v = (np.load(study.DATA_DIR / f"minilm_gpl3_layer{layer}_{n}.npy") for n in "qkv")
        ref = reference.attention(q, k, v)
        for target in sweep.TARGETS:
            for row in cli_rows(args.cli, layer, target):
                setting = sweep.Setting(row["recipe"], row["direct_p"], True, target)
                ours = metrics.errors(sweep.attention(setting)(q, k, v), ref)
                diff = max(abs(row[f] - ours[f]) / max(abs(ours[f]), np.finfo(np.float32).tiny) for f in FIGURES)
                worst = max(worst, diff)
                print(
                    f"layer {layer} {target:5s} {row['recipe']:12s} direct_p={'on ' if row['direct_p'] else 'off'}"
                    f" cos {row['cosine']:.6f} rel_l2 {row['rel_l2']:.4e} max_abs {row['max_abs']:.4e}"
                    f"  (Python: rel. difference {diff:.1e})"
                )
    print(f"largest relative difference CLI vs Python: {worst:.1e}")
    if worst > TOLERANCE:
        sys.exit(f"FAILED: the CLI and the Python package disagree by {worst:.1e} > {TOLERANCE:.0e}")


if __name__ == "__main__":
    main()
