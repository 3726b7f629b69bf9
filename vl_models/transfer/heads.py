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
    regions   RefCOCO+: ``Linear(H_v, 1)`` per region state after dropout (the family's
              `head_dropout`: ViLBERT's 0.1, `VILBertForVLTasks.dropout`; LXMERT's hidden dropout;
              off in eval), -10000 added at padded slots (as vilbert-multi-task's
              ``vision_logit(dropout(sequence_output_v))``);
              BCE on the IoU targets over the real regions, summed over regions, mean over
              expressions (x #regions, as MT)
    choice    VCR: ``Linear(H, 1)`` per (question, choice) pair; 4-way cross-entropy. Also
              retrieval's new scorer (``retrieval_head="new"``: 12-in-1's ``vil_logit``, fine-tuned
              or a vilbert-multi-task checkpoint's) on the pooled pair vector
    retrieval Flickr30k / COCO with ``retrieval_head="pretraining"``: the pretraining pair head's
              logit (alignment / matching) of each candidate, 4-way cross-entropy (positive
              first); no new parameters. Zero-shot scoring always uses this head

`WeightNormAnswerHead` is vilbert_beta's answer classifier (its checkpoints' shape). New heads
start as both references start theirs (`init_bert_weights`: N(0, 0.02) weights — their
configs' ``initializer_range`` —, zero biases, unit LayerNorms). The heads 12-in-1 names
``vil_*`` (answers, pair, choice) say so (``vil``): `vltrain finetune --head-lr` trains them at
their own learning rate, as 12-in-1 trains its ``vil_*`` parameters at 1e-4.

Tasks trained together share a head's scoring layer where the family's reference does
(`ModelFamily.shared_head`: 12-in-1's one ``vision_logit`` for RefCOCO, RefCOCO+ and RefCOCOg,
one ``vil_logit`` for VCR and retrieval's new scorer): one module under each task's head, one
set of parameters (the optimizer counts it once; a checkpoint holds it under every task's name,
so a run's head loads for any one of its tasks).

Every loss returns (loss, metrics) with the batch's accuracy-like figure.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.errors import ConfigError
from vl_models.config import PAIR_LOSSES, RETRIEVAL_HEADS, flat_settings
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
        score = target.gather(1, logits.argmax(-1, keepdim=True)).float().mean().detach()
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
        return loss, {"acc": (logits.argmax(-1) == labels).float().mean().detach()}


class RegionHead(nn.Module):
    reads_vision = True  # the region states (`ModelFamily.encode(vision=...)`); the other heads read pooled ones

    def __init__(self, vision: int, dropout: float = 0.1):
        super().__init__()
        self.dropout = nn.Dropout(dropout)  # VILBertForVLTasks: vision_logit(self.dropout(sequence_output_v))
        self.logit = nn.Linear(vision, 1)

    def forward(self, enc: Encoded, batch: dict) -> torch.Tensor:
        logits = self.logit(self.dropout(enc.vision)).squeeze(-1)
        return logits + (1.0 - batch["region_valid"].to(logits.dtype)) * -10000.0

    @staticmethod
    def loss(logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        valid = batch["region_valid"].float()
        bce = F.binary_cross_entropy_with_logits(logits.float(), batch["region_target"].float(), reduction="none")
        loss = global_mean((bce * valid).sum(), torch.tensor(logits.shape[0], device=logits.device))
        hit = batch["region_iou"].gather(1, logits.argmax(-1, keepdim=True)).squeeze(1) > 0.5
        return loss, {"acc": hit.float().mean().detach()}


class ChoiceHead(nn.Module):
    vil = True  # vil_logit (VCR; retrieval's new scorer)

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
    """No parameters: the pretraining pair head scores every candidate (``retrieval_head=
    "pretraining"``, and zero-shot retrieval)."""

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
    return loss, {"acc": (logits.argmax(-1) == labels).float().mean().detach()}


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
    dropout: float = 0.1,
) -> nn.Module:
    """A new head of `kind` for a backbone of pooled width `pooled` and region-state width
    `vision`, initialized as the references do (`init_bert_weights` with `std`); `pair_loss`:
    the pair head's loss ("ce" or "bce", see `PairHead`); `dropout`: the region scorer's
    (`RegionHead`; 0.1: vilbert-multi-task's)."""
    if kind == "answers":
        if answers < 1:
            raise ConfigError("an answer classifier needs an answer table: the task dataset has none")
        head = AnswerHead(pooled, answers, eps)
    else:
        builders = {
            "pair": lambda: PairHead(pooled, eps, pair_loss),
            "regions": lambda: RegionHead(vision, dropout),
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
    head per task (``heads.<task>``; scoring layers shared as `build_transfer_model` says);
    ``forward(task, batch)`` gives that task's logits.
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


def build_transfer_model(
    family, mcfg, tasks, datas, pair_loss: str = "ce", retrieval_head: Optional[str] = None
) -> TransferModel:
    """The family's model of config `mcfg` with a new head for each of `tasks` (`datas`: their
    task datasets, for the answer tables). `pair_loss`: NLVR2's (`PairHead`); `retrieval_head`:
    retrieval's scorer, "new" (a `ChoiceHead`, 12-in-1's ``vil_logit``) or "pretraining" (the pair
    head, `RetrievalHead`), None: the family's own (`ModelFamily.retrieval_head`). The heads of
    tasks the family's reference scores with one layer share it (`ModelFamily.shared_head`)."""
    pooled, vision = family.widths(mcfg)
    retrieval_head = retrieval_head or family.retrieval_head
    if retrieval_head not in RETRIEVAL_HEADS:
        raise ConfigError(f"retrieval head {retrieval_head!r}: one of {', '.join(RETRIEVAL_HEADS)}")
    kinds = {t.name: "choice" if t.head == "retrieval" and retrieval_head == "new" else t.head for t in tasks}
    heads = {
        t.name: build_head(
            kinds[t.name],
            pooled,
            vision,
            t.candidates,
            len(d.answers),
            mcfg.layer_norm_eps,
            pair_loss=pair_loss,
            dropout=family.head_dropout(mcfg),
        )
        for t, d in zip(tasks, datas)
    }
    shared: dict[str, nn.Module] = {}
    for name, head in heads.items():
        layer = family.shared_head(kinds[name])
        if layer is not None:  # a one-layer scorer (`logit`): the first task's, for every task of the kind
            head.logit = shared.setdefault(layer, head.logit)
    return TransferModel(family, family.build(mcfg), heads, {t.name: family.task_token(mcfg, t.name) for t in tasks})


def shared_heads(model: TransferModel) -> dict[str, list[str]]:
    """The tasks whose heads share their scoring layer, grouped by the first of them
    (``{"refcoco": ["refcoco", "refcoco+"]}``); tasks with a head of their own are left out."""
    groups: dict[int, list[str]] = {}
    for name, head in model.heads.items():
        layer = getattr(head, "logit", None)
        if isinstance(layer, nn.Module):
            groups.setdefault(id(layer), []).append(name)
    return {names[0]: names for names in groups.values() if len(names) > 1}


def run_heads(run: Optional[dict]) -> dict:
    """`build_transfer_model`'s keywords for the heads a fine-tuning run (its record: a
    checkpoint's ``run`` or config.json) was trained with: ``retrieval_head`` as recorded, and
    "pretraining" for a run saved before the setting (every such run trained the pair head)."""
    saved = flat_settings((run or {}).get("train") or {})
    return {"retrieval_head": saved.get("retrieval_head") or "pretraining"}
