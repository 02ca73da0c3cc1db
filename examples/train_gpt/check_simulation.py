"""How close simulated_attention.py is to fp4attn's emulator, on one small problem.

    PYTHONPATH=<fp4attn site> python3 examples/train_gpt/check_simulation.py --out examples/train_gpt/results

For each simulated recipe: O and LSE of the simulation against the CPU
emulator's (fp4attn.attention on NumPy arrays), and, where the build has
fp4attn._ext.backward, dQ, dK, dV against the emulator's FP8 backward fed the
same dO. Each side uses its own forward's O and LSE, as in training. The
error of each against the fp64 reference on the unquantized inputs is printed
beside it, for scale. Runs on the CPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import simulated_attention as sim  # noqa: E402
from train import commit_of_tree  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))
from fp64_reference import attention_backward_bshd, attention_bshd  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn import _ext, _host  # noqa: E402

# (simulated recipe, library recipe, emulator target): the simulation
# multiplies exact dequantized values, which is the sm100 model for FP4 Q/K;
# the sm90 rows show what the Hopper fold adds.
CASES = [("fp8", "fp8", "sm90"), ("mxfp4_train", "mxfp4_train", "sm100"), ("mxfp4_train", "mxfp4_train", "sm90"),
         ("fp4p", "mxfp4", "sm100"), ("fp4p", "mxfp4", "sm90")]
SHAPE = dict(B=1, S=256, H=2, D=64)  # two 128-token tiles per sequence


def metrics(got, ref) -> dict:
    got = np.asarray(got, dtype=np.float64).ravel()
    ref = np.asarray(ref, dtype=np.float64).ravel()
    cos = float(got @ ref / (np.linalg.norm(got) * np.linalg.norm(ref)))
    return {"one_minus_cos": 1 - cos, "rel_l2": float(np.linalg.norm(got - ref) / np.linalg.norm(ref))}


def make_problem(seed: int):
    rng = np.random.default_rng(seed)
    B, S, H, D = SHAPE["B"], SHAPE["S"], SHAPE["H"], SHAPE["D"]
    q = rng.standard_normal((B, S, H, D)).astype(np.float32)
    k = (rng.standard_normal((B, S, H, D)) + 0.5).astype(np.float32)  # keys with a common offset
    v = rng.standard_normal((B, S, H, D)).astype(np.float32)
    d_o = rng.standard_normal((B, S, H, D)).astype(np.float32)
    return q, k, v, d_o


def bhsd(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x).transpose(1, 2)


def bshd(x: torch.Tensor) -> np.ndarray:
    return x.transpose(1, 2).numpy()


def check(sim_recipe: str, lib_recipe: str, target: str, q, k, v, d_o) -> dict:
    scale = 1.0 / math.sqrt(q.shape[-1])
    recipe = sim.SIM_RECIPES[sim_recipe]
    o_sim, lse_smooth, lse_sim = sim.simulated_forward(bhsd(q), bhsd(k), bhsd(v), recipe, True, scale)
    o_emu, lse_emu = fp4attn.attention(q, k, v, causal=True, recipe=lib_recipe, target=target, return_lse=True)
    o_ref, lse_ref = attention_bshd(q, k, v, "bottom_right")
    row = {
        "simulated": sim_recipe, "library_recipe": lib_recipe, "target": target,
        "o_sim_vs_emulator": metrics(bshd(o_sim), o_emu),
        "lse_sim_vs_emulator_max_abs": float(np.abs(lse_sim.numpy() - lse_emu).max()),
        "o_emulator_vs_fp64": metrics(o_emu, o_ref), "o_sim_vs_fp64": metrics(bshd(o_sim), o_ref),
    }
    ref_grads = attention_backward_bshd(q, k, v, d_o, "bottom_right")
    sim_grads = [bshd(g) for g in sim.simulated_backward(bhsd(q), bhsd(k), bhsd(v), o_sim, lse_smooth, bhsd(d_o),
                                                         recipe, True, scale)]
    row["grads_sim_vs_fp64"] = {n: metrics(g, r) for n, g, r in zip(("dq", "dk", "dv"), sim_grads, ref_grads)}
    has_backward = _ext.recipe_has_backward(_ext.Recipe.__members__[lib_recipe])
    if hasattr(_ext, "backward") and has_backward:
        s = _host.make_settings(layout="bshd", mask=_host.MASK_BOTTOM_RIGHT, scale=None, scale_name="scale",
                                recipe=lib_recipe, smooth_k=True, direct_p=True, gqa=True, names=("q", "k", "v"),
                                target=target)
        emu_grads = _ext.backward(q, k, v, np.ascontiguousarray(o_emu), np.ascontiguousarray(lse_emu), d_o,
                                  _host.options(s))[:3]
        row["grads_sim_vs_emulator"] = {n: metrics(g, e) for n, g, e in zip(("dq", "dk", "dv"), sim_grads, emu_grads)}
        row["grads_emulator_vs_fp64"] = {n: metrics(e, r) for n, e, r in zip(("dq", "dk", "dv"), emu_grads, ref_grads)}
    else:
        row["grads_sim_vs_emulator"] = None
        row["grads_note"] = ("the library has no backward for this recipe (inference-only)" if not has_backward
                             else "this build has no fp4attn._ext.backward")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    q, k, v, d_o = make_problem(args.seed)
    rows = [check(*case, q, k, v, d_o) for case in CASES]
    for r in rows:
        line = (f"{r['simulated']:12s} vs {r['library_recipe']:11s} {r['target']}: "
                f"O 1-cos {r['o_sim_vs_emulator']['one_minus_cos']:.2e} rel L2 {r['o_sim_vs_emulator']['rel_l2']:.3f} "
                f"|dLSE| {r['lse_sim_vs_emulator_max_abs']:.3f}")
        if r["grads_sim_vs_emulator"]:
            worst = max(r["grads_sim_vs_emulator"].values(), key=lambda m: m["rel_l2"])
            line += f"; grads worst 1-cos {worst['one_minus_cos']:.2e} rel L2 {worst['rel_l2']:.3f}"
        print(line)
    record = {"date": datetime.date.today().isoformat(), "commit": commit_of_tree(), "device": "CPU (emulator)",
              "command": "python3 examples/train_gpt/check_simulation.py " + " ".join(sys.argv[1:]), "shape": SHAPE,
              "causal": True, "seed": args.seed, "torch": torch.__version__, "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "simulation_check.json"), "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
