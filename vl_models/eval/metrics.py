"""Pure metrics, each matching an official evaluator or a reference's evaluation code.

* retrieval: `ranks` (the one ranking rule), `recall_at_k`, `retrieval_metrics` (both
  directions, R@1/5/10, median and mean rank, as ViLBERT's ``eval_retrieval.py`` reports);
* VQA: `vqa_score` (stored soft scores), `vqa_answer_scores` (the official accuracy of
  every answer that scores on a question), `vqa_accuracy` /
  `vqa_official_accuracy` (one answer, and overall) and `vqa_report` (the official tool's
  overall and per-answer-type);
* GQA: `gqa_accuracy` (the official ``eval.py``'s accuracy, binary and open);
* NLVR2: `nlvr2_metrics` (accuracy and consistency, as lil-lab/nlvr's ``metrics.py``);
* referring expressions: `box_iou_pairs` (+1 pixel widths) and `grounding_accuracy`
  (IoU > 0.5, ViLBERT's rule);
* VCR: `vcr_metrics` (Q->A, QA->R, Q->AR).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Mapping, Sequence

import numpy as np

from pipeline.errors import DataError
from pipeline.items.answers import evaluator_answer, strip_answer


def ranks(scores: np.ndarray, right: np.ndarray) -> np.ndarray:
    """(queries,) 0-based rank of each query's best-ranked right candidate: `scores` is
    (queries x candidates), `right` a boolean matrix of the same shape (each row has a
    right candidate). Candidates are ordered by score, highest first; equal scores keep
    their candidate order (a stable sort), so ties are broken by index, deterministically."""
    if scores.shape != right.shape or not right.any(axis=1).all():
        raise DataError(
            f"ranks: scores {scores.shape} and right {right.shape} differ, or a query has no right candidate"
        )
    order = np.argsort(-scores, axis=1, kind="stable")
    return np.argmax(np.take_along_axis(right, order, axis=1), axis=1)


def recall_at_k(scores: np.ndarray, truth: np.ndarray, ks=(1, 5, 10)) -> dict[str, float]:
    """scores (queries x candidates); truth (queries,) index of the right candidate."""
    right = np.arange(scores.shape[1])[None] == np.asarray(truth)[:, None]
    found = ranks(scores, right)
    return {f"R@{k}": float(np.mean(found < k)) for k in ks}


def retrieval_metrics(scores: np.ndarray, image_of_caption: np.ndarray, ks=(1, 5, 10)) -> dict[str, float]:
    """Caption -> image and image -> caption retrieval over a whole test set: `scores` is
    (captions x images), `image_of_caption` (captions,) the index of each caption's image.
    Caption -> image ranks the images for each caption; image -> caption ranks all captions
    for each image and takes its best-ranked own caption (of its 5). For each direction:
    R@K, and the median and mean 1-based rank as ViLBERT's ``eval_retrieval.py`` reports
    them: ``floor(median(rank)) + 1`` over the 0-based ranks (an even count's median between
    two ranks rounds down: ranks 1 and 2 have median rank 1, not 1.5) and ``mean(rank) + 1``."""
    image_of_caption = np.asarray(image_of_caption)
    right = np.arange(scores.shape[1])[None] == image_of_caption[:, None]  # (captions, images)
    out = {}
    for direction, found in (("text_to_image", ranks(scores, right)), ("image_to_text", ranks(scores.T, right.T))):
        out.update({f"{direction}_R@{k}": float(np.mean(found < k)) for k in ks})
        out[f"{direction}_median_rank"] = float(np.floor(np.median(found)) + 1)
        out[f"{direction}_mean_rank"] = float(np.mean(found + 1))
    return out


def vqa_score(predicted: np.ndarray, answer_ids: list[list[int]], answer_scores: list[list[float]]) -> float:
    """Mean stored soft score of the predicted answers (VQA accuracy as LXMERT reports it).

    For a VQA question with 10 annotators the stored score (`soft_scores`: 0.3 / 0.6 / 0.9 /
    1.0 for 1 / 2 / 3 / 4+ annotators) is the official accuracy (`vqa_accuracy`) of that
    answer. It is not when the annotator count is not 10 (the official average over the
    annotators differs: 1 of 5 scores 0.27, stored 0.3), when a mixture's normalization merges
    what the official tool keeps apart (LXMERT's grey -> gray; ten identical answers not in
    normal form, which the official tool compares raw), and GQA / VG-QA store 1.0 for their
    single answer. The VQA task's targets are BUTD's counted scores
    (`pipeline.items.answers.counted_scores`)."""
    total = 0.0
    for pred, ids, scores in zip(predicted, answer_ids, answer_scores):
        total += dict(zip(ids, scores)).get(int(pred), 0.0)
    return total / max(len(predicted), 1)


def vqa_answer_scores(annotator_answers: Sequence[str]) -> dict[str, float]:
    """The official VQA accuracy (0..1, GT-Vision-Lab/VQA's ``vqaEval.py`` `evaluate`, master
    after its 2021 fix) of every answer that scores on a question, by the answer as the
    evaluator compares it (every other answer scores 0):

    - newlines and tabs become spaces and outer whitespace is stripped, on both sides;
    - only when the annotators' answers are not all identical, both the prediction and the
      answers are normalized (`pipeline.items.answers.evaluator_answer`: punctuation, digits
      and articles; no LXMERT rules, so ``grey`` and ``gray`` are different answers);
      otherwise the strings are compared as they are (case included);
    - annotator i scores min(1, matches among the other annotators / 3); the scores are
      averaged. For 10 annotators: 0.3 / 0.6 / 0.9 / 1.0 for 1 / 2 / 3 / 4+ matches.
    """
    answers = [strip_answer(a) for a in annotator_answers]
    if not answers:
        raise DataError("vqa_accuracy: no annotator answers for the question")
    if len(set(answers)) > 1:
        answers = [evaluator_answer(a) for a in answers]
    scores = {
        answer: sum(min(1.0, (n - (a == answer)) / 3) for a in answers) / len(answers)
        for answer, n in Counter(answers).items()
    }
    return {answer: score for answer, score in scores.items() if score > 0}


def vqa_accuracy(predicted: str, annotator_answers: Sequence[str]) -> float:
    """The official VQA accuracy (0..1) of one predicted answer (`vqa_answer_scores`: the
    prediction is normalized as the annotators' answers are, only when they disagree)."""
    scores = vqa_answer_scores(annotator_answers)
    pred = strip_answer(predicted)
    if len(set(map(strip_answer, annotator_answers))) > 1:
        pred = evaluator_answer(pred)
    return scores.get(pred, 0.0)


def vqa_official_accuracy(predicted: Sequence[str], annotator_answers: Sequence[Sequence[str]]) -> float:
    """The official tool's overall VQA accuracy: 100 x the mean of `vqa_accuracy` over the
    questions, rounded to 2 decimals."""
    if len(predicted) != len(annotator_answers) or not predicted:
        raise DataError(f"vqa_official_accuracy: {len(predicted)} predictions for {len(annotator_answers)} questions")
    return round(100 * sum(vqa_accuracy(p, a) for p, a in zip(predicted, annotator_answers)) / len(predicted), 2)


def vqa_report(results: Sequence[Mapping], annotations: Sequence[Mapping]) -> dict:
    """The official VQA evaluator's ``accuracy``: ``{"overall": %, "perAnswerType": {type:
    %}}``, each the mean of `vqa_accuracy` over its questions x 100, rounded to 2 decimals.
    `results` is the results JSON (``[{"question_id", "answer"}]``), `annotations` the
    annotation file's ``annotations`` (``question_id``, ``answer_type``, ten ``answers``).
    As the official tool, the results must answer exactly the annotated questions."""
    predicted = {r["question_id"]: r["answer"] for r in results}
    truth = {a["question_id"]: a for a in annotations}
    if set(predicted) != set(truth) or len(predicted) != len(results):
        missing, extra = sorted(set(truth) - set(predicted)), sorted(set(predicted) - set(truth))
        raise DataError(
            f"VQA results do not answer the annotated questions: {len(missing)} missing (e.g. "
            f"{missing[:3]}), {len(extra)} not annotated (e.g. {extra[:3]}), "
            f"{len(results) - len(predicted)} answered twice"
        )
    by_type: dict[str, list[float]] = defaultdict(list)
    every = []
    for qid, ann in truth.items():
        acc = vqa_accuracy(predicted[qid], [a["answer"] for a in ann["answers"]])
        every.append(acc)
        by_type[ann["answer_type"]].append(acc)

    def percent(values: list[float]) -> float:
        return round(100 * sum(values) / len(values), 2)

    return {"overall": percent(every), "perAnswerType": {t: percent(v) for t, v in sorted(by_type.items())}}


def gqa_accuracy(predictions: Sequence[Mapping], questions: Mapping[str, Mapping]) -> dict[str, float]:
    """GQA's official accuracy (``eval.py``) over the balanced questions: exact match of the
    prediction with the answer, overall and split into ``binary`` and ``open`` (open: the
    question's structural type is ``query``). `predictions` is the submission format
    (``[{"questionId", "prediction"}]``), `questions` the questions JSON (``{qid: {answer,
    types: {structural}, isBalanced}}``; no ``isBalanced`` counts as balanced). Fractions."""
    predicted = {str(p["questionId"]): p["prediction"] for p in predictions}
    scores: dict[str, list[float]] = defaultdict(list)
    missing = []
    for qid, question in questions.items():
        if not question.get("isBalanced", True):
            continue
        if str(qid) not in predicted:
            missing.append(qid)
            continue
        score = float(predicted[str(qid)] == question["answer"])
        scores["accuracy"].append(score)
        structural = (question.get("types") or {}).get("structural")
        if structural is not None:
            scores["open" if structural == "query" else "binary"].append(score)
    if missing:
        raise DataError(f"GQA predictions miss {len(missing)} balanced question(s), e.g. {missing[:3]}")
    return {k: sum(v) / len(v) for k, v in scores.items()}


def nlvr2_metrics(predictions: Mapping[str, str], examples: Sequence[Mapping]) -> dict[str, float]:
    """NLVR2's accuracy and consistency as lil-lab/nlvr's ``metrics.py`` computes them:
    `predictions` maps each identifier to ``"True"``/``"False"`` (compared with the label
    case-insensitively); consistency is the share of sentences (identifiers with their
    third part, the image pair, blanked: ``dev-850-X-0``) whose every example is right.
    Every example needs a prediction (DataError naming the missing ones)."""
    missing = [e["identifier"] for e in examples if e["identifier"] not in predictions]
    if missing or not examples:
        raise DataError(f"NLVR2 predictions miss {len(missing)} of {len(examples)} examples, e.g. {missing[:3]}")
    correct = 0
    consistent: dict[str, bool] = {}
    for example in examples:
        parts = example["identifier"].split("-")
        parts[2] = ""
        sentence = "-".join(parts)
        right = str(predictions[example["identifier"]]).lower() == str(example["label"]).lower()
        correct += right
        consistent[sentence] = consistent.get(sentence, True) and right
    return {"accuracy": correct / len(examples), "consistency": sum(consistent.values()) / len(consistent)}


def box_iou_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of each box in `a` with the box at the same position in `b` (both (N, 4) x1y1x2y2,
    pixels), with +1 pixel widths and heights as ViLBERT's referring-expression code (and
    Caffe) count them; a box with no area overlaps nothing."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    w = np.clip(np.minimum(a[:, 2], b[:, 2]) - np.maximum(a[:, 0], b[:, 0]) + 1, 0, None)
    h = np.clip(np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1]) + 1, 0, None)
    inter = w * h

    def area(x: np.ndarray) -> np.ndarray:
        return np.clip(x[:, 2] - x[:, 0] + 1, 0, None) * np.clip(x[:, 3] - x[:, 1] + 1, 0, None)

    union = area(a) + area(b) - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def grounding_accuracy(predicted: np.ndarray, truth: np.ndarray, threshold: float = 0.5) -> float:
    """Referring-expression accuracy: the share of expressions whose chosen region overlaps
    the referred box by IoU > `threshold` (strictly; ViLBERT's RefCOCO+ evaluation)."""
    if len(predicted) != len(truth) or not len(truth):
        raise DataError(f"grounding_accuracy: {len(predicted)} predicted boxes for {len(truth)} expressions")
    return float(np.mean(box_iou_pairs(predicted, truth) > threshold))


def vcr_metrics(
    answer_pred: Sequence[int],
    answer_label: Sequence[int],
    rationale_pred: Sequence[int],
    rationale_label: Sequence[int],
) -> dict[str, float]:
    """VCR's three accuracies: Q->A (the answer), QA->R (the rationale, given the right
    answer) and Q->AR (both right)."""
    a = np.asarray(answer_pred) == np.asarray(answer_label)
    r = np.asarray(rationale_pred) == np.asarray(rationale_label)
    if a.shape != r.shape or not a.size:
        raise DataError(f"vcr_metrics: {a.size} answer and {r.size} rationale predictions")
    return {"q2a": float(a.mean()), "qa2r": float(r.mean()), "q2ar": float((a & r).mean())}
