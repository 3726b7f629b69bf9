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
from typing import Optional

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


def assemble(
    image_id: str,
    image_h: int,
    image_w: int,
    arrays: dict[str, Optional[np.ndarray]],
    layout: StoreLayout,
    out_dtype: Optional[np.dtype] = None,
) -> RegionFeatures:
    """Build a record from stored flat column arrays (views; no copy unless converting)."""
    n = arrays["boxes"].shape[0] // 4
    fields: dict = {}

    def floats(a: np.ndarray) -> np.ndarray:
        return a if out_dtype is None or a.dtype == out_dtype else a.astype(out_dtype)

    fields["features"] = floats(arrays["features"].reshape(n, -1))
    for ids, conf in (("objects_id", "objects_conf"), ("attrs_id", "attrs_conf")):
        if arrays.get(ids) is not None:
            fields[ids] = arrays[ids].astype(np.int64)
            fields[conf] = arrays[conf]
    for name in ("cls_prob", "attr_prob"):
        storage = layout.prob(name)
        if storage.mode == "full" and arrays.get(name) is not None:
            fields[name] = floats(arrays[name].reshape(n, -1))
        elif storage.mode == "topk" and arrays.get(f"{name}_topk") is not None:
            ids = arrays[f"{name}_topk_ids"].reshape(n, -1)
            vals = floats(arrays[f"{name}_topk"].reshape(n, -1))
            fields[name] = storage.decode_topk(ids, vals, layout.prob_dim(name))
    return RegionFeatures(
        image_id=image_id,
        image_h=int(image_h),
        image_w=int(image_w),
        boxes=arrays["boxes"].reshape(n, 4),
        **fields,
    )
