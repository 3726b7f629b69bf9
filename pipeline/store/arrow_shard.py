"""Arrow IPC shards: one uncompressed IPC *file* per shard, memory-mapped on read.

Schema: ``image_id: string, image_h: int32, image_w: int32, num_boxes: int32`` then one
``list<T>`` column per stored column (see `columns.py`), flattened row-major
(num_boxes * width values per row), null where an optional field is absent. The store
layout is embedded as schema metadata so a shard file describes itself. Any Arrow tool
can read the files; `ArrowShardReader` returns zero-copy numpy views into the map, and
locates every row's values when it opens (`part` hands a batch's rows to a gather as
plain list look-ups: see batch.py).

On open the reader validates every batch (`RecordBatch.validate(full=True)`: offsets in
bounds, UTF-8 ids) and checks each row's region counts against ``num_boxes``, so a
damaged file is a `StoreError` naming the shard, never a wrong-shaped record or a raw
Arrow/Unicode error. (Flipped bits inside the numbers need the checksum: see store.py.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa

from pipeline.errors import StoreError
from pipeline.records import REGION_SCHEMA_VERSION, RegionFeatures
from pipeline.store.batch import FIRST_START, IMAGE_H, IMAGE_W, NUM_BOXES, Part
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


def _batch_rows(batch: pa.RecordBatch, cols: Sequence[Column], base: int) -> np.ndarray:
    """Where one record batch's rows lie in the shard's map, after checking the batch: per
    row a `Part` row (height, width, num_boxes, and per column the element index, in a view
    of the whole map in the column's dtype, where its values start, -1 where absent), then
    the image id's byte range. Raises `_Damaged` when a column's region counts disagree
    with ``num_boxes``."""
    batch.validate(full=True)
    ids = batch.column("image_id")
    _, offsets, data = ids.buffers()
    id_offsets = np.frombuffer(offsets, np.int32, len(ids) + 1, ids.offset * 4).astype(np.int64) + (data.address - base)
    num_boxes = batch.column("num_boxes").to_numpy().astype(np.int64)
    if (num_boxes < 1).any():
        raise _Damaged("num_boxes", int(np.argmax(num_boxes < 1)))
    table = [batch.column("image_h").to_numpy(), batch.column("image_w").to_numpy(), num_boxes]
    for col in cols:
        arr = batch.column(col.name)
        if col.width is None:  # probability width unknown: no record of the store has this table
            table.append(np.full(batch.num_rows, -1, np.int64))
            continue
        valid = None if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
        offsets = arr.offsets.to_numpy().astype(np.int64)
        expected = num_boxes * col.width if valid is None else np.where(valid, num_boxes * col.width, 0)
        if not np.array_equal(np.diff(offsets), expected):
            raise _Damaged(col.name, int(np.argmax(np.diff(offsets) != expected)))
        values = arr.values
        where = values.buffers()[1].address - base
        if where % col.dtype.itemsize:  # IPC files align buffers to 8 bytes
            raise _Damaged(col.name, 0)
        starts = where // col.dtype.itemsize + values.offset + offsets[:-1]
        table.append(starts if valid is None else np.where(valid, starts, -1))
    return np.stack(table + [id_offsets[:-1], id_offsets[1:]], axis=1).astype(np.int64)  # C-contiguous


class _Damaged(Exception):
    """A column of a batch disagrees with the rest (internal: becomes a StoreError)."""

    def __init__(self, column: str, row: int):
        super().__init__(f"column {column} of batch row {row} disagrees with num_boxes")


class ArrowShardReader:
    """Reads one shard file through one memory map: every row's values are located when
    the shard opens (an element index per row and column into a view of the whole map in
    the column's dtype, in one int64 table of `Part` rows), so a record's arrays are one
    slice each and a batch's rows one look-up in that table (`part`)."""

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
            self._source.seek(0)
            whole = self._source.read_buffer()  # the map itself, no copy
            batches = [_batch_rows(reader.get_batch(i), cols, whole.address) for i in range(reader.num_record_batches)]
        except (OSError, ValueError, pa.ArrowException, _Damaged) as err:  # ArrowInvalid is a ValueError
            self._source.close()
            raise StoreError(f"shard {path.name}: damaged Arrow file: {err}") from err
        except StoreError:
            self._source.close()
            raise

        self._bytes = memoryview(whole).cast("B")  # format "B": slices compare with bytes by memcmp
        self._address = whole.address
        self._table = np.concatenate(batches) if batches else np.zeros((0, FIRST_START + len(cols) + 2), np.int64)
        self._ids = slice(FIRST_START + len(cols), FIRST_START + len(cols) + 2)  # the id's byte range
        self.rows = len(self._table)
        # per column: a view of the whole map in its dtype, and its values per region
        self._values = [np.frombuffer(whole, c.dtype, whole.size // c.dtype.itemsize) for c in cols]
        self._widths = [c.width or 0 for c in cols]

    def addresses(self) -> tuple[int, int, int]:
        """(address of the row table, entries per table row, address of the map): what
        `native.gather_rows` reads, valid while this reader is open. A table row is a
        `Part` row followed by the id's begin and end byte in the map."""
        return self._table.ctypes.data, self._table.shape[1], self._address

    def id_bytes(self, row: int) -> memoryview:
        begin, end = self._table[row, self._ids].tolist()
        return self._bytes[begin:end]

    def image_id(self, row: int) -> str:
        if not 0 <= row < self.rows:
            raise IndexError(row)
        return bytes(self.id_bytes(row)).decode("utf-8")  # valid UTF-8: checked by validate(full=True)

    def image_ids(self) -> list[str]:
        return [bytes(key).decode("utf-8") for key in self.id_keys()]

    def id_keys(self) -> Iterator[memoryview]:
        """Each row's image id as UTF-8 bytes (views into the map), in row order."""
        data = self._bytes
        return (data[begin:end] for begin, end in self._table[:, self._ids].tolist())

    def views(self, row: int, which: Sequence[int], expect: Optional[str] = None) -> Optional[tuple]:
        """(image id, height, width, views of columns `which` in the stored dtype) of the
        record at `row`; None if `expect` is given and is not its image id."""
        if not 0 <= row < self.rows:
            raise IndexError(row)
        entry = self._table[row].tolist()
        stored = self._bytes[entry[self._ids.start] : entry[self._ids.stop - 1]]
        if expect is None:
            image_id = bytes(stored).decode("utf-8")
        elif stored == expect.encode("utf-8"):
            image_id = expect
        else:
            return None
        n, arrays = entry[NUM_BOXES], []
        for c in which:
            start, width = entry[FIRST_START + c], self._widths[c]
            values = None if start < 0 else self._values[c][start : start + n * width]
            arrays.append(values if values is None or width == 1 else values.reshape(n, width))
        return image_id, entry[IMAGE_H], entry[IMAGE_W], arrays

    def part(self, rows: Sequence[int], which: Sequence[int], keys: Sequence[bytes]) -> tuple[Part, list[bool]]:
        """The records at `rows` as a `Part` of every column (`which` is not needed): their
        table rows, and one list of views of the map for all of them; and whether each row
        holds the image id `keys` (UTF-8) at the same position."""
        data, (begin, end) = self._bytes, (self._ids.start, self._ids.stop - 1)
        table = [
            self._table[row].tolist() for row in rows
        ]  # cheaper than a fancy index for the 1-2 rows of a big store
        same = [data[entry[begin] : entry[end]] == key for entry, key in zip(table, keys)]
        return Part(table, [self._values] * len(rows)), same

    def record(self, row: int, expect: Optional[str] = None) -> Optional[RegionFeatures]:
        """The record at `row`; None if `expect` is given and is not its image id."""
        found = self.views(row, self._all, expect)
        return None if found is None else self._assemble(*found)

    def close(self) -> None:
        self._values = []
        self._bytes = memoryview(b"")
        self._source.close()
