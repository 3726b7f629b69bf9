"""Which head answers a query, and how a head's outputs become a result: `TaskHead` (a task
the predictor answers with), `head_for` (a query routed to the head of its kind, or the one it
names), `PretrainingAnswers` (LXMERT's pretraining QA head as an answer head), and per head
kind the scores kept beside the task's predictions (`readout`) and the result they make
(`describe`).

The scores: an answer head's sigmoid per answer (both references train it with BCE; LXMERT's
pretraining QA head, trained with cross-entropy, its softmax), NLVR2's softmax probability of
True, a region's sigmoid, VCR's softmax over the four choices."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

from vl_models.config import DataSettings
from vl_models.predict.queries import ASKED, PredictError, kind_of
from vl_models.transfer.vcr import QA2R

PAIR_HEAD = "pair-head"  # the pretraining pair head, under the name the model's heads know it by
DEFAULT_ANSWERS = 5  # answers a question gets unless it says (rankings: every item)


@dataclass
class TaskHead:
    """A task the predictor answers with: its `Task`, answer table, data settings and the task
    dataset folder it was trained on (VCR's names table), and what kind of run gave it."""

    task: object
    answers: list
    settings: DataSettings
    path: Optional[Path] = None
    zero_shot: bool = False


class PretrainingAnswers(nn.Module):
    """LXMERT's pretraining QA head (over its mixture's answer table) as an answer head."""

    softmax = True  # trained with cross-entropy over the answers

    def __init__(self, logit_fc: nn.Module):
        super().__init__()
        self.logit_fc = logit_fc

    def forward(self, enc, batch: dict) -> torch.Tensor:
        return self.logit_fc(enc.pooled)


def head_for(heads: dict[str, TaskHead], query, source: str) -> str:
    """The name of the head of `heads` that answers `query` (`source`: the run, as errors name
    it): the one head of the query's kind, or the one its ``task`` names; an image and a text
    go to the pretraining pair head, else to a retrieval head. PredictError for a query no head
    (or more than one) fits, and for a VCR QA->R query without its rationales and answer."""
    if not isinstance(query, dict):
        raise PredictError("bad query", f"a query is a JSON object, not {type(query).__name__}")
    kind = kind_of(query)
    if kind == "match":
        name = PAIR_HEAD if PAIR_HEAD in heads else _named(heads, query, "retrieval", kind, source)
    else:
        name = _named(heads, query, kind, kind, source)
    task = heads[name].task
    if isinstance(task, QA2R) and ("rationales" not in query or query.get("answer") is None):
        raise PredictError("bad query", f"{task.name} scores rationales: give the 4 rationales and the answer")
    return name


def _named(heads: dict[str, TaskHead], query: dict, kind: str, asked: str, source: str) -> str:
    fits = [n for n, h in heads.items() if h.task.head == kind]
    if kind == "retrieval" and not fits and PAIR_HEAD in heads:
        fits = [PAIR_HEAD]
    wanted = query.get("task")
    if wanted is not None:
        if wanted not in fits:
            raise PredictError(
                "no head", f"--task {wanted}: not a head of {source} for this query (fitting: {fits or 'none'})"
            )
        return wanted
    if not fits:
        raise PredictError(
            "no head",
            f"{source} has no head for {ASKED.get(asked, 'a ' + asked)} (its heads: {', '.join(heads) or 'none'})",
        )
    if len(fits) > 1:
        raise PredictError("bad query", f"several heads fit ({', '.join(fits)}): say which with --task / task")
    return fits[0]


def readout(kind: str, head: nn.Module, k: int):
    """The per-example scores `vltrain predict` keeps beside the task's predictions."""

    def answers(logits, batch):
        probs = logits.float().softmax(-1) if getattr(head, "softmax", False) else logits.float().sigmoid()
        top = probs.topk(min(max(k, 1), probs.shape[-1]), dim=-1)
        return {"top_ids": top.indices.cpu().numpy(), "top_scores": top.values.cpu().numpy()}

    def pair(logits, batch):
        return {"probability": logits.float().softmax(-1)[:, 1].cpu().numpy()}

    def regions(logits, batch):
        return {"region_score": logits.float().max(-1).values.sigmoid().cpu().numpy()}

    def choice(logits, batch):
        return {"probabilities": logits.float().softmax(-1).cpu().numpy()}

    return {"answers": answers, "pair": pair, "regions": regions, "choice": choice}[kind]


def describe(kind: str, out: dict, values: dict, answers: list, conditioned: int) -> None:
    """Fill a query's result from one of its examples' prediction values."""
    if kind == "answers":
        top = [{"answer": answers[int(a)], "score": float(s)} for a, s in zip(values["top_ids"], values["top_scores"])]
        out.update(answer=answers[int(values["answer"])], score=top[0]["score"], top_k=top)
    elif kind == "pair":
        out.update(label=bool(values["label"]), probability=float(values["probability"]))
    elif kind == "regions":
        out.update(
            box=[float(v) for v in values["box"]], score=float(values["region_score"]), region=int(values["region"])
        )
    else:
        probs = [float(p) for p in values["probabilities"]]
        if conditioned < 0:
            out.update(answer=int(np.argmax(probs)), answer_probabilities=probs)
        else:
            out.setdefault("rationale_probabilities", [None] * len(probs))[conditioned] = probs
