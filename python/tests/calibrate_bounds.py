"""Prints the worst recipe error of fp4attn.attention over the test problems
(conftest.SHAPES, causal and not, Direct-P and smooth_k on and off, 12 seeds),
the figures conftest.BOUNDS is set from (at about twice these).

    PYTHONPATH=build/python-package/site python python/tests/calibrate_bounds.py
"""

import itertools

import numpy as np

import fp4attn
from conftest import SHAPES, make_qkv
from fp64_reference import attention_bshd, cosine, rel_l2

SEEDS = 12


def main():
    worst = {r: [0.0, 0.0, 0.0] for r in fp4attn.RECIPES}
    for seed, shape, causal in itertools.product(range(SEEDS), SHAPES, (False, True)):
        q, k, v = make_qkv(np.random.default_rng(seed), *shape)
        o_ref, lse_ref = attention_bshd(q, k, v, "bottom_right" if causal else "none")
        seen = np.isfinite(lse_ref)
        for recipe, direct_p, smooth_k in itertools.product(fp4attn.RECIPES, (True, False), (True, False)):
            o, lse = fp4attn.attention(
                q, k, v, causal=causal, recipe=recipe, direct_p=direct_p, smooth_k=smooth_k, return_lse=True
            )
            errors = (1 - cosine(o, o_ref), rel_l2(o, o_ref), float(np.abs(lse - lse_ref)[seen].max()))
            worst[recipe] = [max(w, e) for w, e in zip(worst[recipe], errors)]
    for recipe, (c, r, l) in worst.items():
        print(f"{recipe:12s} 1-cos {c:.2e}  rel L2 {r:.3f}  |dLSE| {l:.3f}")


if __name__ == "__main__":
    main()
