"""LMDB shards: one environment (a directory holding `data.mdb`) per shard.

Keys are the row number as 8 bytes big-endian (so writes use `append=True`); values
use the fixed little-endian binary layout below — no pickle, no base64:

    offset  size  field
    0       4     magic b"VLRF"
    4       2     layout version (1)
    6       2     flags: bit0 objects, bit1 attrs, bit2 cls_prob, bit3 attr_prob present
    8       4     num_boxes N
    12      4     image_h
    16      4     image_w
    20      4     feature_dim D
    24      4     cls width (C for full storage, k for top-k, 0 when not stored)
    28      4     attr width (likewise)
    32      4     image id length L (bytes of UTF-8)
    36      4     reserved (0)
    40      L     image id, then zero padding to a multiple of 8
    ...           each present column of `columns.py`, in that order, as N*width
                  little-endian values, each padded to a multiple of 8 bytes

Writers batch many puts per transaction and grow the map on demand (starting small,
doubling on MapFullError). Readers open the environment read-only with
``lock=False, readahead=False`` in the process that reads (see `FeatureStore`).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Optional, Sequence

import lmdb
import numpy as np

from pipeline.errors import StoreError
from pipeline.records import RegionFeatures
from pipeline.store.columns import OPTIONAL_FIELDS, Assembler, columns, encode
from pipeline.store.layout import StoreLayout

SUFFIX = ".lmdb"
MAGIC = b"VLRF"
VALUE_VERSION = 1
HEADER = struct.Struct("<4sHHIIIIIIII")
_unpack_header = HEADER.unpack_from
INITIAL_MAP_SIZE = 64 << 20
_FLAG_BITS = {field: 1 << i for i, field in enumerate(OPTIONAL_FIELDS)}


def row_key(row: int) -> bytes:
    return row.to_bytes(8, "big")


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def encode_value(rec: RegionFeatures, layout: StoreLayout) -> bytes:
    arrays = encode(rec, layout)
    flags = 0
    widths = {"cls_prob": 0, "attr_prob": 0}
    for col in columns(layout):
        if col.field in _FLAG_BITS and arrays[col.name] is not None:
            flags |= _FLAG_BITS[col.field]
            widths[col.field] = arrays[col.name].shape[1]
    iid = rec.image_id.encode("utf-8")
    parts = [
        HEADER.pack(
            MAGIC, VALUE_VERSION, flags, rec.num_boxes, rec.image_h, rec.image_w, rec.features.shape[1],
            widths["cls_prob"], widths["attr_prob"], len(iid), 0,
        ),
        iid,
        bytes(_pad8(len(iid)) - len(iid)),
    ]
    for col in columns(layout):
        a = arrays[col.name]
        if a is None:
            continue
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        parts += [raw, bytes(_pad8(len(raw)) - len(raw))]
    return b"".join(parts)


class LmdbShardWriter:
    def __init__(self, path: Path, layout: StoreLayout):
        self._layout = layout
        self._path = path
        self._rows = 0
        self._env = lmdb.open(str(path), subdir=True, map_size=INITIAL_MAP_SIZE, sync=False, metasync=False)

    def add(self, records: Sequence[RegionFeatures]) -> None:
        items = [(row_key(self._rows + i), encode_value(r, self._layout)) for i, r in enumerate(records)]
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    cursor = txn.cursor()
                    for key, value in items:
                        cursor.put(key, value, append=True)
                break
            except lmdb.MapFullError:
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
        self._rows += len(records)

    def close(self) -> None:
        self._env.sync(True)
        self._env.close()
        (self._path / "lock.mdb").unlink(missing_ok=True)  # readers use lock=False


# py-lmdb allows one Environment per path and process: readers of the same shard in
# one process share it. Keyed by pid: a forked child (DataLoader worker) never uses its
# parent's environment; it closes its inherited copy (safe for read-only, lock-free
# environments: nothing is shared through a lock file) and opens its own.
_ENVS: dict[tuple[int, str], list] = {}


def _acquire_env(path: Path) -> lmdb.Environment:
    key = (os.getpid(), str(path.resolve()))
    for inherited in [k for k in _ENVS if k[1] == key[1] and k[0] != key[0]]:
        _ENVS.pop(inherited)[0].close()
    entry = _ENVS.get(key)
    if entry is None:
        try:
            env = lmdb.open(
                key[1], subdir=True, readonly=True, lock=False, readahead=False,
                meminit=False, max_readers=2048,
            )
        except lmdb.Error as err:
            raise StoreError(f"shard {path.name}: cannot open LMDB environment: {err}") from err
        entry = _ENVS[key] = [env, 0]
    entry[1] += 1
    return entry[0]


def _release_env(path: Path) -> None:
    key = (os.getpid(), str(path.resolve()))
    entry = _ENVS.get(key)
    if entry is not None:
        entry[1] -= 1
        if entry[1] == 0:
            entry[0].close()
            del _ENVS[key]


class LmdbShardReader:
    def __init__(self, path: Path, layout: StoreLayout, out_dtype: Optional[np.dtype] = None):
        self._assemble = Assembler(layout, out_dtype)
        self._name = path.name
        self._path = path
        self._env = _acquire_env(path)
        # Shards are immutable once committed, so one long-lived read transaction is
        # safe; values are returned as buffers into the map (zero-copy).
        self._txn = self._env.begin(buffers=True)
        self.rows = self._env.stat()["entries"]
        self._cols = [(c, c.dtype.newbyteorder("<")) for c in columns(layout)]
        self._plans: dict[tuple, tuple[list, int]] = {}

    def _value(self, row: int) -> memoryview:
        if not 0 <= row < self.rows:
            raise IndexError(row)
        value = self._txn.get(row_key(row))
        if value is None:
            raise StoreError(f"shard {self._name}: row {row} is missing")
        if len(value) < HEADER.size:
            raise StoreError(f"shard {self._name}: row {row}: value shorter than its header")
        return value

    def _header(self, value: memoryview, row: int) -> tuple:
        header = HEADER.unpack_from(value, 0)
        if header[0] != MAGIC or header[1] != VALUE_VERSION:
            raise StoreError(f"shard {self._name}: row {row}: bad magic/version {header[:2]}")
        return header

    def image_id(self, row: int) -> str:
        value = self._value(row)
        id_len = self._header(value, row)[9]
        return bytes(value[HEADER.size : HEADER.size + id_len]).decode("utf-8")

    def image_ids(self) -> list[str]:
        return [self.image_id(r) for r in range(self.rows)]

    def _plan(self, header: tuple) -> tuple[np.dtype, list[Optional[str]]]:
        """A structured dtype laying out every present column of a value with this
        header (one view gives them all), and the field name per column (None when
        absent)."""
        key = header[2:4] + header[6:10]
        plan = self._plans.get(key)
        if plan is None:
            flags, n, feature_dim, cls_w, attr_w, id_len = key
            widths = {"cls_prob": cls_w, "attr_prob": attr_w}
            pos = HEADER.size + _pad8(id_len)
            fields: dict[str, list] = {"names": [], "formats": [], "offsets": []}
            names: list[Optional[str]] = []
            for col, dtype in self._cols:
                if col.field in _FLAG_BITS and not flags & _FLAG_BITS[col.field]:
                    names.append(None)
                    continue
                width = feature_dim if col.name == "features" else widths.get(col.field, col.width)
                fields["names"].append(col.name)
                fields["formats"].append((dtype, (n,) if width == 1 else (n, width)))
                fields["offsets"].append(pos)
                names.append(col.name)
                pos += _pad8(n * width * dtype.itemsize)
            plan = self._plans[key] = (np.dtype({**fields, "itemsize": pos}), names)
        return plan

    def record(self, row: int, expect: Optional[str] = None) -> Optional[RegionFeatures]:
        """The record at `row`; None if `expect` is given and is not its image id."""
        value = self._value(row)
        header = _unpack_header(value)
        if header[0] != MAGIC or header[1] != VALUE_VERSION:
            self._header(value, row)  # raises, naming the shard and row
        stored_id = value[HEADER.size : HEADER.size + header[9]]
        if expect is None:
            image_id = bytes(stored_id).decode("utf-8")
        elif stored_id == expect.encode("utf-8"):
            image_id = expect
        else:
            return None
        layout, names = self._plan(header)
        if layout.itemsize > len(value):
            raise StoreError(f"shard {self._name}: row {row}: value truncated ({len(value)} of {layout.itemsize} bytes)")
        block = np.ndarray((), layout, value)
        arrays = [None if name is None else block[name] for name in names]
        return self._assemble(image_id, header[4], header[5], arrays)

    def close(self) -> None:
        self._txn.abort()
        _release_env(self._path)
