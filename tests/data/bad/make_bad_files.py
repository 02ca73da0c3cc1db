#!/usr/bin/env python3
"""Writes the malformed tensor files of this folder (regression corpus for
tests/test_io.cpp). Each one breaks a single rule of the .npy or .safetensors
format; test_io expects a clean fp4attn::Error for every file here.

Run from anywhere: python3 tests/data/bad/make_bad_files.py
"""
import json
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent


def npy(header: str, payload: bytes, major: int = 1, header_len: int | None = None) -> bytes:
    body = header.encode()
    length = len(body) if header_len is None else header_len
    size = struct.pack("<H", length) if major == 1 else struct.pack("<I", length)
    return b"\x93NUMPY" + bytes([major, 0]) + size + body + payload


def dict_header(descr: str = "<f4", fortran: str = "False", shape: str = "(2, 2)") -> str:
    return "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }\n" % (descr, fortran, shape)


def safetensors(header, payload: bytes, header_len: int | None = None) -> bytes:
    text = header if isinstance(header, str) else json.dumps(header)
    body = text.encode()
    length = len(body) if header_len is None else header_len
    return struct.pack("<Q", length) + body + payload


FOUR_F32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.0)

FILES = {
    "empty.npy": b"",
    "bad_magic.npy": b"\x93NUMPX\x01\x00" + FOUR_F32,
    "bad_version.npy": npy(dict_header(), FOUR_F32, major=9),
    "header_len_beyond_file.npy": npy(dict_header(), FOUR_F32, header_len=4000),
    "truncated_data.npy": npy(dict_header(), FOUR_F32[:10]),
    "trailing_data.npy": npy(dict_header(), FOUR_F32 + b"\x00" * 4),
    "big_endian.npy": npy(dict_header(descr=">f4"), FOUR_F32),
    "float64.npy": npy(dict_header(descr="<f8"), FOUR_F32),
    "fortran_order.npy": npy(dict_header(fortran="True"), FOUR_F32),
    "unterminated_dict.npy": npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2", FOUR_F32),
    "unterminated_string.npy": npy("{'descr': '<f4", FOUR_F32),
    "missing_shape.npy": npy("{'descr': '<f4', 'fortran_order': False, }\n", FOUR_F32),
    "unknown_key.npy": npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), 'x': 1, }\n", FOUR_F32),
    "negative_dim.npy": npy(dict_header(shape="(-2, 2)"), FOUR_F32),
    "dim_beyond_int64.npy": npy(dict_header(shape="(99999999999999999999, 2)"), FOUR_F32),
    "count_overflow.npy": npy(dict_header(shape="(4294967296, 4294967296, 4)"), FOUR_F32),
    "bytes_overflow.npy": npy(dict_header(shape="(2305843009213693952, 4)"), FOUR_F32),
    "absurd_shape.npy": npy(dict_header(shape="(1000000000, 1000000000)"), FOUR_F32),
    "short.safetensors": b"\x10\x00\x00",
    "header_len_beyond_file.safetensors": safetensors("{}", b"", header_len=1 << 40),
    "bad_json.safetensors": safetensors('{"t": {"dtype": "F32", "shape": [4], ', FOUR_F32),
    "not_object.safetensors": safetensors("[1, 2, 3]", FOUR_F32),
    "no_tensors.safetensors": safetensors({"__metadata__": {"a": "b"}}, b""),
    "entry_not_object.safetensors": safetensors({"t": 5}, FOUR_F32),
    "unknown_dtype.safetensors": safetensors({"t": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}},
                                             FOUR_F32),
    "missing_dtype.safetensors": safetensors({"t": {"shape": [4], "data_offsets": [0, 16]}}, FOUR_F32),
    "negative_shape.safetensors": safetensors({"t": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}},
                                              FOUR_F32),
    "float_shape.safetensors": safetensors({"t": {"dtype": "F32", "shape": [4.0], "data_offsets": [0, 16]}},
                                           FOUR_F32),
    "offsets_beyond_data.safetensors": safetensors(
        {"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 62]}}, FOUR_F32),
    "offsets_reversed.safetensors": safetensors({"t": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}},
                                                FOUR_F32),
    "offsets_one_value.safetensors": safetensors({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0]}},
                                                 FOUR_F32),
    "size_mismatch.safetensors": safetensors({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}},
                                             FOUR_F32),
    "count_overflow.safetensors": safetensors(
        {"t": {"dtype": "BF16", "shape": [4294967296, 4294967296, 4], "data_offsets": [0, 16]}}, FOUR_F32),
}

if __name__ == "__main__":
    for name, data in FILES.items():
        (HERE / name).write_bytes(data)
    print(f"wrote {len(FILES)} files to {HERE}")
