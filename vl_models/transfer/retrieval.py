"""Image-text retrieval on the Karpathy splits: Flickr30k (``dataset_flickr30k.json``: 1,000
test images x 5 captions) and COCO (``dataset_coco.json``: 5,000 test images), one row per
caption.

Training is 4-way (ViLBERT's): the caption with its image, then three negatives — another
image's caption with this image, this caption with another image, and one more caption of
another image (ViLBERT draws this one from a precomputed hard-negative pool; we draw it at
random) — with cross-entropy over the pretraining pair head's logits (`heads.RetrievalHead`:
no new parameters, so ``--zero-shot`` evaluation scores with the same head). Evaluation
scores every caption against every image of the split (`evaluate.score_pairs`) and reports
R@1/5/10 both ways and the median / mean rank (`metrics.retrieval_metrics`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.io import atomic_write_json
from pipeline.sources.base import Malformed, Skip
from pipeline.sources.karpathy import read_karpathy
from vl_models.eval.metrics import retrieval_metrics
from vl_models.transfer.task import Row, Task, column


class Retrieval(Task):
    head = "retrieval"
    candidates = 4
    pairwise = True  # evaluation scores all caption x image pairs of a split
    val_split = "test"
    max_text = 30  # ViLBERT-MT's

    def __init__(self, name: str, file: str):
        self.name, self.files, self.metric = (name, f"{file} (Karpathy's split file)", f"eval_{name}_text_to_image_R@1")

    def read(self, files):
        for path in map(Path, files):
            for image in read_karpathy(path):
                if isinstance(image, (Skip, Malformed)):
                    yield image
                    continue
                for sid, caption in zip(image.sentence_ids, image.captions):
                    yield Row(uid=str(sid), split=image.split, images=(image.image,), text=caption, group=image.image)

    def _other(self, view, i: int, rng: np.random.Generator) -> int:
        """A random row of the split whose image is not row i's."""
        group = view.value("group", i)
        for _ in range(20):
            j = int(rng.integers(len(view.rows)))
            if view.value("group", j) != group:
                return j
        return (i + 1) % len(view.rows)

    def example(self, view, i, rng):
        image = view.image(view.value("images", i)[0])
        text = view.text(view.value("text", i))
        a, b, c = (self._other(view, i, rng) for _ in range(3))
        pairs = [
            (text, image),
            (view.text(view.value("text", a)), image),
            (text, view.image(view.value("images", b)[0])),
            (view.text(view.value("text", c)), image),
        ]
        return {**view.candidates(pairs), "label": np.int64(0)}

    def score(self, data, predictions):
        scores, image_of_caption = predictions.values["scores"], predictions.values["image_of_caption"]
        metrics = retrieval_metrics(scores, image_of_caption)
        return {k: 100 * v if "_R@" in k else v for k, v in metrics.items()}  # recalls in %, as the papers

    def write_submission(self, data, predictions, folder):
        """Each caption's ten best images, best first (no official format: ours, JSON)."""
        images = predictions.values["images"]
        top = np.argsort(-predictions.values["scores"], axis=1, kind="stable")[:, :10]
        rows = [
            {"caption_id": uid, "images": [images[j] for j in best]}
            for uid, best in zip(column(data, "uid", predictions.rows), top)
        ]
        path = Path(folder) / f"{self.name}_rankings.json"
        atomic_write_json(path, rows)
        return path


FLICKR30K = Retrieval("flickr30k", "dataset_flickr30k.json")
COCO = Retrieval("coco-retrieval", "dataset_coco.json")
