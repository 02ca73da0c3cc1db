"""A small GPT (pre-norm, learned positions, tied embeddings) whose attention is a parameter.

The attention function takes q, k, v of shape (B, T, H, D), strided views of
one qkv projection, and returns (B, T, H, D); everything else runs in bf16
autocast.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 256
    context: int = 1024
    layers: int = 6
    d_model: int = 512
    heads: int = 8

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def as_dict(self) -> dict:
        return asdict(self)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, attention):
        super().__init__()
        self.cfg = cfg
        self.attention = attention
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False)
        self.out = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.cfg.heads, self.cfg.head_dim).unbind(2)
        x = x + self.proj(self.attention(q, k, v).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, attention):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, attention) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.apply(self._init)
        # Residual projections scaled down with depth (GPT-2's rule).
        for block in self.blocks:
            for w in (block.proj.weight, block.out.weight):
                nn.init.normal_(w, std=0.02 / math.sqrt(2 * cfg.layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln(x), self.tok.weight)  # tied embeddings
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def sdpa_bf16(q, k, v):
    """Reference attention: PyTorch SDPA (its FlashAttention backend), bf16, causal."""
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
