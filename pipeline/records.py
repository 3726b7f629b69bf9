"""Typed records that cross stage boundaries.

`RegionFeatures` is the canonical form of one image's bottom-up region features
(docs/layout.md shows who uses them). Conventions:

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
    iid = rec.image_id
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
        raise InvalidRecordError(iid, "boxes", f"a box lies outside the {rec.image_w}x{rec.image_h} image")
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
    batch, box covering the whole image), then the first `max_regions` regions, then padding. `mask` is True on
    real slots (IMG token included). Padding and the IMG token carry label id -1 and
    zero confidences / probabilities.
    """

    image_ids: list[str]
    features: np.ndarray  # (B, K, D) float32
    positions: np.ndarray  # (B, K, 4|5) float32
    mask: np.ndarray  # (B, K) bool
    num_regions: np.ndarray  # (B,) int64, slots in use per image (the IMG token included)
    objects_id: Optional[np.ndarray] = None  # (B, K) int64
    objects_conf: Optional[np.ndarray] = None  # (B, K) float32
    attrs_id: Optional[np.ndarray] = None
    attrs_conf: Optional[np.ndarray] = None
    cls_prob: Optional[np.ndarray] = None  # (B, K, C) float32
    attr_prob: Optional[np.ndarray] = None

    def image(self, b: int) -> "RegionBatch":
        """Image `b` as a one-image batch of views."""
        one = slice(b, b + 1)
        return RegionBatch(
            **{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[one] for f in fields(self)}
        )


def img_token_feature(features: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """ViLBERT's [IMG] feature: the mean of the `visible` regions' features, (D,) float32;
    zeros when none is visible. Computed over the regions the model gets (not those beyond
    the slot budget), and after masking over the ones left visible, so that a masked
    region cannot be recovered from it."""
    count = int(visible.sum())
    if not count:
        return np.zeros(features.shape[1], np.float32)
    return (features[visible].sum(axis=0, dtype=np.float64) / count).astype(np.float32)


_IMG_POSITION = np.array([0, 0, 1, 1, 1, 1], np.float32)  # the IMG token's box: the whole image (area, w, h 1)
Memory = Literal["plain", "pinned", "shared"]


def empty_array(shape: tuple, dtype, memory: Memory = "plain") -> np.ndarray:
    """A zeroed array; "pinned": in page-locked memory when CUDA exists (fast, asynchronous
    host-to-GPU copies); "shared": a view of a torch tensor in shared memory, which a
    DataLoader worker hands to the main process without copying it (torch collates its
    batches so). The array's `.base` is then that tensor."""
    if memory == "plain":
        return np.zeros(shape, dtype)
    import torch

    if memory == "pinned" and not torch.cuda.is_available():
        return np.zeros(shape, dtype)
    kind = torch.from_numpy(np.zeros(0, dtype)).dtype
    tensor = (
        torch.zeros(shape, dtype=kind, pin_memory=True)
        if memory == "pinned"
        else torch.zeros(shape, dtype=kind).share_memory_()
    )
    return tensor.numpy()


class RegionBuffer:
    """The padded arrays of a `RegionBatch` of `size` images of up to `max_regions` regions,
    allocated once and filled with images (`put_many`, `put` for one): the one owner of the
    slot layout (`pad_regions` is a buffer filled once). Slot 0 holds the IMG token with
    `img_token`; `position` "4d", "5d" or "6d". `fields`: the optional fields to hold (of
    `OPTIONAL_ARRAYS`; `prob_widths` gives each probability table's width); an image lacking
    one gets the padding values there (ids -1, else 0) and is in `missing[field]` (a set of
    image slots). Features and probability tables have dtype `dtype` (the stored float16 copies straight), boxes and
    confidences float32, ids int64; `memory` as in `empty_array`. Filling copies each array
    once; positions, mask and the IMG token are computed for the whole batch by `batch`."""

    def __init__(
        self,
        size: int,
        max_regions: int,
        feature_dim: int,
        *,
        position: Position = "5d",
        img_token: bool = False,
        fields: Sequence[str] = (),
        prob_widths: Optional[dict] = None,
        dtype="float32",
        memory: Memory = "plain",
    ):
        if size < 1 or max_regions < 1:
            raise ValueError("a RegionBuffer needs size >= 1 and max_regions >= 1")
        unknown = set(fields) - set(OPTIONAL_ARRAYS)
        if unknown:
            raise ValueError(f"unknown region fields {sorted(unknown)}; choose from {OPTIONAL_ARRAYS}")
        widths = prob_widths or {}
        self.first, self.max_regions, self.position = int(img_token), max_regions, position
        slots = max_regions + self.first
        self.image_ids: list[str] = [""] * size
        # per image (lists: filled image by image, read once per batch): its size in pixels and the regions held
        self.widths, self.heights, self.counts = [1] * size, [1] * size, [0] * size  # (IMG token excluded)
        self.boxes = np.zeros((size, slots, 4), np.float32)  # pixel boxes, zero in padding
        self.features = empty_array((size, slots, feature_dim), dtype, memory)
        self.positions = empty_array((size, slots, POSITION_WIDTHS[position]), np.float32, memory)
        self.mask = empty_array((size, slots), bool, memory)
        self.optional: dict[str, np.ndarray] = {}
        for name in fields:
            if name in PROB_FIELDS:
                if not widths.get(name):
                    raise ValueError(f"no width for {name}: give it in prob_widths, or leave {name} out of fields")
                self.optional[name] = empty_array((size, slots, widths[name]), dtype, memory)
            else:
                self.optional[name] = empty_array(
                    (size, slots), np.int64 if name.endswith("_id") else np.float32, memory
                )
                if name.endswith("_id"):
                    self.optional[name].fill(-1)
        self.missing = {name: set() for name in fields}  # the image slots lacking each field
        # 1-d views of the region arrays (field -> (view, values per region, padding)): what `put_many` fills
        self._flat = {}
        for name, out in (("boxes", self.boxes), ("features", self.features), *self.optional.items()):
            view = out.view()
            view.shape = (-1,)  # raises rather than copy: the arrays are contiguous
            self._flat[name] = (view, int(np.prod(out.shape[2:], dtype=np.int64)), -1 if name.endswith("_id") else 0)

    def __len__(self) -> int:
        return len(self.image_ids)

    def put(
        self, b: int, image_id: str, image_h: int, image_w: int, boxes: np.ndarray, features: np.ndarray, optional: dict
    ) -> None:
        """Copy one image's first `max_regions` regions into image slot `b` (`optional`: field
        -> array or None, for the buffer's `fields`): `put_many` of one image."""

        def flat(value):
            return ([None], [-1]) if value is None else ([np.ascontiguousarray(value).reshape(-1)], [0])

        sources = {"boxes": flat(boxes), "features": flat(features)}
        sources.update((name, flat(optional.get(name))) for name in self.optional)
        self.put_many([b], [image_id], [image_h], [image_w], [len(boxes)], sources)

    def put_many(
        self,
        slots: Sequence[int],
        image_ids: Sequence[str],
        heights: Sequence[int],
        widths: Sequence[int],
        counts: Sequence[int],
        sources: dict,
    ) -> None:
        """Copy images into image slots `slots`, each its first `max_regions` regions (store
        order), clearing what a previous, larger image left beyond them. Image k has
        `counts[k]` regions; `sources` maps "boxes", "features" and the buffer's optional
        fields to a pair (arrays, starts): image k's values are
        ``arrays[k][starts[k] : starts[k] + counts[k] * width]`` (1-d, row-major; `width`
        values per region); ``starts[k] < 0`` where it lacks the field, which is then
        padded and marked in `missing`. One slice copy per image and field: the arrays may
        be views of a shard's map (the values of many images in one array)."""
        first, limit, per_image = self.first, self.max_regions, self.boxes.shape[1]
        bases, kept, stale = [], [], []  # each image's first region slot, counted over the batch; regions kept
        for b, image_id, image_h, image_w, n in zip(slots, image_ids, heights, widths, counts):
            base, n, held = b * per_image + first, min(n, limit), self.counts[b]
            if held > n:  # a previous, larger image's regions beyond the new ones
                stale.append((base + n, base + held))
            bases.append(base)
            kept.append(n)
            self.image_ids[b], self.heights[b], self.widths[b], self.counts[b] = image_id, image_h, image_w, n
        for name, (out, width, pad) in self._flat.items():
            arrays, starts = sources[name]
            for base, n, values, start in zip(bases, kept, arrays, starts):
                if start < 0:
                    out[base * width : (base + n) * width] = pad
                else:
                    out[base * width : (base + n) * width] = values[start : start + n * width]
            for begin, end in stale:
                out[begin * width : end * width] = pad
            missing = self.missing.get(name)
            if missing is not None:
                missing.difference_update(slots)
                if min(starts, default=0) < 0:
                    missing.update(b for b, start in zip(slots, starts) if start < 0)

    def put_record(self, b: int, rec: RegionFeatures) -> None:
        """`put` of a record."""
        self.put(
            b,
            rec.image_id,
            rec.image_h,
            rec.image_w,
            rec.boxes,
            rec.features,
            {name: getattr(rec, name) for name in self.optional},
        )

    def batch(self, images: Optional[slice] = None, img_feature: bool = True) -> RegionBatch:
        """A `RegionBatch` of views of these arrays (of `images`, default all), its positions,
        mask and IMG token computed now for all its images at once. An optional field
        missing from any of its images is None, as `pad_regions` leaves it. With
        ``img_feature=False`` the IMG token's feature is left as it is (for a caller that
        computes it itself, after masking regions)."""
        sel = images or slice(None)
        first, counts = self.first, np.array(self.counts[sel], np.int64)
        image_w, image_h = np.array(self.widths[sel], np.float64), np.array(self.heights[sel], np.float64)
        positions, mask, features = self.positions[sel], self.mask[sel], self.features[sel]
        positions[:] = box_positions(self.boxes[sel], image_w[:, None], image_h[:, None], self.position)
        np.less(np.arange(mask.shape[1]), (counts + first)[:, None], out=mask)
        if first:
            positions[:, 0] = _IMG_POSITION[: positions.shape[2]]
            if img_feature:  # the mean of the regions (padding is zero), as `img_token_feature`
                features[:, 0] = features[:, 1:].sum(axis=1, dtype=np.float64) / np.maximum(counts, 1)[:, None]
        held = range(len(self))[sel]
        optional = {
            name: out[sel] if self.missing[name].isdisjoint(held) else None for name, out in self.optional.items()
        }
        return RegionBatch(
            image_ids=self.image_ids[sel],
            features=features,
            positions=positions,
            mask=mask,
            num_regions=counts + first,
            **optional,
        )


def pad_regions(
    records: Sequence[RegionFeatures],
    max_regions: int,
    *,
    position: Position = "5d",
    img_token: bool = False,
) -> RegionBatch:
    """Pad records to a fixed number of slots (regions beyond `max_regions` are dropped,
    keeping store order), float32: a `RegionBuffer` filled once. Optional label/probability
    arrays are filled only when every record has them."""
    if not records:
        raise ValueError("pad_regions needs at least one record")
    fields = [name for name in OPTIONAL_ARRAYS if all(getattr(r, name) is not None for r in records)]
    widths = {name: getattr(records[0], name).shape[1] for name in PROB_FIELDS if name in fields}
    buffer = RegionBuffer(
        len(records),
        max_regions,
        records[0].features.shape[1],
        position=position,
        img_token=img_token,
        fields=fields,
        prob_widths=widths,
    )
    for b, rec in enumerate(records):
        buffer.put_record(b, rec)
    return buffer.batch()


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
