"""Arrow IPC shards: one uncompressed IPC *file* per shard, memory-mapped on read.

Schema: ``image_id: string, image_h: int32, image_w: int32, num_boxes: int32`` then one
``list<T>`` column per stored column (see `columns.py`), flattened row-major
(num_boxes * width values per row), null where an optional field is absent. The store
layout is embedded as schema metadata so a shard file describes itself. Any Arrow tool
can read the files; `ArrowShardReader` returns zero-copy numpy views into the map.

On open the reader validates every batch (`RecordBatch.validate(full=True)`: offsets in
bounds, UTF-8 ids) and checks each row's region counts against ``num_boxes``, so a
damaged file is a `StoreError` naming the shard, never a wrong-shaped record or a raw
Arrow/Unicode error. (Flipped bits inside the numbers need the checksum: see store.py.)
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa

from pipeline.errors import StoreError
from pipeline.records import REGION_SCHEMA_VERSION, RegionFeatures
from pipeline.store.columns import Assembler, Column, columns, encode
from pipeline.store.layout import StoreLayout

SUFFIX = ".arrow"


def arrow_schema(layout: StoreLayout) -> pa.Schema:
    fields = [
        pa.field("image_id", pa.string(), nullable=False),
        pa.field("image_h", pa.int32(), nullable=False),
        pa.field("image_w", pa.int32(), nullable=False),
        pa.field("num_boxes", pa.int32(), nullable=False),
    ]
    fields += [pa.field(c.name, pa.list_(pa.from_numpy_dtype(c.dtype))) for c in columns(layout)]
    meta = {
        "vlprep.schema_version": str(REGION_SCHEMA_VERSION),
        "vlprep.layout": json.dumps(layout.storage_settings()),
    }
    return pa.schema(fields, metadata=meta)


class ArrowShardWriter:
    """Writes one shard file; each `add` appends one record batch."""

    def __init__(self, path: Path, layout: StoreLayout):
        self._layout = layout
        self._schema = arrow_schema(layout)
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = pa.ipc.new_file(self._sink, self._schema)

    def add(self, records: Sequence[RegionFeatures]) -> None:
        encoded = [encode(r, self._layout) for r in records]
        arrays = [
            pa.array([r.image_id for r in records], pa.string()),
            pa.array([r.image_h for r in records], pa.int32()),
            pa.array([r.image_w for r in records], pa.int32()),
            pa.array([r.num_boxes for r in records], pa.int32()),
        ]
        for col in columns(self._layout):
            arrays.append(_list_array([e[col.name] for e in encoded], col.dtype))
        self._writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self._schema))

    def close(self) -> None:
        self._writer.close()
        self._sink.close()


def _list_array(values: list[Optional[np.ndarray]], dtype: np.dtype) -> pa.Array:
    sizes = np.array([0 if v is None else v.size for v in values], np.int64)
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    present = [v.reshape(-1) for v in values if v is not None]
    flat = np.concatenate(present) if present else np.zeros(0, dtype)
    mask = None
    if any(v is None for v in values):
        mask = pa.array([v is None for v in values], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat), mask=mask)


class _Batch:
    """Views of one record batch: per column, region offsets (a list) and the values
    shaped (regions, width), so a row is one slice. Raises `_Damaged` when a column's
    region counts disagree with ``num_boxes``."""

    def __init__(self, batch: pa.RecordBatch, cols: Sequence[Column]):
        batch.validate(full=True)
        ids = batch.column("image_id")
        _, offsets, data = ids.buffers()
        self.id_data = memoryview(data).cast("B")  # format "B": compares with bytes by memcmp
        self.id_offsets = np.frombuffer(offsets, np.int32, len(ids) + 1, ids.offset * 4).tolist()
        self.image_h = batch.column("image_h").to_numpy().tolist()
        self.image_w = batch.column("image_w").to_numpy().tolist()
        num_boxes = batch.column("num_boxes").to_numpy().astype(np.int64)
        if (num_boxes < 1).any():
            raise _Damaged("num_boxes", int(np.argmax(num_boxes < 1)))
        self.rows = batch.num_rows
        self.cols: list[tuple[str, Optional[list[int]], Optional[np.ndarray], Optional[list[bool]]]] = []
        for col in cols:
            arr = batch.column(col.name)
            values = arr.values.to_numpy(zero_copy_only=True)
            if col.width is None:  # probability width unknown: no record of the store has this table
                self.cols.append((col.name, None, None, None))
                continue
            valid = None if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
            offsets = arr.offsets.to_numpy()
            expected = num_boxes * col.width if valid is None else np.where(valid, num_boxes * col.width, 0)
            if offsets[0] % col.width or not np.array_equal(np.diff(offsets), expected):
                raise _Damaged(col.name, int(np.argmax(np.diff(offsets) != expected)))
            if col.width != 1:
                values = values.reshape(-1, col.width)
            self.cols.append((col.name, (offsets // col.width).tolist(), values, None if valid is None else valid.tolist()))

    def id_bytes(self, row: int) -> memoryview:
        return self.id_data[self.id_offsets[row] : self.id_offsets[row + 1]]

    def image_id(self, row: int) -> str:
        return bytes(self.id_bytes(row)).decode("utf-8")  # valid UTF-8: checked by validate(full=True)

    def arrays(self, row: int, which: Sequence[int]) -> list[Optional[np.ndarray]]:
        """Views of row `row` in columns `which` (indices into the columns), None where absent."""
        out = []
        for c in which:
            _, offsets, values, valid = self.cols[c]
            absent = offsets is None or (valid is not None and not valid[row])
            out.append(None if absent else values[offsets[row] : offsets[row + 1]])
        return out


class _Damaged(Exception):
    """A column of a batch disagrees with the rest (internal: becomes a StoreError)."""

    def __init__(self, column: str, row: int):
        super().__init__(f"column {column} of batch row {row} disagrees with num_boxes")


class ArrowShardReader:
    def __init__(self, path: Path, layout: StoreLayout, out_dtype: Optional[np.dtype] = None):
        self._assemble = Assembler(layout, out_dtype)
        self._all = range(len(columns(layout)))  # every column, for whole records
        try:
            self._source = pa.memory_map(str(path), "r")
        except OSError as err:
            raise StoreError(f"shard {path.name}: cannot open Arrow file: {err}") from err
        try:
            reader = pa.ipc.open_file(self._source)
            expected = arrow_schema(layout)
            if not reader.schema.equals(expected, check_metadata=False):
                raise StoreError(f"shard {path.name}: schema differs from the store layout: {reader.schema}")
            cols = columns(layout)
            self._batches = [_Batch(reader.get_batch(i), cols) for i in range(reader.num_record_batches)]
        except (OSError, ValueError, pa.ArrowException, _Damaged) as err:  # ArrowInvalid is a ValueError
            self._source.close()
            raise StoreError(f"shard {path.name}: damaged Arrow file: {err}") from err
        except StoreError:
            self._source.close()
            raise
        self._starts = [0]
        for batch in self._batches:
            self._starts.append(self._starts[-1] + batch.rows)
        self.rows = self._starts[-1]

    def _locate(self, row: int) -> tuple[_Batch, int]:
        if not 0 <= row < self.rows:
            raise IndexError(row)
        b = bisect.bisect_right(self._starts, row) - 1
        return self._batches[b], row - self._starts[b]

    def image_id(self, row: int) -> str:
        batch, r = self._locate(row)
        return batch.image_id(r)

    def image_ids(self) -> list[str]:
        return [b.image_id(r) for b in self._batches for r in range(b.rows)]

    def id_keys(self) -> Iterator[memoryview]:
        """Each row's image id as UTF-8 bytes (views into the map), in row order."""
        return (b.id_bytes(r) for b in self._batches for r in range(b.rows))

    def views(self, row: int, which: Sequence[int], expect: Optional[str] = None) -> Optional[tuple]:
        """(image id, height, width, views of columns `which` in the stored dtype) of the
        record at `row`; None if `expect` is given and is not its image id."""
        batch, r = self._locate(row)
        if expect is None:
            image_id = batch.image_id(r)
        elif batch.id_bytes(r) == expect.encode("utf-8"):
            image_id = expect
        else:
            return None
        return image_id, batch.image_h[r], batch.image_w[r], batch.arrays(r, which)

    def record(self, row: int, expect: Optional[str] = None) -> Optional[RegionFeatures]:
        """The record at `row`; None if `expect` is given and is not its image id."""
        found = self.views(row, self._all, expect)
        return None if found is None else self._assemble(*found)

    def close(self) -> None:
        self._batches = []
        self._source.close()
