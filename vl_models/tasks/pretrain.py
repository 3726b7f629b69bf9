"""Pretraining objectives composed per model: a batch of `PretrainDataset` examples in,
weighted losses and metrics out.

ViLBERT: masked LM + masked-region KL to the detector's distribution (on the selected
regions only) + image-text alignment (label 0 = aligned: the dataset's ``matched`` is converted here).
The masked LM, masked-region and feature-regression heads are decoded at the masked
positions only (the models' ``*_positions`` arguments).
LXMERT: masked LM + matching (1 = matched) + object / attribute classification + feature
regression + image QA (matched question items only, from `qa_from_epoch` on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from pipeline.errors import ConfigError
from vl_models.tasks import losses as L


TASKS = {"vilbert": ("mlm", "region", "alignment"), "lxmert": ("mlm", "matching", "obj", "attr", "feat", "qa")}


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

    def check(self, kind: str) -> None:
        unknown = (set(self.weights) | set(self.from_step)) - set(TASKS[kind])
        if unknown:
            raise ConfigError(f"{kind} has no task(s) {sorted(unknown)}; its tasks: {', '.join(TASKS[kind])}")
        bad = {k: v for k, v in self.weights.items() if not math.isfinite(v) or v < 0}
        bad.update({k: v for k, v in self.from_step.items() if v < 0})
        if bad:
            raise ConfigError(f"task weights must be finite and >= 0 and start steps >= 0: {bad}")

    def weights_at(self, step: Optional[int]) -> dict:
        """Loss weights at optimizer step `step` (None: every task on, as in evaluation)."""
        off = {k: 0.0 for k, start in self.from_step.items() if step is not None and step < start}
        return {**self.weights, **off}


def pretrain_losses(kind: str, model, batch: dict, cfg: TaskConfig, epoch: int,
                    step: Optional[int] = None) -> tuple[torch.Tensor, dict, dict]:
    """(total loss, per-task losses, metrics) for one batch. `step`: the number of optimizer
    steps taken so far, for `cfg.from_step`; None (evaluation) counts every task."""
    if kind == "vilbert":
        lm_at, regions_at = batch["lm_labels"] != -1, batch["region_selected"].bool()
        out = model(batch["input_ids"], batch["visual_feats"], batch["visual_pos"], batch["attention_mask"],
                    batch["visual_mask"], lm_positions=lm_at, region_positions=regions_at)
        mlm, m1 = L.masked_lm(out.lm_logits, batch["lm_labels"][lm_at])
        region, m2 = L.region_kl(out.region_logits, batch["region_prob"][regions_at])
        align, m3 = L.pair_classification(out.alignment_logits, 1 - batch["matched"], "alignment")
        losses = {"mlm": mlm, "region": region, "alignment": align}
        metrics = {**m1, **m2, **m3}
    elif kind == "lxmert":
        lm_at = batch["lm_labels"] != -1
        out = model(batch["input_ids"], batch["visual_feats"], batch["visual_pos"], batch["attention_mask"],
                    batch["visual_mask"], lm_positions=lm_at, feat_positions=batch["region_selected"].bool())
        mlm, m1 = L.masked_lm(out.lm_logits, batch["lm_labels"][lm_at])
        matched, m2 = L.pair_classification(out.matched_logits, batch["matched"], "matching")
        targets = L.LxmertVisualTargets(
            obj_ids=batch["obj_ids"], obj_conf=batch["obj_conf"], attr_ids=batch["attr_ids"], attr_conf=batch["attr_conf"],
            features=batch["original_feats"], selected=batch["region_selected"], real=batch["visual_mask"].bool())
        visual, m3 = L.lxmert_visual(out.obj_logits, out.attr_logits, out.feat_pred, targets, cfg.visual_weighting)
        qa, m4 = L.qa(out.answer_logits, batch["qa_label"], active=epoch >= cfg.qa_from_epoch)
        losses = {"mlm": mlm, "matching": matched, **visual, "qa": qa}
        metrics = {**m1, **m2, **m3, **m4}
    else:
        raise ValueError(f"unknown model kind {kind!r}")
    return L.total(losses, cfg.weights_at(step)), losses, metrics
