"""The id -> (shard, row) index: an open-addressing hash table in one Arrow file.

`index.arrow` holds three columns of equal length M (a power of two >= 2 * records):
``hash`` (uint64; 0 marks an empty slot), ``shard`` (uint32), ``row`` (uint32). An id's
64-bit hash (`id_hash`) picks its home slot ``hash & (M - 1)``; collisions probe linearly.
A lookup touches ~1-2 slots of the memory-mapped file: O(1) without loading the store
(or the index) into RAM, shared by every process through the page cache. `candidates`
probes for one id in Python; `find` for a batch of ids at once, compiled. Callers
confirm the id stored at (shard, row), so hash collisions cannot return a wrong record.
The file's metadata holds the digest of the manifest's shard list it was built from
(`Manifest.shards_digest`: names, row counts and checksums) and names the hash function;
an index built for other shards (a stale one, or one copied from another store even
with the same shard names), or with another hash, is rebuilt.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
import pyarrow as pa

from pipeline.io import commit_path, tmp_path_for

INDEX_FILE = "index.arrow"
_BINDING_KEY = b"vlprep.index.shards_digest"
_HASH_KEY = b"vlprep.index.hash"
HASH_NAME = "crc32|adler32<<32"


def id_hash(key) -> int:
    """64-bit hash of an id's UTF-8 bytes (bytes or a memoryview of them): CRC-32 (low half, picks the slot) and
    Adler-32 (high half); never 0 (the empty-slot mark). Fast in pure Python; a
    collision costs one extra id comparison, never a wrong record."""
    return (zlib.crc32(key) | (zlib.adler32(key) << 32)) or 1


def id_hashes(keys) -> np.ndarray:
    """`id_hash` of each of `keys` (UTF-8 bytes), as uint64: one call for a batch of ids."""
    return np.fromiter(map(id_hash, keys), np.uint64, len(keys))


class IdIndex:
    def __init__(self, hashes: np.ndarray, shards: np.ndarray, rows: np.ndarray, binding: str, source=None):
        self._hashes, self._shards, self._rows = hashes, shards, rows
        # memoryviews index to Python ints without numpy scalar overhead
        self._h, self._s, self._r = (memoryview(a).cast("B").cast(a.dtype.char) for a in (hashes, shards, rows))
        self._mask = len(hashes) - 1
        self.columns = (hashes, shards, rows)  # what `native.gather_rows` probes
        self.binding = binding  # Manifest.shards_digest() of the shards indexed
        self._source = source  # keeps a memory map alive

    @classmethod
    def build(cls, shard_keys: Iterable[Iterable[bytes]], total: int, binding: str) -> "IdIndex":
        """Index `total` ids streamed shard by shard: `shard_keys` yields, per shard, its ids'
        UTF-8 bytes in row order (bytes or memoryviews: only hashed, never kept). `binding`
        is the manifest's `shards_digest()` for those shards. Memory: the table (16 bytes per
        slot, 2-4 slots per id) plus one shard's hashes; no collection of all ids."""
        size = 16
        while size < 2 * total:
            size *= 2
        table = cls(np.zeros(size, np.uint64), np.zeros(size, np.uint32), np.zeros(size, np.uint32), binding)
        placed = 0
        for shard, keys in enumerate(shard_keys):
            hashes = np.fromiter(map(id_hash, keys), np.uint64)
            placed += len(hashes)
            if placed > total:
                raise ValueError(f"more ids than the {total} announced")
            table._insert(hashes, shard)
        return table

    def _insert(self, hashes: np.ndarray, shard: int) -> None:
        """Place one shard's hashes (row i = hashes[i]), probing linearly past taken slots."""
        table_h, mask = self._hashes, self._mask
        pos = (hashes & np.uint64(mask)).astype(np.int64)
        pending = np.arange(len(hashes))
        while pending.size:
            slots = pos[pending]
            free = table_h[slots] == 0
            # First claimant of each free slot takes it; everyone else probes onward.
            won_slots, first = np.unique(slots[free], return_index=True)
            winners = pending[free][first]
            table_h[won_slots] = hashes[winners]
            self._shards[won_slots] = shard
            self._rows[won_slots] = winners
            placed = np.zeros(len(hashes), bool)
            placed[winners] = True
            pending = pending[~placed[pending]]
            pos[pending] = (pos[pending] + 1) & mask

    def candidates(self, key: bytes) -> list[tuple[int, int]]:
        """(shard, row) of every entry whose hash matches that of the id `key` (UTF-8)."""
        h = (zlib.crc32(key) | (zlib.adler32(key) << 32)) or 1  # id_hash, inlined: the hot path
        mask, hashes = self._mask, self._h
        slot = h & mask
        found = []
        while True:
            stored = hashes[slot]
            if stored == 0:
                return found
            if stored == h:
                found.append((self._s[slot], self._r[slot]))
            slot = (slot + 1) & mask

    def find(self, hashes: np.ndarray, start: Optional[np.ndarray] = None) -> np.ndarray:
        """For many ids at once (`id_hashes`), in one compiled call (`native.probe`): the
        first slot at or after `start` (default: each id's home slot) whose entry has the
        id's hash, -1 where an empty slot comes first (the id is absent). A caller that
        finds another id at that entry's (shard, row) (a hash collision) probes on from the
        slot after."""
        from pipeline.store.native import probe

        hashes = np.ascontiguousarray(hashes, np.uint64)
        start = (hashes & np.uint64(self._mask) if start is None else np.asarray(start)).astype(np.int64)
        return probe(self._hashes, hashes, start)

    def entries(self, slots: np.ndarray) -> tuple[list[int], list[int]]:
        """(shards, rows) of the entries at `slots` (from `find`, none of them -1)."""
        return self._shards[slots].tolist(), self._rows[slots].tolist()

    def __len__(self) -> int:
        return int(np.count_nonzero(self._hashes))

    def write(self, directory: Path) -> None:
        table = pa.table(
            {"hash": self._hashes, "shard": self._shards, "row": self._rows},
            metadata={_BINDING_KEY: self.binding, _HASH_KEY: HASH_NAME},
        )
        path = directory / INDEX_FILE
        tmp = tmp_path_for(path)
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        commit_path(tmp, path)

    @classmethod
    def read(cls, directory: Path) -> Optional["IdIndex"]:
        """The index file, or None when it is missing, unreadable, of another hash or not a
        regular file (mapping a FIFO would block forever)."""
        path = directory / INDEX_FILE
        if not path.is_file():
            return None
        try:
            source = pa.memory_map(str(path), "r")
            table = pa.ipc.open_file(source).read_all()
            binding = table.schema.metadata[_BINDING_KEY].decode("ascii")
            if table.schema.metadata.get(_HASH_KEY) != HASH_NAME.encode():
                return None  # written with another hash function: stale
            cols = [table.column(n).chunk(0).to_numpy() for n in ("hash", "shard", "row")]
        except (OSError, pa.ArrowInvalid, KeyError, TypeError, ValueError):
            return None  # unreadable index: treated as stale and rebuilt
        if len(cols[0]) & (len(cols[0]) - 1):
            return None
        return cls(*cols, binding=binding, source=source)
