"""The cells of a grid and their boxes, torch-free (the extractor and the grid-pth import share them)."""

from __future__ import annotations

import numpy as np


def bins(size: int, cells: int) -> list[tuple[int, int]]:
    """adaptive_avg_pool2d's bins of a side of `size` into `cells`: [floor(i n / k), ceil((i + 1) n / k))."""
    return [((i * size) // cells, -(-((i + 1) * size) // cells)) for i in range(cells)]


def cell_boxes(
    rows: list[tuple[int, int]], cols: list[tuple[int, int]], stride: int, new_hw: tuple[int, int], hw: tuple[int, int]
) -> np.ndarray:
    """(R * C, 4) float32 boxes in original pixels of cells spanning map rows `rows` x columns
    `cols` (half-open ranges), row-major: in resized pixels ``stride`` per map cell, clipped to
    the resized image, scaled back per axis (``original / resized``)."""
    new_h, new_w = new_hw
    height, width = hw
    sx, sy = width / new_w, height / new_h
    out = np.empty((len(rows), len(cols), 4), np.float32)
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            out[i, j] = (
                c0 * stride * sx,
                r0 * stride * sy,
                min(c1 * stride, new_w) * sx,
                min(r1 * stride, new_h) * sy,
            )
    return out.reshape(-1, 4)
