"""Typed records that cross stage boundaries.

`RegionFeatures` is the canonical form of one image's bottom-up region features
(see ARCHITECTURE.md). Conventions:

* `boxes` are float32 ``x1, y1, x2, y2`` in original-image pixels;
* `cls_prob` has the background class at index 0 (the Caffe convention);
* `objects_id` / `attrs_id` are 0-based over the non-background classes, i.e. the
  argmax of ``cls_prob[:, 1:]`` / ``attr_prob[:, 1:]``, with the (not renormalized)
  maximum as confidence.

Derived views (normalized boxes, the 5-d ViLBERT spatial vector, the IMG token,
padded batches) are computed on read and never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, Optional, Sequence

import numpy as np

from pipeline.errors import InvalidRecordError

REGION_SCHEMA_VERSION = 1
FLOAT16_MAX = 65504.0
FLOAT32_MAX = float(np.finfo(np.float32).max)
INT32_MAX = 2**31 - 1  # image sizes and label ids are stored as int32
# Boxes may sit this many pixels outside the image (float rounding in legacy files).
BOX_TOLERANCE_PX = 0.01
MAX_IMAGE_ID_BYTES = 1024
_FORBIDDEN_ID_CHARS = ("\t", "\n", "\r", "\x00")


@dataclass(eq=False)
class RegionFeatures:
    """Region features of one image. Arrays read from a store are read-only views
    (ids as stored, int32); treat records as values and do not mutate them."""

    image_id: str
    image_h: int
    image_w: int
    boxes: np.ndarray  # (N, 4) float32, x1 y1 x2 y2 in original pixels
    features: np.ndarray  # (N, D)
    objects_id: Optional[np.ndarray] = None  # (N,) int, 0-based over non-background classes
    objects_conf: Optional[np.ndarray] = None  # (N,) float32
    attrs_id: Optional[np.ndarray] = None  # (N,) int
    attrs_conf: Optional[np.ndarray] = None  # (N,) float32
    cls_prob: Optional[np.ndarray] = None  # (N, C), background at index 0
    attr_prob: Optional[np.ndarray] = None  # (N, A), "no attribute" at index 0

    @property
    def num_boxes(self) -> int:
        return int(self.boxes.shape[0])

    def normalized_boxes(self) -> np.ndarray:
        """(N, 4) float32 boxes divided by image width/height (LXMERT's position input)."""
        scale = np.array([self.image_w, self.image_h, self.image_w, self.image_h], np.float32)
        return (self.boxes.astype(np.float32) / scale).astype(np.float32)

    def spatial5(self) -> np.ndarray:
        """(N, 5) float32 ``[x1/W, y1/H, x2/W, y2/H, area/(W*H)]`` (ViLBERT; no +1 pixel)."""
        b = self.boxes.astype(np.float32)
        w, h = float(self.image_w), float(self.image_h)
        out = np.empty((b.shape[0], 5), np.float32)
        out[:, :4] = b / np.array([w, h, w, h], np.float32)
        out[:, 4] = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) / (w * h)
        return out

    def array_fields(self) -> dict[str, np.ndarray]:
        """The array-valued fields that are present, by name."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if isinstance(getattr(self, f.name), np.ndarray)
        }


LABEL_PAIRS = (("objects_id", "objects_conf"), ("attrs_id", "attrs_conf"))
PROB_FIELDS = ("cls_prob", "attr_prob")


def labels_from_probs(prob: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ids and confidences over the non-background columns of a bg-first probability table.

    ``ids = argmax(prob[:, 1:])`` (0-based) and ``conf = max(prob[:, 1:])``, not
    renormalized: what the Caffe/LXMERT extractors store.
    """
    fg = np.asarray(prob, np.float32)[:, 1:]
    ids = fg.argmax(axis=1).astype(np.int64)
    return ids, fg[np.arange(fg.shape[0]), ids].astype(np.float32)


def validate_record(
    rec: RegionFeatures,
    *,
    feature_dim: Optional[int] = None,
    prob_dims: Optional[dict[str, Optional[int]]] = None,
    float16: bool = False,
) -> None:
    """Raise `InvalidRecordError` naming the image and field if `rec` must not be stored.

    `prob_dims` maps ``cls_prob``/``attr_prob`` to the expected width (None: any).
    `float16` checks that float arrays survive a float16 cast (|x| <= 65504); wider
    float arrays must always fit float32. Sizes and label ids must fit int32, as stored.
    """
    iid = rec.image_id
    if not isinstance(iid, str) or not iid:
        raise InvalidRecordError(iid, "image_id", "must be a non-empty string")
    if any(c in iid for c in _FORBIDDEN_ID_CHARS):
        raise InvalidRecordError(iid, "image_id", "must not contain tab, newline or NUL")
    if len(iid.encode("utf-8")) > MAX_IMAGE_ID_BYTES:
        raise InvalidRecordError(iid, "image_id", f"longer than {MAX_IMAGE_ID_BYTES} bytes")
    for name in ("image_h", "image_w"):
        value = getattr(rec, name)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise InvalidRecordError(iid, name, f"must be a positive integer, got {value!r}")
        if value > INT32_MAX:
            raise InvalidRecordError(iid, name, f"must be below 2**31 (stored as int32), got {value!r}")

    def array(name: str, ndim: int, kind: str) -> np.ndarray:
        a = getattr(rec, name)
        if not isinstance(a, np.ndarray):
            raise InvalidRecordError(iid, name, f"must be a numpy array, got {type(a).__name__}")
        if a.ndim != ndim:
            raise InvalidRecordError(iid, name, f"must be {ndim}-d, got shape {a.shape}")
        if a.dtype.kind not in kind:
            raise InvalidRecordError(iid, name, f"has dtype {a.dtype}")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise InvalidRecordError(iid, name, "contains NaN or infinite values")
        if a.dtype.kind == "f" and a.dtype.itemsize > 4 and a.size and np.abs(a).max() > FLOAT32_MAX:
            raise InvalidRecordError(iid, name, "values exceed the float32 range")
        return a

    boxes = array("boxes", 2, "f")
    n = boxes.shape[0]
    if boxes.shape[1] != 4:
        raise InvalidRecordError(iid, "boxes", f"must have shape (N, 4), got {boxes.shape}")
    if n < 1:
        raise InvalidRecordError(iid, "boxes", "has no boxes (num_boxes must be >= 1)")
    x1, y1, x2, y2 = (boxes[:, i].astype(np.float64) for i in range(4))
    tol = BOX_TOLERANCE_PX
    if (x1 < -tol).any() or (y1 < -tol).any() or (x2 > rec.image_w + tol).any() or (y2 > rec.image_h + tol).any():
        raise InvalidRecordError(
            iid, "boxes", f"a box lies outside the {rec.image_w}x{rec.image_h} image"
        )
    if (x2 < x1).any() or (y2 < y1).any():
        raise InvalidRecordError(iid, "boxes", "a box has x2 < x1 or y2 < y1")

    feats = array("features", 2, "f")
    if feats.shape[0] != n:
        raise InvalidRecordError(iid, "features", f"has {feats.shape[0]} rows but num_boxes={n}")
    if feature_dim is not None and feats.shape[1] != feature_dim:
        raise InvalidRecordError(iid, "features", f"has dim {feats.shape[1]}, store expects {feature_dim}")
    if float16 and feats.size and np.abs(feats).max() > FLOAT16_MAX:
        raise InvalidRecordError(iid, "features", "values exceed the float16 range (|x| > 65504)")

    for id_name, conf_name in LABEL_PAIRS:
        present = (getattr(rec, id_name) is not None, getattr(rec, conf_name) is not None)
        if present == (False, False):
            continue
        if present != (True, True):
            raise InvalidRecordError(iid, id_name, f"{id_name} and {conf_name} must be given together")
        ids = array(id_name, 1, "iu")
        conf = array(conf_name, 1, "f")
        for name, a in ((id_name, ids), (conf_name, conf)):
            if a.shape[0] != n:
                raise InvalidRecordError(iid, name, f"has {a.shape[0]} entries but num_boxes={n}")
        if (ids < 0).any() or (ids > INT32_MAX).any():
            raise InvalidRecordError(iid, id_name, "ids must lie in [0, 2**31)")
        _check_probability(iid, conf_name, conf)

    for name in PROB_FIELDS:
        if getattr(rec, name) is None:
            continue
        prob = array(name, 2, "f")
        if prob.shape[0] != n:
            raise InvalidRecordError(iid, name, f"has {prob.shape[0]} rows but num_boxes={n}")
        want = (prob_dims or {}).get(name)
        if want is not None and prob.shape[1] != want:
            raise InvalidRecordError(iid, name, f"has {prob.shape[1]} columns, store expects {want}")
        if prob.shape[1] < 2:
            raise InvalidRecordError(iid, name, "needs a background column and at least one class")
        _check_probability(iid, name, prob)


def _check_probability(image_id: str, name: str, a: np.ndarray) -> None:
    if a.size and (a.min() < 0 or a.max() > 1):
        raise InvalidRecordError(image_id, name, "probabilities must lie in [0, 1]")


@dataclass(frozen=True, eq=False)
class RegionBatch:
    """A padded batch of region features for the trainer.

    Slot layout per image: optional IMG token at slot 0 (`img_token_feature` of the regions in the
    batch, box covering the whole image), then the first `max_boxes` regions, then padding. `mask` is True on
    real slots (IMG token included). Padding and the IMG token carry label id -1 and
    zero confidences / probabilities.
    """

    image_ids: list[str]
    features: np.ndarray  # (B, K, D) float32
    positions: np.ndarray  # (B, K, 4|5) float32
    mask: np.ndarray  # (B, K) bool
    num_boxes: np.ndarray  # (B,) int64, real slots per image
    objects_id: Optional[np.ndarray] = None  # (B, K) int64
    objects_conf: Optional[np.ndarray] = None  # (B, K) float32
    attrs_id: Optional[np.ndarray] = None
    attrs_conf: Optional[np.ndarray] = None
    cls_prob: Optional[np.ndarray] = None  # (B, K, C) float32
    attr_prob: Optional[np.ndarray] = None


def img_token_feature(features: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """ViLBERT's [IMG] feature: the mean of the `visible` regions' features, (D,) float32;
    zeros when none is visible. Computed over the regions the model gets (not those beyond
    the slot budget), and after masking over the ones left visible, so that a masked
    region cannot be recovered from it."""
    count = int(visible.sum())
    if not count:
        return np.zeros(features.shape[1], np.float32)
    return (features[visible].sum(axis=0, dtype=np.float64) / count).astype(np.float32)


def pad_regions(
    records: Sequence[RegionFeatures],
    max_boxes: int,
    *,
    position: Literal["4d", "5d"] = "5d",
    img_token: bool = False,
) -> RegionBatch:
    """Pad records to a fixed number of slots (regions beyond `max_boxes` are dropped,
    keeping store order). Optional label/probability arrays are filled only when every
    record has them."""
    if not records:
        raise ValueError("pad_regions needs at least one record")
    if max_boxes < 1:
        raise ValueError("max_boxes must be >= 1")
    first = int(img_token)
    slots = max_boxes + first
    batch = len(records)
    dim = records[0].features.shape[1]
    pos_dim = 5 if position == "5d" else 4
    feats = np.zeros((batch, slots, dim), np.float32)
    pos = np.zeros((batch, slots, pos_dim), np.float32)
    mask = np.zeros((batch, slots), bool)
    counts = np.zeros(batch, np.int64)
    optional: dict[str, np.ndarray] = {}
    for id_name, conf_name in LABEL_PAIRS:
        if all(getattr(r, id_name) is not None for r in records):
            optional[id_name] = np.full((batch, slots), -1, np.int64)
            optional[conf_name] = np.zeros((batch, slots), np.float32)
    for name in PROB_FIELDS:
        if all(getattr(r, name) is not None for r in records):
            width = getattr(records[0], name).shape[1]
            optional[name] = np.zeros((batch, slots, width), np.float32)

    for b, rec in enumerate(records):
        n = min(rec.num_boxes, max_boxes)
        view = rec.spatial5() if position == "5d" else rec.normalized_boxes()
        sl = slice(first, first + n)
        feats[b, sl] = rec.features[:n]
        pos[b, sl] = view[:n]
        if img_token:
            feats[b, 0] = img_token_feature(feats[b, 1:1 + n], np.ones(n, bool))
            pos[b, 0] = [0, 0, 1, 1, 1][:pos_dim]
        mask[b, : first + n] = True
        counts[b] = first + n
        for name, out in optional.items():
            out[b, sl] = getattr(rec, name)[:n]
    return RegionBatch(
        image_ids=[r.image_id for r in records],
        features=feats,
        positions=pos,
        mask=mask,
        num_boxes=counts,
        **optional,
    )


# ---------------------------------------------------------------------------
# Source items (dataset readers -> downloader) and image records (downloader ->
# image shards -> extractor).

@dataclass(frozen=True)
class Text:
    kind: str  # caption | question | statement
    text: str


@dataclass(frozen=True)
class SourceItem:
    """One image to fetch: a stable, collision-free id, where it lives, and its texts (not a
    mixture's text item: that is `pipeline.mixture.sources.TextItem`)."""

    image_id: str
    url: Optional[str] = None  # http(s) URL ...
    path: Optional[str] = None  # ... or a local file
    texts: tuple[Text, ...] = ()
    split: str = ""
    source: str = ""  # the reader's name
    extra: tuple[tuple[str, str], ...] = ()  # reader-specific string fields (e.g. url_sha1)

    def __post_init__(self) -> None:
        if (self.url is None) == (self.path is None):
            raise ValueError(f"item {self.image_id!r}: give exactly one of url and path")

    @property
    def location(self) -> str:
        return self.url if self.url is not None else str(self.path)
