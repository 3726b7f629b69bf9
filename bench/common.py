"""Shared benchmark inputs."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from pipeline.records import RegionFeatures, labels_from_probs

DISTINCT = 64
BOXES, DIM, CLASSES, ATTRS = 36, 2048, 1601, 401  # a bottom-up-attention record at BUTD settings


def make_jpegs(count: int = DISTINCT) -> list[bytes]:
    """Photo-like 640x480 JPEGs (smooth gradients, shapes and mild noise: ~50-90 KB)."""
    rng = np.random.default_rng(0)
    out = []
    yy, xx = np.mgrid[0:480, 0:640].astype(np.float32)
    for _ in range(count):
        base = np.stack([np.sin(xx / rng.uniform(20, 120) + rng.uniform(0, 6)) * 60 + rng.uniform(60, 190)
                         + np.cos(yy / rng.uniform(20, 120)) * 40 for _ in range(3)], -1)
        for _ in range(12):
            cx, cy, r = rng.uniform(0, 640), rng.uniform(0, 480), rng.uniform(10, 90)
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
        image_id=f"COCO_train2014_{i:012d}", image_h=h, image_w=w, boxes=boxes,
        features=rng.random((BOXES, DIM), np.float32) * 4,
        objects_id=objects_id, objects_conf=objects_conf,
        attrs_id=rng.integers(0, ATTRS - 1, BOXES), attrs_conf=rng.random(BOXES, np.float32),
        cls_prob=cls_prob,
    )
