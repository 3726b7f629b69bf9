"""Detector input: BGR, Caffe pixel means, no std scaling, shortest side to `min_size`
with the longest side at most `max_size` — resized by one of two conventions
(`PREPROCESS_MODES`, `vlprep extract --preprocess`):

* ``caffe`` (default; the bottom-up-attention `_get_image_blob`): one scale, ``min_size /
  short`` unless ``round(scale * long) > max_size`` (then ``max_size / long``); the *float*
  mean-subtracted image is resized bilinearly (half-pixel centres, no antialiasing:
  cv2.INTER_LINEAR's convention). Boxes map with that one scale.
* ``detectron2`` (airsplay/py-bottom-up-attention): sizes by `ResizeShortestEdge`
  (``max(newh, neww) > max_size`` clamps, ``int(x + 0.5)`` rounds); the *uint8* image is
  resized by PIL bilinear (which antialiases when shrinking), then made float and
  mean-subtracted. Boxes map with per-axis scales (``detector_postprocess``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from pipeline.config import one_of
from pipeline.detect.config import PREPROCESS_MODES, DetectorConfig


def check_preprocess(mode: str) -> str:
    one_of("preprocess", mode, PREPROCESS_MODES)
    return mode


@dataclass(frozen=True)
class Resize:
    """How one image was resized, and how boxes map between the original and the resized
    image by the convention of `mode`: Caffe's single `scale`, detectron2's per-axis
    ratios of the sizes."""

    mode: str
    height: int
    width: int
    new_height: int
    new_width: int
    scale: Optional[float] = None  # caffe only

    def _per_axis(self, boxes: torch.Tensor, x: float, y: float) -> torch.Tensor:
        return boxes * boxes.new_tensor([x, y, x, y])

    def to_resized(self, boxes: torch.Tensor) -> torch.Tensor:
        """x1y1x2y2 boxes in original pixels -> resized-image pixels."""
        if self.mode == "caffe":
            return boxes * self.scale
        return self._per_axis(boxes, self.new_width / self.width, self.new_height / self.height)

    def to_original(self, boxes: torch.Tensor) -> torch.Tensor:
        """x1y1x2y2 boxes in resized-image pixels -> original pixels."""
        if self.mode == "caffe":
            return boxes / self.scale
        return self._per_axis(boxes, self.width / self.new_width, self.height / self.new_height)


def butd_scale(height: int, width: int, min_size: int, max_size: int) -> float:
    short, long_ = min(height, width), max(height, width)
    scale = min_size / short
    if round(scale * long_) > max_size:
        scale = max_size / long_
    return scale


def detectron2_size(height: int, width: int, min_size: int, max_size: int) -> tuple[int, int]:
    """(new_height, new_width) by detectron2's `ResizeShortestEdge` (test time)."""
    scale = min_size / min(height, width)
    new_h, new_w = (min_size, scale * width) if height < width else (scale * height, min_size)
    if max(new_h, new_w) > max_size:
        scale = max_size / max(new_h, new_w)
        new_h, new_w = new_h * scale, new_w * scale
    return int(new_h + 0.5), int(new_w + 0.5)


def _check_rgb(rgb: np.ndarray) -> None:
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"expected an (H, W, 3) uint8 RGB image, got {rgb.shape} {rgb.dtype}")


def _mean_subtracted(bgr: np.ndarray, cfg: DetectorConfig) -> torch.Tensor:
    """(3, H, W) float32 of an (H, W, 3) BGR image, minus the pixel means."""
    x = torch.from_numpy(np.ascontiguousarray(bgr)).permute(2, 0, 1).float()
    return x - torch.tensor(cfg.pixel_mean_bgr).view(3, 1, 1)


def preprocess(rgb: np.ndarray, cfg: DetectorConfig) -> tuple[torch.Tensor, float]:
    """The ``caffe`` convention: (1, 3, h, w) float32 BGR mean-subtracted resized tensor,
    and the scale used."""
    _check_rgb(rgb)
    height, width = rgb.shape[:2]
    scale = butd_scale(height, width, cfg.min_size, cfg.max_size)
    size = (max(1, round(height * scale)), max(1, round(width * scale)))
    bgr = _mean_subtracted(rgb[:, :, ::-1], cfg)
    resized = F.interpolate(bgr[None], size=size, mode="bilinear", align_corners=False)
    return resized, scale


def preprocess_detectron2(rgb: np.ndarray, cfg: DetectorConfig) -> torch.Tensor:
    """The ``detectron2`` convention: (1, 3, h, w) float32 BGR tensor, resized as uint8 by
    PIL and then mean-subtracted."""
    _check_rgb(rgb)
    new_h, new_w = detectron2_size(*rgb.shape[:2], cfg.min_size, cfg.max_size)
    bgr = Image.fromarray(np.ascontiguousarray(rgb[:, :, ::-1]))
    return _mean_subtracted(np.array(bgr.resize((new_w, new_h), Image.BILINEAR)), cfg)[None]


def prepare_image(rgb: np.ndarray, cfg: DetectorConfig, mode: str = "caffe") -> tuple[torch.Tensor, Resize]:
    """An (H, W, 3) uint8 RGB image as the detector's (1, 3, h, w) input under `mode`, and
    its `Resize`."""
    check_preprocess(mode)
    height, width = rgb.shape[:2]
    scale = None
    if mode == "caffe":
        x, scale = preprocess(rgb, cfg)
    else:
        x = preprocess_detectron2(rgb, cfg)
    return x, Resize(mode, height, width, x.shape[-2], x.shape[-1], scale)
