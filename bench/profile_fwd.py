#!/usr/bin/env python3
"""One forward configuration, a few calls: the driver to run under ncu.

    ncu --clock-control none --set full --import-source yes -k regex:fp8_forward_kernel \
        --launch-skip 2 --launch-count 1 -o OUT/prof python3 bench/profile_fwd.py --lib build/libfp4attn_capi.so

Recipe fp8 on pre-quantized random inputs through bench_fwd.py's plan (Direct-P
unless --exp2), B·S = 32k tokens, H · D = 2048 (H = 16 at D = 128).
--recipe mxfp4 / mxfp4_train goes through bench_fwd_mx.py's plan (D = 128);
--prepare times the preparation (quantizers, fold) instead of the kernel, e.g.
`ncu --metrics gpu__time_duration.sum` lists each of its kernels.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_fwd_mx  # noqa: E402
from bench_fwd import Ours  # noqa: E402
from capi_lib import load_lib  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--S", type=int, default=16384)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--exp2", action="store_true", help="Direct-P off")
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--recipe", default="fp8", choices=["fp8", "mxfp4", "mxfp4_train"])
    ap.add_argument("--prepare", action="store_true", help="run the preparation from bf16, not the kernel")
    ap.add_argument("--in-kernel", action="store_true",
                    help="mxfp4: the kernel reads MXFP4 and expands it (Fp4Expansion::in_kernel)")
    args = ap.parse_args()
    lib, ll3 = load_lib(args.lib)
    H = 2048 // args.D  # the grid's H·D = 2048
    B = 32768 // args.S
    torch.manual_seed(1)
    sets = [tuple(torch.randn(B, args.S, H, args.D, device="cuda", dtype=torch.bfloat16) for _ in range(3))]
    if args.recipe == "fp8":
        ours = Ours(lib, ll3, sets, B, H, args.S, args.D, args.causal)
        ours.set_direct_p(not args.exp2)
        run = ours.e2e if args.prepare else ours.attend
    else:
        if args.D != 128 or args.causal or args.exp2:
            raise SystemExit("the MX plan here is D = 128, noncausal, Direct-P")
        bench_fwd_mx.declare_mx(lib)
        ours = bench_fwd_mx.Runner(lib, ll3, sets, B, args.S, args.S, args.recipe, args.in_kernel)
        run = ours.prepare if args.prepare else ours.attend
    for _ in range(args.calls):
        run(0)
    torch.cuda.synchronize()
    ours.close()


if __name__ == "__main__":
    main()
