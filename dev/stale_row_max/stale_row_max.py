#!/usr/bin/env python3
"""How often a stale row maximum would need the exact one, by simulation.

FP8 P is coded as 2^(u + 8) with u = s·c − m ≤ 0, m the running row maximum
(DESIGN §3.3). E4M3 reaches 448 = 2^8.807, so P could be coded against the
maximum of the earlier tiles alone as long as a tile's own maximum exceeds it
by at most log2(448 / 256) ≈ 0.807. This counts the 128-key tiles (after the
first) where that fails: per row, per warp (16 rows that share a branch) and
per consumer warpgroup (64 rows). CPU only, numpy.

    python3 dev/stale_row_max/stale_row_max.py [--seq 4096] [--dim 128] [--seed 1]
"""
import argparse

import numpy as np

HEADROOM = np.log2(448 / 256)


def exceed_rates(q: np.ndarray, k: np.ndarray, scale: float) -> tuple[float, float, float]:
    s = (q @ k.T) * scale * np.log2(np.e)  # log2-domain scores, rows × keys
    rows, keys = s.shape
    tiles = keys // 128
    tile_max = s[:, : tiles * 128].reshape(rows, tiles, 128).max(axis=2)
    earlier = np.maximum.accumulate(tile_max, axis=1)[:, :-1]
    exceed = tile_max[:, 1:] > earlier + HEADROOM
    per_warp = exceed[: rows // 16 * 16].reshape(-1, 16, tiles - 1).any(axis=1)
    per_consumer = exceed[: rows // 64 * 64].reshape(-1, 64, tiles - 1).any(axis=1)
    return exceed.mean(), per_warp.mean(), per_consumer.mean()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    S, D = args.seq, args.dim

    def gauss():
        return rng.standard_normal((S, D))

    q, k = gauss(), gauss()
    qo, ko = gauss(), gauss()
    qo[:, :4] *= 4
    ko[:, :4] *= 4
    cases = [
        ("gaussian", q, k),
        ("gaussian, 4 outlier channels ×4", qo, ko),
        ("K with a large shared mean", gauss(), gauss() + 2.0 * rng.standard_normal(D)),
        ("peaked rows (Q ×3)", 3 * gauss(), gauss()),
    ]
    print(f"S = {S}, D = {D}; tiles after the first whose maximum exceeds the earlier tiles' by > {HEADROOM:.3f}")
    for name, a, b in cases:
        r, w, c = exceed_rates(a, b, 1 / np.sqrt(D))
        print(f"{name:34s} rows {100 * r:5.1f} %   warps {100 * w:5.1f} %   consumers {100 * c:5.1f} %")


if __name__ == "__main__":
    main()
