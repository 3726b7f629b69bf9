"""NLVR2 (Suhr et al.): the jsonl files (``identifier``, ``sentence``, the two images named
``{split}-{set}-{pair}-img0/1``, ``label`` "True"/"False"); a pair classifier on the two
images' pooled vectors concatenated (LXMERT's, ViLBERT-MT's), scored by accuracy and
consistency (lil-lab's definitions); the submission is lil-lab's ``identifier,prediction``
CSV."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.sources.base import Malformed, Skip
from pipeline.sources.nlvr2 import read_nlvr2
from vl_models.eval.metrics import nlvr2_metrics
from vl_models.eval.submissions import write_nlvr2_predictions
from vl_models.transfer.task import Row, Task, column, labelled


class Nlvr2(Task):
    name = "nlvr2"
    head = "pair"
    candidates = 2
    files = "train.json, dev.json, test1.json (the jsonl files)"
    metric = "eval_nlvr2_accuracy"
    val_split = "dev"

    def read(self, files):
        for path in map(Path, files):
            for ex in read_nlvr2(path):
                if isinstance(ex, Malformed) or isinstance(ex.sentence, Skip):
                    yield ex if isinstance(ex, Malformed) else ex.sentence
                    continue
                yield Row(
                    uid=ex.identifier,
                    split=ex.split,
                    images=(ex.left_image, ex.right_image),
                    text=ex.sentence,
                    label=None if ex.label is None else int(ex.label),
                )

    def example(self, view, i, rng):
        text = view.text(view.value("text", i))
        pairs = [(text, view.image(key)) for key in view.value("images", i)]
        label = view.value("label", i)
        return {**view.candidates(pairs), "label": np.int64(-100 if label is None else label)}

    def predict(self, logits, batch):
        return {"label": logits.argmax(-1).cpu().numpy()}

    def score(self, data, predictions):
        known = labelled(data, predictions)
        if not len(known):
            return {}
        ids, labels = column(data, "uid", predictions.rows), column(data, "label", predictions.rows)
        predicted = {ids[i]: str(bool(predictions.values["label"][i])) for i in known}
        m = nlvr2_metrics(predicted, [{"identifier": ids[i], "label": str(bool(labels[i]))} for i in known])
        return {"accuracy": 100 * m["accuracy"], "consistency": 100 * m["consistency"]}

    def write_submission(self, data, predictions, folder):
        return write_nlvr2_predictions(
            Path(folder) / "nlvr2_predictions.csv",
            column(data, "uid", predictions.rows),
            [bool(p) for p in predictions.values["label"]],
        )


TASK = Nlvr2()
