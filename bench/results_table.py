"""Render a forward-benchmark results JSON (DESIGN §8 schema) as the markdown table of docs/bench-fwd.md.

usage: python3 bench/results_table.py bench/results/<file>.json
Ratios are recomputed from the rows, so anyone can check them against the raw figures.
"""
import json
import sys


def main(path):
    with open(path) as f:
        result = json.load(f)
    rows = result["rows"]
    cases = sorted({(r["D"], r["H"], r["Sq"], r["B"], r["causal"]) for r in rows},
                   key=lambda c: (-c[0], c[4], c[2]))

    def tflops(case, op, impl, direct_p=None):
        for r in rows:
            if (r["D"], r["H"], r["Sq"], r["B"], r["causal"]) == case and r["op"] == op and r["impl"] == impl \
                    and (direct_p is None or r["direct_p"] == direct_p):
                return r["tflops"]
        return None

    print("| D | H | S | B | causal | Direct-P fwd | exp2 fwd | Direct-P e2e | cuDNN BF16 | FA2 BF16 "
          "| DP / cuDNN | exp2 / cuDNN | e2e / cuDNN | DP / exp2 |")
    print("|" + "---|" * 14)
    for case in cases:
        dp = tflops(case, "fwd", "fp4attn", True)
        ex = tflops(case, "fwd", "fp4attn", False)
        e2e = tflops(case, "fwd_e2e", "fp4attn", True)
        cudnn = tflops(case, "fwd", "cudnn_bf16")
        fa2 = tflops(case, "fwd", "fa2_bf16")
        D, H, S, B, causal = case
        print(f"| {D} | {H} | {S} | {B} | {'yes' if causal else 'no'} | {dp:.1f} | {ex:.1f} | {e2e:.1f} | "
              f"{cudnn:.1f} | {fa2:.1f} | {dp / cudnn:.2f} | {ex / cudnn:.2f} | {e2e / cudnn:.2f} | {dp / ex:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1])
