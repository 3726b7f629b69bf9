"""VCR (Zellers et al.): ``train/val/test.jsonl``, 4-way choice over (text, choice) pairs
scored by a linear layer on the pooled pair (ViLBERT's ``vil_logit``), with the inputs
vilbert-multi-task builds (`vcr_dataset.py`):

    vcr-q2a    Q->A (its TASK5): [CLS] question [SEP] answer [SEP], 60 text tokens
    vcr-qa2r   QA->R (its TASK6): [CLS] question [SEP] right answer [SEP] rationale [SEP], 80
    vcr        both in one task (Q->A then QA->R examples), scored as Q->A, QA->R and Q->AR,
               with the leaderboard's CSV (answer probabilities and rationale probabilities
               conditioned on each answer)

Every pair: token type 1 on the choice (answer, rationale) and its [SEP], 0 before; only the
choice loses tokens when the pair is too long, from its end (the question, and QA->R's
answer, stay whole); the text is tokenized twice as the reference does
(`WordPiece.pieces(retokenize=True)`). Object tags are rendered as the reference renders them
(`pipeline.sources.vcr.MT`: the objects of a tag one after the other, a class name for a
thing, a name for a person): each tagged person gets a name drawn from a names table, seeded
by (run seed, task-data row, object index) — the same names in every epoch and in all of a
question's pairs, as the reference draws them once per question and caches them. The table
is vilbert-multi-task's ``unisex_names_table.csv`` when build-task is given it among its
files (it is data the reference does not ship; copied into the task folder as
``vcr_names.json``), else R2C's 15 names (`pipeline.sources.vcr.NAMES`). The regions: the
detections and, when the fine-tuning has ground-truth stores (`vlprep extract --given-boxes`
on the boxes of VCR's metadata files, which the tags index), every ground-truth box with the
detections filling the slots left (`TaskDataset.image`, ``"keep"``), in training and
evaluation alike, as the reference.

Examples of a split. vcr-q2a: one per question. vcr-qa2r: in training one per question,
conditioned on the right answer; in evaluation the same when every question of the split
has its answer label (the reference's val), else four per question, one per answer (its
test): index r conditioned on answer 0, then index rows + 3 r + k on answer k + 1. vcr: the
Q->A example (index i < rows), then QA->R ones: in training one, conditioned on the right
answer; in evaluation four, one per answer (index rows + 4 i + a), which the CSV needs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from pipeline.errors import ConfigError
from pipeline.sources.base import Malformed, Skip
from pipeline.sources.vcr import MT, NAMES, name_people, read_names_table, read_vcr
from vl_models.eval.metrics import vcr_metrics
from vl_models.eval.submissions import write_vcr_probabilities, write_vcr_submission
from vl_models.transfer.task import Row, Task, column

CHOICES = 4
Q2A_TEXT, QA2R_TEXT = 60, 80  # vilbert_tasks.yml: max_seq_length of TASK5 (VCR_Q-A), TASK6 (VCR_QA-R)
NAMES_FILE = "vcr_names.json"  # the names table, in the task folder (when build-task was given one)


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _names(view) -> tuple[str, ...]:
    def load() -> tuple[str, ...]:
        path = Path(view.data.path) / NAMES_FILE
        return tuple(json.loads(path.read_text())) if path.is_file() else NAMES

    return view.memo("vcr_names", load)


class VcrTask(Task):
    ground_truth = "always"
    """What the three VCR tasks share: the files, the rendering, the pairs."""

    head = "choice"
    candidates = CHOICES
    files = "train.jsonl, val.jsonl, test.jsonl, and optionally a names table (unisex_names_table.csv)"

    def read(self, files):
        for path in map(Path, files):
            if path.suffix.lower() == ".csv":
                continue  # the names table: extra_files
            for q in read_vcr(path, MT):
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

    def extra_files(self, files, rows):
        """``vcr_names.json``: the names of the names table among `files` (none: R2C's are used)."""
        tables = [Path(f) for f in files if Path(f).suffix.lower() == ".csv"]
        if len(tables) > 1:
            raise ConfigError(f"{self.name}: one names table, not {len(tables)} ({', '.join(map(str, tables))})")
        return {NAMES_FILE: list(read_names_table(tables[0]))} if tables else {}

    def _person(self, view, i: int) -> Callable[[int], str]:
        """The name of each tagged person of the split's `i`-th question."""
        table, row = _names(view), int(view.rows[i])
        return lambda k: table[int(np.random.default_rng([view.seed, row, k]).integers(len(table)))]

    def _pairs(self, view, i: int, answer: int, limit) -> list[dict]:
        """The 4 pairs of question `i`: Q->A (`answer` < 0) or QA->R conditioned on `answer`."""
        person = self._person(view, i)

        def text(t: str) -> str:
            return name_people(t, person)

        question = text(view.value("text", i))
        if answer < 0:
            first, seconds = question, view.value("choices", i)
        else:
            first, seconds = (question, text(view.value("choices", i)[answer])), view.value("rationales", i)
        return [view.text(first, text(s), limit=limit, retokenize=True) for s in seconds]

    def _example(self, view, i: int, answer: int, limit=None) -> dict:
        image = view.image(view.value("images", i)[0], ground_truth="keep")
        label = view.value("label" if answer < 0 else "rationale_label", i)
        texts = self._pairs(view, i, answer, limit)
        return {**view.candidates([(t, image) for t in texts]), "label": np.int64(-100 if label is None else label)}

    def predict(self, logits, batch):
        return {"logits": logits.float().cpu().numpy()}

    @staticmethod
    def _ordered(predictions) -> np.ndarray:
        return predictions.values["logits"][np.argsort(predictions.values["index"])]


class Q2A(VcrTask):
    name = "vcr-q2a"
    metric = "eval_vcr-q2a_accuracy"
    max_text = Q2A_TEXT

    def example(self, view, i, rng):
        return self._example(view, i, -1)

    def score(self, data, predictions):
        answers, labels = self._ordered(predictions).argmax(-1), column(data, "label", predictions.rows)
        known = [i for i, v in enumerate(labels) if v is not None]
        return {"accuracy": 100 * float(np.mean([answers[i] == labels[i] for i in known]))} if known else {}

    def write_submission(self, data, predictions, folder):
        """Each question's answer probabilities (no official format for Q->A alone: ours, JSON)."""
        probs = _softmax(self._ordered(predictions))
        path = Path(folder) / f"{self.name}_probabilities.json"
        return write_vcr_probabilities(path, column(data, "uid", predictions.rows), probs)


class QA2R(VcrTask):
    name = "vcr-qa2r"
    metric = "eval_vcr-qa2r_accuracy"
    max_text = QA2R_TEXT

    def _per_row(self, view) -> int:
        """Examples per question: 1 (conditioned on the right answer) or 4 (one per answer)."""
        if view.train:
            return 1
        return view.memo("vcr_qa2r_per_row", lambda: 1 if None not in column(view.data, "label", view.rows) else 4)

    def length(self, view):
        return len(view.rows) * self._per_row(view)

    def example_of(self, view, i: int) -> tuple[int, int]:
        """(question, the answer its rationales are conditioned on)."""
        n = len(view.rows)
        if self._per_row(view) == 1:
            if view.value("label", i) is None:
                raise ConfigError(f"{view.data.path}: question {view.value('uid', i)} has no answer label to train on")
            return i, view.value("label", i)
        return (i, 0) if i < n else ((i - n) // (CHOICES - 1), (i - n) % (CHOICES - 1) + 1)

    def example(self, view, i, rng):
        row, answer = self.example_of(view, i)
        return {**self._example(view, row, answer), "question": np.int64(row), "answer": np.int64(answer)}

    def predict(self, logits, batch):
        return {**super().predict(logits, batch), **{k: batch[k].cpu().numpy() for k in ("question", "answer")}}

    @staticmethod
    def _by_example(predictions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per example, in index order: the logits (examples, 4), the question (its position
        in `predictions.rows`) and the answer its rationales are conditioned on."""
        order = np.argsort(predictions.values["index"])
        return tuple(predictions.values[k][order] for k in ("logits", "question", "answer"))

    def score(self, data, predictions):
        logits, question, answer = self._by_example(predictions)
        labels = column(data, "label", predictions.rows)
        rlabels = column(data, "rationale_label", predictions.rows)
        hits = [
            chosen == rlabels[q]
            for chosen, q, a in zip(logits.argmax(-1), question, answer)
            if rlabels[q] is not None and a == labels[q]
        ]
        return {"accuracy": 100 * float(np.mean(hits))} if hits else {}

    def write_submission(self, data, predictions, folder):
        """Each example's rationale probabilities with the answer it is conditioned on (no
        official format for QA->R alone: ours, JSON)."""
        logits, question, answer = self._by_example(predictions)
        uids = column(data, "uid", predictions.rows)
        path = Path(folder) / f"{self.name}_probabilities.json"
        return write_vcr_probabilities(path, [uids[q] for q in question], _softmax(logits), conditioned_on=answer)


class Vcr(VcrTask):
    name = "vcr"
    metric = "eval_vcr_q2ar"
    max_text = QA2R_TEXT  # Q->A pairs fill at most Q2A_TEXT of it (unless --max-text is given)

    def length(self, view):
        return len(view.rows) * (2 if view.train else 1 + CHOICES)

    def example_of(self, view, i: int) -> tuple[int, int]:
        """(row, answer the rationales are conditioned on; -1: a Q->A example)."""
        n = len(view.rows)
        if i < n:
            return i, -1
        if view.train:
            return i - n, view.value("label", i - n)
        return (i - n) // CHOICES, (i - n) % CHOICES

    def example(self, view, i, rng):
        row, answer = self.example_of(view, i)
        limit = Q2A_TEXT if answer < 0 and view.cfg.max_text is None else None
        return self._example(view, row, answer, limit)

    def _probs(self, predictions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, Q->A probabilities (n, 4), QA->R probabilities (n, 4 answers, 4))."""
        logits = self._ordered(predictions)
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


TASK, Q2A_TASK, QA2R_TASK = Vcr(), Q2A(), QA2R()
