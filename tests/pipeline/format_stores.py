"""The stores the format tests export and import: the shapes world's (the packaged shapes-tiny
detector over a few drawn scenes), a VG-sized synthetic one (100 regions of 2048-d, 1601 classes,
401 attributes, label names; few images, so it stays small in bytes) and a grid one (grid-tiny)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from helpers import make_record

from pipeline.store import FeatureStore, write_records

VG_OBJECTS = [f"object{i}" for i in range(1600)]
VG_ATTRIBUTES = [f"attribute{i}" for i in range(400)]
SHAPES_IMAGES = 2


def vg_sized_store(path: Path, images: int = 3, regions: int = 100, dtype: str = "float32", **kw) -> FeatureStore:
    """`images` records of `regions` regions each (the first one fewer: counts differ), 2048-d
    features, 1601-column cls_prob and 401-column attr_prob with labels derived from them, and
    VG-sized label names; provenance as an extraction records it."""
    rng = np.random.default_rng(7)
    records = [
        make_record(
            rng,
            f"COCO_val2014_{i + 1:012d}",
            num_boxes=regions - (i == 0),
            feature_dim=2048,
            cls_dim=1601,
            attr_dim=401,
            size=(480 + 7 * i, 640 - 3 * i),
        )
        for i in range(images)
    ]
    provenance = {
        "producer": "vlprep 0.1.0 extract",
        "detector": "vg-r101",
        "weights_sha256": "ab" * 32,
        "box_policy": "butd boxes=10-100, conf>=0.2, nms=0.3 +1px",
        "preprocess": "caffe",
        "labels": {"file": "objects_vocab.txt", "objects": VG_OBJECTS, "attributes": VG_ATTRIBUTES},
    }
    config = {"dataset": "coco", "selection": {"policy": "butd", "boxes": "10-100", "conf_thresh": 0.2}}
    return write_records(path, records, dtype=dtype, provenance=provenance, config=config, **kw)


def shapes_records():
    """The shapes-tiny detector's records of a few shapes-world scenes (float32, as extracted)."""
    from pipeline.detect.backends import open_extractor
    from pipeline.detect.backends.butd_c4.weights import shapes_tiny_weights
    from pipeline.synthetic.render import render
    from pipeline.synthetic.scenes import generate_scene

    rng = np.random.default_rng(3)
    pictures = [np.asarray(render(generate_scene(rng)).convert("RGB")) for _ in range(SHAPES_IMAGES)]
    extractor = open_extractor("shapes-tiny", shapes_tiny_weights(), seed=0)
    return extractor(pictures, [f"cc3m-val-{i:08d}" for i in range(SHAPES_IMAGES)])


def shapes_store(path: Path, records) -> FeatureStore:
    from pipeline.detect.backends.butd_c4.weights import WEIGHTS_DATA_DIR

    names = {
        kind: (WEIGHTS_DATA_DIR / f"{kind}_shapes.txt").read_text().split("\n")[:-1]
        for kind in ("objects", "attributes")
    }
    provenance = {
        "producer": "vlprep 0.1.0 extract",
        "detector": "shapes-tiny",
        "weights_sha256": (WEIGHTS_DATA_DIR / "shapes-tiny.sha256").read_text().split()[0],
        "box_policy": "butd boxes=10-100, conf>=0.2, nms=0.3 +1px",
        "labels": {"file": "objects_shapes.txt", **names},
    }
    width = records[0].features.shape[1]
    return write_records(
        path, records, feature_dim=width, dtype="float32", provenance=provenance, config={"dataset": "shapes"}
    )


def grid_store(path: Path) -> FeatureStore:
    """grid-tiny (random weights) over two images, as vlprep extract --detector grid-tiny stores it."""
    from pipeline.detect.backends import open_extractor, resolve

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, size, dtype=np.uint8) for size in ((120, 200, 3), (90, 90, 3))]
    records = open_extractor("grid-tiny", seed=0)(images, ["im0", "im1"])
    provenance = {"detector": "grid-tiny", "extractor": resolve("grid-tiny").to_json()}
    return write_records(
        path,
        records,
        feature_dim=128,
        dtype="float32",
        provenance=provenance,
        config={"grid_pool": None},
        regions="grid",
    )
