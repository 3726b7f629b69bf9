"""The head kinds of the downstream tasks, each with its loss, on what a model family's
backbone gives (`ModelFamily.encode`: the pooled pair vector, the region states and the
pair score's logit of every candidate):

    answers   VQA, GQA: ``Linear(H, 2H) -> GeLU -> LayerNorm -> Linear(2H, answers)`` on the
              pooled pair (vilbert-multi-task's SimpleClassifier; LXMERT's ``logit_fc``, so a
              pretraining QA head copies over by answer string); BCE on the soft targets,
              mean x answers (both references)
    pair      NLVR2: the same classifier on the two images' pooled vectors concatenated
              (2H -> 2H -> 2); cross-entropy (LXMERT's), or with ``loss="bce"`` BCE on the
              one-hot targets, mean over both logits (vilbert-multi-task's)
    regions   RefCOCO+: ``Linear(H_v, 1)`` per region state, -10000 added at padded slots (as
              vilbert-multi-task's ``vision_logit``); BCE on the IoU targets over the real
              regions, summed over regions, mean over expressions (x #regions, as MT)
    choice    VCR: ``Linear(H, 1)`` per (question, choice) pair; 4-way cross-entropy. Also
              the retrieval head of a vilbert-multi-task checkpoint (its fine-tuned ``vil_logit``)
    retrieval Flickr30k / COCO: the pretraining pair head's logit (alignment / matching) of
              each candidate, 4-way cross-entropy (positive first); no new parameters, so
              zero-shot scoring is the same head

`WeightNormAnswerHead` is vilbert_beta's answer classifier (its checkpoints' shape). New heads
start as both references start theirs (`init_bert_weights`: N(0, 0.02) weights — their
configs' ``initializer_range`` —, zero biases, unit LayerNorms). The heads 12-in-1 names
``vil_*`` (answers, pair, choice) say so (``vil``): `vltrain finetune --head-lr` trains them at
their own learning rate, as 12-in-1 trains its ``vil_*`` parameters at 1e-4.

Every loss returns (loss, metrics) with the batch's accuracy-like figure.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.errors import ConfigError
from vl_models.config import PAIR_LOSSES
from vl_models.families.base import Encoded
from vl_models.models.layers import init_bert_weights
from vl_models.tasks.losses import global_mean


def _classifier(width: int, hidden: int, out: int, eps: float) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.LayerNorm(hidden, eps=eps), nn.Linear(hidden, out))


class AnswerHead(nn.Module):
    vil = True  # 12-in-1 names it vil_prediction: --head-lr

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


class WeightNormLinear(nn.Module):
    """A linear layer with its weight as ``weight_g * weight_v / ||weight_v||`` (one scalar
    ``weight_g``, the norm over the whole matrix): ``torch.nn.utils.weight_norm(Linear, dim=None)``
    under the same tensor names."""

    def __init__(self, width: int, out: int):
        super().__init__()
        self.weight_v = nn.Parameter(torch.empty(out, width))
        self.weight_g = nn.Parameter(torch.empty(()))
        self.bias = nn.Parameter(torch.zeros(out))
        nn.init.normal_(self.weight_v, std=0.02)
        with torch.no_grad():
            self.weight_g.copy_(self.weight_v.norm())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight_g * self.weight_v / self.weight_v.norm(), self.bias)


class WeightNormAnswerHead(AnswerHead):
    """vilbert_beta's answer classifier (its `SimpleClassifier`): weight-normed
    ``Linear(H, 2H) -> ReLU -> Dropout(0.5) -> Linear(2H, answers)`` (``main.0`` / ``main.3``)
    on the pooled pair; the loss is `AnswerHead`'s."""

    def __init__(self, pooled: int, answers: int):
        nn.Module.__init__(self)
        self.main = nn.Sequential(
            WeightNormLinear(pooled, 2 * pooled), nn.ReLU(), nn.Dropout(0.5), WeightNormLinear(2 * pooled, answers)
        )

    def forward(self, enc: Encoded, batch: dict) -> torch.Tensor:
        return self.main(enc.pooled)


class PairHead(nn.Module):
    vil = True  # vil_binary_prediction

    def __init__(self, pooled: int, eps: float = 1e-12, loss: str = "ce"):
        super().__init__()
        if loss not in PAIR_LOSSES:
            raise ConfigError(f"pair loss {loss!r}: one of {', '.join(PAIR_LOSSES)}")
        self.logit_fc = _classifier(2 * pooled, 2 * pooled, 2, eps)
        self.loss_kind = loss

    def forward(self, enc: Encoded, batch: dict) -> torch.Tensor:
        return self.logit_fc(enc.pooled.reshape(-1, 2 * enc.pooled.shape[-1]))

    def loss(self, logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        if self.loss_kind == "ce":
            return _cross_entropy(logits, batch["label"])
        labels = batch["label"]
        target = F.one_hot(labels.clamp(min=0), 2).float()
        bce = F.binary_cross_entropy_with_logits(logits.float(), target, reduction="sum")
        loss = global_mean(bce, torch.tensor(2 * logits.shape[0], device=logits.device))  # mean over both logits
        return loss, {"acc": (logits.argmax(-1) == labels).float().mean().item()}


class RegionHead(nn.Module):
    reads_vision = True  # the region states (`ModelFamily.encode(vision=...)`); the other heads read pooled ones

    def __init__(self, vision: int):
        super().__init__()
        self.logit = nn.Linear(vision, 1)

    def forward(self, enc: Encoded, batch: dict) -> torch.Tensor:
        logits = self.logit(enc.vision).squeeze(-1)
        return logits + (1.0 - batch["region_valid"].to(logits.dtype)) * -10000.0

    @staticmethod
    def loss(logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        valid = batch["region_valid"].float()
        bce = F.binary_cross_entropy_with_logits(logits.float(), batch["region_target"].float(), reduction="none")
        loss = global_mean((bce * valid).sum(), torch.tensor(logits.shape[0], device=logits.device))
        hit = batch["region_iou"].gather(1, logits.argmax(-1, keepdim=True)).squeeze(1) > 0.5
        return loss, {"acc": hit.float().mean().item()}


class ChoiceHead(nn.Module):
    vil = True  # vil_logit

    def __init__(self, pooled: int, candidates: int):
        super().__init__()
        self.candidates = candidates
        self.logit = nn.Linear(pooled, 1)

    def forward(self, enc: Encoded, batch: dict) -> torch.Tensor:
        return self.logit(enc.pooled).reshape(-1, self.candidates)

    def score(self, pooled: torch.Tensor) -> torch.Tensor:
        """(N,) the logit of each pooled pair (retrieval's pairwise scoring)."""
        return self.logit(pooled).squeeze(-1)

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


def build_head(
    kind: str,
    pooled: int,
    vision: int,
    candidates: int,
    answers: int,
    eps: float,
    std: float = 0.02,
    pair_loss: str = "ce",
) -> nn.Module:
    """A new head of `kind` for a backbone of pooled width `pooled` and region-state width
    `vision`, initialized as the references do (`init_bert_weights` with `std`); `pair_loss`:
    the pair head's loss ("ce" or "bce", see `PairHead`)."""
    if kind == "answers":
        if answers < 1:
            raise ConfigError("an answer classifier needs an answer table: the task dataset has none")
        head = AnswerHead(pooled, answers, eps)
    else:
        builders = {
            "pair": lambda: PairHead(pooled, eps, pair_loss),
            "regions": lambda: RegionHead(vision),
            "choice": lambda: ChoiceHead(pooled, candidates),
            "retrieval": lambda: RetrievalHead(candidates),
        }
        if kind not in builders:
            raise ConfigError(f"unknown head kind {kind!r}; known: {', '.join(KINDS)}")
        head = builders[kind]()
    head.apply(lambda m: init_bert_weights(m, std))
    return head


class TransferModel(nn.Module):
    """A family's pretraining model (``backbone``: its pair head scores retrieval) with one
    head per task (``heads.<task>``); ``forward(task, batch)`` gives that task's logits.
    `task_tokens`: each task's task-token id for a backbone with a task-token table
    (`ModelFamily.task_token`), passed to `ModelFamily.encode`."""

    def __init__(self, family, backbone: nn.Module, heads: dict[str, nn.Module], task_tokens: Optional[dict] = None):
        super().__init__()
        self.family = family
        self.backbone = backbone
        self.heads = nn.ModuleDict(heads)
        self.task_tokens = {k: v for k, v in (task_tokens or {}).items() if v is not None}
        for module in backbone.modules():  # pretraining's sparse lookup gradient relies on the tied LM decoder
            if isinstance(module, nn.Embedding):
                module.sparse = False

    def forward(self, task: str, batch: dict, enc: Optional[Encoded] = None) -> torch.Tensor:
        head = self.heads[task]
        if enc is None:
            vision = getattr(head, "reads_vision", False)
            enc = self.family.encode(self.backbone, batch, self.task_tokens.get(task), vision=vision)
        return head(enc, batch)


def build_transfer_model(family, mcfg, tasks, datas, pair_loss: str = "ce") -> TransferModel:
    pooled, vision = family.widths(mcfg)
    heads = {
        t.name: build_head(
            t.head,
            pooled,
            vision,
            t.candidates,
            len(d.answers),
            mcfg.layer_norm_eps,
            pair_loss=pair_loss,
        )
        for t, d in zip(tasks, datas)
    }
    return TransferModel(family, family.build(mcfg), heads, {t.name: family.task_token(mcfg, t.name) for t in tasks})
