"""The bottom-up-attention detector's architecture config, torch-free (the CLI reads it).

Named configs in `configs/`: `vg-r101` is the bottom-up-attention Visual Genome model
(ResNet-101 C4, 1600 objects + 400 attributes, BUTD test settings); `tiny` builds the same
architecture small enough for tests; `shapes-tiny` is the packaged shapes-world detector's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Union

from pipeline.config import Config, from_json
from pipeline.detect.config import BoxCount, SelectionConfig
from pipeline.errors import ConfigError
from pipeline.io import read_named_json

CONFIG_DIR = Path(__file__).parent / "configs"
# bottom-up attention's generate_tsv.py: per-class Caffe NMS at 0.3 over the proposals, conf >= 0.2, 10-100 boxes
DEFAULT_SELECTION = SelectionConfig("butd", BoxCount(10, 100), conf_thresh=0.2, nms_thresh=0.3)
POLICIES = ("butd", "maxnms")
WEIGHT_SOURCES = (
    "the public weights are not bundled: get faster_rcnn_from_caffe_attr.pkl (36-box model) or "
    "faster_rcnn_from_caffe_attr_original.pkl (10-100) from airsplay/py-bottom-up-attention's README, "
    "or pytorch_model.bin of unc-nlp/frcnn-vg-finetuned (HF hub), and pass --weights PATH"
)


@dataclass(frozen=True)
class DetectorConfig(Config):
    name: str = "vg-r101"
    # backbone: ResNet C4 (stem, res2..res4) + res5 in the ROI head
    blocks: tuple[int, int, int, int] = (3, 4, 23, 3)  # ResNet-101
    stem_channels: int = 64
    res2_out_channels: int = 256
    bottleneck_channels: int = 64  # res2; doubles per stage
    stride_in_1x1: bool = True
    res5_dilation: int = 2  # res5 runs at stride 1 with dilated 3x3 convs (RES5HALVE False)
    caffe_maxpool: bool = True  # stem max-pool k3 s2 pad0 ceil_mode
    # RPN
    rpn_channels: int = 512
    anchor_sizes: tuple[int, ...] = (64, 128, 256, 512)
    anchor_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)
    feature_stride: int = 16
    rpn_pre_nms_topk: int = 6000
    rpn_post_nms_topk: int = 300
    rpn_nms: float = 0.7
    rpn_min_size: float = 0.0  # in resized-image pixels
    # ROI heads
    pooler_resolution: int = 14
    num_classes: int = 1600  # foreground; class tables have num_classes + 1 columns, background at 0
    num_attributes: int = 400  # attribute tables have num_attributes + 1 columns, "none" at 0
    attribute_embed: int = 256
    attribute_hidden: int = 512
    bbox_reg_weights: tuple[float, float, float, float] = (10.0, 10.0, 5.0, 5.0)
    # preprocessing (BUTD): BGR, caffe means, no std scaling, shortest side 600, longest <= 1000
    pixel_mean_bgr: tuple[float, float, float] = (102.9801, 115.9465, 122.7717)
    min_size: int = 600
    max_size: int = 1000

    def __post_init__(self) -> None:
        if len(self.blocks) != 4 or min(self.blocks) < 1:
            raise ConfigError("blocks must give 4 stage depths >= 1")
        if self.num_classes < 1 or self.num_attributes < 0:
            raise ConfigError("num_classes must be >= 1 and num_attributes >= 0")

    @property
    def num_anchors(self) -> int:
        return len(self.anchor_sizes) * len(self.anchor_ratios)

    @property
    def res4_channels(self) -> int:
        return self.res2_out_channels * 4

    @property
    def res5_channels(self) -> int:
        return self.res2_out_channels * 8

    @property
    def feature_dim(self) -> int:
        return self.res5_channels

    @classmethod
    def from_json(cls, obj: dict) -> "DetectorConfig":
        return from_json(cls, obj, "detector config", ignore=("backend",))

    @classmethod
    def load(cls, name_or_path: Union[str, Path]) -> "DetectorConfig":
        return cls.from_json(read_named_json(name_or_path, CONFIG_DIR, "detector"))
