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
doubling on MapFullError); a failed write to disk is an `OSError` naming the file
(LMDB reports a full disk as ENOSPC, or as EIO after a short write). Readers open the
environment read-only with ``lock=False, readahead=False`` in the process that reads
(see `FeatureStore`) and check every value's header against the store layout and its
exact length, so a damaged value is a `StoreError` naming the shard and row.
"""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path
from typing import Iterator, Optional, Sequence

import lmdb
import numpy as np

from pipeline.errors import StoreError
from pipeline.records import MAX_IMAGE_ID_BYTES, RegionFeatures
from pipeline.store.batch import Part
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
            MAGIC,
            VALUE_VERSION,
            flags,
            rec.num_boxes,
            rec.image_h,
            rec.image_w,
            rec.features.shape[1],
            widths["cls_prob"],
            widths["attr_prob"],
            len(iid),
            0,
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


def write_error(path: Path, err: lmdb.Error) -> OSError:
    """A failed LMDB write as an OSError naming `path`/data.mdb: ENOSPC for LMDB's
    DiskError, else EIO (what LMDB reports after a short write: "filesystem full?" in
    its source), so the CLI reports it in one line (exit 74)."""
    if isinstance(err, lmdb.DiskError):
        return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (LMDB: {err})", str(path / "data.mdb"))
    return OSError(
        errno.EIO,
        f"{os.strerror(errno.EIO)} (LMDB: {err}; after a short write this means the disk "
        "is full: free space and rerun, finished work is kept)",
        str(path / "data.mdb"),
    )


def put_all(env: lmdb.Environment, items: Sequence[tuple[bytes, bytes]], path: Path, append: bool = False) -> None:
    """Put `items` in one write transaction, doubling the map while it is too small;
    a failed write to disk is an OSError (`write_error`)."""
    while True:
        try:
            with env.begin(write=True) as txn:
                cursor = txn.cursor()
                for key, value in items:
                    cursor.put(key, value, append=append)
            return
        except lmdb.MapFullError:
            env.set_mapsize(env.info()["map_size"] * 2)
        except (lmdb.BadValsizeError, lmdb.KeyExistsError):
            raise  # a bad key: a bug, not the disk
        except lmdb.Error as err:  # the commit's write to disk failed
            raise write_error(path, err) from err


class LmdbShardWriter:
    def __init__(self, path: Path, layout: StoreLayout):
        self._layout = layout
        self._path = path
        self._rows = 0
        self._env = lmdb.open(str(path), subdir=True, map_size=INITIAL_MAP_SIZE, sync=False, metasync=False)

    def add(self, records: Sequence[RegionFeatures]) -> None:
        items = [(row_key(self._rows + i), encode_value(r, self._layout)) for i, r in enumerate(records)]
        put_all(self._env, items, self._path, append=True)
        self._rows += len(records)

    def close(self) -> None:
        try:
            self._env.sync(True)
        except lmdb.Error as err:
            raise write_error(self._path, err) from err
        finally:
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
                key[1],
                subdir=True,
                readonly=True,
                lock=False,
                readahead=False,
                meminit=False,
                max_readers=2048,
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


class _Plan:
    """How the values with one header lay out their columns: a structured dtype with a
    field per present column (one view gives them all: `layout`), each column's field name
    (None when absent: `names`), and, per set of columns a gather reads, where each starts
    in a flat view of the value in its dtype (`starts`)."""

    def __init__(self, layout: np.dtype, names: list[Optional[str]]):
        self.layout, self.names = layout, names
        self._starts: dict[tuple, tuple] = {}

    def starts(self, which: tuple, cols: Sequence[tuple]) -> tuple[list[np.dtype], list[int], list[int]]:
        """For columns `which` (the others read as absent): the dtypes of the flat views
        to make of a value, per column the view holding it (-1: absent), and per column the
        element where it starts in that view (-1: absent). Field offsets are multiples of 8,
        so every start is a whole element."""
        found = self._starts.get(which)
        if found is None:
            dtypes, picks, starts = [], [-1] * len(cols), [-1] * len(cols)
            for c in which:
                name, dtype = self.names[c], cols[c][1]
                if name is not None:
                    if dtype not in dtypes:
                        dtypes.append(dtype)
                    picks[c], starts[c] = dtypes.index(dtype), self.layout.fields[name][1] // dtype.itemsize
            found = self._starts[which] = (dtypes, picks, starts)
        return found


class LmdbShardReader:
    def __init__(self, path: Path, layout: StoreLayout, out_dtype: Optional[np.dtype] = None):
        self._assemble = Assembler(layout, out_dtype)
        self._all = range(len(columns(layout)))  # every column, for whole records
        self._name = path.name
        self._path = path
        self._layout = layout
        self._env = _acquire_env(path)
        try:
            # Shards are immutable once committed, so one long-lived read transaction is
            # safe; values are returned as buffers into the map (zero-copy).
            self._txn = self._env.begin(buffers=True)
            self.rows = self._env.stat()["entries"]
        except lmdb.Error as err:
            _release_env(path)
            raise StoreError(f"shard {path.name}: damaged LMDB environment: {err}") from err
        self._cols = [(c, c.dtype.newbyteorder("<")) for c in columns(layout)]
        self._plans: dict[tuple, _Plan] = {}

    def _damaged(self, row: int, what: str) -> StoreError:
        return StoreError(f"shard {self._name}: row {row}: {what} (the shard is damaged)")

    def _value(self, row: int) -> memoryview:
        if not 0 <= row < self.rows:
            raise IndexError(row)
        try:
            value = self._txn.get(row_key(row))
        except lmdb.Error as err:
            raise self._damaged(row, f"LMDB: {err}") from err
        if value is None:
            raise self._damaged(row, "missing")
        if len(value) < HEADER.size:
            raise self._damaged(row, "value shorter than its header")
        return value

    def _header(self, value: memoryview, row: int) -> tuple:
        """The value's header, after checking it and the value's exact length."""
        header = HEADER.unpack_from(value, 0)
        if header[0] != MAGIC or header[1] != VALUE_VERSION:
            raise self._damaged(row, f"bad magic/version {header[:2]}")
        self._sized(self._plan(header, row, len(value)), value, row)
        return header

    def _sized(self, plan: "_Plan", value: memoryview, row: int) -> None:
        if plan.layout.itemsize != len(value):
            raise self._damaged(row, f"value of {len(value)} bytes, its header describes {plan.layout.itemsize}")

    def _decode_id(self, value: memoryview, id_len: int, row: int) -> str:
        try:
            return bytes(value[HEADER.size : HEADER.size + id_len]).decode("utf-8")
        except UnicodeDecodeError as err:
            raise self._damaged(row, f"image id is not UTF-8 ({err})") from None

    def image_id(self, row: int) -> str:
        value = self._value(row)
        return self._decode_id(value, self._header(value, row)[9], row)

    def image_ids(self) -> list[str]:
        return [self.image_id(r) for r in range(self.rows)]

    def id_keys(self) -> Iterator[bytes]:
        """Each row's image id as UTF-8 bytes, in row order."""
        return (self.image_id(r).encode("utf-8") for r in range(self.rows))

    def _plan(self, header: tuple, row: int, size: int) -> "_Plan":
        """How a value with this header lays out its present columns (see `_Plan`). A
        header that cannot come from this store's layout is damage."""
        key = header[2:4] + header[6:10]
        plan = self._plans.get(key)
        if plan is None:
            self._check_header(key, row, size)
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
            plan = self._plans[key] = _Plan(np.dtype({**fields, "itemsize": pos}), names)
        return plan

    def _check_header(self, key: tuple, row: int, size: int) -> None:
        flags, n, feature_dim, cls_w, attr_w, id_len = key
        layout = self._layout
        problems = []
        if flags & ~sum(_FLAG_BITS.values()):
            problems.append(f"unknown flags {flags:#x}")
        if not 1 <= n <= size // 16:  # 16 bytes of box per region at least
            problems.append(f"num_boxes {n} in a value of {size} bytes")
        if feature_dim != layout.feature_dim:
            problems.append(f"feature dim {feature_dim}, the store's is {layout.feature_dim}")
        for name, width in (("cls_prob", cls_w), ("attr_prob", attr_w)):
            storage = layout.prob(name)
            want = storage.k if storage.mode == "topk" else layout.prob_dim(name) if storage.mode == "full" else 0
            if width != (want if flags & _FLAG_BITS[name] else 0):
                problems.append(f"{name} width {width}")
        if not 0 < id_len <= MAX_IMAGE_ID_BYTES:
            problems.append(f"image id length {id_len}")
        if problems:
            raise self._damaged(row, "header does not fit the store layout: " + ", ".join(problems))

    def _located(self, row: int, expect: Optional[bytes]) -> Optional[tuple[memoryview, tuple, "_Plan"]]:
        """The value at `row`, its header and its `_Plan`, after checking the header and
        the value's exact length; None if `expect` (UTF-8) is given and is not its image id."""
        value = self._value(row)
        header = _unpack_header(value)
        if header[0] != MAGIC or header[1] != VALUE_VERSION:
            self._header(value, row)  # raises, naming the shard and row
        if expect is not None and value[HEADER.size : HEADER.size + header[9]] != expect:
            return None
        plan = self._plan(header, row, len(value))
        self._sized(plan, value, row)
        return value, header, plan

    def views(self, row: int, which: Sequence[int], expect: Optional[str] = None) -> Optional[tuple]:
        """(image id, height, width, views of columns `which` in the stored dtype) of the
        record at `row`; None if `expect` is given and is not its image id."""
        found = self._located(row, None if expect is None else expect.encode("utf-8"))
        if found is None:
            return None
        value, header, plan = found
        image_id = self._decode_id(value, header[9], row) if expect is None else expect
        block = np.ndarray((), plan.layout, value)
        return image_id, header[4], header[5], [None if plan.names[c] is None else block[plan.names[c]] for c in which]

    def part(self, rows: Sequence[int], which: Sequence[int], keys: Sequence[bytes]) -> tuple[Part, list[bool]]:
        """The records at `rows`, columns `which` (the others read as absent), as a `Part`:
        each record's values lie in its own LMDB value, which it gives as one flat view per
        dtype its columns use (`_Plan.starts`); and whether each row holds the image id
        `keys` (UTF-8) at the same position (a row that does not is left empty)."""
        which, empty = tuple(which), [None] * len(self._cols)
        table, values, same = [], [], []
        for row, key in zip(rows, keys):
            found = self._located(row, key)
            same.append(found is not None)
            if found is None:
                table.append([0, 0, 0, *[-1] * len(self._cols)])
                values.append(empty)
                continue
            value, header, plan = found
            dtypes, picks, starts = plan.starts(which, self._cols)
            typed = [np.frombuffer(value, dtype) for dtype in dtypes]
            table.append([header[4], header[5], header[3], *starts])
            values.append([None if pick < 0 else typed[pick] for pick in picks])
        return Part(table, values), same

    def record(self, row: int, expect: Optional[str] = None) -> Optional[RegionFeatures]:
        """The record at `row`; None if `expect` is given and is not its image id."""
        found = self.views(row, self._all, expect)
        return None if found is None else self._assemble(*found)

    def close(self) -> None:
        self._txn.abort()
        _release_env(self._path)
