"""Pretraining objectives, composed per model family: a batch of `PretrainDataset` examples
in, weighted losses and metrics out. Each family (`vl_models.families`) computes its own
per-task losses; this module owns what is common: the task weights, switching a task on
at a step (`from_step`) and LXMERT-style QA from an epoch, and the weighted total.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from pipeline.errors import ConfigError
from vl_models.tasks import losses as L


@dataclass(frozen=True)
class TaskConfig:
    weights: dict = field(default_factory=dict)  # per-loss weight, default 1
    visual_weighting: str = "confidence"  # LXMERT obj/attr: "confidence" (reference) or "masked"
    qa_from_epoch: int = 0  # LXMERT QA switched on from this epoch (the paper: second half)
    # {task: N}: the task's loss is off (weight 0) for the first N optimizer steps. It is still
    # computed, so DDP ranks stay in step; weight decay still applies to its head meanwhile.
    # (Narrow models at BERT-base's init scale needed it for alignment / matching; at the
    # width-scaled init they do not: docs/fidelity.md.)
    from_step: dict = field(default_factory=dict)

    def check(self, family) -> None:
        """ConfigError for a task `family` does not have, or a negative weight / start step."""
        unknown = (set(self.weights) | set(self.from_step)) - set(family.tasks)
        if unknown:
            raise ConfigError(f"{family.name} has no task(s) {sorted(unknown)}; its tasks: {', '.join(family.tasks)}")
        bad = {k: v for k, v in self.weights.items() if not math.isfinite(v) or v < 0}
        bad.update({k: v for k, v in self.from_step.items() if v < 0})
        if bad:
            raise ConfigError(f"task weights must be finite and >= 0 and start steps >= 0: {bad}")

    def weights_at(self, step: Optional[int]) -> dict:
        """Loss weights at optimizer step `step` (None: every task on, as in evaluation)."""
        off = {k: 0.0 for k, start in self.from_step.items() if step is not None and step < start}
        return {**self.weights, **off}


def pretrain_losses(family, model, batch: dict, cfg: TaskConfig, epoch: int,
                    step: Optional[int] = None) -> tuple[torch.Tensor, dict, dict]:
    """(total loss, per-task losses, metrics) for one batch of `family`'s model. `step`: the
    number of optimizer steps taken so far, for `cfg.from_step`; None (evaluation) counts
    every task."""
    losses, metrics = family.losses(model, batch, qa_active=epoch >= cfg.qa_from_epoch,
                                    visual_weighting=cfg.visual_weighting)
    return L.total(losses, cfg.weights_at(step)), losses, metrics
