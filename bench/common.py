"""Shared benchmark inputs."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from pipeline.records import RegionFeatures, labels_from_probs

DISTINCT = 64
BOXES, DIM, CLASSES, ATTRS = 36, 2048, 1601, 401  # a bottom-up-attention record at BUTD settings


# (width, height) of COCO-like photos: 4:3 both ways, 3:2, 16:9, square; under the BUTD
# resize (600 / 1000) 600x800, 800x600, 600x899, 600x800, 600x800, 899x600, 563x1000, 600x600.
MIXED_SIZES = ((640, 480), (480, 640), (640, 427), (500, 375), (640, 480), (427, 640), (640, 360), (612, 612))


def make_jpegs(count: int = DISTINCT, sizes: tuple[tuple[int, int], ...] = ((640, 480),)) -> list[bytes]:
    """Photo-like JPEGs (smooth gradients, shapes and mild noise: ~50-90 KB at 640x480),
    of the (width, height) `sizes` in turn (e.g. `MIXED_SIZES`); 640x480 by default."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        width, height = sizes[i % len(sizes)]
        yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
        base = np.stack(
            [
                np.sin(xx / rng.uniform(20, 120) + rng.uniform(0, 6)) * 60
                + rng.uniform(60, 190)
                + np.cos(yy / rng.uniform(20, 120)) * 40
                for _ in range(3)
            ],
            -1,
        )
        for _ in range(12):
            cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(10, 90)
            base[(xx - cx) ** 2 + (yy - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
        base += rng.normal(0, 6, base.shape)
        buf = io.BytesIO()
        Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def vg_like_record(i: int) -> RegionFeatures:
    """Image `COCO_train2014_<i>`: 36 random boxes with 2048-d features, a 1601-class
    cls_prob and the object / attribute labels the VG detector would give."""
    rng = np.random.default_rng(i)
    w, h = 640, 480
    x1, y1 = rng.uniform(0, 320, BOXES), rng.uniform(0, 240, BOXES)
    boxes = np.stack([x1, y1, x1 + rng.uniform(1, 320, BOXES), y1 + rng.uniform(1, 240, BOXES)], 1).astype(np.float32)
    cls_prob = rng.random((BOXES, CLASSES), np.float32)
    cls_prob /= cls_prob.sum(1, keepdims=True)
    objects_id, objects_conf = labels_from_probs(cls_prob)
    return RegionFeatures(
        image_id=f"COCO_train2014_{i:012d}",
        image_h=h,
        image_w=w,
        boxes=boxes,
        features=rng.random((BOXES, DIM), np.float32) * 4,
        objects_id=objects_id,
        objects_conf=objects_conf,
        attrs_id=rng.integers(0, ATTRS - 1, BOXES),
        attrs_conf=rng.random(BOXES, np.float32),
        cls_prob=cls_prob,
    )
