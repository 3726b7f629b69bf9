"""Predictions in the official submission formats, written atomically (a killed write
leaves the previous file or none):

* VQA v2 (EvalAI and the official evaluator): a JSON list ``[{"question_id": int, "answer": str}]``;
* GQA (EvalAI and the official ``eval.py``): a JSON list ``[{"questionId": str, "prediction": str}]``;
* NLVR2 (lil-lab's ``metrics.py``): CSV lines ``identifier,True|False``, no header;
* VCR (the leaderboard's CSV): ``annot_id``, the 4 answer probabilities, and the 4 rationale
  probabilities conditioned on each answer (``rationale_conditioned_on_a{i}_{j}``);
* VCR Q->A or QA->R alone (no official format; ours, JSON, one entry per scored 4-way choice):
  ``[{"annot_id": str, "probabilities": [4 floats]}]``, QA->R's with ``"conditioned_on": a``
  (the answer its rationales follow).

Each writer checks that it got one prediction per id (per (id, answer) for QA->R alone;
DataError otherwise) and returns the
path it wrote.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from pipeline.errors import DataError
from pipeline.io import atomic_write_bytes, strict_json

VCR_COLUMNS = (
    "annot_id",
    *(f"answer_{i}" for i in range(4)),
    *(f"rationale_conditioned_on_a{i}_{j}" for i in range(4) for j in range(4)),
)


def _check(kind: str, ids: Sequence, predictions: Sequence) -> None:
    if len(ids) != len(predictions):
        raise DataError(f"{kind} submission: {len(predictions)} predictions for {len(ids)} ids")
    if len(set(ids)) != len(ids):
        raise DataError(f"{kind} submission: an id is listed twice")


def write_vqa_results(path: Path, question_ids: Sequence[int], answers: Sequence[str]) -> Path:
    _check("VQA", question_ids, answers)
    rows = [{"question_id": int(q), "answer": str(a)} for q, a in zip(question_ids, answers)]
    atomic_write_bytes(Path(path), strict_json(rows, str(path)).encode())
    return Path(path)


def write_gqa_predictions(path: Path, question_ids: Sequence[str], predictions: Sequence[str]) -> Path:
    _check("GQA", question_ids, predictions)
    rows = [{"questionId": str(q), "prediction": str(p)} for q, p in zip(question_ids, predictions)]
    atomic_write_bytes(Path(path), strict_json(rows, str(path)).encode())
    return Path(path)


def write_nlvr2_predictions(path: Path, identifiers: Sequence[str], predictions: Sequence[bool]) -> Path:
    _check("NLVR2", identifiers, predictions)
    lines = "".join(f"{i},{bool(p)}\n" for i, p in zip(identifiers, predictions))
    atomic_write_bytes(Path(path), lines.encode())
    return Path(path)


def write_vcr_submission(
    path: Path, annot_ids: Sequence[str], answer_probs: np.ndarray, rationale_probs: np.ndarray
) -> Path:
    """`answer_probs` (N, 4); `rationale_probs` (N, 4, 4): row i, answer a, rationale r is
    P(rationale r | question, answer a)."""
    answer_probs, rationale_probs = np.asarray(answer_probs, np.float64), np.asarray(rationale_probs, np.float64)
    _check("VCR", annot_ids, answer_probs)
    if answer_probs.shape != (len(annot_ids), 4) or rationale_probs.shape != (len(annot_ids), 4, 4):
        raise DataError(
            f"VCR submission: answer probabilities {answer_probs.shape} and rationale probabilities "
            f"{rationale_probs.shape}, expected ({len(annot_ids)}, 4) and ({len(annot_ids)}, 4, 4)"
        )
    if not (np.isfinite(answer_probs).all() and np.isfinite(rationale_probs).all()):
        raise DataError("VCR submission: a probability is not finite")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(VCR_COLUMNS)
    for annot, answers, rationales in zip(annot_ids, answer_probs, rationale_probs):
        writer.writerow([annot, *(repr(float(v)) for v in answers), *(repr(float(v)) for v in rationales.reshape(-1))])
    atomic_write_bytes(Path(path), out.getvalue().encode())
    return Path(path)


def write_vcr_probabilities(
    path: Path, annot_ids: Sequence[str], probs: np.ndarray, conditioned_on: Optional[Sequence[int]] = None
) -> Path:
    """`probs` (N, 4): the choice probabilities of entry i (question `annot_ids[i]`, its
    rationales conditioned on answer `conditioned_on[i]` when given)."""
    probs = np.asarray(probs, np.float64)
    keys = list(annot_ids) if conditioned_on is None else [(a, int(c)) for a, c in zip(annot_ids, conditioned_on)]
    _check("VCR", keys, probs)
    if probs.shape != (len(keys), 4) or (conditioned_on is not None and len(conditioned_on) != len(keys)):
        raise DataError(f"VCR probabilities: {probs.shape} for {len(keys)} entries, expected ({len(keys)}, 4)")
    if not np.isfinite(probs).all():
        raise DataError("VCR probabilities: a probability is not finite")
    rows = [{"annot_id": str(a), "probabilities": [float(v) for v in p]} for a, p in zip(annot_ids, probs)]
    if conditioned_on is not None:
        for row, c in zip(rows, conditioned_on):
            row["conditioned_on"] = int(c)
    atomic_write_bytes(Path(path), strict_json(rows, str(path)).encode())
    return Path(path)
