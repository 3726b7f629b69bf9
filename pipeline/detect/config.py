"""The detect stage's settings, torch-free (the CLI imports them), each validated in itself.

* `SelectionConfig` (with `BoxCount`): which regions are kept, by one of `POLICIES`; a field
  left unset takes the detector backend's default (`pipeline.detect.backends`: each backend
  names the policies it implements).
* `GridPool`: the cells a grid backend pools its feature map to (``--grid-pool 8x8``).
* `ExtractConfig`: one `vlprep extract` run — the detector (a named config of one of the
  backends, or a JSON path) and its inputs (`PREPROCESS_MODES`, see
  `pipeline.detect.preprocess`), the store written, and the sections it shares with
  `vlprep download` (shards and Ray, reader, fetching, images). It resolves what the user left
  to the backend (preprocessing, selection) when it is built, so the config a store records is
  the one that ran.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Optional

from pipeline.config import Config, at_least, check_device, flag, from_json, one_of
from pipeline.datasets import READERS, ReaderOptions, check_inputs
from pipeline.distribute import DistributeConfig, absolute
from pipeline.download.fetch import FetchConfig
from pipeline.errors import ConfigError
from pipeline.images import ImageConfig
from pipeline.store.layout import BACKENDS, FLOAT_DTYPES, ProbStorage

# Region selection policies (each backend implements some of them; see pipeline.detect.backends):
# butd / maxnms: bottom-up attention's Caffe rule and the detectron2/HF ports' (BUTD R101-C4);
# per-class / class-agnostic: maskrcnn-benchmark's NMS_FILTER 1 and 2 (VinVL X152-C4).
POLICIES = ("butd", "maxnms", "per-class", "class-agnostic")
# Resize conventions (pipeline.detect.preprocess): Caffe BUTD, detectron2, maskrcnn-benchmark.
PREPROCESS_MODES = ("caffe", "detectron2", "maskrcnn")


class ResNeXtWidths:
    """The widths a ResNe(X)t architecture config derives from its fields (``groups``,
    ``width_per_group``, ``res2_out_channels``): res2's bottleneck and res5's output."""

    @property
    def bottleneck_channels(self) -> int:
        return self.groups * self.width_per_group

    @property
    def feature_dim(self) -> int:
        return self.res2_out_channels * 8


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
    """Which regions an image keeps. A field left None takes the backend's default
    (`resolved`); a store records the resolved selection."""

    policy: Optional[str] = None
    boxes: Optional[BoxCount] = None
    conf_thresh: Optional[float] = None  # a region's best class score must reach this
    nms_thresh: Optional[float] = None  # per-class (or class-agnostic) NMS overlap threshold
    regression: Optional[bool] = None  # per-class / class-agnostic: regressed boxes, or the proposals

    def __post_init__(self) -> None:
        if self.policy is not None:
            one_of("policy", self.policy, POLICIES)
        at_least(self, {name: 0 for name in ("conf_thresh", "nms_thresh") if getattr(self, name) is not None})

    def resolved(self, defaults: "SelectionConfig") -> "SelectionConfig":
        """This selection with each unset field taken from `defaults`."""
        return replace(
            self, **{f.name: getattr(defaults, f.name) for f in fields(self) if getattr(self, f.name) is None}
        )

    @classmethod
    def from_json(cls, obj: dict) -> "SelectionConfig":
        """The selection as `to_json` (a store's recorded run config) writes it: ``boxes`` as text."""
        fields_ = dict(obj)
        if fields_.get("boxes") is not None:
            fields_["boxes"] = BoxCount.parse(fields_["boxes"])
        return from_json(cls, fields_, "selection")

    def describe(self) -> str:
        """The store's ``box_policy`` provenance of a resolved selection (an identity key: a store
        is appended to only under the same one). "+1px" marks Caffe's NMS rule: stores of the
        earlier rule differ."""
        if self.policy == "butd":
            return f"butd boxes={self.boxes}, conf>={self.conf_thresh}, nms={self.nms_thresh} +1px"
        if self.policy == "maxnms":
            return f"maxnms boxes={self.boxes}"
        kept = "regressed boxes" if self.regression else "proposal boxes"
        return f"{self.policy} boxes={self.boxes}, conf>={self.conf_thresh}, nms={self.nms_thresh}, {kept}"


@dataclass(frozen=True)
class GridPool:
    """The cells a grid is average-pooled to: ``ROWSxCOLS`` (``8x8``) or ``K`` (K x K), each >= 1."""

    rows: int
    cols: int

    def __post_init__(self) -> None:
        if self.rows < 1 or self.cols < 1:
            raise ConfigError(f"--grid-pool must be ROWSxCOLS (or K) with sides >= 1, got {self}")

    @classmethod
    def parse(cls, text: str) -> "GridPool":
        parts = str(text).lower().split("x")
        try:
            rows, cols = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (0, 0)
        except ValueError:
            rows = cols = 0
        if rows < 1 or cols < 1:
            raise ConfigError(f"--grid-pool must be ROWSxCOLS (e.g. 8x8) or K, with sides >= 1, got {text!r}")
        return cls(rows, cols)

    def __str__(self) -> str:
        return f"{self.rows}x{self.cols}"

    def to_json(self) -> str:
        return str(self)


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
    detector: str = "vg-r101"  # a named detector config of any backend, or a JSON path
    preprocess: Optional[str] = None  # resize convention (PREPROCESS_MODES); None: the backend's own
    selection: SelectionConfig = SelectionConfig()  # unset fields: the backend's defaults
    given_boxes: Optional[Path] = None  # JSON/Arrow/Parquet of image_id -> boxes: extract exactly those
    labelmap: Optional[Path] = None  # the detector's label names (VinVL's VG-SGG-dicts JSON)
    grid_pool: Optional[GridPool] = None  # a grid backend's cells, average-pooled (None: the whole map)
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
        for name in ("out", "images", "weights", "keep_images", "given_boxes", "labelmap"):
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
        from pipeline.detect.backends import resolve  # here: the registry imports this module

        detector = resolve(self.detector)
        backend = detector.backend
        if self.weights is None and not self.random_weights:
            raise ConfigError(f"--weights is required: {backend.weights_help} (or --random-weights for a smoke run)")
        if self.weights is not None and self.random_weights:
            raise ConfigError("give --weights or --random-weights, not both")
        if self.given_boxes is not None and not Path(self.given_boxes).exists():
            raise ConfigError(f"given-boxes file not found: {self.given_boxes}")
        object.__setattr__(self, "preprocess", backend.check_preprocess(self.preprocess))
        object.__setattr__(self, "selection", backend.check_selection(self.selection))
        backend.check_options(self, detector.config)
        at_least(self, {"batch_size": 1, "actor_cpus": 0, **({"actors": 1} if self.actors is not None else {})})
        check_device("device", self.device)
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
