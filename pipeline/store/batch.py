"""Batched reads: a batch's regions gathered straight into one set of preallocated arrays.

`RegionBuffer` holds the padded arrays of a `pipeline.records.RegionBatch` for B images
(features (B, slots, D), positions, mask, labels, probability tables), allocated once
(optionally in pinned memory, when CUDA exists) and filled by
`FeatureStore.get_many_into`: each stored array is copied once, from the memory map into
its rows, converting dtype on the way; no per-record arrays are allocated. The result is
identical to `pad_regions` over `FeatureStore.get_many` (the per-record path).
"""

from __future__ import annotations

from typing import Literal, Optional, Sequence

import numpy as np

from pipeline.records import LABEL_PAIRS, PROB_FIELDS, RegionBatch, RegionFeatures, img_token_feature
from pipeline.store.layout import StoreLayout

OPTIONAL = tuple(name for pair in LABEL_PAIRS for name in pair) + PROB_FIELDS
_IMG_POSITION = np.array([0, 0, 1, 1, 1], np.float32)  # the IMG token's box: the whole image (area 1)


def _empty(shape: tuple, dtype, pin_memory: bool) -> np.ndarray:
    """A zeroed array; in page-locked memory when asked and CUDA exists (fast, async host->GPU copies)."""
    if pin_memory:
        import torch

        if torch.cuda.is_available():
            return torch.zeros(shape, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype, pin_memory=True).numpy()
    return np.zeros(shape, dtype)


class RegionBuffer:
    """Preallocated padded arrays for `size` images of up to `max_boxes` regions, laid out
    as `pad_regions` lays out a `RegionBatch` (IMG token at slot 0 with `img_token`,
    `position` "5d" or "4d"). `fields`: the optional record fields to gather (of
    objects_id/objects_conf/attrs_id/attrs_conf/cls_prob/attr_prob; default: every one the
    store can hold, probability tables once some record had one); an image lacking one gets the padding values there (ids -1, else 0) and
    is marked in `missing[field]`. Features and probability tables are float32 unless
    `dtype` says otherwise (e.g. the stored float16)."""

    def __init__(self, layout: StoreLayout, size: int, max_boxes: int, *, position: Literal["4d", "5d"] = "5d",
                 img_token: bool = False, fields: Optional[Sequence[str]] = None, dtype: str = "float32",
                 pin_memory: bool = False):
        if size < 1 or max_boxes < 1:
            raise ValueError("a RegionBuffer needs size >= 1 and max_boxes >= 1")
        if fields is None:
            fields = [f for f in OPTIONAL if f not in PROB_FIELDS or layout.prob_dim(f) is not None]
        unknown = set(fields) - set(OPTIONAL)
        if unknown:
            raise ValueError(f"unknown region fields {sorted(unknown)}; choose from {OPTIONAL}")
        self.first = int(img_token)
        self.max_boxes = max_boxes
        self.position = position
        slots = max_boxes + self.first
        widths = {"features": layout.feature_dim, "cls_prob": layout.cls_dim, "attr_prob": layout.attr_dim}
        self.image_ids: list[str] = [""] * size
        self.features = _empty((size, slots, layout.feature_dim), dtype, pin_memory)
        self.positions = _empty((size, slots, 5 if position == "5d" else 4), np.float32, pin_memory)
        self.mask = _empty((size, slots), bool, pin_memory)
        self.num_boxes = np.zeros(size, np.int64)
        self.optional: dict[str, np.ndarray] = {}
        for name in fields:
            if name in PROB_FIELDS:
                if widths[name] is None or layout.prob(name).mode == "none":
                    raise ValueError(f"the store holds no {name}; leave it out of fields")
                self.optional[name] = _empty((size, slots, widths[name]), dtype, pin_memory)
            else:
                self.optional[name] = _empty((size, slots), np.int64 if name.endswith("_id") else np.float32, pin_memory)
                if name.endswith("_id"):
                    self.optional[name].fill(-1)
        self.missing = {name: np.zeros(size, bool) for name in fields}
        self._filled = np.zeros(size, np.int64)  # slots written last time, per image: what to clear

    def __len__(self) -> int:
        return len(self.image_ids)

    def put(self, b: int, rec: RegionFeatures) -> None:
        """Copy `rec`'s first `max_boxes` regions into image slot `b` (and its derived
        positions, mask and IMG token), clearing what a previous image left beyond them."""
        first, n = self.first, min(rec.num_boxes, self.max_boxes)
        end, stale = first + n, int(self._filled[b])
        rows = slice(first, end)
        self.image_ids[b] = rec.image_id
        self.features[b, rows] = rec.features[:n]
        self.positions[b, rows] = (rec.spatial5() if self.position == "5d" else rec.normalized_boxes())[:n]
        self.mask[b, :end] = True
        for name, out in self.optional.items():
            value = getattr(rec, name)
            self.missing[name][b] = value is None
            if value is None:
                out[b, rows] = -1 if name.endswith("_id") else 0
            else:
                out[b, rows] = value[:n]
        if stale > end:  # padding left by a larger image
            for out in (self.features, self.positions, self.mask, *self.optional.values()):
                out[b, end:stale] = -1 if out.dtype == np.int64 else 0
        if first:
            self.features[b, 0] = img_token_feature(self.features[b, 1:end], np.ones(n, bool))
            self.positions[b, 0] = _IMG_POSITION[: self.positions.shape[2]]
        self.num_boxes[b] = end
        self._filled[b] = end

    def batch(self, images: Optional[slice] = None) -> RegionBatch:
        """A `RegionBatch` of views of these arrays (of `images`, default all). An optional
        field missing from any of its images is None, as `pad_regions` leaves it."""
        sel = images or slice(None)
        optional = {name: None if self.missing[name][sel].any() else out[sel] for name, out in self.optional.items()}
        return RegionBatch(image_ids=self.image_ids[sel], features=self.features[sel], positions=self.positions[sel],
                           mask=self.mask[sel], num_boxes=self.num_boxes[sel], **optional)
