"""NLVR2 (Suhr et al.): the jsonl files (``identifier``, ``sentence``, the two images named
``{split}-{set}-{pair}-img0/1``, ``label`` "True"/"False"); a pair classifier on the two
images' pooled vectors concatenated (LXMERT's, ViLBERT-MT's), scored by accuracy and
consistency (lil-lab's definitions); the submission is lil-lab's ``identifier,prediction``
CSV.

Each image of a pair fills its own row of region slots (its IMG token and regions), the
model applied as both references intend. vilbert-multi-task packs them otherwise, which
matters where an image has fewer regions than its slots (its own extraction keeps 100 per
image: then the two agree): `mt_packed`, chosen by the dataset's ``packing`` (``vltrain
evaluate --nlvr2-packing mt``), reproduces it."""

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
        keys = view.value("images", i)
        if view.packing == "mt":
            rows = {**{k: np.stack([v, v]) for k, v in text.items()}, **mt_packed(view, keys)}
        else:
            rows = view.candidates([(text, view.image(key)) for key in keys])
        label = view.value("label", i)
        return {**rows, "label": np.int64(-100 if label is None else label)}

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


def mt_packed(view, keys) -> dict:
    """The two rows of region slots (``visual_feats``, ``visual_pos``, ``visual_mask``, each
    (2, S, ...)) of images `keys` as vilbert-multi-task fills them (``nlvr2_dataset.py``, then
    ``task_utils.py``'s "nlvr" process), S = the view's region slots and the IMG token (its
    ``max_region_num``, 101). Each image is its reader's IMG token (the mean of all its regions,
    the whole image's box) then all its regions (`TaskDataset.image` ``whole``); the first
    image's then the second's fill 2 S slots in that order, the rest cut, the mask set on the
    filled ones, and the 2 S slots are split into two rows of S. So with fewer than S - 1
    regions in the first image, the second image's IMG token and regions begin in the first
    row, and the second row keeps what does not fit there (nothing: a row of padding). The
    reference's attention adds -10000 to every masked slot's score: in a row with no slot set
    that shifts all its scores alike and leaves the softmax unchanged, so such a row attends to
    all its slots; its mask here is set on all of them (ours gives a row with none set no
    attention at all). Each region's 5-d position is its own image's."""
    slots = view.cfg.max_regions + 1
    images = [view.image(key, whole=True) for key in keys]
    rows = {}
    for name in ("visual_feats", "visual_pos"):
        filled = np.concatenate([image[name][image["valid"]] for image in images])[: 2 * slots]
        packed = np.zeros((2 * slots, *filled.shape[1:]), filled.dtype)
        packed[: len(filled)] = filled
        rows[name] = packed.reshape(2, slots, *filled.shape[1:])
    filled = min(sum(int(image["valid"].sum()) for image in images), 2 * slots)
    mask = (np.arange(2 * slots) < filled).astype(np.int64).reshape(2, slots)
    mask[mask.sum(1) == 0] = 1
    rows["visual_mask"] = mask
    return rows


TASK = Nlvr2()
