"""The region-feature record: `RegionFeatures`, its schema (field names, limits) and
`validate_record`, the check before anything is stored.

`RegionFeatures` is the canonical form of one image's bottom-up region features
(docs/layout.md shows who uses them). Conventions:

* `boxes` are float32 ``x1, y1, x2, y2`` in original-image pixels;
* `cls_prob` has the background class at index 0 (the Caffe convention);
* `objects_id` / `attrs_id` are 0-based over the non-background classes, i.e. the
  argmax of ``cls_prob[:, 1:]`` / ``attr_prob[:, 1:]``, with the (not renormalized)
  maximum as confidence.

Derived views (normalized boxes, the 5-d ViLBERT spatial vector; the IMG token and padded
batches: `pipeline.store.buffer`) are computed on read and never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, Optional

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
        return box_positions(self.boxes, self.image_w, self.image_h, "4d")

    def spatial5(self) -> np.ndarray:
        """(N, 5) float32 ``[x1/W, y1/H, x2/W, y2/H, area/(W*H)]`` (ViLBERT; no +1 pixel)."""
        return box_positions(self.boxes, self.image_w, self.image_h, "5d")

    def spatial6(self) -> np.ndarray:
        """(N, 6) float32 ``[x1/W, y1/H, x2/W, y2/H, w/W, h/H]`` (VinVL / Oscar: the tail of its 2054-d rows)."""
        return box_positions(self.boxes, self.image_w, self.image_h, "6d")

    def array_fields(self) -> dict[str, np.ndarray]:
        """The array-valued fields that are present, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), np.ndarray)}


LABEL_PAIRS = (("objects_id", "objects_conf"), ("attrs_id", "attrs_conf"))
PROB_FIELDS = ("cls_prob", "attr_prob")
OPTIONAL_ARRAYS = tuple(name for pair in LABEL_PAIRS for name in pair) + PROB_FIELDS  # the optional array fields


Position = Literal["4d", "5d", "6d"]
POSITION_WIDTHS = {"4d": 4, "5d": 5, "6d": 6}


def box_positions(boxes: np.ndarray, image_w, image_h, position: Position) -> np.ndarray:
    """Position vectors of pixel boxes ``(..., 4)`` x1 y1 x2 y2 in float32: "4d" divides by
    the image width/height (LXMERT), "5d" adds the area over the image's (ViLBERT; no +1
    pixel), "6d" the width and height over the image's (VinVL / Oscar). `image_w` / `image_h`
    are numbers, or arrays broadcasting against ``boxes[..., 0]`` (one size per image of a
    batch: shape (B, 1) for boxes (B, K, 4))."""
    b = np.asarray(boxes, np.float32)
    w, h = np.asarray(image_w, np.float64), np.asarray(image_h, np.float64)
    out = np.empty(b.shape[:-1] + (POSITION_WIDTHS[position],), np.float32)
    out[..., :4] = b / np.stack([w, h, w, h], -1).astype(np.float32)
    if position == "5d":
        out[..., 4] = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1]) / (w * h).astype(np.float32)
    elif position == "6d":
        out[..., 4] = (b[..., 2] - b[..., 0]) / w.astype(np.float32)
        out[..., 5] = (b[..., 3] - b[..., 1]) / h.astype(np.float32)
    return out


def grid_shape(boxes: np.ndarray) -> tuple[int, int]:
    """(rows, cols) of a grid record (a store whose layout's ``regions`` is ``"grid"``): its
    cells are in row-major order, so the first row is the cells sharing the first cell's top
    edge. Derived from the boxes on read, never stored; ValueError when they are no grid."""
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    if not len(b):
        return 0, 0
    below = np.flatnonzero(b[:, 1] != b[0, 1])
    cols = int(below[0]) if len(below) else len(b)
    rows = len(b) // cols
    if rows * cols != len(b) or not np.array_equal(b[:, 1].reshape(rows, cols), np.repeat(b[::cols, 1:2], cols, 1)):
        raise ValueError(f"{len(b)} boxes in no row-major grid")
    return rows, cols


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
    _check_image_id(rec.image_id)
    _check_image_size(rec)
    n = _check_boxes(rec)
    _check_features(rec, n, feature_dim, float16)
    _check_labels(rec, n)
    _check_prob_tables(rec, n, prob_dims or {})


def _check_image_id(iid) -> None:
    """A non-empty string of valid Unicode without tab, newline or NUL, of at most
    `MAX_IMAGE_ID_BYTES` bytes in UTF-8."""
    if not isinstance(iid, str) or not iid:
        raise InvalidRecordError(iid, "image_id", "must be a non-empty string")
    if any(c in iid for c in _FORBIDDEN_ID_CHARS):
        raise InvalidRecordError(iid, "image_id", "must not contain tab, newline or NUL")
    try:
        encoded = iid.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate (from surrogateescape'd bytes, say)
        raise InvalidRecordError(
            iid, "image_id", f"is not valid Unicode text: {err.reason} at position {err.start}"
        ) from None
    if len(encoded) > MAX_IMAGE_ID_BYTES:
        raise InvalidRecordError(iid, "image_id", f"longer than {MAX_IMAGE_ID_BYTES} bytes")


def _check_image_size(rec: RegionFeatures) -> None:
    """Height and width: positive integers that fit int32."""
    for name in ("image_h", "image_w"):
        value = getattr(rec, name)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise InvalidRecordError(rec.image_id, name, f"must be a positive integer, got {value!r}")
        if value > INT32_MAX:
            raise InvalidRecordError(rec.image_id, name, f"must be below 2**31 (stored as int32), got {value!r}")


def _checked_array(rec: RegionFeatures, name: str, ndim: int, kind: str) -> np.ndarray:
    """Field `name` of `rec`: a numpy array of `ndim` dimensions whose dtype kind is one of
    `kind`; float values finite and within the float32 range."""
    iid, a = rec.image_id, getattr(rec, name)
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


def _check_boxes(rec: RegionFeatures) -> int:
    """At least one box, each inside the image (within `BOX_TOLERANCE_PX`) with x1 <= x2 and
    y1 <= y2; returns the number of boxes."""
    iid, boxes = rec.image_id, _checked_array(rec, "boxes", 2, "f")
    n = boxes.shape[0]
    if boxes.shape[1] != 4:
        raise InvalidRecordError(iid, "boxes", f"must have shape (N, 4), got {boxes.shape}")
    if n < 1:
        raise InvalidRecordError(iid, "boxes", "has no boxes (num_boxes must be >= 1)")
    x1, y1, x2, y2 = (boxes[:, i].astype(np.float64) for i in range(4))
    tol = BOX_TOLERANCE_PX
    if (x1 < -tol).any() or (y1 < -tol).any() or (x2 > rec.image_w + tol).any() or (y2 > rec.image_h + tol).any():
        raise InvalidRecordError(iid, "boxes", f"a box lies outside the {rec.image_w}x{rec.image_h} image")
    if (x2 < x1).any() or (y2 < y1).any():
        raise InvalidRecordError(iid, "boxes", "a box has x2 < x1 or y2 < y1")
    return n


def _check_features(rec: RegionFeatures, n: int, feature_dim: Optional[int], float16: bool) -> None:
    """One row per box, of `feature_dim` values (None: any); with `float16`, within its range."""
    iid, feats = rec.image_id, _checked_array(rec, "features", 2, "f")
    if feats.shape[0] != n:
        raise InvalidRecordError(iid, "features", f"has {feats.shape[0]} rows but num_boxes={n}")
    if feature_dim is not None and feats.shape[1] != feature_dim:
        raise InvalidRecordError(iid, "features", f"has dim {feats.shape[1]}, store expects {feature_dim}")
    if float16 and feats.size and np.abs(feats).max() > FLOAT16_MAX:
        raise InvalidRecordError(iid, "features", "values exceed the float16 range (|x| > 65504)")


def _check_labels(rec: RegionFeatures, n: int) -> None:
    """Each label pair (ids, confidences): both or neither, one entry per box, ids in int32's
    non-negative range, confidences probabilities."""
    iid = rec.image_id
    for id_name, conf_name in LABEL_PAIRS:
        present = (getattr(rec, id_name) is not None, getattr(rec, conf_name) is not None)
        if present == (False, False):
            continue
        if present != (True, True):
            raise InvalidRecordError(iid, id_name, f"{id_name} and {conf_name} must be given together")
        ids = _checked_array(rec, id_name, 1, "iu")
        conf = _checked_array(rec, conf_name, 1, "f")
        for name, a in ((id_name, ids), (conf_name, conf)):
            if a.shape[0] != n:
                raise InvalidRecordError(iid, name, f"has {a.shape[0]} entries but num_boxes={n}")
        if (ids < 0).any() or (ids > INT32_MAX).any():
            raise InvalidRecordError(iid, id_name, "ids must lie in [0, 2**31)")
        _check_probability(iid, conf_name, conf)


def _check_prob_tables(rec: RegionFeatures, n: int, prob_dims: dict[str, Optional[int]]) -> None:
    """Each probability table present: one row per box, the width `prob_dims` gives (None:
    any, at least a background column and one class), probabilities."""
    iid = rec.image_id
    for name in PROB_FIELDS:
        if getattr(rec, name) is None:
            continue
        prob = _checked_array(rec, name, 2, "f")
        if prob.shape[0] != n:
            raise InvalidRecordError(iid, name, f"has {prob.shape[0]} rows but num_boxes={n}")
        want = prob_dims.get(name)
        if want is not None and prob.shape[1] != want:
            raise InvalidRecordError(iid, name, f"has {prob.shape[1]} columns, store expects {want}")
        if prob.shape[1] < 2:
            raise InvalidRecordError(iid, name, "needs a background column and at least one class")
        _check_probability(iid, name, prob)


def _check_probability(image_id: str, name: str, a: np.ndarray) -> None:
    if a.size and (a.min() < 0 or a.max() > 1):
        raise InvalidRecordError(image_id, name, "probabilities must lie in [0, 1]")
