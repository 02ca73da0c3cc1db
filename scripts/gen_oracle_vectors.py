#!/usr/bin/env python3
"""Oracle vectors for the format and quantizer tests, computed with ml_dtypes.

The C++ codecs and quantizers are checked against these vectors, so the
rounding here must come from ml_dtypes casts, never from fp4attn's own rules.
Pinned: numpy 2.1.3, ml_dtypes 0.5.1. Run from anywhere:

    python3 scripts/gen_oracle_vectors.py

Writes tests/data/formats.vec and tests/data/quantize.vec in the container
format read by tests/oracle_vectors.hpp:

    b"FP4AVEC1", u32 record count, then per record:
    u8 name length, name (ASCII), u8 dtype ('f' float32, 'B' uint8, 'I' uint32),
    u32 element count, the elements (little endian).

Where ml_dtypes and fp4attn differ by definition, vectors stay out of that
region: ml_dtypes' float8 casts do not saturate (E4M3 overflow gives NaN,
E5M2 overflow gives Inf) while fp4attn saturates to the largest finite value,
so FP8 inputs stop at the rounding boundary above the largest finite value;
NaN inputs are left out (ml_dtypes maps NaN to -0 in E2M1, fp4attn has no NaN
code there); E8M0 casts round to nearest, which neither MX scale rule does, so
E8M0 encodes are checked on exact powers of two only.
"""

import struct
from pathlib import Path

import ml_dtypes
import numpy as np

REQUIRED = {"numpy": "2.1.3", "ml_dtypes": "0.5.1"}
MAGIC = b"FP4AVEC1"
SEED = 20261201
RANDOM_ENCODES = 20000
DATA_DIR = Path(__file__).resolve().parent.parent / "tests" / "data"

# name -> (ml_dtypes type, upper limit of compared |x|, whether the limit itself is compared)
ELEMENT_FORMATS = {
    # 464 is the tie between 448 and the NaN slot; RNE takes it down to 448.
    "e4m3": (ml_dtypes.float8_e4m3fn, 464.0, True),
    # 61440 is the tie between 57344 and Inf; RNE takes it up to Inf.
    "e5m2": (ml_dtypes.float8_e5m2, 61440.0, False),
    # ml_dtypes saturates E2M1 like fp4attn, so overflow is compared too.
    "e2m1": (ml_dtypes.float4_e2m1fn, float(np.finfo(np.float32).max), True),
}

# Quantizer vectors: a small (B, S, H, D) tensor whose S is not a multiple of
# any block, so every axis has a partial last block.
SHAPE = (2, 40, 2, 64)
FP8_TOKEN_BLOCK = 16
MX_BLOCK = 32
NV_BLOCK = 16
E8M0_BIAS = 127
E8M0_MAX_FINITE = 254
NVFP4_TENSOR_NUMERATOR = np.float32(6.0 * 448.0)


def check_versions():
    found = {"numpy": np.__version__, "ml_dtypes": ml_dtypes.__version__}
    if found != REQUIRED:
        raise SystemExit(f"need {REQUIRED}, found {found}")


def write_container(path, records):
    out = bytearray(MAGIC)
    out += struct.pack("<I", len(records))
    for name, array in records:
        dtype = {np.dtype(np.float32): b"f", np.dtype(np.uint8): b"B", np.dtype(np.uint32): b"I"}[array.dtype]
        out += struct.pack("<B", len(name)) + name.encode("ascii") + dtype + struct.pack("<I", array.size)
        out += array.astype(array.dtype.newbyteorder("<")).tobytes()
    path.write_bytes(bytes(out))
    print(f"{path}: {len(out)} bytes, {len(records)} records")


def codes_of(values, dtype):
    return values.astype(dtype).view(np.uint8)


def element_vectors(rng, name, dtype, limit, limit_included):
    all_codes = np.arange(256 if dtype != ml_dtypes.float4_e2m1fn else 16, dtype=np.uint8)
    decoded = all_codes.view(dtype).astype(np.float32)
    finite = np.unique(np.abs(decoded[np.isfinite(decoded)]))
    mids = (finite[:-1] + finite[1:]) / np.float32(2)  # exact: adjacent codes differ in one bit
    special = np.concatenate([
        finite, mids,
        np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0)),
        np.array([1e-45, 1e-40, np.finfo(np.float32).tiny, limit], dtype=np.float32),
    ])
    # Random floats: exponents a few binades beyond the format's range on both
    # sides, full random mantissas, random signs.
    smallest = np.float32(finite[1])
    lo = int(np.floor(np.log2(smallest))) - 3
    hi = int(np.ceil(np.log2(finite[-1]))) + 2
    mant = rng.integers(0, 1 << 23, RANDOM_ENCODES, dtype=np.uint32)
    exps = rng.integers(lo + 127, hi + 127, RANDOM_ENCODES, dtype=np.uint32)
    randoms = ((exps << 23) | mant).view(np.float32)
    x = np.concatenate([special, randoms]).astype(np.float32)
    x = np.concatenate([x, -x])
    keep = (np.abs(x) <= limit) if limit_included else (np.abs(x) < limit)
    x = x[keep]
    return [(f"{name}.decode", decoded), (f"{name}.encode.x", x), (f"{name}.encode.code", codes_of(x, dtype))]


def e8m0_vectors():
    codes = np.arange(256, dtype=np.uint8)
    decoded = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    powers = np.ldexp(np.float32(1), np.arange(-127, 128)).astype(np.float32)
    return [("e8m0.decode", decoded), ("e8m0.encode.x", powers),
            ("e8m0.encode.code", codes_of(powers, ml_dtypes.float8_e8m0fnu))]


def quantizer_input(rng):
    b_, s_, h_, d_ = SHAPE
    # Magnitudes vary per (token, head, 8 channels), so blocks along D and
    # along S both see a wide range of block maxima.
    exps = rng.integers(-12, 13, size=(b_, s_, h_, d_ // 8))
    x = rng.standard_normal(SHAPE).astype(np.float32) * np.ldexp(np.float32(1), np.repeat(exps, 8, axis=3))
    x = x.astype(np.float32)
    x[0, :32, 1, 32:] = 0.0  # whole MX/NV blocks of zeros: amax 0
    x[1, :32, 0, :32] *= np.float32(2.0**-135)  # float-subnormal blocks
    # Block maxima exactly on the round-up rule's switch (1.5·2^e) and on 6·2^k.
    x[0, 33, 0, :MX_BLOCK] = np.float32(1.0)
    x[0, 33, 0, 0] = np.float32(12.0)
    x[0, 33, 0, MX_BLOCK:] = np.float32(2.0)
    x[0, 33, 0, MX_BLOCK] = np.float32(24.0)
    # Exact E2M1 ties after scaling by 2 (the first block's scale is 2): 0.25, 1.25, 2.5, 5 times 2.
    x[0, 33, 0, 1:5] = np.array([0.5, 2.5, 5.0, 10.0], dtype=np.float32)
    return x


def scale_blocks(shape, fmt, axis):
    """(index of the block's elements, position in the C++ scale array) for
    every scale block, and the shape of that array (QuantizedTensor layout)."""
    b_, s_, h_, d_ = shape
    if fmt == "fp8":
        if axis == "along_d":
            n = -(-s_ // FP8_TOKEN_BLOCK)
            return [((b, slice(j * FP8_TOKEN_BLOCK, (j + 1) * FP8_TOKEN_BLOCK), h, slice(None)), (b, h, j))
                    for b in range(b_) for h in range(h_) for j in range(n)], (b_, h_, n)
        return [((b, slice(None), h, d), (b, h, d)) for b in range(b_) for h in range(h_) for d in range(d_)], \
            (b_, h_, d_)
    block = MX_BLOCK if fmt == "mxfp4" else NV_BLOCK
    if axis == "along_d":
        n = d_ // block
        return [((b, s, h, slice(j * block, (j + 1) * block)), (b, s, h, j))
                for b in range(b_) for s in range(s_) for h in range(h_) for j in range(n)], (b_, s_, h_, n)
    n = -(-s_ // block)
    return [((b, slice(j * block, (j + 1) * block), h, d), (b, j, h, d))
            for b in range(b_) for j in range(n) for h in range(h_) for d in range(d_)], (b_, n, h_, d_)


def mx_scale_code(amax, rule):
    if amax == 0:
        return 0
    mant, exp = np.frexp(amax)  # amax = mant·2^exp, mant in [0.5, 1)
    e, m = exp - 1, mant * 2
    k = e - 2 if rule == "ocp_floor" or m <= 1.5 else e - 1
    return int(np.clip(k + E8M0_BIAS, 0, E8M0_MAX_FINITE))


def mxfp4(x, axis, rule):
    blocks, scale_shape = scale_blocks(x.shape, "mxfp4", axis)
    codes = np.zeros(x.shape, dtype=np.uint8)
    scale_codes = np.zeros(scale_shape, dtype=np.uint8)
    for idx, pos in blocks:
        c = mx_scale_code(np.max(np.abs(x[idx])), rule)
        scale_codes[pos] = c
        codes[idx] = codes_of(np.ldexp(x[idx], -(c - E8M0_BIAS)).astype(np.float32), ml_dtypes.float4_e2m1fn)
    return codes, scale_codes


def nvfp4(x, axis):
    amax = np.max(np.abs(x))
    s_enc = np.float32(1) if amax == 0 else np.minimum(NVFP4_TENSOR_NUMERATOR / amax, np.finfo(np.float32).max)
    blocks, scale_shape = scale_blocks(x.shape, "nvfp4", axis)
    codes = np.zeros(x.shape, dtype=np.uint8)
    scale_codes = np.zeros(scale_shape, dtype=np.uint8)
    for idx, pos in blocks:
        sb_code = codes_of((np.max(np.abs(x[idx])) * s_enc) / np.float32(6), ml_dtypes.float8_e4m3fn)
        sb = np.float32(sb_code.view(ml_dtypes.float8_e4m3fn))
        scale_codes[pos] = sb_code
        if sb != 0:
            codes[idx] = codes_of(((x[idx] * s_enc) / sb).astype(np.float32), ml_dtypes.float4_e2m1fn)
    return codes, scale_codes, np.float32(s_enc)


def fp8(x, axis):
    blocks, scale_shape = scale_blocks(x.shape, "fp8", axis)
    codes = np.zeros(x.shape, dtype=np.uint8)
    scales = np.zeros(scale_shape, dtype=np.float32)
    for idx, pos in blocks:
        scale = np.max(np.abs(x[idx])) / np.float32(448)
        scales[pos] = np.float32(1) if scale == 0 else scale
        codes[idx] = codes_of((x[idx] / scales[pos]).astype(np.float32), ml_dtypes.float8_e4m3fn)
    return codes, scales


def quantizer_vectors(rng):
    x = quantizer_input(rng)
    records = [("input.shape", np.array(SHAPE, dtype=np.uint32)), ("input", x.reshape(-1)),
               ("fp8_token_block", np.array([FP8_TOKEN_BLOCK], dtype=np.uint32))]
    for axis in ("along_d", "along_s"):
        codes, scales = fp8(x, axis)
        records += [(f"fp8.{axis}.codes", codes.reshape(-1)), (f"fp8.{axis}.scales", scales.reshape(-1))]
        for rule in ("round_up", "ocp_floor"):
            codes, scale_codes = mxfp4(x, axis, rule)
            records += [(f"mxfp4.{axis}.{rule}.codes", codes.reshape(-1)),
                        (f"mxfp4.{axis}.{rule}.scale_codes", scale_codes.reshape(-1))]
        codes, scale_codes, s_enc = nvfp4(x, axis)
        records += [(f"nvfp4.{axis}.codes", codes.reshape(-1)),
                    (f"nvfp4.{axis}.scale_codes", scale_codes.reshape(-1)),
                    (f"nvfp4.{axis}.tensor_scale", np.array([s_enc], dtype=np.float32))]
    return records


def main():
    check_versions()
    rng = np.random.default_rng(SEED)
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    records = []
    for name, (dtype, limit, included) in ELEMENT_FORMATS.items():
        records += element_vectors(rng, name, dtype, np.float32(limit), included)
    records += e8m0_vectors()
    write_container(DATA_DIR / "formats.vec", records)
    write_container(DATA_DIR / "quantize.vec", quantizer_vectors(rng))


if __name__ == "__main__":
    main()
