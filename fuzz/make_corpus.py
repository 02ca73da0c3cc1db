#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_readers: small valid .npy files (every
version, every dtype) and .safetensors files, written by numpy and ml_dtypes
where they can be, so the fuzzer starts from what real tools produce.

Run from anywhere: python3 fuzz/make_corpus.py
"""
import io
import json
import pathlib
import struct

import ml_dtypes
import numpy as np

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"


def npy_bytes(array: np.ndarray, version: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=version)
    return buf.getvalue()


def safetensors_bytes(tensors: dict[str, tuple[str, np.ndarray]]) -> bytes:
    header: dict = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, (dtype, array) in tensors.items():
        raw = array.tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def main() -> None:
    CORPUS.mkdir(exist_ok=True)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    files = {
        "f32_v1.npy": npy_bytes(x, (1, 0)),
        "f32_v2.npy": npy_bytes(x, (2, 0)),
        "f16_v3.npy": npy_bytes(x.astype(np.float16), (3, 0)),
        "bf16_v1.npy": npy_bytes(x.astype(ml_dtypes.bfloat16), (1, 0)),
        "scalar.npy": npy_bytes(np.float32(1.5).reshape(()), (1, 0)),
        "one.safetensors": safetensors_bytes({"t": ("F32", x)}),
        "three.safetensors": safetensors_bytes(
            {"t": ("BF16", x.astype(ml_dtypes.bfloat16)), "u": ("F16", x.astype(np.float16)), "w": ("F32", x[0])}),
    }
    for name, data in files.items():
        (CORPUS / name).write_bytes(data)
    print(f"wrote {len(files)} files to {CORPUS}")


if __name__ == "__main__":
    main()
