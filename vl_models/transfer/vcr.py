"""VCR (Zellers et al.): ``train/val/test.jsonl`` with object tags rendered into text
(`pipeline.sources.vcr`); 4-way choice over (question, choice) pairs scored by a linear
layer on the pooled pair (ViLBERT's), for Q->A and QA->R (the question and the right answer,
then each rationale), scored as Q->A, QA->R and Q->AR; the submission is the leaderboard's
CSV (answer probabilities and rationale probabilities conditioned on each answer).

A row is one question; its examples are the Q->A one (index i < rows) and QA->R ones after
it: in training one, conditioned on the right answer; in evaluation four, one per answer
(index rows + 4 i + a), which the submission needs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.sources.base import Malformed, Skip
from pipeline.sources.vcr import read_vcr
from vl_models.eval.metrics import vcr_metrics
from vl_models.eval.submissions import write_vcr_submission
from vl_models.transfer.task import Row, Task, column

CHOICES = 4


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class Vcr(Task):
    name = "vcr"
    head = "choice"
    candidates = CHOICES
    files = "train.jsonl, val.jsonl, test.jsonl"
    metric = "eval_vcr_q2ar"
    max_text = 60  # ViLBERT-MT's Q->A length (QA->R: 80)

    def read(self, files):
        for path in map(Path, files):
            for q in read_vcr(path):
                if isinstance(q, (Skip, Malformed)):
                    yield q
                    continue
                yield Row(
                    uid=q.annot_id,
                    split=path.stem,
                    images=(q.image,),
                    text=q.question,
                    choices=list(q.answers),
                    rationales=list(q.rationales),
                    label=q.answer_label,
                    rationale_label=q.rationale_label,
                )

    def length(self, view):
        return len(view.rows) * (2 if view.train else 1 + CHOICES)

    def _split(self, view, i: int) -> tuple[int, int]:
        """(row, answer the rationales are conditioned on; -1: a Q->A example)."""
        n = len(view.rows)
        if i < n:
            return i, -1
        if view.train:
            return i - n, view.value("label", i - n)
        return (i - n) // CHOICES, (i - n) % CHOICES

    def example(self, view, i, rng):
        row, answer = self._split(view, i)
        image = view.image(view.value("images", row)[0])
        question = view.value("text", row)
        if answer < 0:
            texts = [view.text(question, c) for c in view.value("choices", row)]
            label = view.value("label", row)
        else:
            context = f"{question} {view.value('choices', row)[answer]}"
            texts = [view.text(context, r) for r in view.value("rationales", row)]
            label = view.value("rationale_label", row)
        return {**view.candidates([(t, image) for t in texts]), "label": np.int64(-100 if label is None else label)}

    def predict(self, logits, batch):
        return {"logits": logits.float().cpu().numpy()}

    def _probs(self, predictions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, Q->A probabilities (n, 4), QA->R probabilities (n, 4 answers, 4))."""
        logits = predictions.values["logits"][np.argsort(predictions.values["index"])]
        n = len(predictions.rows)
        return predictions.rows, _softmax(logits[:n]), _softmax(logits[n:]).reshape(n, CHOICES, CHOICES)

    def score(self, data, predictions):
        rows, answers, rationales = self._probs(predictions)
        labels, rlabels = column(data, "label", rows), column(data, "rationale_label", rows)
        known = [i for i, v in enumerate(labels) if v is not None]
        if not known:
            return {}
        m = vcr_metrics(
            answers[known].argmax(-1),
            [labels[i] for i in known],
            [rationales[i, labels[i]].argmax() for i in known],
            [rlabels[i] for i in known],
        )
        return {k: 100 * v for k, v in m.items()}

    def write_submission(self, data, predictions, folder):
        rows, answers, rationales = self._probs(predictions)
        return write_vcr_submission(Path(folder) / "vcr_submission.csv", column(data, "uid", rows), answers, rationales)


TASK = Vcr()
