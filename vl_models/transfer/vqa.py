"""VQA v2 (Antol et al.; Goyal et al.): questions + annotations JSON (train2014, val2014;
test-dev2015 and test2015 questions alone), an answer classifier over the answers given as
``multiple_choice_answer`` at least 9 times in train+val (3,129 in the reference setups),
scored by the official accuracy (overall and per answer type); the submission is the
official results JSON.

The answer table's entries are normalized exactly as the official evaluator normalizes
answers (`pipeline.items.answers.evaluator_answer`, the strings BUTD's ``preprocess_answer``
makes: ``grey`` and ``gray`` are two answers). A row's targets are BUTD's
(``tools/compute_softscore.py`` ``compute_target``, where vilbert-multi-task's cached targets
and LXMERT's VQA labels come from; `pipeline.items.answers.counted_scores`): each annotator
answer counted as given, 0.3 / 0.6 / 0.9 / 1.0 for 1 / 2 / 3 / 4+ annotators, kept where the
table holds that string. An answer given otherwise than its normal form (``t-shirt``, ``Two``)
thus scores no target, as in both references; `vlprep build-task` counts the questions this
leaves without a target, or with other targets than counting normalized answers would give.
Predictions are scored by the official evaluator (`vl_models.eval.metrics.vqa_report`).

Named splits besides train / val / test-dev / test: ``minval``, ViLBERT's (vilbert-multi-task
``vqa_dataset.py`` `_load_dataset`): the val questions sorted by question id, the last 3,000;
it trains on train + (val - minval), less the questions on the images of its
``cache/coco_test_ids.npy`` (``clean_datasets``: `vlprep build-task --test-images`, split
``test_images``): ``train-test_images,val-minval-test_images`` (`pipeline.task_data.TaskData.rows`).
LXMERT's ``minival`` / ``nominival`` come from its published ``minival.json`` /
``nominival.json`` (`vlprep build-task --minival / --nominival`, `vl_models.transfer.build`);
it trains on ``train,nominival``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from pipeline.errors import ConfigError
from pipeline.items.answers import counted_scores, evaluator_answer
from pipeline.sources.base import Malformed, Skip
from pipeline.sources.coco import coco_split
from pipeline.sources.vqa import read_vqa, read_vqa_questions
from vl_models.eval.metrics import vqa_report
from vl_models.eval.submissions import write_vqa_results
from vl_models.transfer.task import Predictions, Row, Task, column

SPLIT_NAMES = {"train2014": "train", "val2014": "val", "test2015": "test"}  # test-dev2015: its images are test2015's
VILBERT_MINVAL = 3000  # the last val questions by question id
# The evaluator's normalization, memoized: millions of annotator answers, a few hundred thousand distinct
_normalized = lru_cache(maxsize=1 << 18)(evaluator_answer)


class Classifier(Task):
    """Answer-classifier tasks (VQA, GQA): one question, one image; soft targets over the table."""

    head = "answers"

    def example(self, view, i, rng):
        text, image = view.text(view.value("text", i)), view.image(view.value("images", i)[0])
        target = np.zeros(len(view.data.answers), np.float32)
        ids, scores = view.value("answer_ids", i) or [], view.value("answer_scores", i) or []
        target[ids] = scores
        return {**view.candidates([(text, image)]), "target": target}

    def predict(self, logits, batch):
        return {"answer": logits.argmax(-1).cpu().numpy()}

    def answers_of(self, data, predictions: Predictions) -> list[str]:
        return [data.answers[int(a)] for a in predictions.values["answer"]]


class Vqa(Classifier):
    name = "vqa"
    files = (
        "v2_OpenEnded_mscoco_<split>_questions.json, each followed by its v2_mscoco_<split>_annotations.json "
        "(test-dev2015 / test2015 questions alone)"
    )
    metric = "eval_vqa_accuracy"
    min_count = 9

    def read(self, files):
        files = [Path(f) for f in files]
        i = 0
        while i < len(files):
            questions = files[i]
            split = (
                "test-dev" if "test-dev2015" in questions.name else SPLIT_NAMES.get(coco_split(questions.name) or "")
            )
            if split is None:
                raise ConfigError(
                    f"{questions.name}: not a VQA v2 questions file (train2014, val2014, test-dev2015, test2015)"
                )
            has_answers = split in ("train", "val")
            if has_answers and (i + 1 >= len(files) or "annotations" not in files[i + 1].name):
                raise ConfigError(f"{questions.name}: its annotations file must follow it in the file list")
            reader = read_vqa(questions, files[i + 1]) if has_answers else read_vqa_questions(questions)
            i += 2 if has_answers else 1
            for q in reader:
                if isinstance(q, (Skip, Malformed)):
                    yield q
                    continue
                yield Row(
                    uid=str(q.question_id),
                    split=split,
                    images=(q.image,),
                    text=q.text,
                    answers=list(q.answers) if has_answers else None,
                    answer_type=q.answer_type or None,
                    question_type=q.question_type or None,
                    answer=q.multiple_choice_answer or None,
                )

    def named_splits(self, rows):
        """ViLBERT's ``minval``: the val questions sorted by question id, the last 3,000."""
        val = sorted((i for i, r in enumerate(rows) if r.split == "val"), key=lambda i: int(rows[i].uid))
        return {"minval": sorted(val[-VILBERT_MINVAL:])}

    test_images_file = "coco_test_ids.npy"  # 12-in-1's clean_datasets list (cache/ beside its VQA data)

    def targets(self, row):
        """BUTD's: the annotators' answers counted as given (`counted_scores`)."""
        return counted_scores(row.answers) if row.answers else {}

    def normalized_targets(self, row) -> dict[str, float]:
        """The targets counting the answers normalized as the table is (what BUTD's
        ``compute_target`` docstring asks for and its code does not do): for the build report's
        count of the questions the references' raw comparison affects."""
        return counted_scores(map(_normalized, row.answers)) if row.answers else {}

    def table_answer(self, answer):
        return _normalized(answer)

    def score(self, data, predictions):
        rows = predictions.rows
        annotators = column(data, "answers", rows)
        known = [i for i, a in enumerate(annotators) if a]
        if not known:
            return {}
        answers, types = self.answers_of(data, predictions), column(data, "answer_type", rows)
        report = vqa_report(
            [{"question_id": i, "answer": answers[i]} for i in known],
            [
                {
                    "question_id": i,
                    "answer_type": types[i] or "other",
                    "answers": [{"answer": a} for a in annotators[i]],
                }
                for i in known
            ],
        )
        return {
            "accuracy": report["overall"],
            **{f"accuracy_{t.replace('/', '_')}": v for t, v in report["perAnswerType"].items()},
        }

    def write_submission(self, data, predictions, folder):
        return write_vqa_results(
            Path(folder) / "vqa_results.json",
            [int(u) for u in column(data, "uid", predictions.rows)],
            self.answers_of(data, predictions),
        )


TASK = Vqa()
