import numpy as np
import pytest

from pipeline.errors import DataError
from pipeline.mixture.answers import soft_scores
from vl_models.eval.metrics import recall_at_k, vqa_score


def test_recall_at_k():
    scores = np.array([[0.9, 0.1, 0.0], [0.5, 0.4, 0.6], [0.3, 0.2, 0.1]])
    # query 0: right (0) first; query 1: right (1) third; query 2: right (2) third
    assert recall_at_k(scores, np.arange(3), ks=(1, 2, 3)) == {"R@1": 1 / 3, "R@2": 1 / 3, "R@3": 1.0}


def test_vqa_score():
    assert vqa_score(np.array([3, 5]), [[3, 4], [4]], [[1.0, 0.3], [0.6]]) == 0.5


# -- the official VQA accuracy (GT-Vision-Lab/VQA vqaEval.py `evaluate`, master)


def official(predicted, answers):
    from vl_models.eval.metrics import vqa_accuracy

    return vqa_accuracy(predicted, answers)


@pytest.mark.parametrize("k, expected", [(0, 0.0), (1, 0.3), (2, 0.6), (3, 0.9), (4, 1.0), (7, 1.0)])
def test_vqa_accuracy_k_of_10_annotators(k, expected):
    # annotator i scores min(1, matches among the 9 others / 3); the 10 are averaged
    answers = ["cat"] * k + ["dog"] * (10 - k)
    assert official("cat", answers) == pytest.approx(expected)


def test_vqa_accuracy_5_annotators():
    # the two "cat" annotators see 1 other cat (1/3 each), the three others see 2 (2/3 each)
    assert official("cat", ["cat", "cat", "dog", "dog", "bird"]) == pytest.approx((2 * 1 / 3 + 3 * 2 / 3) / 5)
    # the stored soft score is BUTD's table on k, exact for 10 annotators only
    assert soft_scores(["cat", "cat", "dog", "dog", "bird"])["cat"] == 0.6


def test_vqa_accuracy_normalizes_only_when_annotators_disagree():
    # all ten identical: neither side is processed (no digit/article or case rules)
    assert official("two", ["2"] * 10) == 0.0
    assert official("two", ["two"] * 10) == 1.0
    assert official("yes", ["Yes"] * 10) == 0.0
    # annotators disagree: both sides get punctuation + digit/article processing
    assert official("two", ["2"] * 9 + ["two"]) == 1.0
    assert official("2", ["two"] * 2 + ["cat"] * 8) == pytest.approx(0.6)


def test_vqa_accuracy_punctuation_articles_whitespace():
    assert official("hot dog", ["hot-dog"] * 5 + ["hot dog"] * 5) == 1.0
    assert official("hotdog", ["hot-dog"] * 5 + ["hot dog"] * 5) == 0.0
    assert official("a dog", ["the dog"] * 2 + ["dog"] + ["cat"] * 7) == pytest.approx(0.9)
    assert official("Yes!\n", ["yes"] * 3 + ["no"] * 7) == pytest.approx(0.9)
    assert official("1,000", ["1000", "1,000", "one thousand"] + ["no"] * 7) == pytest.approx(0.6)
    with pytest.raises(DataError, match="no annotator answers"):
        official("yes", [])


def test_vqa_official_overall_is_a_rounded_percentage():
    from vl_models.eval.metrics import vqa_official_accuracy

    answers = [["cat"] + ["dog"] * 9, ["two"] * 10, ["yes"] * 10]
    assert vqa_official_accuracy(["cat", "2", "yes"], answers) == round(100 * (0.3 + 0 + 1) / 3, 2) == 43.33


@pytest.mark.parametrize("k", range(11))
def test_stored_score_is_the_official_accuracy_for_10_annotators(k):
    """The score `vqa_score` reads (written by the mixture as float32) equals the official
    averaged accuracy of the predicted answer, for every number k of 10 annotators giving it."""
    answers = ["cat"] * k + ["dog", "bird"] * 5
    answers = answers[:10]
    stored = soft_scores(answers)
    table = sorted(stored)
    ids = [table.index(a) for a in stored]
    scores = [float(np.float32(s)) for s in stored.values()]
    predicted = table.index("cat") if "cat" in stored else len(table)
    assert vqa_score(np.array([predicted]), [ids], [scores]) == pytest.approx(official("cat", answers), abs=1e-6)
