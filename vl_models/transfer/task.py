"""What a downstream task is, in one object: a `Task`.

A task says
* how its official files are read (`read`: `Row`s, `Skip`s and `Malformed`s, through the
  readers of `pipeline.sources`), which named splits it adds (`named_splits`: VQA's
  minival), and the soft targets of a row for classifier tasks (`targets`);
* how one example looks to the model (`example`, over a `TaskDataset` view): C candidate
  (text, image) pairs — 1 for a question, 2 images for NLVR2, 4 choices for VCR and for
  retrieval training — and its targets;
* its head kind (`head`: a `vl_models.transfer.heads` kind with its loss: answer classifier,
  pair classifier, per-region scorer, 4-way choice, pair score);
* its official metric (`score`, from `vl_models.eval.metrics`) with the validation score
  that picks the best checkpoint (`metric`), and its submission file (`write_submission`,
  from `vl_models.eval.submissions`).

Tasks are found by name (`vl_models.transfer.get`); adding a task is one module that
defines a `Task` and calls `register`. This module imports no torch: `vlprep build-task`
reads files through tasks without loading the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterator, Optional, Sequence, Union

import numpy as np

from pipeline.sources.base import Malformed, Skip


@dataclass
class Row:
    """One item of a task dataset as a reader yields it (`pipeline.task_data.ITEMS_SCHEMA`
    names the fields); `images` are named as the official files name them (the builder maps
    them to store keys), `answer` is the answer the table is counted over (VQA's
    multiple-choice answer, GQA's answer)."""

    uid: str
    split: str
    images: tuple[str, ...]
    text: str
    choices: Optional[list[str]] = None
    rationales: Optional[list[str]] = None
    label: Optional[int] = None
    rationale_label: Optional[int] = None
    answers: Optional[list[str]] = None
    answer_type: Optional[str] = None
    question_type: Optional[str] = None
    box: Optional[list[float]] = None
    group: Optional[str] = None
    answer: Optional[str] = None


Read = Union[Row, Skip, Malformed]


@dataclass(frozen=True)
class Predictions:
    """A split's predictions: `rows` (task-data rows, in evaluation order) and per-row
    arrays named by the task (``answer`` ids, ``label``s, ``region``s, probabilities)."""

    rows: np.ndarray
    values: dict


class Task:
    """Base of the tasks; subclasses set the class attributes and the methods."""

    name: ClassVar[str]
    head: ClassVar[str]  # a head kind of vl_models.transfer.heads
    candidates: ClassVar[int] = 1  # (text, image) pairs per example
    files: ClassVar[str]  # what `vlprep build-task --task NAME` reads, for its help
    metric: ClassVar[str]  # the validation score that picks the best checkpoint (higher is better)
    train_split: ClassVar[str] = "train"
    val_split: ClassVar[str] = "val"
    min_count: ClassVar[int] = 1  # classifier tasks: answers kept in the table (occurrences in train+val)
    table_splits: ClassVar[tuple[str, ...]] = ("train", "val")  # splits the answer table is counted over
    max_text: ClassVar[Optional[int]] = None  # text tokens per candidate (None: the model family's)
    # when its examples read the ground-truth boxes' store (--given-stores): "" never, "train" in
    # training only (RefCOCO: candidates), "always" (VCR: the question's boxes)
    ground_truth: ClassVar[str] = ""

    def read(self, files: Sequence[Path]) -> Iterator[Read]:
        """The official files' rows, in file order."""
        raise NotImplementedError

    def named_splits(self, rows: list[Row]) -> dict[str, list[int]]:
        """Further named splits (name -> indices into `rows`) besides each row's own."""
        return {}

    def extra_files(self, files: Sequence[Path], rows: list[Row]) -> dict[str, Any]:
        """Further JSON files for the task folder, by name (RefCOCO: the ground-truth boxes
        for `vlprep extract --given-boxes`)."""
        return {}

    def targets(self, row: Row) -> dict[str, float]:
        """Classifier tasks: the row's soft target per answer (as `table_answer` writes it)."""
        return {}

    def table_answer(self, answer: str) -> str:
        """An answer as the answer table holds it (VQA: normalized as the official tool does)."""
        return answer

    def length(self, view) -> int:
        """Examples in a `TaskDataset` view (one per row unless a task says otherwise)."""
        return len(view.rows)

    def example_of(self, view, i: int) -> tuple[int, int]:
        """(the view position of example `i`'s row, the answer its rationales are conditioned on:
        VCR's QA->R examples; -1 for none)."""
        return i, -1

    def example(self, view, i: int, rng: np.random.Generator) -> dict:
        """Example `i` of `view`: its C candidates (`view.candidates`) and its targets."""
        raise NotImplementedError

    def predict(self, logits: Any, batch: dict) -> dict:
        """Per-example predictions (numpy arrays) from the head's logits on an evaluation batch."""
        raise NotImplementedError

    def score(self, data, predictions: Predictions) -> dict[str, float]:
        """The official metric(s) of `predictions` (rows with known labels only); named
        without prefix (``accuracy``), the trainer prefixes ``eval_<task>_``."""
        raise NotImplementedError

    def write_submission(self, data, predictions: Predictions, folder: Path) -> Path:
        """The predictions in the task's official submission format; returns the file."""
        raise NotImplementedError(f"{self.name} has no official submission format")

    def __repr__(self) -> str:
        return f"<task {self.name}>"


def column(data, name: str, rows: np.ndarray) -> list:
    """`name` of each of `rows` (task-data rows)."""
    values = data.column(name)
    return [values[int(r)] for r in rows]


def labelled(data, predictions: Predictions, field: str = "label") -> np.ndarray:
    """Positions in `predictions` whose row has a known `field` (test splits have none)."""
    values = column(data, field, predictions.rows)
    return np.array([i for i, v in enumerate(values) if v is not None], np.int64)
