"""The case loop and the JSON record shared by the randomized GPU scripts
(fuzz_device.py, fuzz_varlen_device.py)."""

import json
import sys
import time
import traceback

import torch


def run_cases(cases: list, run_case, only, seconds: float) -> tuple:
    """(rows, failed, seconds taken): each case's draw and result, case N alone if `only` is N,
    no case started after `seconds`. An exception is a failure too, with its message."""
    rows, failed, start = [], 0, time.time()
    for i, c in enumerate(cases):
        if only is not None and i != only:
            continue
        if time.time() - start > seconds:
            break
        try:
            r = run_case(i, c)
        except Exception as e:
            r = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc(limit=3)}
        rows.append({"case": i, **c, **r})
        if not r["ok"]:
            failed += 1
            print(f"case {i} FAILED: {json.dumps(rows[-1])}", flush=True)
    return rows, failed, time.time() - start


def write_record(path, seed: int, commit, rows: list) -> None:
    """The run as JSON (date, GPU, commit, command, seed, every case) at `path`, if one is given."""
    if not path:
        return
    with open(path, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(), "commit": commit,
                   "command": " ".join(sys.argv), "seed": seed, "cases": rows}, f, separators=(",", ":"))
