"""Submissions in the official formats: read back the way the official tools read them,
they score as the predictions do."""

import csv
import json

import numpy as np
import pytest

from pipeline.errors import DataError
from vl_models.eval.metrics import gqa_accuracy, nlvr2_metrics, vcr_metrics, vqa_report
from vl_models.eval.submissions import (
    VCR_COLUMNS,
    write_gqa_predictions,
    write_nlvr2_predictions,
    write_vcr_submission,
    write_vqa_results,
)


def test_vqa_results_json_scores_with_the_official_report(tmp_path):
    annotations = [
        {"question_id": 7, "answer_type": "yes/no", "answers": [{"answer": "yes"}] * 10},
        {"question_id": 8, "answer_type": "other", "answers": [{"answer": "red"}] * 10},
    ]
    path = write_vqa_results(tmp_path / "vqa.json", np.array([7, 8]), ["yes", "blue"])
    results = json.loads(path.read_text())
    assert results == [{"question_id": 7, "answer": "yes"}, {"question_id": 8, "answer": "blue"}]
    assert vqa_report(results, annotations)["overall"] == 50.0
    with pytest.raises(DataError, match="1 predictions for 2 ids"):
        write_vqa_results(tmp_path / "bad.json", [7, 8], ["yes"])


def test_gqa_predictions_json(tmp_path):
    path = write_gqa_predictions(tmp_path / "gqa.json", ["20968", "20969"], ["yes", "left"])
    predictions = json.loads(path.read_text())
    assert predictions[0] == {"questionId": "20968", "prediction": "yes"}
    questions = {"20968": {"answer": "yes"}, "20969": {"answer": "right"}}
    assert gqa_accuracy(predictions, questions)["accuracy"] == 0.5


def test_nlvr2_csv_is_read_as_lil_labs_metrics_reads_it(tmp_path):
    ids = ["dev-1-0-0", "dev-1-1-0"]
    path = write_nlvr2_predictions(tmp_path / "nlvr2.csv", ids, [True, False])
    predictions = dict(line.strip().split(",") for line in path.read_text().splitlines() if line)
    assert predictions == {"dev-1-0-0": "True", "dev-1-1-0": "False"}
    examples = [{"identifier": i, "label": "True"} for i in ids]
    assert nlvr2_metrics(predictions, examples) == {"accuracy": 0.5, "consistency": 0.0}
    with pytest.raises(DataError, match="listed twice"):
        write_nlvr2_predictions(tmp_path / "x.csv", ids[:1] * 2, [True, True])


def test_vcr_leaderboard_csv(tmp_path):
    rng = np.random.default_rng(0)
    answers = rng.dirichlet(np.ones(4), size=3)
    rationales = rng.dirichlet(np.ones(4), size=(3, 4))
    path = write_vcr_submission(tmp_path / "vcr.csv", ["test-0", "test-1", "test-2"], answers, rationales)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == VCR_COLUMNS and len(VCR_COLUMNS) == 21 and len(rows) == 3
    read_answers = np.array([[float(r[f"answer_{i}"]) for i in range(4)] for r in rows])
    np.testing.assert_array_equal(read_answers, answers)  # exact: repr round-trips floats
    assert float(rows[1]["rationale_conditioned_on_a2_3"]) == rationales[1, 2, 3]
    # the leaderboard's reading: argmax answer; the rationale conditioned on the right answer
    labels_a, labels_r = [0, 1, 2], [3, 2, 1]
    picked_a = read_answers.argmax(1)
    picked_r = [
        int(np.argmax([float(r[f"rationale_conditioned_on_a{a}_{j}"]) for j in range(4)]))
        for r, a in zip(rows, labels_a)
    ]
    assert vcr_metrics(picked_a, labels_a, picked_r, labels_r) == vcr_metrics(
        answers.argmax(1), labels_a, rationales[np.arange(3), labels_a].argmax(1), labels_r
    )
    with pytest.raises(DataError, match="expected"):
        write_vcr_submission(tmp_path / "bad.csv", ["a"], answers[:1], rationales[:1, :3])
    with pytest.raises(DataError, match="not finite"):
        write_vcr_submission(tmp_path / "bad.csv", ["a"], np.full((1, 4), np.nan), rationales[:1])
