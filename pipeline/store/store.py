"""`FeatureStore` (read) and `FeatureStoreWriter` (write/append/resume) over both backends.

A store is a directory::

    manifest.json        what the store holds (see manifest.py); written last
    index.arrow          id -> (shard, row) hash table (see index.py)
    shards/00000.arrow   Arrow IPC file shards ...
    shards/00000.lmdb/   ... or LMDB environment shards

Readers open shards lazily and per process, so a `FeatureStore` may be created before
a `DataLoader` forks its workers (or be pickled to Ray actors): each process maps the
files itself and shares the page cache, never a per-worker copy of the data.

Damage is a `StoreError` naming the shard, never a crash: a shard's size is checked
against the manifest before it is first mapped (a truncated memory-mapped file would kill
the reader with SIGBUS), readers check each record's structure, and with ``verify=True`` (or
``VLPREP_VERIFY_SHARDS=1``) each shard's sha256 is checked once per process on first use,
which also catches flipped bits inside the numbers.

One writer at a time: `FeatureStoreWriter` holds the store's write lock (`.vlprep.lock`,
see `pipeline.io.exclusive_lock`) from `open()` to `close()`; a second writer gets a
`BusyError` at once, before it reads or removes anything.
"""

from __future__ import annotations

import logging
import os
import stat
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from pipeline.errors import ConfigError, StoreError
from pipeline.io import (
    commit_path,
    disk_bytes,
    exclusive_lock,
    remove_path,
    remove_stale_tmp,
    sha256_file,
    sha256_mismatch,
    tmp_path_for,
)
from pipeline.records import RegionFeatures, validate_record
from pipeline.store import arrow_shard, lmdb_shard
from pipeline.store.batch import Gather, Part, buffer_for
from pipeline.store.buffer import RegionBuffer
from pipeline.store.index import INDEX_FILE, IdIndex, id_hash, id_hashes
from pipeline.store.layout import ProbStorage, StoreLayout
from pipeline.store.manifest import IDENTITY_KEYS, MANIFEST_FILE, SHARDS_DIR, Manifest, ShardInfo, now_iso

log = logging.getLogger(__name__)

_BACKENDS = {
    "arrow": (arrow_shard.SUFFIX, arrow_shard.ArrowShardWriter, arrow_shard.ArrowShardReader),
    "lmdb": (lmdb_shard.SUFFIX, lmdb_shard.LmdbShardWriter, lmdb_shard.LmdbShardReader),
}
# Set to "1" to check every shard's sha256 once per process on first use (FeatureStore(verify=None)).
VERIFY_ENV = "VLPREP_VERIFY_SHARDS"
LOCK_WHAT = "feature store"


def shard_checksum_path(shard_path: Path) -> Path:
    """The file whose sha256 and size the manifest records for a shard (the Arrow file,
    or an LMDB shard's data.mdb: its only file once committed)."""
    return shard_path / "data.mdb" if shard_path.is_dir() and not shard_path.is_symlink() else shard_path


def check_shard(directory: Path, info: ShardInfo, *, checksum: bool = False) -> Path:
    """The shard's path, once its data file is present, a regular file (not a link, a pipe
    or a device: never followed or opened) with the size the manifest records (one lstat:
    mapping a truncated file would crash its reader with SIGBUS) and, with `checksum`, the
    recorded sha256 (reads the whole file). A `StoreError` names the shard."""
    path = directory / SHARDS_DIR / info.name
    data = shard_checksum_path(path)
    where = f"{directory}: shard {info.name}"
    advice = f"restore the shard, or re-create the store (`vlprep verify {directory}` checks all of it)"
    try:
        # lstat: a link is not followed, and anything but a regular file (a FIFO would block
        # its reader forever, a device read without end) is refused before it is opened
        found = data.lstat()
    except FileNotFoundError:
        raise StoreError(f"{where} is missing ({data} not found); {advice}") from None
    except OSError as err:
        raise StoreError(f"{where} cannot be read ({err}); {advice}") from None
    if not stat.S_ISREG(found.st_mode):
        raise StoreError(f"{where}: {data} is not a regular file (a link, a pipe or a device); {advice}")
    size = found.st_size
    if size != info.bytes:
        state = "truncated" if size < info.bytes else "changed since it was written"
        raise StoreError(f"{where} is {state}: {size:,} bytes on disk, the manifest says {info.bytes:,}; {advice}")
    if checksum and (digest := sha256_mismatch(data, info.sha256)):
        raise StoreError(
            f"{where} is corrupt: sha256 mismatch (file {digest[:12]}…, manifest {info.sha256[:12]}…); {advice}"
        )
    return path


def open_shard_reader(directory: Path, manifest: Manifest, index: int, out_dtype=None, *, checksum: bool = False):
    """A reader of shard `index`, after `check_shard`."""
    _, _, reader_cls = _BACKENDS[manifest.layout.backend]
    info = manifest.shards[index]
    reader = reader_cls(check_shard(directory, info, checksum=checksum), manifest.layout, out_dtype)
    if reader.rows != info.rows:
        reader.close()
        raise StoreError(f"{directory}: shard {info.name} holds {reader.rows} records, the manifest says {info.rows}")
    return reader


def fresh_index(directory: Path, manifest: Manifest) -> Optional[IdIndex]:
    """The store's index.arrow if it was built for exactly the manifest's shards (names,
    rows and checksums: `Manifest.shards_digest`), else None."""
    index = IdIndex.read(directory)
    return index if index is not None and index.binding == manifest.shards_digest() else None


def build_index(directory: Path, manifest: Manifest) -> IdIndex:
    """The id index of the manifest's shards, streamed: one shard open at a time, its ids
    hashed from the map (bounded memory: the table plus one shard's hashes)."""

    def shard_keys():
        for i in range(len(manifest.shards)):
            reader = open_shard_reader(directory, manifest, i)
            try:
                yield reader.id_keys()  # consumed by IdIndex.build before the next shard opens
            finally:
                reader.close()

    return IdIndex.build(shard_keys(), manifest.num_records, manifest.shards_digest())


def verify_from_env() -> bool:
    return os.environ.get(VERIFY_ENV, "").strip() == "1"


def _id_key(image_id: object) -> Optional[bytes]:
    """An image id's UTF-8 bytes, as the index and the shards hold it; None for what no
    stored id can be (not a string, or a string with a lone surrogate)."""
    try:
        return image_id.encode("utf-8") if isinstance(image_id, str) else None
    except UnicodeEncodeError:
        return None


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    """Put the file's name into an OSError raised while writing it (Arrow's and
    file.write's errors leave it out), so the one-line CLI message names it."""
    try:
        yield
    except OSError as err:
        if err.filename is None and err.errno is not None:
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise


@dataclass
class _OpenShard:
    """The shard a writer is filling, under its temporary name."""

    tmp: Path
    final: Path
    writer: object  # ArrowShardWriter | LmdbShardWriter
    rows: int = 0


@dataclass
class _ProcessState:
    """Open handles of one process (never shared across fork)."""

    pid: int
    shards: int = 0
    index: Optional[IdIndex] = None
    readers: dict = field(default_factory=dict)
    # per shard, where an open Arrow reader keeps its row table and map (0: none yet), and the
    # table's entries per row: what `native.gather_rows` reads
    tables: np.ndarray = field(init=False)
    maps: np.ndarray = field(init=False)
    row_width: int = 0

    def __post_init__(self) -> None:
        self.tables, self.maps = np.zeros(self.shards, np.int64), np.zeros(self.shards, np.int64)

    def opened(self, shard: int, reader) -> None:
        where = getattr(reader, "addresses", None)
        if where is not None:
            self.tables[shard], self.row_width, self.maps[shard] = where()


class FeatureStore:
    """Read access to a feature store, used like a read-only mapping from image id to
        `RegionFeatures`: ``store[image_id]`` (or ``store.get``), ``image_id in store``,
        ``len(store)``, ``store.keys()`` / ``store.ids()``; iterating yields the records in
        storage order, and ``store.record_at(position)`` picks one by position.

        Records are zero-copy, read-only views valid while the store is open; pass
        ``dtype="float32"`` to get float32 copies of the float16 features and probability
        tables. Opening reads only the manifest (no per-shard work: a store of 100,000 shards opens in
    a fraction of a second); each shard's size is checked before its first use, and
    `check_shards` checks them all at once. ``verify=True``
        (default: the ``VLPREP_VERIFY_SHARDS=1`` environment variable) also checks each
        shard's sha256 once per process, on its first use. Damage raises `StoreError`."""

    def __init__(self, path: Union[str, Path], *, dtype: Optional[str] = None, verify: Optional[bool] = None):
        self.path = Path(path)
        self.manifest = Manifest.read(self.path)
        self.layout = self.manifest.layout
        self._out_dtype = None if dtype is None else np.dtype(dtype)
        self.verify = verify_from_env() if verify is None else bool(verify)
        self._state: Optional[_ProcessState] = None
        self._orphans: list[_ProcessState] = []
        self._starts = np.cumsum([0] + [s.rows for s in self.manifest.shards])
        self._gathers: dict[tuple, Gather] = {}  # per set of buffer fields

    @classmethod
    def open(
        cls, path: Union[str, Path], *, dtype: Optional[str] = None, verify: Optional[bool] = None
    ) -> "FeatureStore":
        return cls(path, dtype=dtype, verify=verify)

    def check_shards(self, checksum: bool = False) -> None:
        """Check every shard's presence and size (and, with `checksum`, its sha256) now;
        `StoreError` names the first bad one."""
        for info in self.manifest.shards:
            check_shard(self.path, info, checksum=checksum)

    # -- per-process handles -------------------------------------------------
    def _process(self) -> _ProcessState:
        state = self._state
        if state is not None and state.pid == os.getpid():
            return state
        if state is not None:
            # Inherited through fork: keep the parent's handles untouched, open our own.
            self._orphans.append(state)
        state = self._state = _ProcessState(os.getpid(), len(self.manifest.shards))
        try:
            index = fresh_index(self.path, self.manifest)
            if index is None:
                log.warning("%s: id index missing or stale; rebuilding it in memory", self.path)
                keys = (self._reader(i).id_keys() for i in range(len(self.manifest.shards)))
                index = IdIndex.build(keys, self.manifest.num_records, self.manifest.shards_digest())
        except BaseException:
            self.close()
            raise
        state.index = index
        return state

    def _reader(self, shard: int):
        state = self._process()
        reader = state.readers.get(shard)
        if reader is None:
            reader = state.readers[shard] = open_shard_reader(
                self.path, self.manifest, shard, self._out_dtype, checksum=self.verify
            )
            state.opened(shard, reader)
        return reader

    def __getstate__(self) -> dict:
        return {
            "path": self.path,
            "dtype": None if self._out_dtype is None else self._out_dtype.name,
            "verify": self.verify,
        }

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], dtype=state["dtype"], verify=state.get("verify"))

    # -- the API -------------------------------------------------------------
    def __len__(self) -> int:
        return self.manifest.num_records

    def _check_entry(self, shard: int, row: int, key: bytes, stored: str) -> None:
        """The index sent a lookup of `key` to a row holding another id, `stored`. A true
        hash collision is harmless; an id that does not even hash like the index entry
        means the shard or the index is damaged."""
        if id_hash(stored.encode("utf-8")) != id_hash(key):
            raise StoreError(
                f"{self.path}: index.arrow puts image {key.decode('utf-8', 'replace')!r} at shard "
                f"{self.manifest.shards[shard].name} row {row}, which holds {stored!r}: the shard or the "
                f"index is corrupt; run `vlprep verify {self.path}`"
            )

    def __contains__(self, image_id: object) -> bool:
        key = _id_key(image_id)
        if key is None:
            return False
        for shard, row in self._process().index.candidates(key):
            stored = self._reader(shard).image_id(row)
            if stored == image_id:
                return True
            self._check_entry(shard, row, key, stored)
        return False

    def get(self, image_id: str) -> RegionFeatures:
        """The record of `image_id`; KeyError naming the id and the store if absent."""
        return self._find(image_id, lambda reader, row: reader.record(row, image_id))

    def _not_an_id(self, image_id: object) -> KeyError:
        return KeyError(
            f"image ids are strings, got {image_id!r}; use record_at(position) for the "
            f"record at a position of the feature store {self.path}"
        )

    def _find(self, image_id: str, read):
        """`read(reader, row)` at the row holding `image_id` (it returns None at a row of
        another id); KeyError naming the id and the store if absent."""
        if not isinstance(image_id, str):
            raise self._not_an_id(image_id)
        key = _id_key(image_id)
        if key is None:  # not encodable: no stored id (all valid UTF-8) can equal it
            raise KeyError(f"image {image_id!r} is not in the feature store {self.path}")
        state = self._process()
        for shard, row in state.index.candidates(key):
            reader = state.readers.get(shard) or self._reader(shard)
            found = read(reader, row)
            if found is not None:
                return found
            self._check_entry(shard, row, key, reader.image_id(row))
        raise KeyError(f"image {image_id!r} is not in the feature store {self.path}")

    def __getitem__(self, image_id: str) -> RegionFeatures:
        return self.get(image_id)

    def get_many(self, image_ids: Iterable[str]) -> list[RegionFeatures]:
        """One record per id (zero-copy views unless the store converts dtypes)."""
        return [self.get(i) for i in image_ids]

    def get_many_into(
        self, image_ids: Sequence[str], out: RegionBuffer, slots: Optional[Sequence[int]] = None
    ) -> RegionBuffer:
        """Gather the regions of `image_ids` into `out`'s image slots `slots` (default
        0, 1, ...): the ids are looked up together, then each shard holding some of them
        gives where their values of the columns `out` holds lie in its map (`_parts`), and
        each is copied once into its rows, all in one `put_many` (in `out`'s dtype) — on
        Arrow stores all of it in one compiled call (`_gather_native`); `out.batch()` then
        equals `pad_regions` over `get_many` (in float32). KeyError naming the id and the
        store if one is absent."""
        fields = tuple(out.optional)
        gather = self._gathers.get(fields)
        if gather is None:
            gather = self._gathers[fields] = Gather(self.layout, fields)
        slots = range(len(image_ids)) if slots is None else slots
        native = gather.native_fields(out) if self.layout.backend == "arrow" else None
        if native is None or not self._gather_native(image_ids, out, slots, *native):
            order, part = self._parts(image_ids, gather.columns)
            gather.put(out, [slots[k] for k in order], [image_ids[k] for k in order], part)
        return out

    def _gather_native(
        self, image_ids: Sequence[str], out: RegionBuffer, slots: Sequence[int], names: list, fields: np.ndarray
    ) -> bool:
        """`get_many_into` of an Arrow store in one compiled call (`native.gather_rows`:
        hashing, index probing, id checks and every field's copies). False, with nothing
        written, where the Python gather must do it: an id that is absent or not a string,
        or a row holding another id (a hash collision, or damage, which that gather names)."""
        from pipeline.store.native import GATHERED, SHARDS_CLOSED, gather_rows

        try:
            keys = [image_id.encode("utf-8") for image_id in image_ids]
        except (AttributeError, UnicodeEncodeError):
            return False
        state = self._process()
        key_at = np.zeros(len(keys) + 1, np.int64)
        np.cumsum([len(key) for key in keys], out=key_at[1:])
        sizes, lacking = np.empty((len(keys), 3), np.int64), np.empty((len(keys), len(names)), np.bool_)
        held = np.array(out.counts, np.int64)
        geometry = np.array([out.boxes.shape[1], out.first, out.max_regions], np.int64)
        slots = np.asarray(slots, np.int64)[: len(keys)]
        if len(slots) < len(keys) or slots.min(initial=0) < 0 or slots.max(initial=0) >= len(out):
            return False  # the Python gather raises the IndexError
        keys = np.frombuffer(b"".join(keys), np.uint8)
        for _ in range(2):  # a second time after opening the shards the first found closed
            where = (state.tables, state.maps, state.row_width)
            result = gather_rows(
                keys, key_at, state.index.columns, *where, slots, geometry, held, fields, sizes, lacking
            )
            if result != SHARDS_CLOSED:
                break
            for shard in set(sizes[sizes[:, 0] < 0, 1].tolist()):
                self._reader(shard)
        if result != GATHERED:
            return False
        out.note_filled(slots.tolist(), image_ids, sizes, {name: lacking[:, f] for f, name in enumerate(names)})
        return True

    def _parts(self, image_ids: Sequence[str], which: Sequence[int]) -> tuple[list[int], Part]:
        """The records of `image_ids` as one `Part` (columns `which`), and the position in
        `image_ids` of each of its records. The index is probed for all ids at once
        (`IdIndex.find`); each shard holding some of them confirms their ids and gives their
        part in one call (a hash collision probes on). KeyError naming the first absent id
        and the store."""
        keys = [_id_key(image_id) for image_id in image_ids]
        if None in keys:
            image_id = image_ids[keys.index(None)]
            if not isinstance(image_id, str):
                raise self._not_an_id(image_id)
            raise KeyError(f"image {image_id!r} is not in the feature store {self.path}")
        index = self._process().index
        hashes = id_hashes(keys)
        slots = index.find(hashes)
        order, part = [], Part([], [])
        pending = np.arange(len(keys))
        while pending.size:
            absent = slots[pending] < 0
            if absent.any():
                raise KeyError(f"image {image_ids[pending[absent][0]]!r} is not in the feature store {self.path}")
            probed: dict[int, tuple[list[int], list[int]]] = {}
            for k, shard, row in zip(pending.tolist(), *index.entries(slots[pending])):
                ks, rows = probed.setdefault(shard, ([], []))
                ks.append(k)
                rows.append(row)
            wrong = []
            for shard, (ks, rows) in probed.items():
                reader = self._reader(shard)
                found, same = reader.part(rows, which, [keys[k] for k in ks])
                if not all(same):
                    for k, row, ok in zip(ks, rows, same):
                        if not ok:
                            self._check_entry(shard, row, keys[k], reader.image_id(row))
                            wrong.append(k)
                    ks, found = [k for k, ok in zip(ks, same) if ok], found.where(same)
                order += ks
                part.extend(found)
            pending = np.array(wrong, np.int64)
            if pending.size:
                slots[pending] = index.find(hashes[pending], slots[pending] + 1)
        return order, part

    def region_buffer(self, size: int, max_regions: int, **options) -> RegionBuffer:
        """A `RegionBuffer` for this store's layout (options: `fields`, default every
        optional field the store holds, and those of `RegionBuffer`)."""
        return buffer_for(self.layout, size, max_regions, **options)

    def ids(self) -> Iterator[str]:
        """Image ids in storage order (shard by shard, row by row)."""
        for shard in range(len(self.manifest.shards)):
            yield from self._reader(shard).image_ids()

    keys = ids  # the mapping spelling, for notebooks

    def record_at(self, position: int) -> RegionFeatures:
        """The record at a global position in storage order (0 <= position < len)."""
        if not 0 <= position < len(self):
            raise IndexError(position)
        shard = int(np.searchsorted(self._starts, position, side="right")) - 1
        return self._reader(shard).record(position - int(self._starts[shard]))

    def __iter__(self) -> Iterator[RegionFeatures]:
        for shard, info in enumerate(self.manifest.shards):
            reader = self._reader(shard)
            for row in range(info.rows):
                yield reader.record(row)

    def disk_bytes(self) -> int:
        return disk_bytes(self.path)

    def close(self) -> None:
        if self._state is not None and self._state.pid == os.getpid():
            for reader in self._state.readers.values():
                reader.close()
        self._state = None

    def __enter__(self) -> "FeatureStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        layout = self.layout
        return (
            f"FeatureStore({str(self.path)!r}, backend={layout.backend}, records={len(self):,}, "
            f"shards={len(self.manifest.shards)}, features={layout.feature_dim} x {layout.dtype}, "
            f"cls_prob={layout.cls_prob}, attr_prob={layout.attr_prob})"
        )


class FeatureStoreWriter:
    """Writes records into a store, `shard_size` records per shard.

    Reopening an existing store (``resume=True``) skips ids already present and
    continues with new shards; the requested layout must match the store's. Records
    are validated before they are accepted (`InvalidRecordError` names image and field).

    `open()` takes the store's write lock (a second writer gets `BusyError` at once) and
    only then removes what killed or failed writers left (temporary files, shards never
    committed to the manifest). Use as a context manager: leaving it normally commits
    the last, partial shard, the manifest and the index (`close`); leaving it with an
    exception (`abort`) keeps the committed shards and discards the unfinished one, so
    the exception (a full disk, say) is what propagates. Both release the lock.
    """

    def __init__(
        self,
        path: Union[str, Path],
        backend: str = "arrow",
        shard_size: int = 1000,
        resume: bool = True,
        *,
        feature_dim: int = 2048,
        dtype: str = "float16",
        cls_prob: Union[str, ProbStorage] = "full",
        attr_prob: Union[str, ProbStorage] = "full",
        provenance: Optional[dict] = None,
        config: Optional[dict] = None,
        batch_rows: int = 64,
        regions: str = "detections",
    ):
        if shard_size < 1 or batch_rows < 1:
            raise ConfigError("shard_size and batch_rows must be >= 1")
        self.path = Path(path)
        self.shard_size = shard_size
        self.resume = resume
        self.batch_rows = min(batch_rows, shard_size)
        parse = lambda p: p if isinstance(p, ProbStorage) else ProbStorage.parse(p)  # noqa: E731
        self._requested = StoreLayout(backend, feature_dim, dtype, parse(cls_prob), parse(attr_prob), regions=regions)
        self._provenance = {k: v for k, v in (provenance or {}).items() if v is not None}
        self._config = config or {}
        self.written = 0
        self.skipped_duplicates = 0
        self._manifest: Optional[Manifest] = None
        self._existing: Optional[FeatureStore] = None
        self._session_ids: set[str] = set()
        self._buffer: list[RegionFeatures] = []
        self._shard: Optional[_OpenShard] = None
        self._run: dict = {}
        self._lock: Optional[ExitStack] = None

    # -- lifecycle -----------------------------------------------------------
    def __enter__(self) -> "FeatureStoreWriter":
        self.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def open(self) -> None:
        """Take the write lock (`BusyError` if another process holds it), clean up after
        killed writers, and read (or create) the manifest."""
        lock = ExitStack()
        lock.enter_context(exclusive_lock(self.path, LOCK_WHAT))
        try:
            self._open_locked()
        except BaseException:
            self._release()
            lock.close()
            raise
        self._lock = lock

    def _open_locked(self) -> None:
        shards_dir = self.path / SHARDS_DIR
        for stale in remove_stale_tmp(self.path) + remove_stale_tmp(shards_dir):
            log.info("removed %s, left unfinished by a killed or failed writer", stale.name)
        if (self.path / MANIFEST_FILE).exists():
            if not self.resume:
                raise ConfigError(f"{self.path} already holds a feature store; resume it or choose another path")
            manifest = Manifest.read(self.path)
            self._check_compatible(manifest)
            listed = set(manifest.shard_names)
            for orphan in sorted(shards_dir.iterdir()) if shards_dir.is_dir() else []:
                if orphan.name not in listed:
                    log.info("removing %s: written but never committed to the manifest", orphan.name)
                    remove_path(orphan)
            self._existing = FeatureStore(self.path)
            self._existing.check_shards()  # every shard's size, before appending
            if fresh_index(self.path, manifest) is None:
                with _naming(self.path / INDEX_FILE):
                    build_index(self.path, manifest).write(self.path)
            self._manifest = manifest
            log.info("resuming %s: %d records in %d shards", self.path, len(self._existing), len(manifest.shards))
        else:
            leftovers = sorted(p.name for p in shards_dir.iterdir()) if shards_dir.is_dir() else []
            if leftovers:  # a new store writes its manifest first: shards without one are not ours to reuse
                raise StoreError(
                    f"{shards_dir} holds {', '.join(leftovers[:5])} but {self.path} has no "
                    f"{MANIFEST_FILE}; move them away or write the store elsewhere"
                )
            shards_dir.mkdir(parents=True, exist_ok=True)
            self._manifest = Manifest(layout=self._requested, provenance={**self._provenance, "config": self._config})
            self._write_manifest()
        self._run = {"started": now_iso(), "config": self._config, "producer": self._provenance.get("producer")}

    def _write_manifest(self) -> None:
        with _naming(self.path / MANIFEST_FILE):
            self._manifest.write(self.path)

    def _check_compatible(self, manifest: Manifest) -> None:
        have, want = manifest.layout.storage_settings(), self._requested.storage_settings()
        diffs = [
            f"{k}: store has {have.get(k, 'detections')}, requested {want.get(k, 'detections')}"
            for k in {**have, **want}
            if have.get(k) != want.get(k)
        ]
        for key in IDENTITY_KEYS:
            old, new = manifest.provenance.get(key), self._provenance.get(key)
            if old is not None and new is not None and old != new:
                diffs.append(f"{key}: store has {old}, requested {new}")
        if diffs:
            raise ConfigError(f"cannot append to {self.path}; it was written differently: " + "; ".join(diffs))

    @property
    def layout(self) -> StoreLayout:
        assert self._manifest is not None, "writer is not open"
        return self._manifest.layout

    # -- writing -------------------------------------------------------------
    def __contains__(self, image_id: str) -> bool:
        return image_id in self._session_ids or (self._existing is not None and image_id in self._existing)

    def write(self, rec: RegionFeatures) -> bool:
        """Validate and add a record; returns False (and counts it) if the id is already stored."""
        if self._manifest is None:
            raise RuntimeError("FeatureStoreWriter.write called before open() / outside its with-block")
        layout = self.layout
        validate_record(
            rec,
            feature_dim=layout.feature_dim,
            prob_dims={"cls_prob": layout.cls_dim, "attr_prob": layout.attr_dim},
            float16=layout.dtype == "float16",
        )
        if rec.image_id in self:
            self.skipped_duplicates += 1
            return False
        for name in ("cls_prob", "attr_prob"):
            prob = getattr(rec, name)
            if prob is not None and layout.prob_dim(name) is None and layout.prob(name).mode != "none":
                self._manifest.layout = layout = layout.with_prob_dim(name, prob.shape[1])
        self._session_ids.add(rec.image_id)
        self._buffer.append(rec)
        if len(self._buffer) >= self.batch_rows:
            self._flush_buffer()
        return True

    def _flush_buffer(self) -> None:
        if not self._buffer:
            return
        if self._shard is None:
            suffix, writer_cls, _ = _BACKENDS[self.layout.backend]
            final = self.path / SHARDS_DIR / f"{self._next_shard_number():05d}{suffix}"
            tmp = tmp_path_for(final)
            with _naming(tmp):
                self._shard = _OpenShard(tmp, final, writer_cls(tmp, self.layout))
        take = self._buffer[: self.shard_size - self._shard.rows]
        with _naming(self._shard.tmp):
            self._shard.writer.add(take)
        self._shard.rows += len(take)
        self._buffer = self._buffer[len(take) :]
        if self._shard.rows >= self.shard_size:
            self._commit_shard()
            self._flush_buffer()

    def _next_shard_number(self) -> int:
        names = self._manifest.shard_names
        return 1 + max((int(n.split(".")[0]) for n in names), default=-1)

    def _commit_shard(self) -> None:
        shard = self._shard
        with _naming(shard.tmp):
            shard.writer.close()
            commit_path(shard.tmp, shard.final)
        final, rows = shard.final, shard.rows
        info = ShardInfo(
            name=final.name,
            rows=rows,
            bytes=disk_bytes(final),
            sha256=sha256_file(shard_checksum_path(final)),
            created=now_iso(),
        )
        self._manifest.shards.append(info)
        self._write_manifest()  # last: the shard exists for readers from here on
        self.written += rows
        self._shard = None
        log.debug("committed shard %s (%d records)", info.name, rows)

    def commit_shard(self) -> None:
        """Commit everything written so far as a (possibly partial) shard now; the next
        record starts a new shard. Lets a producer make its unit of work durable."""
        self._flush_buffer()
        if self._shard is not None:
            self._commit_shard()

    def close(self) -> None:
        """Commit the last shard, the run record and the index, then release the lock
        (also when committing fails: that error propagates, as in `abort`)."""
        if self._manifest is None:
            return
        try:
            self.commit_shard()
            self._run.update(finished=now_iso(), records_added=self.written, duplicates_skipped=self.skipped_duplicates)
            self._manifest.runs.append(self._run)
            self._write_manifest()
            with _naming(self.path / INDEX_FILE):
                build_index(self.path, self._manifest).write(self.path)
        except BaseException:
            self.abort()
            raise
        self._release()

    def abort(self) -> None:
        """Stop without committing anything more: the shards already in the manifest stay;
        the unfinished shard and any other temporary file are removed (we hold the lock, so
        none is another writer's). Cleanup errors are logged, never raised, so the error
        that made us abort is the one the caller sees. Releases the lock."""
        if self._manifest is None:
            return
        shard, self._shard = self._shard, None
        if shard is not None:
            with suppress(Exception):
                shard.writer.close()
        for directory in (self.path / SHARDS_DIR, self.path):
            try:
                for stale in remove_stale_tmp(directory):
                    log.debug("removed unfinished %s", stale.name)
            except OSError as err:
                log.warning("could not remove the temporary files in %s: %s (the next writer will)", directory, err)
        self._release()

    def _release(self) -> None:
        """Close the handles and release the write lock."""
        if self._existing is not None:
            self._existing.close()
            self._existing = None
        self._manifest = None
        self._buffer = []
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def write_records(path: Union[str, Path], records: Sequence[RegionFeatures], **kwargs) -> FeatureStore:
    """Write `records` into a store at `path` (convenience for tests and scripts)."""
    with FeatureStoreWriter(path, **kwargs) as writer:
        for rec in records:
            writer.write(rec)
    return FeatureStore.open(path)
