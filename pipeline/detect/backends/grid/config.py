"""A grid extractor's architecture config, torch-free (the CLI reads it).

Named configs in `configs/` are grid-feats-vqa's published models (`configs/X-152-grid.yaml`,
`X-101-grid.yaml`, `R-50-grid.yaml` over `Base-RCNN-grid.yaml`, with detectron2's defaults):
``grid-x152`` (ResNeXt-152 32x8d, Caffe2 weights: stride in the 3x3, pixel std 1), ``grid-x101``
(ResNeXt-101 32x8d, pixel std [57.375, 57.12, 58.395]), ``grid-r50`` (ResNet-50, MSRA weights:
stride in the 1x1), and ``grid-tiny`` for tests. All read BGR images at 600 / 1000 (detectron2's
`ResizeShortestEdge`) with detectron2's pixel means, and run res5 at dilation 1, as
`extract_grid_feature.py` forces (the models were trained at dilation 2): a [2048, H/32, W/32]
map per image.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.config import Config, at_least, from_json
from pipeline.detect.config import ResNeXtWidths
from pipeline.errors import ConfigError

CONFIG_DIR = Path(__file__).parent / "configs"
WEIGHT_SOURCES = (
    "the public weights are not bundled: get X-152.pth (or X-101.pth, R-50.pth, X-152pp.pth) from "
    "facebookresearch/grid-feats-vqa's README (dl.fbaipublicfiles.com/grid-feats-vqa/<name>/<name>.pth) "
    "and pass --weights PATH"
)


@dataclass(frozen=True)
class GridConfig(ResNeXtWidths, Config):
    name: str = "grid-x152"
    blocks: tuple[int, int, int, int] = (3, 8, 36, 3)  # ResNet depth 152
    stem_channels: int = 64
    res2_out_channels: int = 256
    groups: int = 32
    width_per_group: int = 8
    stride_in_1x1: bool = False  # Caffe2 / ResNeXt weights: the stride in the 3x3
    res5_dilation: int = 1  # extraction (extract_grid_feature.py); training used 2
    norm_eps: float = 1e-5  # detectron2's FrozenBatchNorm2d
    # preprocessing: detectron2's (BGR uint8 resized by PIL bilinear, then (x - mean) / std)
    pixel_mean_bgr: tuple[float, float, float] = (103.530, 116.280, 123.675)
    pixel_std_bgr: tuple[float, float, float] = (1.0, 1.0, 1.0)
    min_size: int = 600
    max_size: int = 1000

    def __post_init__(self) -> None:
        if len(self.blocks) != 4 or min(self.blocks) < 1:
            raise ConfigError("blocks must give 4 stage depths >= 1")
        at_least(self, {"groups": 1, "width_per_group": 1, "res5_dilation": 1, "min_size": 1})
        if self.max_size < self.min_size:
            raise ConfigError(f"max_size {self.max_size} is below min_size {self.min_size}")
        if min(self.pixel_std_bgr) <= 0:
            raise ConfigError("pixel_std_bgr must be positive")

    @property
    def stride(self) -> int:
        """Pixels of the resized image per cell of the map."""
        return 32 if self.res5_dilation == 1 else 16

    @classmethod
    def from_json(cls, obj: dict) -> "GridConfig":
        return from_json(cls, obj, "grid config", ignore=("backend",))
