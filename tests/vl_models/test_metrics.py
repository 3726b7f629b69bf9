import numpy as np
import pytest

from pipeline.errors import DataError
from pipeline.items.answers import soft_scores
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


# -- downstream metrics, each against hand-computed cases


def test_ranks_break_ties_by_candidate_order():
    from vl_models.eval.metrics import ranks

    scores = np.array([[0.5, 0.5, 0.5], [0.1, 0.9, 0.9]])
    right = np.array([[False, True, False], [False, False, True]])
    # row 0: all tied, the right candidate (index 1) comes second; row 1: tied with index 1, ranked after it
    assert ranks(scores, right).tolist() == [1, 1]
    with pytest.raises(DataError, match="no right candidate"):
        ranks(scores, np.zeros_like(right))


def test_retrieval_metrics_both_directions():
    from vl_models.eval.metrics import retrieval_metrics

    # 4 captions x 2 images; captions 0, 1 show image 0, captions 2, 3 image 1
    scores = np.array(
        [
            [0.9, 0.1],  # c0 -> image 0 first (rank 1)
            [0.2, 0.8],  # c1 -> image 0 second (rank 2)
            [0.3, 0.7],  # c2 -> image 1 first
            [0.6, 0.4],
        ]
    )  # c3 -> image 1 second
    m = retrieval_metrics(scores, np.array([0, 0, 1, 1]), ks=(1, 2))
    assert (m["text_to_image_R@1"], m["text_to_image_R@2"]) == (0.5, 1.0)
    # ViLBERT's eval_retrieval.py: floor(median(0-based ranks)) + 1 = floor(0.5) + 1 (not the median 1.5)
    assert (m["text_to_image_median_rank"], m["text_to_image_mean_rank"]) == (1.0, 1.5)
    # image 0 ranks captions 0.9, 0.6, 0.3, 0.2 -> its own c0 first; image 1: 0.8 (c1), 0.7 (c2) -> own c2 second
    assert (m["image_to_text_R@1"], m["image_to_text_R@2"]) == (0.5, 1.0)
    assert (m["image_to_text_median_rank"], m["image_to_text_mean_rank"]) == (1.0, 1.5)
    odd = retrieval_metrics(scores[:3], np.array([0, 0, 1]), ks=(1,))  # 0-based ranks 0, 1, 0: median 0 -> 1
    assert odd["text_to_image_median_rank"] == 1.0
    many = retrieval_metrics(np.array([[1.0, 0, 0, 0]] * 4), np.array([0, 1, 2, 3]), ks=(1,))  # ranks 0..3
    assert many["text_to_image_median_rank"] == 2.0  # floor(1.5) + 1, where median(rank + 1) is 2.5


def test_vqa_grey_and_gray_are_different_answers():
    """The official evaluator has no grey -> gray mapping: ten 'grey's score 'grey' 1.0 and
    'gray' 0; when the annotators disagree, both are scored as given (normalized)."""
    from vl_models.eval.metrics import vqa_accuracy, vqa_answer_scores, vqa_report

    assert vqa_accuracy("grey", ["grey"] * 10) == 1.0 and vqa_accuracy("gray", ["grey"] * 10) == 0.0
    assert vqa_answer_scores(["grey"] * 7 + ["Gray."] * 3) == pytest.approx({"grey": 1.0, "gray": 0.9})
    assert vqa_answer_scores(["Grey"] * 10) == {"Grey": 1.0}  # identical: compared raw, as the evaluator does
    report = vqa_report([{"question_id": 1, "answer": "grey"}], [_vqa_annotation(1, "other", ["grey"] * 10)])
    assert report["overall"] == 100.0


def _vqa_annotation(qid, answer_type, answers):
    return {"question_id": qid, "answer_type": answer_type, "answers": [{"answer": a} for a in answers]}


def test_vqa_report_overall_and_per_answer_type():
    from vl_models.eval.metrics import vqa_report

    annotations = [
        _vqa_annotation(1, "yes/no", ["yes"] * 10),  # "yes": 1.0
        _vqa_annotation(2, "number", ["2"] * 2 + ["3"] * 8),  # "two" -> "2" (normalized: they disagree): 0.6
        _vqa_annotation(3, "other", ["red"] * 3 + ["blue"] * 7),  # "red": 0.9
        _vqa_annotation(4, "other", ["cat"] * 10),  # "dog": 0
    ]
    results = [
        {"question_id": 1, "answer": "yes"},
        {"question_id": 2, "answer": "two"},
        {"question_id": 3, "answer": "red"},
        {"question_id": 4, "answer": "dog"},
    ]
    report = vqa_report(results, annotations)
    assert report == {"overall": 62.5, "perAnswerType": {"number": 60.0, "other": 45.0, "yes/no": 100.0}}
    with pytest.raises(DataError, match="1 missing"):
        vqa_report(results[:3], annotations)
    with pytest.raises(DataError, match="answered twice"):
        vqa_report(results + results[:1], annotations)


def test_gqa_accuracy_binary_open_and_balanced_only():
    from vl_models.eval.metrics import gqa_accuracy

    questions = {
        "1": {"answer": "yes", "types": {"structural": "verify"}, "isBalanced": True},
        "2": {"answer": "red", "types": {"structural": "query"}, "isBalanced": True},
        "3": {"answer": "left", "types": {"structural": "query"}, "isBalanced": True},
        "4": {"answer": "no", "types": {"structural": "logical"}, "isBalanced": False},  # not counted
    }
    predictions = [
        {"questionId": "1", "prediction": "yes"},
        {"questionId": "2", "prediction": "red"},
        {"questionId": "3", "prediction": "Left"},
    ]  # exact match: case counts
    assert gqa_accuracy(predictions, questions) == {"accuracy": 2 / 3, "binary": 1.0, "open": 0.5}
    with pytest.raises(DataError, match="miss 1 balanced"):
        gqa_accuracy(predictions[:2], questions)


def test_nlvr2_accuracy_and_consistency():
    from vl_models.eval.metrics import nlvr2_metrics

    examples = [{"identifier": f"dev-850-{pair}-0", "label": "True"} for pair in range(3)]  # one sentence, 3 pairs
    examples += [{"identifier": f"dev-851-{pair}-1", "label": "False"} for pair in range(2)]  # another sentence
    predictions = {e["identifier"]: "true" for e in examples[:3]}  # case-insensitive, all right
    predictions.update({"dev-851-0-1": "False", "dev-851-1-1": "True"})  # one wrong: the sentence is inconsistent
    assert nlvr2_metrics(predictions, examples) == {"accuracy": 4 / 5, "consistency": 1 / 2}
    with pytest.raises(DataError, match="miss 1 of 5"):
        nlvr2_metrics({k: v for k, v in predictions.items() if k != "dev-850-2-0"}, examples)


def test_box_iou_pairs_and_grounding_accuracy_edges():
    from vl_models.eval.metrics import box_iou_pairs, grounding_accuracy

    truth = np.array([[0, 0, 9, 9]] * 4, np.float32)  # 10 x 10 pixels with +1 widths
    predicted = np.array(
        [
            [0, 0, 9, 9],  # identical: 1
            [0, 0, 9, 4],  # half of it: 50 / 100 = 0.5, not > 0.5
            [0, 0, 9, 5],  # 60 / 100
            [20, 20, 29, 29],
        ],  # disjoint: 0
        np.float32,
    )
    np.testing.assert_allclose(box_iou_pairs(predicted, truth), [1.0, 0.5, 0.6, 0.0])
    assert grounding_accuracy(predicted, truth) == 0.5  # IoU > 0.5 strictly
    assert box_iou_pairs(np.array([[5, 5, 3, 3]]), np.array([[5, 5, 3, 3]]))[0] == 0.0  # no area: no overlap
    with pytest.raises(DataError):
        grounding_accuracy(predicted[:2], truth)


def test_vcr_metrics():
    from vl_models.eval.metrics import vcr_metrics

    m = vcr_metrics([0, 1, 2, 3], [0, 1, 0, 3], [1, 2, 3, 0], [1, 0, 3, 0])
    assert m == {"q2a": 0.75, "qa2r": 0.75, "q2ar": 0.5}


def test_retrieval_hands_the_model_contiguous_query_batches():
    """Each caption is scored against every image in one batch: its text repeated per image as
    a tensor of its own, not a stride-0 view (a compiled backbone recompiles for the stride)."""
    import torch

    from vl_models.config import DataSettings
    from vl_models.eval.evaluate import retrieval

    class Split:  # three images, two captions each; caption row = 10 * image + k
        cfg = DataSettings()

        def captions(self, limit, per_image):
            return [[10 * i + k for k in range(per_image)] for i in range(limit)]

        def image(self, row):
            return {"image_tag": torch.tensor([float(row // 10)])}

        def text(self, row):
            return {"input_ids": torch.tensor([row // 10, 7, 8])}

    seen = []

    class Family:
        def pair_score(self, model, batch):
            seen.append({k: v.is_contiguous() for k, v in batch.items()})
            return -(batch["input_ids"][:, 0] - batch["image_tag"][:, 0]).abs()  # the caption's own image first

    scores = retrieval(Family(), None, Split(), "cpu", limit=3, captions_per_image=2)
    assert scores["eval_retrieval_queries"] == 6 and scores["eval_retrieval_R@1"] == 1.0
    assert len(seen) == 6 and all(all(c.values()) for c in seen), seen


def test_a_metric_is_averaged_over_the_batches_that_have_it():
    """A batch with no item for a metric (NaN: e.g. QA accuracy on a batch of captions) leaves
    that metric's mean as it is instead of pulling it towards 0."""
    from vl_models.eval.evaluate import batch_means

    nan = float("nan")
    means = batch_means([{"qa_acc": 1.0, "mlm_acc": 0.2}, {"qa_acc": nan, "mlm_acc": 0.4}, {"qa_acc": 0.5}])
    assert means == {"qa_acc": 0.75, "mlm_acc": pytest.approx(0.3)}
    assert batch_means([{"qa_acc": nan}]) == {}
