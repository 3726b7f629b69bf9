"""BERT-style building blocks shared by the models (attribute names are BERT's, so
checkpoints of BERT, LXMERT and ViLBERT map onto them key for key).

Attention runs through `F.scaled_dot_product_attention`; masks are boolean
(B, 1, 1, T) tensors, True = attend (see `sdpa_mask`).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


def sdpa_mask(mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """(B, T) 1/0 -> (B, 1, 1, T) boolean mask (True = attend), built once per batch."""
    return None if mask is None else mask.bool()[:, None, None, :]


def at_positions(hidden: torch.Tensor, positions: Optional[torch.Tensor]) -> torch.Tensor:
    """(B, T, H) states -> (M, H) at the True entries of a (B, T) mask (all of them if None)."""
    return hidden if positions is None else hidden[positions]


class MultiHeadAttention(nn.Module):
    """`heads`-head attention of `hidden` (q_dim) over `context` (kv_dim) in `inner` dims."""

    def __init__(self, q_dim: int, kv_dim: int, inner: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(q_dim, inner)
        self.key = nn.Linear(kv_dim, inner)
        self.value = nn.Linear(kv_dim, inner)
        self.dropout_p = dropout

    def forward(self, hidden: torch.Tensor, context: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        return attend(
            self.query(hidden),
            self.key(context),
            self.value(context),
            self.heads,
            mask,
            self.dropout_p if self.training else 0.0,
        )


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, mask: Optional[torch.Tensor], dropout_p: float
) -> torch.Tensor:
    """Scaled dot-product attention of projected (B, Lq, D) queries over (B, Lk, D) keys/values."""
    b, lq, d = q.shape

    def split(x: torch.Tensor) -> torch.Tensor:
        return x.view(b, x.shape[1], heads, d // heads).transpose(1, 2)

    out = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask, dropout_p=dropout_p)
    return out.transpose(1, 2).reshape(b, lq, d)


class ResidualOutput(nn.Module):
    """LayerNorm(dropout(dense(x)) + residual): BERT's attention/FFN output sub-layer."""

    def __init__(self, dim_in: int, dim: int, eps: float, dropout: float):
        super().__init__()
        self.dense = nn.Linear(dim_in, dim)
        self.LayerNorm = nn.LayerNorm(dim, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class Intermediate(nn.Module):
    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.dense = nn.Linear(dim, inner)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(hidden))


class SelfAttentionBlock(nn.Module):
    """`self` attention + `output` sub-layer (BERT's `attention` module)."""

    def __init__(self, dim: int, heads: int, eps: float, dropout: float, attention_dropout: float):
        super().__init__()
        self.self = MultiHeadAttention(dim, dim, dim, heads, attention_dropout)
        self.output = ResidualOutput(dim, dim, eps, dropout)

    def forward(self, hidden: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        return self.output(self.self(hidden, hidden, mask), hidden)


class TransformerLayer(nn.Module):
    """A post-LN BERT layer: `attention`, `intermediate`, `output`."""

    def __init__(self, dim: int, heads: int, inner: int, eps: float, dropout: float, attention_dropout: float):
        super().__init__()
        self.attention = SelfAttentionBlock(dim, heads, eps, dropout, attention_dropout)
        self.intermediate = Intermediate(dim, inner)
        self.output = ResidualOutput(inner, dim, eps, dropout)

    def forward(self, hidden: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        attended = self.attention(hidden, mask)
        return self.output(self.intermediate(attended), attended)


class TextEmbeddings(nn.Module):
    """BERT embeddings: word + position + token type, LayerNorm, dropout.

    With `task_tokens` > 0 it also has a task-token table (``task_embeddings``, vilbert-multi-
    task's ``--task_specific_tokens``): given ``task_ids`` (B,), the task's row is inserted after
    the first token ([CLS]) as it is, without a position or token-type embedding, and the tokens
    after it keep the positions they had without it (the sequence grows by one; LayerNorm and
    dropout apply to it as to the others). Without ``task_ids`` nothing is inserted."""

    def __init__(
        self,
        vocab: int,
        dim: int,
        positions: int,
        types: int,
        eps: float,
        dropout: float,
        padding_idx=None,
        task_tokens: int = 0,
    ):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim, padding_idx=padding_idx)
        self.position_embeddings = nn.Embedding(positions, dim, padding_idx=padding_idx)
        self.token_type_embeddings = nn.Embedding(types, dim, padding_idx=padding_idx)
        self.LayerNorm = nn.LayerNorm(dim, eps=eps)
        self.dropout = nn.Dropout(dropout)
        if task_tokens:
            self.task_embeddings = nn.Embedding(task_tokens, dim)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: Optional[torch.Tensor] = None,
        task_ids: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings(token_type_ids)
        )
        if task_ids is not None:
            x = torch.cat([x[:, :1], self.task_embeddings(task_ids.reshape(-1, 1)), x[:, 1:]], dim=1)
        return self.dropout(self.LayerNorm(x))


def with_task_token(mask: torch.Tensor, task_ids: Optional[torch.Tensor]) -> torch.Tensor:
    """A (B, L) text mask grown by the task token `TextEmbeddings` inserts (always attended;
    vilbert-multi-task prepends the 1, the same mask since [CLS] is always attended)."""
    return mask if task_ids is None else torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1)


def init_bert_weights(module: nn.Module, std: float) -> None:
    """N(0, std) weights, zero biases, unit LayerNorms, zero padding rows."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
