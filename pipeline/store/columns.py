"""The stored per-region columns of a store, shared by both backends.

A record is stored as a few scalars (image id, height, width, num_boxes) plus one
2-d array per column below, each (num_boxes, width) in the column's dtype:

    boxes              float32  4
    features           float16|float32  feature_dim
    objects_id         int32    1        (optional, with objects_conf)
    objects_conf       float32  1
    attrs_id           int32    1        (optional, with attrs_conf)
    attrs_conf         float32  1
    cls_prob           float16|float32  C          (storage "full")
    cls_prob_topk_ids  uint16   k                  (storage "topk:k")
    cls_prob_topk      float16|float32  k
    attr_prob ...      as cls_prob

Optional columns belong to a record field; a field is present or absent per record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from pipeline.records import RegionFeatures
from pipeline.store.layout import StoreLayout

OPTIONAL_FIELDS = ("objects_id", "attrs_id", "cls_prob", "attr_prob")


@dataclass(frozen=True)
class Column:
    name: str
    dtype: np.dtype
    width: Optional[int]  # None: a probability width not yet known
    field: str  # the RegionFeatures field it stores ("objects_id" covers objects_conf too)


def columns(layout: StoreLayout) -> tuple[Column, ...]:
    f32, i32 = np.dtype(np.float32), np.dtype(np.int32)
    cols = [
        Column("boxes", f32, 4, "boxes"),
        Column("features", layout.np_dtype, layout.feature_dim, "features"),
        Column("objects_id", i32, 1, "objects_id"),
        Column("objects_conf", f32, 1, "objects_id"),
        Column("attrs_id", i32, 1, "attrs_id"),
        Column("attrs_conf", f32, 1, "attrs_id"),
    ]
    for name in ("cls_prob", "attr_prob"):
        storage = layout.prob(name)
        if storage.mode == "full":
            cols.append(Column(name, layout.np_dtype, layout.prob_dim(name), name))
        elif storage.mode == "topk":
            cols.append(Column(f"{name}_topk_ids", np.dtype(np.uint16), storage.k, name))
            cols.append(Column(f"{name}_topk", layout.np_dtype, storage.k, name))
    return tuple(cols)


def present_fields(rec: RegionFeatures, layout: StoreLayout) -> set[str]:
    """Optional fields of `rec` that this layout stores."""
    out = {f for f in ("objects_id", "attrs_id") if getattr(rec, f) is not None}
    for name in ("cls_prob", "attr_prob"):
        if getattr(rec, name) is not None and layout.prob(name).mode != "none":
            out.add(name)
    return out


def encode(rec: RegionFeatures, layout: StoreLayout) -> dict[str, Optional[np.ndarray]]:
    """Column name -> C-contiguous (N, width) array in the stored dtype, or None if absent."""
    present = present_fields(rec, layout)
    out: dict[str, Optional[np.ndarray]] = {}
    topk_cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for col in columns(layout):
        if col.field in OPTIONAL_FIELDS and col.field not in present:
            out[col.name] = None
            continue
        if col.name.endswith("_topk_ids") or col.name.endswith("_topk"):
            field = col.field
            if field not in topk_cache:
                topk_cache[field] = layout.prob(field).encode_topk(getattr(rec, field))
            ids, vals = topk_cache[field]
            value = ids if col.name.endswith("_ids") else vals
        else:
            value = getattr(rec, col.name)
        out[col.name] = np.ascontiguousarray(np.asarray(value).reshape(rec.num_boxes, -1), col.dtype)
    return out


class Assembler:
    """Builds records from a shard's column views in `columns(layout)` order, each
    shaped (N, width) (1-d for the id/confidence columns), None where absent. No copy
    unless converting float16 to `out_dtype`."""

    def __init__(self, layout: StoreLayout, out_dtype: Optional[np.dtype] = None):
        names = [c.name for c in columns(layout)]
        # When the stored columns are a prefix of the record's fields, values pass straight through.
        self._direct = names == list(_RECORD_ARRAYS[: len(names)])
        self._plain = [(name, names.index(name)) for name in _RECORD_ARRAYS if name in names]
        self._topk = [
            (name, layout.prob(name), layout.prob_dim(name), names.index(f"{name}_topk_ids"))
            for name in ("cls_prob", "attr_prob")
            if layout.prob(name).mode == "topk"
        ]
        self._convert = out_dtype is not None and out_dtype != layout.np_dtype
        self._out_dtype = out_dtype

    def __call__(
        self, image_id: str, image_h: int, image_w: int, values: Sequence[Optional[np.ndarray]]
    ) -> RegionFeatures:
        if self._direct:
            rec = RegionFeatures(image_id, image_h, image_w, *values)
        else:
            rec = RegionFeatures(image_id, image_h, image_w, **{name: values[i] for name, i in self._plain})
        for name, storage, dim, i in self._topk:
            if values[i] is not None:
                setattr(rec, name, storage.decode_topk(values[i], values[i + 1], dim))
        if self._convert:
            for name in ("features", "cls_prob", "attr_prob"):
                value = getattr(rec, name)
                if value is not None:
                    setattr(rec, name, value.astype(self._out_dtype))
        return rec


_RECORD_ARRAYS = ("boxes", "features", "objects_id", "objects_conf", "attrs_id", "attrs_conf", "cls_prob", "attr_prob")


def as_stored(rec: RegionFeatures, layout: StoreLayout, out_dtype: Optional[np.dtype] = None) -> RegionFeatures:
    """`rec` as a store of `layout` gives it back once written (`encode`: each column in its
    stored dtype, probabilities top-k'd where the layout says so; float columns read back as
    `out_dtype`), without writing it: new images extracted for a model trained on a store."""
    encoded = encode(rec, layout)
    values = [
        None if encoded[c.name] is None else encoded[c.name].reshape(-1) if c.width == 1 else encoded[c.name]
        for c in columns(layout)
    ]
    return Assembler(layout, out_dtype)(rec.image_id, rec.image_h, rec.image_w, values)
