"""Referring expressions: RefCOCO+ (and RefCOCO, RefCOCOg): the ``refs(unc).p`` pickle
(read by the restricted unpickler) and COCO's ``instances.json``, one row per sentence (its
``raw`` text, as vilbert-multi-task reads it) with the referred box; splits train / val /
testA / testB (RefCOCOg: train / val / test). vilbert-multi-task trains on train less the refs
on the images of its ``cache/coco_test_ids.npy`` (``clean_datasets``: `vlprep build-task
--test-images`, split ``test_images``).

The region candidates are as vilbert-multi-task's ``refer_expression_dataset.py`` builds
them: the detections (the feature stores, `vlprep extract`) with the IMG token first (for a
family that has one: its box the whole image, ``0, 0, W, H``, a candidate with its own IoU
target); in training followed by the ground-truth boxes of the image (the dataset's
``given_stores``: `vlprep extract --given-boxes given_boxes.json`, the file build-task writes
into the task folder), as many as the region slots hold after the detections; in evaluation
the detections alone, so the referred object's own box is never a candidate. Each
candidate's target is its IoU with the referred box (+1-pixel widths), values below 0.5 set
to 0 (the reference's); a per-region scorer is trained with BCE, and an expression counts as
right when its best-scored candidate overlaps the referred box by IoU > 0.5
(`metrics.grounding_accuracy`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.errors import ConfigError
from pipeline.io import atomic_write_json
from pipeline.sources.base import Malformed, Skip
from pipeline.sources.refcoco import annotation_boxes, read_refs
from vl_models.eval.metrics import box_iou_pairs, grounding_accuracy
from vl_models.transfer.task import Row, Task, column

TARGET_IOU = 0.5
GIVEN_BOXES = "given_boxes.json"  # written into the task folder by build-task: the ground-truth boxes to extract


class Referring(Task):
    ground_truth = "train"
    head = "regions"
    max_text = 20  # ViLBERT-MT's
    # 12-in-1's clean_datasets list (cache/ beside its RefCOCO data): refer_expression_dataset.py
    # drops the refs on these COCO images from "train" (build-task --test-images: split test_images)
    test_images_file = "coco_test_ids.npy"

    def __init__(self, name: str, refs: str):
        self.name, self.metric = name, f"eval_{name}_accuracy"
        self.files = f"{refs} then instances.json (COCO)"

    def read(self, files):
        files = [Path(f) for f in files]
        if len(files) != 2:
            raise ConfigError(f"{self.name} reads two files: the refs pickle, then COCO's instances.json")
        for ref in read_refs(files[0], files[1]):
            if isinstance(ref, (Skip, Malformed)):
                yield ref
                continue
            yield Row(
                uid=f"{ref.ref_id}-{ref.sent_id}",
                split=ref.split,
                images=(ref.image,),
                text=ref.sentence,
                box=[float(v) for v in ref.box],
                group=str(ref.ref_id),
            )

    def extra_files(self, files, rows):
        """``given_boxes.json``: every COCO annotation's box on the task's images, by image name
        (`vlprep extract --given-boxes`: ground-truth region candidates, as ViLBERT's training adds)."""
        return {GIVEN_BOXES: annotation_boxes(Path(files[1]), {r.images[0] for r in rows})}

    def example(self, view, i, rng):
        image = view.image(view.value("images", i)[0], ground_truth="fill" if view.train else None)
        box = np.asarray(view.value("box", i), np.float32)
        iou = (box_iou_pairs(image["boxes"], np.broadcast_to(box, image["boxes"].shape)) * image["valid"]).astype(
            np.float32
        )
        return {
            **view.candidates([(view.text(view.value("text", i)), image)]),
            "boxes": image["boxes"],
            "region_iou": iou,
            "region_target": np.where(iou >= TARGET_IOU, iou, 0).astype(np.float32),
            "region_valid": image["valid"],
        }

    def predict(self, logits, batch):
        region = logits.argmax(-1)
        boxes = batch["boxes"][np.arange(len(region)), region.cpu()]
        return {"region": region.cpu().numpy(), "box": boxes.cpu().numpy()}

    def score(self, data, predictions):
        truth = np.asarray(column(data, "box", predictions.rows), np.float64)
        return {"accuracy": 100 * grounding_accuracy(predictions.values["box"], truth)}

    def write_submission(self, data, predictions, folder):
        """Each expression's chosen box (no official format: ours, JSON)."""
        rows = [
            {"ref_sent": uid, "box": [float(v) for v in box]}
            for uid, box in zip(column(data, "uid", predictions.rows), predictions.values["box"])
        ]
        path = Path(folder) / f"{self.name}_predictions.json"
        atomic_write_json(path, rows)
        return path


REFCOCO_PLUS = Referring("refcoco+", "refs(unc).p")
REFCOCO = Referring("refcoco", "refs(unc).p")
REFCOCOG = Referring("refcocog", "refs(umd).p")
