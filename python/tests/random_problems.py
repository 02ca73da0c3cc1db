"""Random attention problems: the draws of fuzz_device.py (GPU against the
emulator) and of test_random_problems.py (the host path against fp64), and
the emulator options of a draw."""

import numpy as np

import fp4attn

RECIPES = ("fp8", "mxfp4", "mxfp4_train", "nvfp4")
TRAINABLE = ("fp8", "mxfp4_train")
DTYPE_NAMES = ("bf16", "f16", "f32")
HEAD_DIMS = (8, 16, 32, 40, 48, 64, 72, 80, 96, 112, 128, 136, 144, 160, 192, 200, 224, 256)
EDGE_LENGTHS = (1, 2, 31, 32, 33, 63, 64, 65, 127, 128, 129, 191, 255, 256, 257, 383, 384, 385, 511, 513)
DISTRIBUTIONS = ("plain", "outlier_channels", "key_mean", "tiny", "huge")
MAX_WORK = 1.5e9  # B · Hq · Sq · Sk · D: keeps the emulator to about a second a case


def length(rng: np.random.Generator) -> int:
    """A sequence length: a tile edge, a short one, or one of many tiles."""
    u = rng.random()
    return int(rng.choice(EDGE_LENGTHS) if u < 0.4 else rng.integers(1, 900) if u < 0.85 else rng.integers(900, 3000))


def draw(rng: np.random.Generator, max_work: float = MAX_WORK) -> dict:
    """One random problem and call."""
    while True:
        c = {
            "recipe": str(rng.choice(RECIPES)),
            "B": int(rng.integers(1, 4)),
            "Hkv": int(rng.integers(1, 4)),
            "group": int(rng.choice([1, 1, 2, 3, 4, 7])),
            "Sq": length(rng),
            "Sk": length(rng),
            "D": int(rng.choice(HEAD_DIMS)),
            "dtype": str(rng.choice(DTYPE_NAMES)),
            "layout": str(rng.choice(["bshd", "bhsd", "strided"])),
            "causal": bool(rng.random() < 0.5),
            "smooth_k": bool(rng.random() < 0.7),
            "direct_p": bool(rng.random() < 0.8),
            "scale": None if rng.random() < 0.6 else float(rng.uniform(0.02, 0.5)),
            "distribution": str(rng.choice(DISTRIBUTIONS)),
            "data_seed": int(rng.integers(0, 2**31)),
        }
        if rng.random() < 0.3:
            c["Sk"] = c["Sq"]
        c["Hq"] = c["Hkv"] * c["group"]
        c["backward"] = c["recipe"] in TRAINABLE and rng.random() < 0.5
        work = c["B"] * c["Hq"] * c["Sq"] * c["Sk"] * c["D"]
        if work <= max_work / (3 if c["backward"] else 1):
            c["window"] = window(c["data_seed"], c["causal"], max(c["Sq"], c["Sk"]))
            return c


def window(data_seed: int, causal: bool, longest: int) -> list:
    """A sliding window for a draw (FlashAttention's window_size; [-1, -1] in 7 of 10 draws), from a
    stream of its own (seeded by the draw's data_seed), so that seeds keep the draws they made before
    windows existed. Bounds from a few keys to twice the longest sequence."""
    rng = np.random.default_rng([data_seed, 0x77])
    if rng.random() < 0.7:
        return [-1, -1]
    bound = lambda: int(rng.integers(0, 40)) if rng.random() < 0.4 else int(rng.integers(0, 2 * longest + 1))
    left = -1 if rng.random() < 0.2 else bound()
    right = (-1 if left >= 0 and rng.random() < 0.5 else 0) if causal else (-1 if rng.random() < 0.3 else bound())
    if left < 0 and right < 0:
        left = bound()
    return [left, right]


def emulator_options(c: dict, scale):
    """The options of draw c for fp4attn._ext on (B, S, H, D) arrays, at softmax scale `scale` (None: 1/sqrt(D))."""
    s = fp4attn._host.make_settings(layout="bshd", mask="causal" if c["causal"] else "none", scale=scale,
                                    scale_name="scale", recipe=c["recipe"], smooth_k=c["smooth_k"],
                                    direct_p=c["direct_p"], gqa=True, names=("q", "k", "v"),
                                    window=tuple(c.get("window", (-1, -1))), window_name="window")
    return fp4attn._host.options(s)
