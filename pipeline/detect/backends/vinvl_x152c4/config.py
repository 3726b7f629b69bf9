"""VinVL's AttrRCNN architecture config, torch-free (the CLI reads it).

Named configs in `configs/`: ``vinvl-x152c4`` is microsoft/scene_graph_benchmark's
`sgg_configs/vgattr/vinvl_x152c4.yaml` (over maskrcnn-benchmark's defaults): ResNeXt-152 32x8d
C4, RPN 6000 -> 300 proposals at test, res5 box head, 1595 classes and 525 attributes with
background, score threshold 0.2, 10-100 detections, 600 / 1000 resize, its BGR pixel means;
``vinvl-tiny`` is the same architecture small enough for tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.config import Config, at_least, from_json
from pipeline.detect.config import BoxCount, ResNeXtWidths, SelectionConfig
from pipeline.errors import ConfigError

CONFIG_DIR = Path(__file__).parent / "configs"
POLICIES = ("per-class", "class-agnostic")
# The VinVL README's feature extraction (tools/test_sg_net.py): NMS_FILTER 1 (per-class),
# SCORE_THRESH 0.2, TEST.IGNORE_BOX_REGRESSION True; 10-100 detections (the yaml).
CLASS_AGNOSTIC_NMS = 0.5  # NMS_FILTER 2's one NMS runs at ROI_HEADS.NMS (per-class: 0.3, fixed in filter_results_peter)
DEFAULT_SELECTION = SelectionConfig("per-class", BoxCount(10, 100), conf_thresh=0.2, nms_thresh=0.3, regression=False)
WEIGHT_SOURCES = (
    "the public weights are not bundled: get vinvl_vg_x152c4.pth and its label map "
    "VG-SGG-dicts-vgoi6-clipped.json (the links in microsoft/scene_graph_benchmark's README, re-hosted by "
    "the community since) and pass --weights PATH [--labelmap JSON]"
)


@dataclass(frozen=True)
class VinvlConfig(ResNeXtWidths, Config):
    name: str = "vinvl-x152c4"
    # backbone: ResNeXt C4 (stem, res2..res4); res5 is the box head, at stride 2 on the pooled map
    blocks: tuple[int, int, int, int] = (3, 8, 36, 3)  # ResNet-152
    stem_channels: int = 64
    res2_out_channels: int = 256
    groups: int = 32
    width_per_group: int = 8
    stride_in_1x1: bool = False
    norm_eps: float = 0.0  # maskrcnn-benchmark's FrozenBatchNorm2d has none
    # RPN
    anchor_sizes: tuple[int, ...] = (32, 64, 128, 256, 512)
    anchor_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)
    feature_stride: int = 16
    rpn_pre_nms_topk: int = 6000
    rpn_post_nms_topk: int = 300
    rpn_nms: float = 0.7
    rpn_min_size: float = 0.0
    # ROI heads
    pooler_resolution: int = 14
    pooler_sampling_ratio: int = 0
    num_classes: int = 1595  # with the background (index 0)
    num_attributes: int = 525  # with "no attribute" (index 0)
    attribute_embed: int = 256  # CLS_EMD_DIM
    attribute_hidden: int = 512  # ATTR_EMD_DIM
    attribute_thresh: float = 0.05  # POSTPROCESS_ATTRIBUTES_THRESHOLD: an attribute is reported above it
    max_attributes: int = 16  # MAX_NUM_ATTR_PER_OBJ: attributes reported per box (predictions.tsv)
    bbox_reg_weights: tuple[float, float, float, float] = (10.0, 10.0, 5.0, 5.0)
    # preprocessing: BGR 0-255, minus the means, shortest side 600, longest <= 1000
    pixel_mean_bgr: tuple[float, float, float] = (103.530, 116.280, 123.675)
    pixel_std_bgr: tuple[float, float, float] = (1.0, 1.0, 1.0)
    min_size: int = 600
    max_size: int = 1000

    def __post_init__(self) -> None:
        if len(self.blocks) != 4 or min(self.blocks) < 1:
            raise ConfigError("blocks must give 4 stage depths >= 1")
        at_least(self, {"groups": 1, "width_per_group": 1, "num_classes": 2, "num_attributes": 0, "min_size": 1})
        if self.res4_channels != 1024:  # BACKBONE_OUT_CHANNELS: the res5 head adds no projection here
            raise ConfigError(
                f"res2_out_channels must be 256 (res4 gives the box head 1024 channels), got {self.res2_out_channels}"
            )

    @property
    def res4_channels(self) -> int:
        return self.res2_out_channels * 4

    @classmethod
    def from_json(cls, obj: dict) -> "VinvlConfig":
        return from_json(cls, obj, "VinVL config", ignore=("backend",))
