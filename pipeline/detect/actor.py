"""The detector as a Ray actor, and the device it runs on.

`resolve_device` turns ``--device`` into the device the actors use (``auto``: CUDA when
the Ray cluster has GPUs: the driver may run on a node without one). `DetectorActor`
loads one detector once and turns a shard's image rows into `RegionFeatures` records,
saying which node did the work (`distribute.this_node`): every image that cannot be used
fails alone, with a named reason (`image_failure`) — a row that failed earlier keeps its
reason, an image that does not decode (`pipeline.images.load_rgb`) or a model error on
it (after a failed batch its images are tried one by one) costs that image, never its
shard.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

from pipeline.detect.backends import build_extractor, detector_from_json, load_model
from pipeline.detect.config import SelectionConfig
from pipeline.distribute import this_node
from pipeline.download.fetch import redact_url
from pipeline.errors import ConfigError
from pipeline.images import ImageError, load_rgb

log = logging.getLogger(__name__)


def resolve_device(device: str, cluster_gpus: float) -> str:
    """The device ``--device`` names, given the GPUs of the Ray cluster the actors run on
    (``auto``: cuda when it has any, else cpu)."""
    if device == "auto":
        return "cuda" if cluster_gpus else "cpu"
    if device.startswith("cuda") and not cluster_gpus:
        raise ConfigError(f"--device {device} asked for, but the Ray cluster has no GPU")
    return device


def image_failure(row: dict, kind: str, detail: str, transient: bool = False) -> dict:
    """The failed-image entry of a shard's extract stats (URL credentials removed)."""
    url = row.get("url")
    return {
        "image_id": row["image_id"],
        "url": redact_url(url) if url else None,
        "kind": kind,
        "detail": (detail or "")[:500],
        "transient": transient,
    }


def extract_failure(row: dict, err: Exception) -> dict:
    """The failed-image entry of an extractor's error on one image: its own reason where it
    names one (a grid smaller than --grid-pool), else ``extract error``."""
    return image_failure(row, getattr(err, "kind", "extract error"), f"{type(err).__name__}: {err}")


class DetectorActor:
    """Holds one extractor (its model loaded once, through the backend registry) and turns a
    shard's image rows into records. `detector` is ``Detector.to_json()``; `options` the
    backend's own (``grid_pool``)."""

    def __init__(
        self,
        detector: dict,
        weights: Optional[str],
        seed: int,
        selection: Optional[SelectionConfig],
        device: str,
        fp16: bool,
        batch_size: int,
        given_boxes: Optional[dict] = None,
        preprocess: Optional[str] = None,
        options: Optional[dict] = None,
    ):
        det = detector_from_json(detector)
        model, _ = load_model(det, weights, seed)
        self.extractor = build_extractor(
            det, model, selection=selection, preprocess=preprocess, device=device, fp16=fp16, **(options or {})
        )
        self.batch_size = batch_size
        self.given = given_boxes

    def pid(self) -> int:
        return os.getpid()

    def extract(self, number: int, rows: list[dict]) -> dict:
        records, failures = [], []
        ready = []
        for row in rows:
            if row["status"] != "ok":
                failures.append(
                    image_failure(row, row["error_kind"], row.get("error") or "", bool(row.get("transient")))
                )
                continue
            if self.given is not None and row["image_id"] not in self.given:
                failures.append(
                    image_failure(row, "no given boxes", "the --given-boxes file has no boxes for this image")
                )
                continue
            try:
                ready.append((row, load_rgb(row["image"])))
            except ImageError as err:
                failures.append(image_failure(row, err.kind, err.detail))
            except Exception as err:  # a bug must cost one image, not its shard
                log.exception("image %s: unexpected error while decoding", row["image_id"])
                failures.append(image_failure(row, "internal error", f"{type(err).__name__}: {err}"))
        for start in range(0, len(ready), self.batch_size):
            batch = ready[start : start + self.batch_size]
            try:
                records += self._run([img for _, img in batch], [row["image_id"] for row, _ in batch])
            except Exception as err:  # a model failure on one batch: try its images one by one
                if len(batch) == 1:
                    failures.append(extract_failure(batch[0][0], err))
                    continue
                for row, img in batch:
                    try:
                        records += self._run([img], [row["image_id"]])
                    except Exception as one:
                        failures.append(extract_failure(row, one))
        return {"number": number, "records": records, "failures": failures, "node": this_node()}

    def _run(self, images: list, ids: list[str]) -> list:
        given = [self.given[i] for i in ids] if self.given is not None else None
        return self.extractor(images, ids, given_boxes=given)
