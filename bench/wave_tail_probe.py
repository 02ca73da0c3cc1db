#!/usr/bin/env python3
"""How much the last, partly filled wave of CTAs costs the fp8 forward kernel.

Shapes in pairs with the same work per CTA (128 query rows, S / 128 key tiles)
and a grid of whole or fractional waves of 132 CTAs (one CTA per SM), e.g.
B = 1, H = 128 (4096 CTAs, 31.03 waves) against H = 132 (4224, 32.00): if the
tail were lost in full, the second would run 3 % faster per FLOP. Recipe fp8,
Direct-P, pre-quantized inputs, D = 128, noncausal; cuDNN BF16 and FA2 BF16
SDPA timed beside it in each round. Prints one line per shape and writes
OUT/wave_tail_probe.json.

    python3 bench/wave_tail_probe.py --lib build/libfp4attn_capi.so --out OUT
"""
import argparse
import json
import os
import statistics

import torch
from torch.nn.attention import SDPBackend

from bench_fwd import Ours, flops, sdpa
from capi_lib import load_lib, time_ms

# (B, H, S): pairs of equal S, one with a partly filled last wave and one without.
SHAPES = [(1, 128, 4096), (1, 132, 4096), (8, 16, 4096), (4, 33, 3968), (2, 64, 8192), (2, 66, 8192),
          (1, 64, 2048), (1, 66, 2048)]
SMS = 132


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    lib, ll3 = load_lib(args.lib)
    impls = {}
    for shape in SHAPES:
        B, H, S = shape
        sets = [tuple(torch.randn(B, S, H, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))]
        impls[shape] = {"ours": Ours(lib, ll3, sets, B, H, S, 128, False).attend,
                        "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, sets, False),
                        "fa2": sdpa(SDPBackend.FLASH_ATTENTION, sets, False)}
    tf = {(shape, name): [] for shape in SHAPES for name in ("ours", "cudnn", "fa2")}
    for _ in range(args.rounds):
        for shape in SHAPES:
            for name, fn in impls[shape].items():
                tf[(shape, name)].append(flops(*shape, 128, False) / time_ms(fn, 10, 3) / 1e9)
    rows = []
    for shape in SHAPES:
        B, H, S = shape
        ctas = B * H * ((S + 127) // 128)
        row = {"B": B, "H": H, "S": S, "ctas": ctas, "waves": ctas / SMS}
        for name in ("ours", "cudnn", "fa2"):
            row[name] = statistics.median(tf[(shape, name)])
            row[name + "_rounds"] = tf[(shape, name)]
        rows.append(row)
        print(f"B={B:2d} H={H:3d} S={S:5d} ctas={ctas:5d} waves={ctas / SMS:6.2f}  ours {row['ours']:6.1f}  "
              f"cudnn {row['cudnn']:6.1f}  fa2 {row['fa2']:6.1f} TFLOP/s")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "wave_tail_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
