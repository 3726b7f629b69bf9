"""The head kinds of the downstream tasks, each with its loss, on what a model family's
backbone gives (`ModelFamily.encode`: the pooled pair vector, the region states and the
pair score's logit of every candidate):

    answers   VQA, GQA: ``Linear(H, 2H) -> GeLU -> LayerNorm -> Linear(2H, answers)`` on the
              pooled pair (vilbert-multi-task's SimpleClassifier; LXMERT's ``logit_fc``, so a
              pretraining QA head copies over by answer string); BCE on the soft targets,
              mean x answers (both references)
    pair      NLVR2: the same classifier on the two images' pooled vectors concatenated
              (2H -> 2H -> 2); cross-entropy
    regions   RefCOCO+: ``Linear(H_v, 1)`` per region state; BCE on the IoU targets over the
              real regions, summed over regions, mean over expressions (x #regions, as MT)
    choice    VCR: ``Linear(H, 1)`` per (question, choice) pair; 4-way cross-entropy
    retrieval Flickr30k / COCO: the pretraining pair head's logit (alignment / matching) of
              each candidate, 4-way cross-entropy (positive first); no new parameters, so
              zero-shot scoring is the same head

Every loss returns (loss, metrics) with the batch's accuracy-like figure.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.errors import ConfigError
from vl_models.families.base import Encoded
from vl_models.tasks.losses import global_mean


def _classifier(width: int, hidden: int, out: int, eps: float) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.LayerNorm(hidden, eps=eps), nn.Linear(hidden, out))


class AnswerHead(nn.Module):
    def __init__(self, pooled: int, answers: int, eps: float = 1e-12):
        super().__init__()
        self.logit_fc = _classifier(pooled, 2 * pooled, answers, eps)

    def forward(self, enc: Encoded, batch: dict) -> torch.Tensor:
        return self.logit_fc(enc.pooled)

    @staticmethod
    def loss(logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        target = batch["target"].to(logits.dtype)
        bce = F.binary_cross_entropy_with_logits(logits.float(), target.float(), reduction="sum")
        loss = global_mean(bce, torch.tensor(logits.shape[0], device=logits.device))
        score = target.gather(1, logits.argmax(-1, keepdim=True)).float().mean().item()
        return loss, {"score": score}


class PairHead(nn.Module):
    def __init__(self, pooled: int, eps: float = 1e-12):
        super().__init__()
        self.logit_fc = _classifier(2 * pooled, 2 * pooled, 2, eps)

    def forward(self, enc: Encoded, batch: dict) -> torch.Tensor:
        return self.logit_fc(enc.pooled.reshape(-1, 2 * enc.pooled.shape[-1]))

    @staticmethod
    def loss(logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        return _cross_entropy(logits, batch["label"])


class RegionHead(nn.Module):
    def __init__(self, vision: int):
        super().__init__()
        self.logit = nn.Linear(vision, 1)

    def forward(self, enc: Encoded, batch: dict) -> torch.Tensor:
        logits = self.logit(enc.vision).squeeze(-1)
        return logits.masked_fill(~batch["region_valid"].bool(), -1e4)

    @staticmethod
    def loss(logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        valid = batch["region_valid"].float()
        bce = F.binary_cross_entropy_with_logits(logits.float(), batch["region_target"].float(), reduction="none")
        loss = global_mean((bce * valid).sum(), torch.tensor(logits.shape[0], device=logits.device))
        hit = batch["region_iou"].gather(1, logits.argmax(-1, keepdim=True)).squeeze(1) > 0.5
        return loss, {"acc": hit.float().mean().item()}


class ChoiceHead(nn.Module):
    def __init__(self, pooled: int, candidates: int):
        super().__init__()
        self.candidates = candidates
        self.logit = nn.Linear(pooled, 1)

    def forward(self, enc: Encoded, batch: dict) -> torch.Tensor:
        return self.logit(enc.pooled).reshape(-1, self.candidates)

    @staticmethod
    def loss(logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        return _cross_entropy(logits, batch["label"])


class RetrievalHead(nn.Module):
    """No parameters: the pretraining pair head scores every candidate."""

    def __init__(self, candidates: int):
        super().__init__()
        self.candidates = candidates

    def forward(self, enc: Encoded, batch: dict) -> torch.Tensor:
        return enc.pair.reshape(-1, self.candidates)

    @staticmethod
    def loss(logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        return _cross_entropy(logits, batch["label"])


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict]:
    ce = F.cross_entropy(logits.float(), labels, reduction="sum")
    loss = global_mean(ce, torch.tensor(logits.shape[0], device=logits.device))
    return loss, {"acc": (logits.argmax(-1) == labels).float().mean().item()}


KINDS = ("answers", "pair", "regions", "choice", "retrieval")


def build_head(kind: str, pooled: int, vision: int, candidates: int, answers: int, eps: float) -> nn.Module:
    """A new head of `kind` for a backbone of pooled width `pooled` and region-state width `vision`."""
    if kind == "answers":
        if answers < 1:
            raise ConfigError("an answer classifier needs an answer table: the task dataset has none")
        return AnswerHead(pooled, answers, eps)
    builders = {
        "pair": lambda: PairHead(pooled, eps),
        "regions": lambda: RegionHead(vision),
        "choice": lambda: ChoiceHead(pooled, candidates),
        "retrieval": lambda: RetrievalHead(candidates),
    }
    if kind not in builders:
        raise ConfigError(f"unknown head kind {kind!r}; known: {', '.join(KINDS)}")
    return builders[kind]()


class TransferModel(nn.Module):
    """A family's pretraining model (``backbone``: its pair head scores retrieval) with one
    head per task (``heads.<task>``); ``forward(task, batch)`` gives that task's logits."""

    def __init__(self, family, backbone: nn.Module, heads: dict[str, nn.Module]):
        super().__init__()
        self.family = family
        self.backbone = backbone
        self.heads = nn.ModuleDict(heads)
        for module in backbone.modules():  # pretraining's sparse lookup gradient relies on the tied LM decoder
            if isinstance(module, nn.Embedding):
                module.sparse = False

    def forward(self, task: str, batch: dict, enc: Optional[Encoded] = None) -> torch.Tensor:
        enc = enc if enc is not None else self.family.encode(self.backbone, batch)
        return self.heads[task](enc, batch)


def build_transfer_model(family, mcfg, tasks, datas) -> TransferModel:
    pooled, vision = family.widths(mcfg)
    heads = {
        t.name: build_head(t.head, pooled, vision, t.candidates, len(d.answers), mcfg.layer_norm_eps)
        for t, d in zip(tasks, datas)
    }
    return TransferModel(family, family.build(mcfg), heads)
