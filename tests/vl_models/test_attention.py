"""Attention runs through `F.scaled_dot_product_attention` in every block of both models
(`vl_models.models.layers.attend`): it equals eager attention with the same masks."""

import math

import torch

from vl_models.models.layers import attend, sdpa_mask


def eager(q, k, v, heads, mask):
    """softmax(Q K^T / sqrt(d) + mask) V per head, the masked keys at -10000 as BERT adds them."""
    b, lq, d = q.shape

    def split(x):
        return x.view(b, x.shape[1], heads, d // heads).transpose(1, 2)

    scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(d // heads)
    if mask is not None:
        scores = scores + (1.0 - mask[:, None, None, :].float()) * -10000.0
    return (scores.softmax(-1) @ split(v)).transpose(1, 2).reshape(b, lq, d)


def test_sdpa_attention_equals_eager_attention_with_the_same_masks():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, n, 64, generator=g) for n in (5, 7, 7))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 1:] = 0
    for m in (None, mask):
        got = attend(q, k, v, 4, sdpa_mask(m), 0.0)
        assert (got - eager(q, k, v, 4, m)).abs().max() < 1e-5
    cls = attend(q[:, :1], k, v, 4, sdpa_mask(mask), 0.0)  # one query row: what a pooled-only layer asks
    assert (cls - eager(q, k, v, 4, mask)[:, :1]).abs().max() < 1e-5
