"""Detector input: BGR, the config's pixel means (and std where it has one), shortest side to
`min_size` with the longest side at most `max_size` — resized by one of three conventions
(`PREPROCESS_MODES`, `vlprep extract --preprocess`; each backend names the ones it takes):

* ``caffe`` (default; the bottom-up-attention `_get_image_blob`): one scale, ``min_size /
  short`` unless ``round(scale * long) > max_size`` (then ``max_size / long``); the *float*
  mean-subtracted image is resized bilinearly (half-pixel centres, no antialiasing:
  cv2.INTER_LINEAR's convention). Boxes map with that one scale.
* ``detectron2`` (airsplay/py-bottom-up-attention): sizes by `ResizeShortestEdge`
  (``max(newh, neww) > max_size`` clamps, ``int(x + 0.5)`` rounds); the *uint8* image is
  resized by PIL bilinear (which antialiases when shrinking), then made float and
  mean-subtracted. Boxes map with per-axis scales (``detector_postprocess``). grid-feats-vqa's
  input too (then divided by its pixel std).
* ``maskrcnn`` (VinVL, maskrcnn-benchmark's test transforms): sizes by its `Resize.get_size`
  (the short side becomes ``round(max_size * short / long)`` when the long side would pass
  `max_size`; the long side is truncated, ``int(size * long / short)``); the *uint8* RGB image is
  resized by PIL bilinear (torchvision's `resize` of a PIL image), then made BGR float and
  mean-subtracted. Boxes map with per-axis scales (``BoxList.resize``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from pipeline.config import one_of
from pipeline.detect.config import PREPROCESS_MODES


class InputSpec(Protocol):
    """What a backend's config says of its input (every detector config has these)."""

    min_size: int
    max_size: int
    pixel_mean_bgr: tuple[float, float, float]


def check_preprocess(mode: str) -> str:
    one_of("preprocess", mode, PREPROCESS_MODES)
    return mode


@dataclass(frozen=True)
class Resize:
    """How one image was resized, and how boxes map between the original and the resized
    image by the convention of `mode`: Caffe's single `scale`, detectron2's and
    maskrcnn-benchmark's per-axis ratios of the sizes."""

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


def maskrcnn_size(height: int, width: int, min_size: int, max_size: int) -> tuple[int, int]:
    """(new_height, new_width) by maskrcnn-benchmark's ``Resize.get_size`` (test time)."""
    size, short, long_ = min_size, min(height, width), max(height, width)
    if long_ / short * size > max_size:
        size = int(round(max_size * short / long_))
    if (width <= height and width == size) or (height <= width and height == size):
        return height, width
    if width < height:
        return int(size * height / width), size
    return size, int(size * width / height)


def _check_rgb(rgb: np.ndarray) -> None:
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"expected an (H, W, 3) uint8 RGB image, got {rgb.shape} {rgb.dtype}")


def _mean_subtracted(bgr: np.ndarray, cfg: InputSpec) -> torch.Tensor:
    """(3, H, W) float32 of an (H, W, 3) BGR image, minus the pixel means (and divided by the
    config's ``pixel_std_bgr`` where it has one, as detectron2's ``(x - mean) / std``)."""
    x = torch.from_numpy(np.ascontiguousarray(bgr)).permute(2, 0, 1).float()
    x = x - torch.tensor(cfg.pixel_mean_bgr).view(3, 1, 1)
    std = getattr(cfg, "pixel_std_bgr", None)
    return x if std is None else x / torch.tensor(std, dtype=torch.float32).view(3, 1, 1)


def preprocess(rgb: np.ndarray, cfg: InputSpec) -> tuple[torch.Tensor, float]:
    """The ``caffe`` convention: (1, 3, h, w) float32 BGR mean-subtracted resized tensor,
    and the scale used."""
    _check_rgb(rgb)
    height, width = rgb.shape[:2]
    scale = butd_scale(height, width, cfg.min_size, cfg.max_size)
    size = (max(1, round(height * scale)), max(1, round(width * scale)))
    bgr = _mean_subtracted(rgb[:, :, ::-1], cfg)
    resized = F.interpolate(bgr[None], size=size, mode="bilinear", align_corners=False)
    return resized, scale


def preprocess_detectron2(rgb: np.ndarray, cfg: InputSpec) -> torch.Tensor:
    """The ``detectron2`` convention: (1, 3, h, w) float32 BGR tensor, resized as uint8 by
    PIL and then normalized (`_mean_subtracted`)."""
    _check_rgb(rgb)
    new_h, new_w = detectron2_size(*rgb.shape[:2], cfg.min_size, cfg.max_size)
    bgr = Image.fromarray(np.ascontiguousarray(rgb[:, :, ::-1]))
    return _mean_subtracted(np.array(bgr.resize((new_w, new_h), Image.BILINEAR)), cfg)[None]


def preprocess_maskrcnn(rgb: np.ndarray, cfg: InputSpec) -> torch.Tensor:
    """The ``maskrcnn`` convention: (1, 3, h, w) float32 BGR tensor, the uint8 RGB image resized
    by PIL (unless already at its size) and then mean-subtracted."""
    _check_rgb(rgb)
    new_h, new_w = maskrcnn_size(*rgb.shape[:2], cfg.min_size, cfg.max_size)
    if (new_h, new_w) != rgb.shape[:2]:
        rgb = np.asarray(Image.fromarray(np.ascontiguousarray(rgb)).resize((new_w, new_h), Image.BILINEAR))
    return _mean_subtracted(rgb[:, :, ::-1], cfg)[None]


def prepare_image(rgb: np.ndarray, cfg: InputSpec, mode: str = "caffe") -> tuple[torch.Tensor, Resize]:
    """An (H, W, 3) uint8 RGB image as the detector's (1, 3, h, w) input under `mode`, and
    its `Resize`."""
    check_preprocess(mode)
    height, width = rgb.shape[:2]
    scale = None
    if mode == "caffe":
        x, scale = preprocess(rgb, cfg)
    elif mode == "detectron2":
        x = preprocess_detectron2(rgb, cfg)
    else:
        x = preprocess_maskrcnn(rgb, cfg)
    return x, Resize(mode, height, width, x.shape[-2], x.shape[-1], scale)
