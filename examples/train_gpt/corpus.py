"""The training text: the Python standard library's .py sources as bytes.

Every Python installation ships them, so the study needs no download. Byte
tokens (vocabulary 256). The held-out split is by file: a file belongs to
validation when crc32 of its path relative to the stdlib root is 0 mod 20
(about 5 % of the files), so the split depends on nothing but the file names.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import zlib
from dataclasses import dataclass

import numpy as np

VOCAB = 256
VALIDATION_MODULUS = 20
SEPARATOR = b"\n\n"  # between files


@dataclass
class Corpus:
    root: str
    python: str
    train: np.ndarray  # uint8
    val: np.ndarray
    train_files: int
    val_files: int

    def describe(self) -> dict:
        return {
            "root": self.root,
            "python": self.python,
            "train_files": self.train_files,
            "val_files": self.val_files,
            "train_bytes": int(self.train.size),
            "val_bytes": int(self.val.size),
            "split": f"crc32(relative path) % {VALIDATION_MODULUS} == 0 is validation",
        }


def stdlib_files(root: str) -> list[str]:
    """Relative paths of the .py files under root, sorted; installed third-party packages left out."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        for name in filenames:
            if name.endswith(".py"):
                out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(out)


def load(root: str | None = None) -> Corpus:
    root = root or sysconfig.get_paths()["stdlib"]
    parts = {"train": [], "val": []}
    counts = {"train": 0, "val": 0}
    for rel in stdlib_files(root):
        with open(os.path.join(root, rel), "rb") as f:
            data = f.read()
        split = "val" if zlib.crc32(rel.encode()) % VALIDATION_MODULUS == 0 else "train"
        parts[split].append(data + SEPARATOR)
        counts[split] += 1
    if not counts["train"] or not counts["val"]:
        raise RuntimeError(f"root: no usable .py files under {root}")
    return Corpus(
        root=root,
        python=sys.version.split()[0],
        train=np.frombuffer(b"".join(parts["train"]), dtype=np.uint8),
        val=np.frombuffer(b"".join(parts["val"]), dtype=np.uint8),
        train_files=counts["train"],
        val_files=counts["val"],
    )


def train_offsets(corpus: Corpus, steps: int, batch: int, context: int, seed: int) -> np.ndarray:
    """(steps, batch) start offsets of the training windows: the data order, fixed by the seed alone."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, corpus.train.size - context - 1, size=(steps, batch))


def val_offsets(corpus: Corpus, sequences: int, context: int) -> np.ndarray:
    """Evenly spaced windows over the validation text: the same held-out tokens for every run and every evaluation."""
    return np.linspace(0, corpus.val.size - context - 1, sequences).astype(np.int64)


def windows(tokens, offsets, context: int):
    """Inputs and next-byte targets (len(offsets), context) gathered from a 1-D token tensor."""
    import torch

    idx = torch.as_tensor(offsets, device=tokens.device).reshape(-1, 1) + torch.arange(context + 1, device=tokens.device)
    seq = tokens[idx].long()
    return seq[:, :-1], seq[:, 1:]
