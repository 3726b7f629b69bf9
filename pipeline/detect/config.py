"""The detect stage's settings, torch-free (the CLI imports them), each validated in itself.

* `DetectorConfig`: the architecture, with named JSON configs in `configs/`: `vg-r101` is
  the bottom-up-attention Visual Genome model (ResNet-101 C4, 1600 objects + 400
  attributes, BUTD test settings); `tiny` builds the same architecture small enough for
  tests and the embedded demo.
* `SelectionConfig` (with `BoxCount`): which regions are kept, by one of `POLICIES`
  (`pipeline.detect.boxes` implements them).
* `ExtractConfig`: one `vlprep extract` run — the detector and its inputs (`PREPROCESS_MODES`,
  see `pipeline.detect.preprocess`), the store written, and the sections it shares with
  `vlprep download` (shards and Ray, reader, fetching, images).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from pipeline.config import Config, at_least, flag, from_json, one_of
from pipeline.datasets import READERS, ReaderOptions, check_inputs
from pipeline.distribute import DistributeConfig, absolute
from pipeline.download.fetch import FetchConfig
from pipeline.errors import ConfigError
from pipeline.images import ImageConfig
from pipeline.io import read_named_json
from pipeline.store.layout import BACKENDS, FLOAT_DTYPES, ProbStorage

CONFIG_DIR = Path(__file__).parent / "configs"
POLICIES = ("butd", "maxnms")
PREPROCESS_MODES = ("caffe", "detectron2")
WEIGHT_SOURCES = (
    "the public weights are not bundled: get faster_rcnn_from_caffe_attr.pkl (36-box model) or "
    "faster_rcnn_from_caffe_attr_original.pkl (10-100) from airsplay/py-bottom-up-attention's README, "
    "or pytorch_model.bin of unc-nlp/frcnn-vg-finetuned (HF hub), and pass --weights PATH"
)
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


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

    @classmethod
    def from_json(cls, obj: dict) -> "DetectorConfig":
        return from_json(cls, obj, "detector config")

    @classmethod
    def load(cls, name_or_path: Union[str, Path]) -> "DetectorConfig":
        return cls.from_json(read_named_json(name_or_path, CONFIG_DIR, "detector"))


@dataclass(frozen=True)
class BoxCount:
    """How many regions per image: ``36`` (fixed) or ``10-100`` (min-max)."""

    min: int
    max: int

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.max:
            raise ConfigError(f"box count must be K or MIN-MAX with 1 <= MIN <= MAX, got {self.min}-{self.max}")

    @classmethod
    def parse(cls, text: str) -> "BoxCount":
        parts = str(text).split("-")
        try:
            lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (None, None)
        except ValueError:
            lo = hi = None
        if lo is None or not 1 <= lo <= hi:
            raise ConfigError(f"box count must be K or MIN-MAX with 1 <= MIN <= MAX, got {text!r}")
        return cls(lo, hi)

    def __str__(self) -> str:
        return str(self.min) if self.min == self.max else f"{self.min}-{self.max}"

    def to_json(self) -> str:
        return str(self)


@dataclass(frozen=True)
class SelectionConfig(Config):
    policy: str = "butd"
    boxes: BoxCount = BoxCount(10, 100)
    conf_thresh: float = 0.2  # butd
    nms_thresh: float = 0.3  # butd per-class NMS

    def __post_init__(self) -> None:
        one_of("policy", self.policy, POLICIES)
        at_least(self, {"conf_thresh": 0, "nms_thresh": 0})

    @classmethod
    def from_json(cls, obj: dict) -> "SelectionConfig":
        """The selection as `to_json` (a store's recorded run config) writes it: ``boxes`` as text."""
        fields = dict(obj)
        if "boxes" in fields:
            fields["boxes"] = BoxCount.parse(fields["boxes"])
        return from_json(cls, fields, "selection")

    def describe(self) -> str:
        """The store's ``box_policy`` provenance (an identity key: a store is appended to only
        under the same one). "+1px" marks Caffe's NMS rule: stores of the earlier rule differ."""
        extra = f", conf>={self.conf_thresh}, nms={self.nms_thresh} +1px" if self.policy == "butd" else ""
        return f"{self.policy} boxes={self.boxes}{extra}"


@dataclass(frozen=True)
class ExtractConfig(Config):
    """One `vlprep extract` run. Paths are made absolute (workers on other nodes)."""

    out: Path
    dataset: Optional[str] = None  # with inputs: download and extract in one job
    inputs: tuple[Path, ...] = ()
    images: Optional[Path] = None  # or: image shards, a folder or img2dataset output
    keep_images: Optional[Path] = None  # also write the downloaded images as image shards here
    weights: Optional[Path] = None
    random_weights: bool = False
    seed: int = 0  # of --random-weights
    detector: str = "vg-r101"  # a DetectorConfig name or JSON path
    preprocess: str = "caffe"  # resize convention: caffe (BUTD) or detectron2 (py-bottom-up-attention)
    selection: SelectionConfig = SelectionConfig()
    given_boxes: Optional[Path] = None  # JSON/Arrow/Parquet of image_id -> boxes: extract exactly those
    batch_size: int = 1
    device: str = "auto"  # auto, cpu, cuda or cuda:N
    fp16: bool = False
    actors: Optional[int] = None  # default: one per GPU, else 1
    actor_cpus: float = 1.0  # CPUs a CPU detector actor reserves on its node (a GPU actor: one GPU, no CPU)
    backend: str = "arrow"
    dtype: str = "float16"
    cls_prob: str = "full"  # full, topk:K or none
    attr_prob: str = "full"
    distribute: DistributeConfig = DistributeConfig()
    reader: ReaderOptions = ReaderOptions()
    fetch: FetchConfig = FetchConfig()
    image: ImageConfig = ImageConfig()

    def __post_init__(self) -> None:
        for name in ("out", "images", "weights", "keep_images", "given_boxes"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, absolute(getattr(self, name)))
        object.__setattr__(self, "inputs", tuple(absolute(p) for p in self.inputs))
        if (self.images is None) == (self.dataset is None):
            raise ConfigError("give either --dataset with --input files, or --images")
        if self.dataset is not None:
            one_of("dataset", self.dataset, READERS)
            check_inputs(self.inputs)
        if self.images is not None and not Path(self.images).exists():
            raise ConfigError(f"image source not found: {self.images}")
        if self.weights is None and not self.random_weights:
            raise ConfigError(f"--weights is required: {WEIGHT_SOURCES} (or --random-weights for a smoke run)")
        if self.weights is not None and self.random_weights:
            raise ConfigError("give --weights or --random-weights, not both")
        if self.given_boxes is not None and not Path(self.given_boxes).exists():
            raise ConfigError(f"given-boxes file not found: {self.given_boxes}")
        at_least(self, {"batch_size": 1, "actor_cpus": 0, **({"actors": 1} if self.actors is not None else {})})
        if not _DEVICE.fullmatch(self.device):
            raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        one_of("preprocess", self.preprocess, PREPROCESS_MODES)
        one_of("backend", self.backend, BACKENDS)
        one_of("dtype", self.dtype, FLOAT_DTYPES)
        for name in ("cls_prob", "attr_prob"):
            try:
                ProbStorage.parse(getattr(self, name))
            except ConfigError as err:
                raise ConfigError(f"{flag(name)}: {err}") from None
        if self.keep_images is not None:
            keep, out = Path(self.keep_images), Path(self.out)
            if keep == out or out in keep.parents or keep in out.parents:
                raise ConfigError(
                    f"--keep-images {keep} and --out {out} overlap: the image shards and the feature "
                    "store need folders of their own"
                )
