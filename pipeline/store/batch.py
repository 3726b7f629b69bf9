"""Batched reads: which stored columns fill which fields of a `pipeline.records.RegionBuffer`.

`FeatureStore.get_many_into` reads, per image, only the columns the buffer holds (boxes,
features and its optional fields) as views of the shard's map, with no `RegionFeatures`
in between, and `RegionBuffer.put` copies each once into its preallocated rows, in the
buffer's dtype (the stored float16 copies straight); top-k probability tables are
expanded on the way. `Gather` is that plan, made once per store layout and set of fields.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from pipeline.records import OPTIONAL_ARRAYS, PROB_FIELDS, RegionBuffer
from pipeline.store.columns import columns
from pipeline.store.layout import StoreLayout


class Gather:
    """The columns (indices into `columns(layout)`) to read for a buffer holding `fields`,
    and how they fill it. A field the layout does not store reads as missing."""

    def __init__(self, layout: StoreLayout, fields: Sequence[str]):
        names = [c.name for c in columns(layout)]
        wanted = ["boxes", "features"]
        self.plain: list[tuple[str, int]] = []
        self.topk: list[tuple[str, object, int, int]] = []
        for field in fields:
            if field in names:
                self.plain.append((field, len(wanted)))
                wanted.append(field)
            elif f"{field}_topk_ids" in names:
                self.topk.append((field, layout.prob(field), layout.prob_dim(field), len(wanted)))
                wanted += [f"{field}_topk_ids", f"{field}_topk"]
        self.columns = [names.index(name) for name in wanted]

    def put(self, out: RegionBuffer, b: int, image_id: str, image_h: int, image_w: int,
            values: Sequence[Optional[np.ndarray]]) -> None:
        """Fill image slot `b` of `out` from one record's column views (`self.columns` order)."""
        optional = {field: values[i] for field, i in self.plain}
        for field, storage, dim, i in self.topk:
            optional[field] = None if values[i] is None else storage.decode_topk(values[i], values[i + 1], dim)
        out.put(b, image_id, image_h, image_w, values[0], values[1], optional)


def buffer_for(layout: StoreLayout, size: int, max_boxes: int, *, fields: Optional[Sequence[str]] = None,
               **options) -> RegionBuffer:
    """A `RegionBuffer` for a store of `layout` (options: see `RegionBuffer`) holding the
    optional `fields` (default: all) that the store can hold: a probability table it drops,
    or that no record had yet, is left out (None in the buffer's batches)."""
    def stored(name: str) -> bool:
        return name not in PROB_FIELDS or (layout.prob(name).mode != "none" and layout.prob_dim(name) is not None)

    fields = [f for f in (OPTIONAL_ARRAYS if fields is None else fields) if stored(f)]
    widths = {name: layout.prob_dim(name) for name in PROB_FIELDS if name in fields}
    return RegionBuffer(size, max_boxes, layout.feature_dim, fields=fields, prob_widths=widths, **options)
