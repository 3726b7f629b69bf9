"""Parameter groups, optimizer and the learning-rate schedule (a pure function)."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from vl_models.config import OPTIMIZERS

NO_DECAY = ("bias", "LayerNorm.weight", "LayerNorm.bias", "layer_norm.weight", "layer_norm.bias")


Scales = Optional[Callable[[str], float]]  # a parameter's name -> its learning rate over the schedule's


def param_groups(model: nn.Module, weight_decay: float, scale_of: Scales = None) -> list[dict]:
    """Weight decay on weights; none on biases and LayerNorm parameters (tied weights once).
    With `scale_of` (a parameter's name -> its learning rate over the base one), the groups
    are split further by that scale, kept in each group as ``lr_scale`` (the trainer's
    schedule multiplies it in)."""
    groups: dict[tuple[bool, float], list] = {}
    seen: set = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        scale = float(scale_of(name)) if scale_of else 1.0
        groups.setdefault((not name.endswith(NO_DECAY), scale), []).append(p)
    for key in ((True, 1.0), (False, 1.0)):  # the two plain groups always, in this order (checkpoints)
        groups.setdefault(key, [])
    ordered = sorted(groups, key=lambda k: (k[1] != 1.0, k[1], not k[0]))
    return [{"params": groups[k], "weight_decay": weight_decay if k[0] else 0.0, "lr_scale": k[1]} for k in ordered]


def lr_at(step: int, base_lr: float, warmup: int, total: int) -> float:
    """Linear warmup from 0 to `base_lr` over `warmup` steps, then linear decay to 0 at `total`
    (`step` counts from 0): both references' ``warmup_linear`` — vilbert-multi-task's
    ``WarmupLinearSchedule`` (``step / warmup_steps``) and LXMERT's BertAdam (its step counter
    is 0 on the first update) —, so the first warm-up step runs at 0."""
    if warmup and step < warmup:
        return base_lr * step / warmup
    if total <= warmup:
        return base_lr
    return base_lr * max(0.0, (total - step) / (total - warmup))


class BertAdam(torch.optim.Optimizer):
    """LXMERT's BertAdam: Adam moments *without* bias correction, and weight decay added to
    the update (``p -= lr * (m / (sqrt(v) + eps) + wd * p)``). With ``decay_after``, the
    decay is applied after the step instead (``p -= lr * m / (sqrt(v) + eps)``, then
    ``p -= lr * wd * p``): pytorch-transformers' ``AdamW(correct_bias=False)``, 12-in-1's.
    The learning rate comes from the caller's schedule (our `lr_at` is BertAdam's
    ``warmup_linear``); gradient clipping is the trainer's global-norm clip, as LXMERT's
    training loop does."""

    def __init__(
        self,
        params,
        lr: float,
        betas=(0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        decay_after: bool = False,
    ):
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "decay_after": decay_after}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                update = m / (v.sqrt() + group["eps"])
                if group["weight_decay"] and not group.get("decay_after"):  # absent in older checkpoints
                    update.add_(p, alpha=group["weight_decay"])
                p.add_(update, alpha=-group["lr"])
                if group["weight_decay"] and group.get("decay_after"):
                    p.mul_(1 - group["lr"] * group["weight_decay"])


def make_optimizer(
    model: nn.Module,
    name: str,
    lr: float,
    weight_decay: float,
    betas=(0.9, 0.999),
    eps: float = 1e-6,
    scale_of: Scales = None,
):
    """``adamw`` (default; fused kernel, no decay on bias/LayerNorm), ``bertadam`` (LXMERT's
    optimizer: decay on *all* parameters, as the reference), ``adamw-uncorrected`` (12-in-1's
    ``AdamW(correct_bias=False)``: BertAdam's update, no decay on bias/LayerNorm) or ``sgd``
    (momentum 0.9).
    `scale_of`: per-parameter learning-rate scales (`param_groups`)."""
    groups = param_groups(model, weight_decay, scale_of)
    for group in groups:
        group["lr"] = lr * group["lr_scale"]
    if name == "adamw":
        fused = all(p.dtype.is_floating_point for g in groups for p in g["params"])
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused)
    if name == "bertadam":  # one group per learning rate (decay on all)
        merged: dict[float, dict] = {}
        for group in groups:
            into = merged.setdefault(group["lr_scale"], {**group, "params": [], "weight_decay": weight_decay})
            into["params"] += group["params"]
        return BertAdam(list(merged.values()), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if name == "adamw-uncorrected":
        return BertAdam(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, decay_after=True)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")
