"""Pure metrics."""

from __future__ import annotations

import numpy as np


def recall_at_k(scores: np.ndarray, truth: np.ndarray, ks=(1, 5, 10)) -> dict[str, float]:
    """scores (queries x candidates); truth (queries,) index of the right candidate."""
    order = np.argsort(-scores, axis=1, kind="stable")
    ranks = np.argmax(order == truth[:, None], axis=1)
    return {f"R@{k}": float(np.mean(ranks < k)) for k in ks}


def vqa_score(predicted: np.ndarray, answer_ids: list[list[int]], answer_scores: list[list[float]]) -> float:
    """Mean soft score of the predicted answers (VQA accuracy as LXMERT reports it)."""
    total = 0.0
    for pred, ids, scores in zip(predicted, answer_ids, answer_scores):
        total += dict(zip(ids, scores)).get(int(pred), 0.0)
    return total / max(len(predicted), 1)
