"""`GridExtractor`: images in, grid features out, as grid-feats-vqa's `extract_grid_feature.py`.

Per image: detectron2's test input (`pipeline.detect.preprocess`, ``detectron2`` convention:
the uint8 BGR image resized by `ResizeShortestEdge` with PIL bilinear, then ``(x - mean) /
std``; one image per backbone run, so no padding reaches the map), the backbone through res5
at dilation 1, and the C5 map ``[C, h, w]`` as ``h * w`` regions in row-major order, each with
its cell's box: cell (i, j) covers resized pixels ``[32 j, 32 i, 32 (j + 1), 32 (i + 1)]``
clipped to the resized image, mapped back to original pixels by detectron2's per-axis scales.
With `grid_pool` (``--grid-pool RxC``) the map is average-pooled to R x C cells first
(`torch.nn.functional.adaptive_avg_pool2d`: bin i covers rows ``floor(i h / R)`` to
``ceil((i + 1) h / R)``), each cell's box the union of its bin's cells; a map smaller than the
pool on either side is that image's `GridTooSmall` error. A grid has no labels: the records
carry boxes and features only.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.detect.backends.grid.cells import bins, cell_boxes
from pipeline.detect.backends.grid.model import GridBackbone
from pipeline.detect.config import GridPool
from pipeline.detect.inference import OnDevice
from pipeline.detect.preprocess import prepare_image
from pipeline.errors import EXIT_CONFIG, VlprepError
from pipeline.records import RegionFeatures


class GridTooSmall(VlprepError, ValueError):
    """An image whose map has fewer rows or columns than ``--grid-pool`` asks for (an image
    far longer than wide): that image's error, named ``grid too small`` in the extract stats."""

    exit_code = EXIT_CONFIG
    kind = "grid too small"


class GridExtractor(OnDevice):
    def __init__(
        self,
        model: GridBackbone,
        device: str = "cpu",
        fp16: bool = False,
        preprocess: str = "detectron2",
        grid_pool: Optional[GridPool] = None,
    ):
        self.place(model, device, fp16)
        self.preprocess = preprocess
        self.grid_pool = grid_pool

    @torch.no_grad()
    def grid(self, rgb: np.ndarray) -> tuple[torch.Tensor, tuple[int, int]]:
        """The (1, C, h, w) float32 C5 map of one image (what grid-feats-vqa saves as
        ``<image_id>.pth``), and the resized input's (h, w)."""
        x, resize = prepare_image(rgb, self.cfg, self.preprocess)
        with self._autocast():
            fmap = self.model(x.to(self.device))
        return fmap.float(), (resize.new_height, resize.new_width)

    @torch.no_grad()
    def __call__(
        self,
        images: Sequence[np.ndarray],
        image_ids: Sequence[str],
        given_boxes: Optional[Sequence[Optional[np.ndarray]]] = None,
    ) -> list[RegionFeatures]:
        if given_boxes is not None and any(b is not None for b in given_boxes):
            raise ValueError("a grid extractor takes no given boxes")
        out = []
        for rgb, image_id in zip(images, image_ids):
            fmap, new_hw = self.grid(rgb)
            h, w = fmap.shape[-2:]
            if self.grid_pool is None:
                rows, cols = [(i, i + 1) for i in range(h)], [(j, j + 1) for j in range(w)]
            else:
                if self.grid_pool.rows > h or self.grid_pool.cols > w:
                    raise GridTooSmall(f"its {h}x{w} map is smaller than --grid-pool {self.grid_pool}")
                fmap = F.adaptive_avg_pool2d(fmap, (self.grid_pool.rows, self.grid_pool.cols))
                rows, cols = bins(h, self.grid_pool.rows), bins(w, self.grid_pool.cols)
            features = fmap[0].flatten(1).t().contiguous().cpu().numpy()
            boxes = cell_boxes(rows, cols, self.cfg.stride, new_hw, rgb.shape[:2])
            out.append(RegionFeatures(image_id, int(rgb.shape[0]), int(rgb.shape[1]), boxes, features))
        return out
