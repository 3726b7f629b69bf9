"""Pure metrics."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pipeline.errors import DataError
from pipeline.mixture.answers import process_digit_article, process_punctuation


def recall_at_k(scores: np.ndarray, truth: np.ndarray, ks=(1, 5, 10)) -> dict[str, float]:
    """scores (queries x candidates); truth (queries,) index of the right candidate."""
    order = np.argsort(-scores, axis=1, kind="stable")
    ranks = np.argmax(order == truth[:, None], axis=1)
    return {f"R@{k}": float(np.mean(ranks < k)) for k in ks}


def vqa_score(predicted: np.ndarray, answer_ids: list[list[int]], answer_scores: list[list[float]]) -> float:
    """Mean stored soft score of the predicted answers (VQA accuracy as LXMERT reports it).

    For a VQA question with 10 annotators the stored score (`soft_scores`: 0.3 / 0.6 / 0.9 /
    1.0 for 1 / 2 / 3 / 4+ annotators) is the official accuracy (`vqa_accuracy`) of that
    answer. It is not when the annotator count is not 10 (the official average over the
    annotators differs: 1 of 5 scores 0.27, stored 0.3), when our normalization merges what
    the official tool keeps apart (LXMERT's grey -> gray; ten identical answers not in normal
    form, which the official tool compares raw), and GQA / VG-QA store 1.0 for their single
    answer."""
    total = 0.0
    for pred, ids, scores in zip(predicted, answer_ids, answer_scores):
        total += dict(zip(ids, scores)).get(int(pred), 0.0)
    return total / max(len(predicted), 1)


def _strip(text: str) -> str:
    return text.replace("\n", " ").replace("\t", " ").strip()


def vqa_accuracy(predicted: str, annotator_answers: Sequence[str]) -> float:
    """The official VQA accuracy (0..1) of one predicted answer, as GT-Vision-Lab/VQA's
    ``vqaEval.py`` `evaluate` computes it (master, after its 2021 fix):

    - newlines and tabs become spaces and outer whitespace is stripped, on both sides;
    - only when the annotators' answers are not all identical, both the prediction and the
      answers get the official punctuation and digit/article processing (no LXMERT rules);
      otherwise the strings are compared as they are (case included);
    - annotator i scores min(1, matches among the other annotators / 3); the scores are
      averaged. For 10 annotators: 0.3 / 0.6 / 0.9 / 1.0 for 1 / 2 / 3 / 4+ matches.
    """
    answers = [_strip(a) for a in annotator_answers]
    if not answers:
        raise DataError("vqa_accuracy: no annotator answers for the question")
    pred = _strip(predicted)
    if len(set(answers)) > 1:
        answers = [process_digit_article(process_punctuation(a)) for a in answers]
        pred = process_digit_article(process_punctuation(pred))
    matches = sum(a == pred for a in answers)
    return sum(min(1.0, (matches - (a == pred)) / 3) for a in answers) / len(answers)


def vqa_official_accuracy(predicted: Sequence[str], annotator_answers: Sequence[Sequence[str]]) -> float:
    """The official tool's overall VQA accuracy: 100 x the mean of `vqa_accuracy` over the
    questions, rounded to 2 decimals."""
    if len(predicted) != len(annotator_answers) or not predicted:
        raise DataError(f"vqa_official_accuracy: {len(predicted)} predictions for {len(annotator_answers)} questions")
    return round(100 * sum(vqa_accuracy(p, a) for p, a in zip(predicted, annotator_answers)) / len(predicted), 2)
