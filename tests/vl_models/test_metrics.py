import numpy as np

from vl_models.eval.metrics import recall_at_k, vqa_score


def test_recall_at_k():
    scores = np.array([[0.9, 0.1, 0.0], [0.5, 0.4, 0.6], [0.3, 0.2, 0.1]])
    # query 0: right (0) first; query 1: right (1) third; query 2: right (2) third
    assert recall_at_k(scores, np.arange(3), ks=(1, 2, 3)) == {"R@1": 1 / 3, "R@2": 1 / 3, "R@3": 1.0}


def test_vqa_score():
    assert vqa_score(np.array([3, 5]), [[3, 4], [4]], [[1.0, 0.3], [0.6]]) == 0.5
