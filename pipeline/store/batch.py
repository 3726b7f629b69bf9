"""Batched reads: which stored columns fill which fields of a `pipeline.store.buffer.RegionBuffer`,
and the `Part` a shard reader hands a gather.

`FeatureStore.get_many_into` looks a batch's ids up at once, then asks each shard holding
some of them for a `Part`: where those records' values of the columns the buffer holds
(boxes, features and its optional fields) lie in the shard's map, as plain lists, with no
per-record arrays or `RegionFeatures` in between. The parts of all shards are joined, and
`Gather.put` hands them to one `RegionBuffer.put_many`, which copies each record's values
of each field with one slice copy into its preallocated rows, in the buffer's dtype (the
stored float16 copies straight); top-k probability tables are expanded on the way.
`Gather` is that plan, made once per store layout and set of fields.

On Arrow stores the same work runs compiled (`pipeline.store.native.gather_rows`, one call
per batch: look-up, id checks and every copy); `Gather.native_fields` gives it the fields'
table, and this Python gather stays the reference and takes what the kernel cannot (top-k
tables, LMDB shards, absent or colliding ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from pipeline.records import OPTIONAL_ARRAYS, PROB_FIELDS
from pipeline.store.buffer import RegionBuffer
from pipeline.store.columns import columns
from pipeline.store.layout import StoreLayout

# How `native.gather_rows` brings a stored column into a buffer field (stored dtype -> buffer
# dtype), and what it pads an absent field or cleared slots with (zero bytes; int64 -1 for label ids).
COPY, WIDEN_INT32, HALF_TO_SINGLE, SINGLE_TO_HALF = range(4)
PAD_ZERO, PAD_MINUS_ONE = range(2)
_CONVERSIONS = {
    ("int32", "int64"): WIDEN_INT32,
    ("float16", "float32"): HALF_TO_SINGLE,
    ("float32", "float16"): SINGLE_TO_HALF,
}


def conversion(stored: np.dtype, buffered: np.dtype) -> Optional[int]:
    """The `native.gather_rows` conversion copying `stored` values into a `buffered` array;
    None when it has none (the Python gather does it)."""
    return COPY if stored == buffered else _CONVERSIONS.get((stored.name, buffered.name))


# A `Part` row: the record's height, width and number of regions, then per stored column
# (`columns(layout)`) the element where its values start.
IMAGE_H, IMAGE_W, NUM_BOXES, FIRST_START = range(4)


@dataclass
class Part:
    """Records of one or more shards, as a gather reads them, one entry per record:
    ``rows[k]`` is [image_h, image_w, num_boxes, then per column of `columns(layout)` the
    element where its values start] (entries after those are the reader's own), and
    record k's values of column c are ``values[k][c][start : start + num_boxes * width]``
    (1-d, row-major; `width` values per region), start < 0 where it lacks the column. An
    Arrow shard's records share one list of views of its map; an LMDB shard gives each
    record one flat view of its value per dtype its columns use. Parts of several shards
    are joined with `extend`."""

    rows: list[list[int]]
    values: list[Sequence[Optional[np.ndarray]]]

    def extend(self, other: "Part") -> None:
        self.rows += other.rows
        self.values += other.values

    def where(self, keep: Sequence[bool]) -> "Part":
        """The records for which `keep` is true."""
        return Part([r for r, ok in zip(self.rows, keep) if ok], [v for v, ok in zip(self.values, keep) if ok])


class Gather:
    """The columns (indices into `columns(layout)`) to read for a buffer holding `fields`,
    and how they fill it. A field the layout does not store reads as missing."""

    def __init__(self, layout: StoreLayout, fields: Sequence[str]):
        names = [c.name for c in columns(layout)]
        self.plain: list[tuple[str, int]] = [("boxes", names.index("boxes")), ("features", names.index("features"))]
        self.topk: list[tuple[str, object, int, int]] = []
        for field in fields:
            if field in names:
                self.plain.append((field, names.index(field)))
            elif f"{field}_topk_ids" in names:
                self.topk.append((field, layout.prob(field), layout.prob_dim(field), names.index(f"{field}_topk_ids")))
        self.columns = sorted({c for _, c in self.plain} | {c + i for _, _, _, c in self.topk for i in (0, 1)})
        self._stored = {c: np.dtype(col.dtype) for c, col in enumerate(columns(layout))}
        self._plans: dict[tuple, tuple] = {}  # per buffer signature: see `native_fields`

    def native_fields(self, out: RegionBuffer) -> Optional[tuple[list[str], np.ndarray]]:
        """The fields `out` holds and their table for `native.gather_rows` (per field: its
        `Part` row entry, stored value size, buffer address, values per region, buffer value
        size, conversion, padding); None when one needs this Python gather (a top-k table,
        a conversion the kernel lacks). Worked out once per buffer signature."""
        plan = self._plans.get(out.signature)
        if plan is None:
            plan = self._plans[out.signature] = self._plan(out.signature)
        if not plan:
            return None
        names, positions, table = plan
        table = table.copy()
        table[:, 2] = out.addresses[positions]
        return names, table

    def _plan(self, signature: tuple) -> tuple:
        """`native_fields` less the addresses, for buffers of `signature`; () if it has none."""
        if self.topk:
            return ()
        targets = {name: (k, width, dtype, pad) for k, (name, width, dtype, pad) in enumerate(signature)}
        names, positions, table = [], [], []
        for field, c in self.plain:
            k, width, dtype, pad = targets[field]
            kind = conversion(self._stored[c], dtype)
            if kind is None:
                return ()
            names.append(field)
            positions.append(k)
            padding = PAD_MINUS_ONE if pad < 0 else PAD_ZERO
            table.append((FIRST_START + c, self._stored[c].itemsize, 0, width, dtype.itemsize, kind, padding))
        return names, np.array(positions, np.int64), np.array(table, np.int64)

    def put(self, out: RegionBuffer, slots: Sequence[int], image_ids: Sequence[str], part: Part) -> None:
        """Fill image slots `slots` of `out` with the records of `part`, whose ids are
        `image_ids`: one `RegionBuffer.put_many` for all of them."""
        rows, values = part.rows, part.values
        counts = [row[NUM_BOXES] for row in rows]
        sources = {field: ([v[c] for v in values], [row[FIRST_START + c] for row in rows]) for field, c in self.plain}
        for field, storage, dim, c in self.topk:  # expanded to full tables, one record at a time
            k, tables = storage.k, []
            for row, v, n in zip(rows, values, counts):
                ids_at, values_at = row[FIRST_START + c], row[FIRST_START + c + 1]
                tables.append(
                    None
                    if ids_at < 0
                    else storage.decode_topk(
                        v[c][ids_at : ids_at + n * k].reshape(n, k),
                        v[c + 1][values_at : values_at + n * k].reshape(n, k),
                        dim,
                    ).reshape(-1)
                )
            sources[field] = (tables, [-1 if table is None else 0 for table in tables])
        out.put_many(slots, image_ids, [row[IMAGE_H] for row in rows], [row[IMAGE_W] for row in rows], counts, sources)


def buffer_for(
    layout: StoreLayout, size: int, max_regions: int, *, fields: Optional[Sequence[str]] = None, **options
) -> RegionBuffer:
    """A `RegionBuffer` for a store of `layout` (options: see `RegionBuffer`) holding the
    optional `fields` (default: all) that the store can hold: a probability table it drops,
    or that no record had yet, is left out (None in the buffer's batches)."""

    def stored(name: str) -> bool:
        return name not in PROB_FIELDS or (layout.prob(name).mode != "none" and layout.prob_dim(name) is not None)

    fields = [f for f in (OPTIONAL_ARRAYS if fields is None else fields) if stored(f)]
    widths = {name: layout.prob_dim(name) for name in PROB_FIELDS if name in fields}
    return RegionBuffer(size, max_regions, layout.feature_dim, fields=fields, prob_widths=widths, **options)
