"""Shared benchmark inputs."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

DISTINCT = 64


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
