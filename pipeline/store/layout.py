"""What a feature store holds and how: backend, dims, dtypes, probability storage.

A `StoreLayout` is fixed when a store is created and recorded in its manifest; every
shard of the store follows it, and a writer resuming the store must ask for the same.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Optional

import numpy as np

from pipeline.config import Config
from pipeline.errors import ConfigError

Backend = Literal["arrow", "lmdb"]
BACKENDS: tuple[str, ...] = ("arrow", "lmdb")
FLOAT_DTYPES: tuple[str, ...] = ("float16", "float32")
REGION_KINDS: tuple[str, ...] = ("detections", "grid")


@dataclass(frozen=True)
class ProbStorage:
    """How a per-region probability table (cls_prob / attr_prob) is stored.

    ``full``: every column; ``topk``: the k largest per region (ids + values; other
    columns read back as 0); ``none``: dropped.
    """

    mode: Literal["full", "topk", "none"] = "full"
    k: int = 0

    @classmethod
    def parse(cls, text: str) -> "ProbStorage":
        text = text.strip().lower()
        if text in ("full", "none"):
            return cls(text)  # type: ignore[arg-type]
        if text.startswith("topk:") and text[5:].isdigit() and int(text[5:]) > 0:
            return cls("topk", int(text[5:]))
        raise ConfigError(f"probability storage must be 'full', 'none' or 'topk:K' (K > 0), got {text!r}")

    def __str__(self) -> str:
        return f"topk:{self.k}" if self.mode == "topk" else self.mode

    def to_json(self) -> str:
        return str(self)

    def encode_topk(self, prob: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N, k) uint16 column ids and (N, k) values, largest first."""
        ids = np.argsort(-prob, axis=1, kind="stable")[:, : self.k].astype(np.uint16)
        return ids, np.take_along_axis(prob, ids.astype(np.int64), axis=1)

    @staticmethod
    def decode_topk(ids: np.ndarray, values: np.ndarray, dim: int) -> np.ndarray:
        dense = np.zeros((ids.shape[0], dim), values.dtype)
        np.put_along_axis(dense, ids.astype(np.int64), values, axis=1)
        return dense


@dataclass(frozen=True)
class StoreLayout(Config):
    backend: Backend = "arrow"
    feature_dim: int = 2048
    dtype: str = "float16"  # features and probability tables; boxes/confidences are float32
    cls_prob: ProbStorage = ProbStorage("full")
    attr_prob: ProbStorage = ProbStorage("full")
    # Widths of the probability tables; fixed by the first record that has one.
    cls_dim: Optional[int] = None
    attr_dim: Optional[int] = None
    # "detections" (a detector's regions, most confident first or in its own order) or "grid"
    # (a feature map's cells, row-major: `pipeline.records.grid_shape` reads a record's shape)
    regions: str = "detections"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.dtype not in FLOAT_DTYPES:
            raise ConfigError(f"dtype must be one of {FLOAT_DTYPES}, got {self.dtype!r}")
        if self.regions not in REGION_KINDS:
            raise ConfigError(f"regions must be one of {REGION_KINDS}, got {self.regions!r}")
        if self.feature_dim < 1:
            raise ConfigError(f"feature_dim must be positive, got {self.feature_dim}")
        for name in ("cls_prob", "attr_prob"):
            storage, dim = self.prob(name), self.prob_dim(name)
            if storage.mode == "topk" and dim is not None and not storage.k < dim <= 65535:
                raise ConfigError(f"{name} top-k of {storage.k} needs a table wider than k (and <= 65535), got {dim}")

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    def prob(self, name: str) -> ProbStorage:
        return getattr(self, name)

    def prob_dim(self, name: str) -> Optional[int]:
        return self.cls_dim if name == "cls_prob" else self.attr_dim

    def with_prob_dim(self, name: str, dim: int) -> "StoreLayout":
        return replace(self, **{"cls_dim" if name == "cls_prob" else "attr_dim": dim})

    def storage_settings(self) -> dict:
        """The settings a resuming writer must agree with (dims learnt later excluded; the
        region kind only for a grid, so a detections store's shard metadata is as it was)."""
        settings = {
            "backend": self.backend,
            "feature_dim": self.feature_dim,
            "dtype": self.dtype,
            "cls_prob": str(self.cls_prob),
            "attr_prob": str(self.attr_prob),
        }
        if self.regions != "detections":
            settings["regions"] = self.regions
        return settings

    @classmethod
    def from_json(cls, obj: dict) -> "StoreLayout":
        """The layout a manifest records; a value of the wrong type is a ValueError naming it."""
        obj = dict(obj)
        kinds = {"backend": str, "dtype": str, "cls_prob": str, "attr_prob": str, "feature_dim": int, "regions": str}
        for key, value in obj.items():
            wanted = kinds.get(key, int if key in ("cls_dim", "attr_dim") else None)
            if wanted is None:
                continue  # an unknown key: refused by the constructor
            if isinstance(value, bool) or not (isinstance(value, wanted) or (value is None and key.endswith("_dim"))):
                raise ValueError(f"layout {key}: {value!r} is not a {wanted.__name__}")
        obj["cls_prob"] = ProbStorage.parse(obj["cls_prob"])
        obj["attr_prob"] = ProbStorage.parse(obj["attr_prob"])
        return cls(**obj)
