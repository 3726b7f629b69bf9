"""Parameter groups, optimizer and the learning-rate schedule (a pure function)."""

from __future__ import annotations

import torch
from torch import nn

NO_DECAY = ("bias", "LayerNorm.weight", "LayerNorm.bias", "layer_norm.weight", "layer_norm.bias")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on weights; none on biases and LayerNorm parameters (tied weights once)."""
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (no_decay if name.endswith(NO_DECAY) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def lr_at(step: int, base_lr: float, warmup: int, total: int) -> float:
    """Linear warmup to `base_lr` over `warmup` steps, then linear decay to 0 at `total`."""
    if warmup and step < warmup:
        return base_lr * (step + 1) / warmup
    if total <= warmup:
        return base_lr
    return base_lr * max(0.0, (total - step) / (total - warmup))


def make_optimizer(model: nn.Module, name: str, lr: float, weight_decay: float, betas=(0.9, 0.999), eps: float = 1e-6):
    """AdamW (default) or SGD with momentum 0.9, over the decay / no-decay groups."""
    groups = param_groups(model, weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9)
    raise ValueError(f"optimizer must be adamw or sgd, got {name!r}")
