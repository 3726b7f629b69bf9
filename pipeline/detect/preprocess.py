"""BUTD image preprocessing: BGR, Caffe pixel means, no std scaling; shortest side to
`min_size` unless that makes the longest side exceed `max_size` (the reference's
``round(scale * long) > max_size`` rule); bilinear resize of the *float* image (half-pixel
centres, no antialiasing: cv2.INTER_LINEAR's convention)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.detect.config import DetectorConfig


def butd_scale(height: int, width: int, min_size: int, max_size: int) -> float:
    short, long_ = min(height, width), max(height, width)
    scale = min_size / short
    if round(scale * long_) > max_size:
        scale = max_size / long_
    return scale


def preprocess(rgb: np.ndarray, cfg: DetectorConfig) -> tuple[torch.Tensor, float]:
    """(1, 3, h, w) float32 BGR mean-subtracted resized tensor, and the scale used."""
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"expected an (H, W, 3) uint8 RGB image, got {rgb.shape} {rgb.dtype}")
    height, width = rgb.shape[:2]
    scale = butd_scale(height, width, cfg.min_size, cfg.max_size)
    bgr = torch.from_numpy(np.ascontiguousarray(rgb[:, :, ::-1])).permute(2, 0, 1).float()
    bgr -= torch.tensor(cfg.pixel_mean_bgr).view(3, 1, 1)
    size = (max(1, round(height * scale)), max(1, round(width * scale)))
    resized = F.interpolate(bgr[None], size=size, mode="bilinear", align_corners=False)
    return resized, scale
