"""Pretraining objectives, composed per model family: a batch of `PretrainDataset` examples
in, weighted losses and metrics out. Each family (`vl_models.families`) computes its own
per-task losses; this module owns what is common: the task weights, switching a task on
at a step (`from_step`) and QA from an epoch (`TaskConfig`, in `vl_models.config`), and the
weighted total.
"""

from __future__ import annotations

from typing import Optional

import torch

from vl_models.config import TaskConfig
from vl_models.tasks import losses as L


def pretrain_losses(
    family, model, batch: dict, cfg: TaskConfig, epoch: int, step: Optional[int] = None
) -> tuple[torch.Tensor, dict, dict]:
    """(total loss, per-task losses, metrics) for one batch of `family`'s model. `step`: the
    number of optimizer steps taken so far, for `cfg.from_step`; None (evaluation) counts
    every task."""
    losses, metrics = family.losses(
        model, batch, qa_active=epoch >= cfg.qa_from_epoch, visual_weighting=cfg.visual_weighting
    )
    return L.total(losses, cfg.weights_at(step)), losses, metrics
