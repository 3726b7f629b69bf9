"""GQA (Hudson & Manning): the balanced questions JSON (``{qid: {imageId, question, answer,
...}}``; train, val, testdev; the submission file without answers; the named split
``minval``, 12-in-1's: the last 3,000 of train + val sorted by question id, the ids compared as
the strings GQA writes them, ``"05451384"``), an answer classifier
over the train+val answers (or exactly the seeds' tables: LXMERT's 1,842 answers, ViLBERT's
1,533, with ``--answers-from``), scored by exact match; the submission is the official
``[{"questionId", "prediction"}]`` JSON. 12-in-1 trains on (train + val) - minval less the
questions on the Visual Genome images of its ``cache/genome_test_ids.npy`` (``clean_datasets``:
`vlprep build-task --test-images`, split ``test_images``)."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import ConfigError
from pipeline.sources.base import Malformed, Skip
from pipeline.sources.gqa import read_questions
from vl_models.eval.metrics import gqa_accuracy
from vl_models.eval.submissions import write_gqa_predictions
from vl_models.transfer.task import Row, column
from vl_models.transfer.vqa import VILBERT_MINVAL, Classifier

# The file name's first part -> the split (train_balanced_questions.json, testdev_balanced_..., submission_all_...)
SPLIT_NAMES = {
    "train": "train",
    "val": "val",
    "testdev": "testdev",
    "test": "test",
    "challenge": "challenge",
    "submission": "submission",
}


class Gqa(Classifier):
    name = "gqa"
    files = "<split>_balanced_questions.json (train, val, testdev, test), submission_all_questions.json"
    metric = "eval_gqa_accuracy"

    def read(self, files):
        for path in map(Path, files):
            split = SPLIT_NAMES.get(path.name.split("_", 1)[0])
            if split is None:
                raise ConfigError(
                    f"{path}: a GQA file's name starts with its split and '_' ({', '.join(SPLIT_NAMES)}): {self.files}"
                )
            for q in read_questions(path, answers_required=False):
                if isinstance(q, (Skip, Malformed)):
                    yield q
                    continue
                yield Row(
                    uid=q.question_id,
                    split=split,
                    images=(q.image,),
                    text=q.text,
                    answers=[q.answer] if q.answer is not None else None,
                    answer=q.answer,
                )

    test_images_file = "genome_test_ids.npy"  # 12-in-1's clean_datasets list (cache/ beside its GQA data)

    def named_splits(self, rows):
        """12-in-1's ``minval`` (`vilbert/datasets/gqa_dataset.py` `_load_dataset`): train + val
        sorted by question id, the last 3,000 (its ``trainval``, the rest: ``train-minval,val-minval``:
        minval holds train questions as well as val ones).
        Its cached items keep GQA's question ids as the JSON keys they are (strings: the entry it
        makes of an item converts ``int(item["question_id"])`` after sorting), so they are sorted
        as strings: ``"10000000"`` before ``"9999999"``; a stable sort, file order among equals."""
        both = [i for i, r in enumerate(rows) if r.split in ("train", "val")]
        both.sort(key=lambda i: rows[i].uid)
        return {"minval": sorted(both[-VILBERT_MINVAL:])}

    def targets(self, row):
        return {row.answer: 1.0} if row.answer is not None else {}

    def score(self, data, predictions):
        truth = column(data, "answers", predictions.rows)
        known = [i for i, a in enumerate(truth) if a]
        if not known:
            return {}
        answers = self.answers_of(data, predictions)
        scores = gqa_accuracy(
            [{"questionId": i, "prediction": answers[i]} for i in known],
            {str(i): {"answer": truth[i][0]} for i in known},
        )
        return {"accuracy": 100 * scores["accuracy"]}

    def write_submission(self, data, predictions, folder):
        return write_gqa_predictions(
            Path(folder) / "gqa_predictions.json",
            column(data, "uid", predictions.rows),
            self.answers_of(data, predictions),
        )


TASK = Gqa()
