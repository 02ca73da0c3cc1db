#!/usr/bin/env python3
"""Where a CTA of the FP8 forward spends its cycles (device side of dev/fwd_timeline).

    python3 dev/fwd_timeline/timeline.py --lib BUILD/fwd_timeline/libfp4attn_capi.so --out OUT [--commit C]

For each case (recipe fp8, Direct-P, pre-quantized random inputs, bench_fwd.py's
plan: B·S = 32k, H = 16 at D = 128 and 32 at D = 64) it runs the kernel a few
times, clears the marks, runs it once more and reads every CTA's marks
(src/cuda/sm90/fwd/fp8_direct_p/timeline.cuh). Printed and written to
OUT/timeline.json: per-CTA medians, in SM clock cycles from the CTA's first
instruction, of each mark; the median gap in ns between a CTA's end
(consumer 1's last store) and the start of the next CTA on the same SM; the
share of the kernel's span that SMs hold a CTA. CTAs whose consumer 1 owns no
row are left out (they never reach its marks).
"""
import argparse
import ctypes
import datetime
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from bench_fwd import Ours  # noqa: E402
from capi_lib import load_lib  # noqa: E402

MARKS = ["entry", "entry_ns", "sm", "producer_start", "q_ready", "kv0_ready", "s0_done", "softmax0_done",
         "loop_end", "last_turn", "last_pv_done", "end", "other_loop_end", "other_end", "other_end_ns"]
CTAS = 8192
CASES = [(128, 4096, False), (128, 16384, False), (128, 4096, True), (64, 4096, False), (64, 16384, False)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="libfp4attn_capi.so built by dev/fwd_timeline/build.sh")
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    lib, ll3 = load_lib(args.lib)
    raw = ctypes.CDLL(args.lib)
    raw.fp4attn_fwd_timeline_read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulonglong]
    raw.fp4attn_fwd_timeline_clear.argtypes = [ctypes.c_int]
    rows = []
    for D, S, causal in CASES:
        H = 16 if D == 128 else 32
        B = 32768 // S
        torch.manual_seed(1)
        sets = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))]
        ours = Ours(lib, ll3, sets, B, H, S, D, causal)
        ours.set_direct_p(True)
        for _ in range(5):
            ours.attend(0)
        torch.cuda.synchronize()
        assert raw.fp4attn_fwd_timeline_clear(D) == 0
        torch.cuda.synchronize()
        ours.attend(0)
        torch.cuda.synchronize()
        buf = np.zeros((CTAS, len(MARKS)), dtype=np.uint64)
        assert raw.fp4attn_fwd_timeline_read(D, buf.ctypes.data, buf.nbytes) == 0
        ours.close()
        m = {name: i for i, name in enumerate(MARKS)}
        t = buf[(buf[:, m["entry_ns"]] != 0) & (buf[:, m["other_end_ns"]] != 0)].astype(np.int64)
        start, start_ns, sm, end_ns = t[:, m["entry"]], t[:, m["entry_ns"]], t[:, m["sm"]], t[:, m["other_end_ns"]]
        gaps, held = [], 0
        for s_ in np.unique(sm):
            idx = np.where(sm == s_)[0]
            order = idx[np.argsort(start_ns[idx])]
            held += int((end_ns[order] - start_ns[order]).sum())
            gaps += list(start_ns[order][1:] - end_ns[order][:-1])
        span = int(end_ns.max() - start_ns.min())
        row = dict(D=D, S=S, causal=causal, ctas=int(len(t)), span_us=span / 1e3,
                   held_share=held / (span * len(np.unique(sm))), gap_ns=float(np.median(gaps)),
                   cycles_per_ns=float(np.median((t[:, m["other_end"]] - start) / np.maximum(end_ns - start_ns, 1))))
        for name in MARKS:
            if name not in ("entry", "entry_ns", "sm", "other_end_ns"):
                row[name] = float(np.median(t[:, m[name]] - start))
        print(json.dumps(row))
        rows.append(row)
    os.makedirs(args.out, exist_ok=True)
    result = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), commit=args.commit,
                  command="python3 " + " ".join(sys.argv), unit="SM cycles from the CTA's first instruction (medians)",
                  rows=rows)
    with open(os.path.join(args.out, "timeline.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
