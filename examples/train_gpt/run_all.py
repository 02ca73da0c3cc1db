"""The GPT training study, every run in one process: same seed, data order and steps.

    python3 examples/train_gpt/run_all.py --out OUT --minutes-per-run 0.6

Order: 1. bf16 SDPA, 2. fp8 (fp4attn kernels), 3. mxfp4_train (fp4attn
kernels), 4. FP4-P training (simulated: FP4 P has no backward kernel), then the
simulated mxfp4_train and fp8 runs if --total-minutes allows. The step count is the same for every run: a short timing probe of the
slowest attentions sizes it so that the slowest run takes about
--minutes-per-run. Writes OUT/training_runs.json (every run's record) and
OUT/training-loss.png after each run, so a cut-short study keeps what ran.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import gpt  # noqa: E402
import plot  # noqa: E402
import train  # noqa: E402

MAIN_RUNS = ("bf16", "fp8", "mxfp4_train", "fp4p_sim")
OPTIONAL_RUNS = ("mxfp4_train_sim", "fp8_sim")
PROBED = ("fp8", "fp4p_sim")  # the slowest: simulated backward, or simulated forward and backward
EVAL_EVERY = 25
EVAL_OVERHEAD = 1.12  # validation passes and the final bf16-attention evaluation, relative to training time


def seconds_per_step(attention: str, cfg: gpt.GPTConfig, batch: int, data: corpus.Corpus) -> float:
    r = train.train(attention, 6, None, batch=batch, cfg=cfg, data=data, eval_every=10**9, val_sequences=batch,
                    timed_from=2)
    return r["tokens_per_step"] / r["tokens_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes-per-run", type=float, default=0.6)
    ap.add_argument("--total-minutes", type=float, default=4.5, help="no optional run starts after this")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--min-steps", type=int, default=50)
    ap.add_argument("--max-steps", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=None, help="fixed step count (skips the probe)")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()
    started = time.perf_counter()
    command = "python3 examples/train_gpt/run_all.py " + " ".join(sys.argv[1:])
    cfg = gpt.GPTConfig()
    data = corpus.load()
    print(f"corpus: {data.describe()}", flush=True)

    probe = {}
    if args.steps is None:
        for name in PROBED:
            probe[name] = seconds_per_step(name, cfg, args.batch, data)
            print(f"probe: {name} {probe[name] * 1e3:.1f} ms/step", flush=True)
        steps = int(args.minutes_per_run * 60 / (max(probe.values()) * EVAL_OVERHEAD))
        steps = max(args.min_steps, min(args.max_steps, steps // EVAL_EVERY * EVAL_EVERY))
    else:
        steps = args.steps
    print(f"steps per run: {steps}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    summary = {
        "date": datetime.date.today().isoformat(),
        "gpu": train.gpu_name(),
        "commit": args.commit or train.commit_of_tree(),
        "command": command,
        "steps": steps,
        "probe_seconds_per_step": probe,
        "runs": [],
    }
    for name in MAIN_RUNS + OPTIONAL_RUNS:
        elapsed = (time.perf_counter() - started) / 60
        if name in OPTIONAL_RUNS and elapsed > args.total_minutes:
            print(f"skipping {name}: {elapsed:.1f} min spent, limit {args.total_minutes}", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            record = train.train(name, steps, None, batch=args.batch, cfg=cfg, data=data, eval_every=EVAL_EVERY,
                                 commit=summary["commit"], command=command)
        except Exception as e:  # one failed run must not cost the others
            print(f"{name}: failed: {type(e).__name__}: {e}", flush=True)
            summary.setdefault("failed", {})[name] = f"{type(e).__name__}: {e}"
            continue
        record["wall_seconds"] = time.perf_counter() - t0
        summary["runs"].append(record)
        print(f"{name}: final train {record['final_train_loss']} val {record['final_val_loss']} "
              f"(bf16-attention val {record['final_val_loss_bf16_attention']}), "
              f"{record['tokens_per_s']} tokens/s, {record['wall_seconds']:.0f} s", flush=True)
        with open(os.path.join(args.out, "training_runs.json"), "w") as f:
            json.dump(summary, f, indent=1)
        try:
            plot.plot(summary["runs"], os.path.join(args.out, "training-loss.png"))
        except ImportError as e:  # no matplotlib: plot.py draws it later from the JSON
            print(f"no plot: {e}", flush=True)


if __name__ == "__main__":
    main()
