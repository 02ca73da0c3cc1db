"""The H200 columns of the accuracy study: parts (a) and (b, c) run on the sm90
kernels, next to the CPU emulator's sm90 and sm100 figures for the same
settings, and how far the GPU's O and LSE are from the emulator's.

    PYTHONPATH=<fp4attn site> python3 gpu_columns.py [--out results/gpu-columns.json]
    PYTHONPATH=<fp4attn site> python3 gpu_columns.py --dry-run      # no GPU, no torch

On a Hopper GPU with PyTorch, every setting runs as CUDA tensors through
fp4attn.attention (target sm90; the torch op takes its zero-copy device path;
twice, to see that it repeats) and on the emulator (sm90 and sm100) from NumPy
arrays, on the same inputs. --dry-run runs the same
code with the sm90 emulator standing in for the GPU, so the whole script can be
tested on a machine without one; its "GPU" figures are the emulator's and are
labelled so.

Inputs:
  (a) synthetic.py's problems (every variant, D = 64 and 128, every seed);
  (b, c) the saved MiniLM Q, K, V of layers 0 and 5 (data/*.npy, D = 32),
      zero-padded to D = 64 for the kernels (pad_head_dim says why that is
      exact, and the script checks it on the emulator).
Recipes: fp8, mxfp4_train, mxfp4 and nvfp4 x Direct-P on/off x smooth_k on/off,
every one on the GPU. A setting the sm90 executor did not implement
(sm90_supports, src/dispatch/validate.cpp) would get the emulator columns and an
empty GPU column (no_gpu_kernel).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

import fp4attn
import metrics
import reference
import synthetic

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT_OUT = HERE / "results" / "gpu-columns.json"
DATA_DIR = HERE / "data"
MINILM_LAYERS = (0, 5)
MINILM_HEAD_DIM = 32
# The head dims the sm90 kernels take; MiniLM's 32 is padded to the smallest.
KERNEL_HEAD_DIMS = (64, 128)
PADDED_HEAD_DIM = 64
RECIPES = ("fp8", "mxfp4_train", "mxfp4", "nvfp4")
TARGETS = ("sm90", "sm100")
ON_OFF = (True, False)
FIGURES = ("cosine", "rel_l2", "max_abs")


class Setting(NamedTuple):
    recipe: str
    direct_p: bool
    smooth_k: bool


class Problem(NamedTuple):
    part: str  # "a" (synthetic) or "bc" (MiniLM layer)
    labels: dict  # variant / D / seed, or layer
    q: np.ndarray  # (B, S, H, D) float32 as the study feeds it
    k: np.ndarray
    v: np.ndarray
    scale: float | None  # None: the library's 1/sqrt(D)


def settings() -> list[Setting]:
    return [Setting(*c) for c in itertools.product(RECIPES, ON_OFF, ON_OFF)]


def no_gpu_kernel(s: Setting) -> str | None:
    """Why the sm90 executor does not implement s (None where it does): the GPU
    column of such a setting stays empty, its emulator columns are computed.
    Every recipe x Direct-P x smooth_k setting of this study has a kernel."""
    del s
    return None


def pad_head_dim(x: np.ndarray, head_dim: int) -> np.ndarray:
    """x (B, S, H, D) with zero channels appended up to head_dim.

    Why the padded problem gives the unpadded O (and LSE) in every recipe, with
    the softmax scale passed as 1/sqrt(32) instead of 1/sqrt(64):
    * Scores: a zero channel adds q_d * k_d = 0 to every dot product. On sm90
      the FP8 wgmma sums D/32 chained k32 steps; the real channels fill the
      first step exactly as at D = 32, and the padded step adds only zero
      products, which take no part in the alignment (docs/numerics.md), so it
      returns its 14-bit accumulator unchanged.
    * FP8 Q and K: one scale per (head, block of 128 tokens) from the block's
      max |x|; zeros never change a max. smooth_k's K mean of a zero channel is
      zero, and the LSE correction scale * q . k_mean gains only exact zeros.
    * FP8 V: one scale per channel; a zero channel gets scale 1 and zero codes
      and only touches its own output column, which is sliced off.
    * MXFP4 Q and K: 32-element blocks along D, so the padded channels form
      whole blocks of their own, all zero. An all-zero block gets the smallest
      E8M0 scale (2^-127), so it never raises the fold exponent R of a query
      row or a key tile on sm90 (R = max of the block exponents), and the real
      blocks fold into E4M3 exactly as before; on sm100 each block's scale
      multiplies only its own (zero) products.
    * MXFP4 V: blocks run along the sequence per channel, so a zero channel's
      blocks (and its sm90 column fold factor) touch only its own column.
    * NVFP4 Q and K: 16-element blocks along D, so again the padded channels
      form whole all-zero blocks, whose BF16 expansion is zero; the fp32
      tensor scale comes from the tensor's max |x|, which zeros never change.
      The BF16 wgmma only adds zero products for the padded channels.
    * NVFP4 V: blocks run along the sequence per channel, with the tensor
      scale from max |V| as for Q and K; a zero channel touches only its own
      column.
    * P (E4M3, or MXFP4 / NVFP4 per key block) comes from the unchanged scores.
    The script checks this on the emulator (padding_check in the JSON).
    """
    pad = head_dim - x.shape[-1]
    if pad < 0:
        raise ValueError(f"head dim {x.shape[-1]} is larger than {head_dim}")
    return np.concatenate([x, np.zeros(x.shape[:-1] + (pad,), dtype=x.dtype)], axis=-1)


def kernel_head_dim(d: int) -> int:
    return next(k for k in KERNEL_HEAD_DIMS if k >= d)


def problems(seeds) -> list[Problem]:
    out = []
    for variant in synthetic.VARIANTS:
        for head_dim in synthetic.HEAD_DIMS:
            for seed in seeds:
                q, k, v = synthetic.make_qkv(variant, head_dim, seed)
                out.append(Problem("a", {"variant": variant, "D": head_dim, "seed": seed}, q, k, v, None))
    for layer in MINILM_LAYERS:
        q, k, v = (np.load(DATA_DIR / f"minilm_gpl3_layer{layer}_{n}.npy") for n in "qkv")
        # The model's own scale, passed explicitly so that padding cannot change it.
        out.append(Problem("bc", {"layer": layer, "D": q.shape[-1]}, q, k, v, 1.0 / math.sqrt(q.shape[-1])))
    return out


# ---- executors ------------------------------------------------------------------


def emulate(q, k, v, s: Setting, target: str, scale) -> tuple[np.ndarray, np.ndarray]:
    """(O, LSE) from the CPU emulator, whatever hardware is present.

    fp4attn.attention on NumPy arrays picks its executor itself and, on a
    Hopper machine, runs the sm90 kernels; the emulator figures must come from
    the emulator, so this asks the core for it by name (the executor argument
    the public API leaves at automatic)."""
    opt = fp4attn._host.options(_host_settings(s, target, scale))
    o, lse, executor = fp4attn._ext.forward(
        np.ascontiguousarray(q, dtype=np.float32),
        np.ascontiguousarray(k, dtype=np.float32),
        np.ascontiguousarray(v, dtype=np.float32),
        opt,
        fp4attn._ext.Executor.emulator,
    )
    if executor != fp4attn._ext.Executor.emulator:
        raise RuntimeError(f"asked for the emulator, ran on {executor}")
    return o, lse


def _host_settings(s: Setting, target: str, scale):
    return fp4attn._host.make_settings(
        layout="bshd",
        mask=fp4attn._host.MASK_NONE,
        scale=scale,
        scale_name="scale",
        recipe=s.recipe,
        smooth_k=s.smooth_k,
        direct_p=s.direct_p,
        gqa=True,
        names=("q", "k", "v"),
        target=target,
    )


class TorchGpu:
    """The H200: CUDA tensors through fp4attn.attention, target sm90."""

    def __init__(self):
        import torch  # only here: the dry run needs no torch

        self.torch = torch
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA GPU visible to torch; use --dry-run to test without one")
        cap = torch.cuda.get_device_capability()
        if cap != (9, 0):
            raise SystemExit(f"the sm90 kernels need a compute-capability 9.0 GPU, this one is {cap}")
        self.name = torch.cuda.get_device_name()
        self.versions = {"torch": torch.__version__, "cuda": torch.version.cuda}
        self._inputs = None

    def load(self, q, k, v) -> None:
        """Copies one problem's operands to the GPU once; every setting then runs on them."""
        self._inputs = tuple(self.torch.from_numpy(np.ascontiguousarray(x)).cuda() for x in (q, k, v))

    def run(self, s: Setting, scale) -> tuple[np.ndarray, np.ndarray]:
        q, k, v = self._inputs
        self._require_device_path(q, k, v, s, scale)
        o, lse = fp4attn.attention(
            q, k, v, recipe=s.recipe, direct_p=s.direct_p, smooth_k=s.smooth_k, scale=scale,
            target="sm90", return_lse=True,
        )
        self.torch.cuda.synchronize()
        return o.cpu().numpy(), lse.cpu().numpy()

    def _require_device_path(self, q, k, v, s: Setting, scale) -> None:
        # For a call the device path does not take, the torch op quietly
        # copies to the host, where the automatic executor may pick the
        # emulator; such a figure would not be the GPU's. So the op's own test
        # is made first, and a call that fails it gets no GPU figure.
        hs = _host_settings(s, "sm90", scale)
        d = fp4attn._host.check(q, k, v, hs)
        shape = (d.B, d.Sq, d.Sk, d.Hq, d.Hkv, d.D)
        if not (fp4attn._ext.cuda_built() and fp4attn._ext.device_forward_supported(shape, fp4attn._host.options(hs))):
            raise NotOnDevice(f"{s} at D = {d.D} does not take the device path")


class NotOnDevice(RuntimeError):
    pass


class EmulatorStandIn:
    """--dry-run: the sm90 emulator in the GPU's place, on the same (padded) operands."""

    name = "none (dry run: the sm90 emulator stands in for the GPU)"
    versions: dict = {}

    def load(self, q, k, v) -> None:
        self._inputs = (q, k, v)

    def run(self, s: Setting, scale) -> tuple[np.ndarray, np.ndarray]:
        return emulate(*self._inputs, s, "sm90", scale)


# ---- comparisons ------------------------------------------------------------------


def agreement(o_gpu, lse_gpu, o_emu, lse_emu) -> dict:
    """How far two runs of the same problem are apart: elements that differ, largest differences."""
    o_gpu, o_emu = np.asarray(o_gpu, np.float64), np.asarray(o_emu, np.float64)
    lse_gpu, lse_emu = np.asarray(lse_gpu, np.float64), np.asarray(lse_emu, np.float64)
    return {
        "o_elements": int(o_gpu.size),
        "o_differing": int(np.count_nonzero(o_gpu != o_emu)),
        "o_max_abs_diff": float(np.abs(o_gpu - o_emu).max()),
        "lse_elements": int(lse_gpu.size),
        "lse_differing": int(np.count_nonzero(lse_gpu != lse_emu)),
        "lse_max_abs_diff": float(np.abs(lse_gpu - lse_emu).max()),
    }


def identical(a: tuple, b: tuple) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def run_problem(p: Problem, device, pool) -> list[dict]:
    d = p.q.shape[-1]
    dk = kernel_head_dim(d)
    padded = d != dk
    qp, kp, vp = (pad_head_dim(x, dk) for x in (p.q, p.k, p.v)) if padded else (p.q, p.k, p.v)
    # The emulator runs on its own threads with the GIL released; the
    # reference and the GPU run in this thread meanwhile.
    jobs = {}
    for s in settings():
        for target in TARGETS:
            jobs[s, target, "kernel_d"] = pool.submit(emulate, qp, kp, vp, s, target, p.scale)
            if padded:
                jobs[s, target, "original_d"] = pool.submit(emulate, p.q, p.k, p.v, s, target, p.scale)
    ref = reference.attention(p.q, p.k, p.v)
    device.load(qp, kp, vp)
    rows = []
    for s in settings():
        row = {"part": p.part} | p.labels | {"D_kernel": dk} | s._asdict()
        o_gpu = None
        if no_gpu_kernel(s):
            row["gpu_not_run"] = no_gpu_kernel(s)
        else:
            try:
                o_gpu, lse_gpu = device.run(s, p.scale)
                repeat = device.run(s, p.scale)
            except Exception as e:  # noqa: BLE001 - one failed setting must not cost the others' figures
                o_gpu = None
                row["gpu_error"] = f"{type(e).__name__}: {e}"
                print(f"  {s}: no GPU figure: {row['gpu_error']}", file=sys.stderr, flush=True)
        emu = {t: jobs[s, t, "kernel_d"].result() for t in TARGETS}
        if o_gpu is not None:
            row["gpu"] = metrics.errors(o_gpu[..., :d], ref)
            row["gpu_repeat_identical"] = identical((o_gpu, lse_gpu), repeat)
            row["gpu_vs_emulator_sm90"] = agreement(o_gpu, lse_gpu, *emu["sm90"])
        if padded:
            original = {t: jobs[s, t, "original_d"].result() for t in TARGETS}
            # The emulator columns are those of the study's own (unpadded) problem.
            for t in TARGETS:
                row[f"emulator_{t}"] = metrics.errors(original[t][0], ref)
            row["padding_check"] = {
                t: agreement(emu[t][0][..., :d], emu[t][1], *original[t]) for t in TARGETS
            }
            zero = {f"emulator_{t}": bool(not emu[t][0][..., d:].any()) for t in TARGETS}
            if o_gpu is not None:
                zero["gpu"] = bool(not o_gpu[..., d:].any())
            row["padded_channels_zero"] = zero
        else:
            for t in TARGETS:
                row[f"emulator_{t}"] = metrics.errors(emu[t][0], ref)
        rows.append(row)
    return rows


# ---- report -------------------------------------------------------------------------


def on_off(flag: bool) -> str:
    return "on" if flag else "off"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def summarize(rows: list[dict], key: str) -> dict:
    """Mean cosine, mean rel L2 and worst max abs over rows."""
    return {
        "cosine": float(np.mean([r[key]["cosine"] for r in rows])),
        "rel_l2": float(np.mean([r[key]["rel_l2"] for r in rows])),
        "max_abs": float(max(r[key]["max_abs"] for r in rows)),
    }


def pooled_agreement(parts: list[dict]) -> dict:
    """agreement() over several problems at once: counts add up, maxima are taken."""
    return {
        "o_elements": sum(a["o_elements"] for a in parts),
        "o_differing": sum(a["o_differing"] for a in parts),
        "o_max_abs_diff": max(a["o_max_abs_diff"] for a in parts),
        "lse_elements": sum(a["lse_elements"] for a in parts),
        "lse_differing": sum(a["lse_differing"] for a in parts),
        "lse_max_abs_diff": max(a["lse_max_abs_diff"] for a in parts),
    }


def figure_cells(f: dict) -> list[str]:
    return [f"{f['cosine']:.5f}", f"{f['rel_l2']:.3e}", f"{f['max_abs']:.3e}"]


def agreement_cells(a: dict) -> list[str]:
    return [f"{a['o_differing']} / {a['o_elements']}", f"{a['o_max_abs_diff']:.1e}", f"{a['lse_max_abs_diff']:.1e}"]


def select(rows, **match):
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def gpu_cells(sel: list[dict]) -> list[str]:
    """GPU figures and agreement of rows pooled; a setting that did not run on the GPU says so."""
    if all("gpu_not_run" in r for r in sel):
        return ["no sm90 kernel"] + ["–"] * 2, ["–"] * 3
    failed = [r for r in sel if "gpu" not in r]
    if failed:
        return [f"not run on the GPU ({len(failed)} of {len(sel)})"] + ["–"] * 2, ["–"] * 3
    return (figure_cells(summarize(sel, "gpu")),
            agreement_cells(pooled_agreement([r["gpu_vs_emulator_sm90"] for r in sel])))


def report(doc: dict) -> str:
    gpu = "stand-in" if doc["dry_run"] else "GPU"
    rows = doc["rows"]
    out = []
    if doc["dry_run"]:
        out.append("**Dry run: the sm90 emulator stands in for the GPU; no figure here is a GPU figure.**\n")
    head = ["recipe", "Direct-P", "smooth_k"]
    fig_head = lambda who, agg: [f"{who} cos{agg[0]}", f"{who} rel L2{agg[1]}", f"{who} max abs{agg[2]}"]  # noqa: E731
    agree_head = [f"O differing, {gpu} vs emu sm90", "max abs ΔO", "max abs ΔLSE"]

    synth = select(rows, part="a")
    if synth:
        n = len(synth) // len(settings())
        out.append(f"(a) synthetic, {n} problems per setting (mean cos, mean rel L2, worst max abs):\n")
        agg = (" (mean)", " (mean)", " (worst)")
        body = []
        for s in settings():
            sel = select(synth, **s._asdict())
            figures, agree = gpu_cells(sel)
            body.append(
                [s.recipe, on_off(s.direct_p), on_off(s.smooth_k)]
                + figures
                + figure_cells(summarize(sel, "emulator_sm90"))
                + figure_cells(summarize(sel, "emulator_sm100"))
                + agree
            )
        out.append(table(head + fig_head(gpu, agg) + fig_head("emu sm90", agg) + fig_head("emu sm100", agg) + agree_head, body))
        out.append("")
        # Per variant, as the study's headline table (Direct-P on).
        body = []
        for variant, sk in itertools.product(synthetic.VARIANTS, ON_OFF):
            cells = [variant, on_off(sk)]
            for recipe in RECIPES:
                sel = select(synth, variant=variant, recipe=recipe, direct_p=True, smooth_k=sk)
                if not sel:
                    break
                gpu_l2 = f"{summarize(sel, 'gpu')['rel_l2']:.3e}" if all("gpu" in r for r in sel) else "not run"
                cells += [gpu_l2, f"{summarize(sel, 'emulator_sm90')['rel_l2']:.3e}"]
            else:
                body.append(cells)
        if body:
            out.append("(a) rel L2 of O per variant, mean over its problems (Direct-P on):\n")
            vh = ["variant", "smooth_k"] + [f"{r} {w}" for r in RECIPES for w in (gpu, "emu sm90")]
            out.append(table(vh, body))
            out.append("")

    layers = select(rows, part="bc")
    if layers:
        out.append("(b, c) MiniLM layers, D = 32 zero-padded to 64 on the " + gpu + "; emulator columns on the unpadded problem:\n")
        body = []
        for s in settings():
            for r in select(layers, **s._asdict()):
                figures, agree = gpu_cells([r])
                body.append(
                    [s.recipe, on_off(s.direct_p), on_off(s.smooth_k), str(r["layer"])]
                    + figures
                    + figure_cells(r["emulator_sm90"])
                    + figure_cells(r["emulator_sm100"])
                    + agree
                )
        out.append(table(head + ["layer"] + fig_head(gpu, ("",) * 3) + fig_head("emu sm90", ("",) * 3)
                         + fig_head("emu sm100", ("",) * 3) + agree_head, body))
        out.append("")
        out.append("Padding check, emulator: padded D = 64 against the original D = 32 (both layers, every setting):\n")
        body = []
        for recipe in RECIPES:
            sel = select(layers, recipe=recipe)
            cells = [recipe]
            for t in TARGETS:
                a = pooled_agreement([r["padding_check"][t] for r in sel])
                cells += [f"{a['o_differing']} / {a['o_elements']}", f"{a['o_max_abs_diff']:.1e}", f"{a['lse_max_abs_diff']:.1e}"]
            zero = all(all(r["padded_channels_zero"].values()) for r in sel)
            body.append(cells + ["yes" if zero else "NO"])
        ph = ["recipe"] + [f"{t} {c}" for t in TARGETS for c in ("O differing", "max abs ΔO", "max abs ΔLSE")]
        out.append(table(ph + [f"padded O channels all zero ({gpu} and emulator)"], body))
        out.append("")
    ran = [r for r in rows if "gpu" in r]
    no_kernel = sum("gpu_not_run" in r for r in rows)
    repeat = all(r["gpu_repeat_identical"] for r in ran)
    out.append(f"{gpu} run twice per setting: {'bit-identical in every setting' if repeat else 'NOT always identical'}"
               f" ({len(ran)} of {len(rows)} problem settings ran on it; {no_kernel} have no sm90 kernel).")
    if not doc.get("complete", True):
        out.append("\n**Incomplete: the run stopped before every problem was done.**")
    return "\n".join(out)


# ---- provenance ---------------------------------------------------------------------


def git_commit() -> str | None:
    def git(*args) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        return commit + ("+uncommitted" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help=f"JSON file to write (default {DEFAULT_OUT.relative_to(REPO)}; "
                        "a dry run writes none unless given)")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: the sm90 emulator stands in for it")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(synthetic.SEEDS), help="synthetic seeds")
    parser.add_argument("--commit", help="the library's commit, where the tree has no git (a copy on another machine)")
    parser.add_argument("--report", type=Path, help="print the tables of an existing JSON and exit")
    args = parser.parse_args()
    if args.report:
        print(report(json.loads(args.report.read_text())))
        return

    start = time.time()
    device = EmulatorStandIn() if args.dry_run else TorchGpu()
    out = args.out or (None if args.dry_run else DEFAULT_OUT)
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "dry_run": args.dry_run,
        "gpu": device.name,
        # A copy of the tree on another machine may have no git; the caller
        # then names the commit the package was built from.
        "commit": args.commit or git_commit() or "unknown",
        "command": "python3 examples/accuracy/gpu_columns.py" + "".join(f" {a}" for a in sys.argv[1:]),
        "fp4attn": fp4attn.backend_info(),
        "versions": {"python": platform.python_version(), "numpy": np.__version__} | device.versions,
        "recipes_on_gpu": list(RECIPES),
        "emulator_only": {f"{s.recipe}, Direct-P {on_off(s.direct_p)}, smooth_k {on_off(s.smooth_k)}": no_gpu_kernel(s)
                          for s in settings() if no_gpu_kernel(s)},
        "synthetic": {"shape": {"B": synthetic.BATCH, "S": synthetic.SEQ, "H": synthetic.HEADS},
                      "D": list(synthetic.HEAD_DIMS), "seeds": args.seeds},
        "minilm": {"layers": list(MINILM_LAYERS), "files": "data/minilm_gpl3_layer{L}_{q,k,v}.npy",
                   "D": MINILM_HEAD_DIM, "D_kernel": PADDED_HEAD_DIM, "scale": 1.0 / math.sqrt(MINILM_HEAD_DIM),
                   "emulator_columns": "the unpadded D = 32 problem; padding_check compares the padded one with it"},
        "complete": False,
        "rows": [],
    }
    # Concurrent emulator calls fill the cores that one small problem's query
    # tiles leave idle (it parallelizes over batch x heads x query tiles).
    workers = max(1, min(4, (os.cpu_count() or 1) // 4))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for p in problems(args.seeds):
            doc["rows"] += run_problem(p, device, pool)
            doc["seconds"] = round(time.time() - start, 1)
            print(f"{p.part} {p.labels}: done ({doc['seconds']} s)", file=sys.stderr, flush=True)
            if out:  # after every problem, so that a run cut short keeps what it measured
                write(out, doc)
    doc["complete"] = True
    if out:
        write(out, doc)
        print(f"wrote {out} in {doc['seconds']} s", file=sys.stderr)
    print(report(doc))


def write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
