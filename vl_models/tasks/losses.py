"""Pretraining losses of both models, as pure functions of logits and targets.

Label conventions (declared here, converted at import/export): ignore index -1;
ViLBERT alignment label 0 = aligned (the reference's); LXMERT matching label 1 = matched
(the reference's and HF's). Every function returns (loss, metrics) and is safe on a batch
with nothing to predict (the loss is then 0, not NaN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

VISUAL_LOSS_NORMALIZER = 6.67  # 1 / 0.15, LXMERT's


def global_mean(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """`total / count` where, when gradients are being recorded under DDP, `count` is summed
    over all ranks (times the world size, which DDP's gradient averaging divides back out):
    the gradient of a mean over the *global* batch, whatever each rank's share of valid
    targets. Without gradients (evaluation, which may run on one rank alone) it is the
    local mean and talks to no other rank."""
    import torch.distributed as dist

    count = count.detach().float().clone()
    world = 1
    if torch.is_grad_enabled() and dist.is_available() and dist.is_initialized():
        dist.all_reduce(count)
        world = dist.get_world_size()
    return total * world / count.clamp(min=1.0)


def masked_lm(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Cross-entropy over the positions whose label is not -1; accuracy on them."""
    flat, target = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    return _classification(flat, target, "mlm")


def pair_classification(logits: torch.Tensor, labels: torch.Tensor, name: str) -> tuple[torch.Tensor, dict]:
    """Two-way cross-entropy (alignment / matching); labels -1 are ignored."""
    return _classification(logits, labels, name)


def _classification(logits: torch.Tensor, labels: torch.Tensor, name: str) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy over labels != -1 (0 when there are none). The collective in
    `global_mean` runs on every rank whatever its labels, so DDP ranks stay in step."""
    valid = labels != -1
    ce = F.cross_entropy(logits, labels.clamp(min=0), reduction="none")
    loss = global_mean((ce * valid).sum(), valid.sum())
    acc = (logits[valid].argmax(-1) == labels[valid]).float().mean().item() if valid.any() else float("nan")
    return loss, {f"{name}_acc": acc}


def region_kl(logits: torch.Tensor, target_prob: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """ViLBERT's masked-region loss over the (M, C) masked regions: KL(detector
    distribution || predicted), summed over classes, divided by M (0 when M = 0)."""
    log_pred = F.log_softmax(logits.float(), dim=-1)
    kl = F.kl_div(log_pred, target_prob.float(), reduction="none").sum(-1)
    loss = global_mean(kl.sum(), torch.tensor(kl.shape[0], device=kl.device))
    return loss, {"region_kl": loss.item()}


@dataclass(frozen=True)
class LxmertVisualTargets:
    obj_ids: torch.Tensor  # (B, N) 0-based object ids
    obj_conf: torch.Tensor  # (B, N) detector confidences
    attr_ids: torch.Tensor
    attr_conf: torch.Tensor
    features: torch.Tensor  # (B, N, D) the original (unmasked) features
    selected: torch.Tensor  # (B, N) bool, the masked regions
    real: torch.Tensor  # (B, N) bool, real (not padding) regions
    slots: Optional[torch.Tensor] = None  # the region slots the means are over (None: B x N; `vl_models.data.padding`)


def lxmert_visual(
    obj_logits, attr_logits, feat_pred, t: LxmertVisualTargets, weighting: str = "confidence"
) -> tuple[dict[str, torch.Tensor], dict]:
    """Object / attribute classification and feature regression.

    ``weighting="confidence"`` (default, the reference): classification terms weighted by
    the detector's confidence over *all* real boxes (the author's regularizer);
    ``"masked"``: over the masked boxes only. Feature regression (smooth L1, averaged over
    dimensions) always uses the masked boxes. Each term is a mean over the region slots
    (`t.slots`, the padded slot count before dynamic padding cut it) x 6.67, as the reference.
    """
    sel, real = t.selected.float(), t.real.float()
    slots = t.slots if t.slots is not None else t.selected.numel()
    losses, metrics = {}, {}
    for name, logits, ids, conf in (
        ("obj", obj_logits, t.obj_ids, t.obj_conf),
        ("attr", attr_logits, t.attr_ids, t.attr_conf),
    ):
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1).clamp(min=0), reduction="none")
        weight = (conf * real if weighting == "confidence" else sel).reshape(-1)
        losses[name] = (ce * weight).sum() / slots * VISUAL_LOSS_NORMALIZER
        on = t.selected.reshape(-1) & (ids.reshape(-1) >= 0)  # masked regions that have a label
        metrics[f"{name}_acc"] = (
            (logits.reshape(-1, logits.shape[-1]).argmax(-1) == ids.reshape(-1))[on].float().mean().item()
            if on.any()
            else float("nan")
        )
    l1 = F.smooth_l1_loss(feat_pred.float(), t.features[t.selected].float(), reduction="none").mean(-1)
    losses["feat"] = l1.sum() / slots * VISUAL_LOSS_NORMALIZER  # = mean over all slots of l1 * sel
    return losses, metrics


def qa(logits: torch.Tensor, labels: torch.Tensor, active: bool = True) -> tuple[torch.Tensor, dict]:
    """Image QA over the answer table on matched question items (label -1 elsewhere);
    switched off (zero loss) before its starting epoch."""
    if not active:
        labels = torch.full_like(labels, -1)  # still through the collective, as on every rank
    return _classification(logits, labels, "qa")


def total(losses: dict[str, torch.Tensor], weights: Optional[dict[str, float]] = None) -> torch.Tensor:
    """Weighted sum (weight 1 unless configured)."""
    weights = weights or {}
    return sum(weights.get(k, 1.0) * v for k, v in losses.items())
