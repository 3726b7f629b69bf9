"""`FeatureStore` (read) and `FeatureStoreWriter` (write/append/resume) over both backends.

A store is a directory::

    manifest.json        what the store holds (see manifest.py); written last
    index.arrow          id -> (shard, row) hash table (see index.py)
    shards/00000.arrow   Arrow IPC file shards ...
    shards/00000.lmdb/   ... or LMDB environment shards

Readers open shards lazily and per process, so a `FeatureStore` may be created before
a `DataLoader` forks its workers (or be pickled to Ray actors): each process maps the
files itself and shares the page cache, never a per-worker copy of the data.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from pipeline.errors import ConfigError
from pipeline.io import commit_path, disk_bytes, remove_path, remove_stale_tmp, sha256_file, tmp_path_for
from pipeline.records import RegionFeatures, validate_record
from pipeline.store import arrow_shard, lmdb_shard
from pipeline.store.index import IdIndex
from pipeline.store.layout import ProbStorage, StoreLayout
from pipeline.store.manifest import SHARDS_DIR, Manifest, ShardInfo, now_iso

log = logging.getLogger(__name__)

_BACKENDS = {
    "arrow": (arrow_shard.SUFFIX, arrow_shard.ArrowShardWriter, arrow_shard.ArrowShardReader),
    "lmdb": (lmdb_shard.SUFFIX, lmdb_shard.LmdbShardWriter, lmdb_shard.LmdbShardReader),
}
# Provenance keys that must agree between the runs that write one store.
_PROVENANCE_KEYS = ("detector", "weights_sha256", "box_policy")


def shard_checksum_path(shard_path: Path) -> Path:
    """The file whose sha256 the manifest records for a shard."""
    return shard_path / "data.mdb" if shard_path.is_dir() else shard_path


def open_shard_reader(directory: Path, manifest: Manifest, index: int, out_dtype=None):
    _, _, reader_cls = _BACKENDS[manifest.layout.backend]
    return reader_cls(directory / SHARDS_DIR / manifest.shards[index].name, manifest.layout, out_dtype)


def fresh_index(directory: Path, manifest: Manifest) -> Optional[IdIndex]:
    """The store's index.arrow if it covers exactly the manifest's shards, else None."""
    index = IdIndex.read(directory)
    return index if index is not None and list(index.covers) == manifest.shard_names else None


def build_index(directory: Path, manifest: Manifest) -> IdIndex:
    ids = []
    for i in range(len(manifest.shards)):
        reader = open_shard_reader(directory, manifest, i)
        ids.append(reader.image_ids())
        reader.close()
    return IdIndex.build(ids, manifest.shard_names)


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
    index: IdIndex
    readers: dict = field(default_factory=dict)


class FeatureStore:
    """Read access to a feature store. Records are zero-copy, read-only views valid
    while the store is open; pass ``dtype="float32"`` to get float32 copies of the
    float16 features and probability tables."""

    def __init__(self, path: Union[str, Path], *, dtype: Optional[str] = None):
        self.path = Path(path)
        self.manifest = Manifest.read(self.path)
        self.layout = self.manifest.layout
        self._out_dtype = None if dtype is None else np.dtype(dtype)
        self._state: Optional[_ProcessState] = None
        self._orphans: list[_ProcessState] = []
        self._starts = np.cumsum([0] + [s.rows for s in self.manifest.shards])

    @classmethod
    def open(cls, path: Union[str, Path], *, dtype: Optional[str] = None) -> "FeatureStore":
        return cls(path, dtype=dtype)

    # -- per-process handles -------------------------------------------------
    def _process(self) -> _ProcessState:
        state = self._state
        if state is not None and state.pid == os.getpid():
            return state
        if state is not None:
            # Inherited through fork: keep the parent's handles untouched, open our own.
            self._orphans.append(state)
        index = fresh_index(self.path, self.manifest)
        if index is None:
            log.warning("%s: id index missing or stale; rebuilding it in memory", self.path)
            index = build_index(self.path, self.manifest)
        self._state = _ProcessState(os.getpid(), index)
        return self._state

    def _reader(self, shard: int):
        state = self._process()
        reader = state.readers.get(shard)
        if reader is None:
            reader = state.readers[shard] = open_shard_reader(self.path, self.manifest, shard, self._out_dtype)
        return reader

    def __getstate__(self) -> dict:
        return {"path": self.path, "dtype": None if self._out_dtype is None else self._out_dtype.name}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], dtype=state["dtype"])

    # -- the API -------------------------------------------------------------
    def __len__(self) -> int:
        return self.manifest.num_records

    def _locate(self, image_id: str) -> Optional[tuple[int, int]]:
        key = image_id.encode("utf-8")
        for shard, row in self._process().index.candidates(key):
            if self._reader(shard).image_id(row) == image_id:
                return shard, row
        return None

    def __contains__(self, image_id: object) -> bool:
        return isinstance(image_id, str) and self._locate(image_id) is not None

    def get(self, image_id: str) -> RegionFeatures:
        state = self._process()
        for shard, row in state.index.candidates(image_id.encode("utf-8")):
            rec = (state.readers.get(shard) or self._reader(shard)).record(row, image_id)
            if rec is not None:
                return rec
        raise KeyError(f"image {image_id!r} is not in the feature store {self.path}")

    def get_many(self, image_ids: Iterable[str]) -> list[RegionFeatures]:
        return [self.get(i) for i in image_ids]

    def ids(self) -> Iterator[str]:
        """Image ids in storage order (shard by shard, row by row)."""
        for shard in range(len(self.manifest.shards)):
            yield from self._reader(shard).image_ids()

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
        return f"FeatureStore({str(self.path)!r}, backend={self.layout.backend}, records={len(self)})"


class FeatureStoreWriter:
    """Writes records into a store, `shard_size` records per shard.

    Reopening an existing store (``resume=True``) skips ids already present and
    continues with new shards; the requested layout must match the store's. Records
    are validated before they are accepted (`InvalidRecordError` names image and field).
    Use as a context manager; leaving it commits the last, partial shard and the index.
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
    ):
        if shard_size < 1 or batch_rows < 1:
            raise ConfigError("shard_size and batch_rows must be >= 1")
        self.path = Path(path)
        self.shard_size = shard_size
        self.resume = resume
        self.batch_rows = min(batch_rows, shard_size)
        parse = lambda p: p if isinstance(p, ProbStorage) else ProbStorage.parse(p)  # noqa: E731
        self._requested = StoreLayout(backend, feature_dim, dtype, parse(cls_prob), parse(attr_prob))
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

    # -- lifecycle -----------------------------------------------------------
    def __enter__(self) -> "FeatureStoreWriter":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        shards_dir = self.path / SHARDS_DIR
        if (self.path / "manifest.json").exists():
            if not self.resume:
                raise ConfigError(f"{self.path} already holds a feature store; resume it or choose another path")
            manifest = Manifest.read(self.path)
            self._check_compatible(manifest)
            for stale in remove_stale_tmp(shards_dir):
                log.info("removed unfinished shard %s left by a killed writer", stale.name)
            listed = set(manifest.shard_names)
            for orphan in shards_dir.iterdir():
                if orphan.name not in listed:
                    log.info("removing %s: written but never committed to the manifest", orphan.name)
                    remove_path(orphan)
            self._manifest = manifest
            if fresh_index(self.path, manifest) is None:
                build_index(self.path, manifest).write(self.path)
            self._existing = FeatureStore(self.path)
            log.info("resuming %s: %d records in %d shards", self.path, len(self._existing), len(manifest.shards))
        else:
            shards_dir.mkdir(parents=True, exist_ok=True)
            remove_stale_tmp(shards_dir)
            self._manifest = Manifest(layout=self._requested, provenance={**self._provenance, "config": self._config})
            self._manifest.write(self.path)
        self._run = {"started": now_iso(), "config": self._config, "producer": self._provenance.get("producer")}

    def _check_compatible(self, manifest: Manifest) -> None:
        have, want = manifest.layout.storage_settings(), self._requested.storage_settings()
        diffs = [f"{k}: store has {have[k]}, requested {want[k]}" for k in have if have[k] != want[k]]
        for key in _PROVENANCE_KEYS:
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
            self._shard = _OpenShard(tmp, final, writer_cls(tmp, self.layout))
        take = self._buffer[: self.shard_size - self._shard.rows]
        self._shard.writer.add(take)
        self._shard.rows += len(take)
        self._buffer = self._buffer[len(take):]
        if self._shard.rows >= self.shard_size:
            self._commit_shard()
            self._flush_buffer()

    def _next_shard_number(self) -> int:
        names = self._manifest.shard_names
        return 1 + max((int(n.split(".")[0]) for n in names), default=-1)

    def _commit_shard(self) -> None:
        shard = self._shard
        shard.writer.close()
        commit_path(shard.tmp, shard.final)
        final, rows = shard.final, shard.rows
        info = ShardInfo(
            name=final.name, rows=rows, bytes=disk_bytes(final),
            sha256=sha256_file(shard_checksum_path(final)), created=now_iso(),
        )
        self._manifest.shards.append(info)
        self._manifest.write(self.path)  # last: the shard exists for readers from here on
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
        if self._manifest is None:
            return
        self.commit_shard()
        self._run.update(finished=now_iso(), records_added=self.written, duplicates_skipped=self.skipped_duplicates)
        self._manifest.runs.append(self._run)
        self._manifest.write(self.path)
        build_index(self.path, self._manifest).write(self.path)
        if self._existing is not None:
            self._existing.close()
        self._manifest = None


def write_records(path: Union[str, Path], records: Sequence[RegionFeatures], **kwargs) -> FeatureStore:
    """Write `records` into a store at `path` (convenience for tests and scripts)."""
    with FeatureStoreWriter(path, **kwargs) as writer:
        for rec in records:
            writer.write(rec)
    return FeatureStore.open(path)
