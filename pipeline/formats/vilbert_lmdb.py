"""ViLBERT-style feature LMDBs (import and export).

vilbert-multi-task `script/convert_to_lmdb.py` (and MMF's `lmdb_conversion.py`) store,
under the key ``str(image_id).encode()``, a pickled dict of numpy arrays
(`image_id, image_h, image_w, num_boxes, boxes, features`; MMF: `image_height,
image_width, bbox, objects, cls_prob, ...`), plus a ``b"keys"`` entry holding the pickled
list of keys. vilbert_beta's `convert_trainval_lmdb.py` pickles the raw TSV row dict
instead, with base64 strings. All are read here, only with ``trust_pickle`` and only
through the restricted unpickler (numpy arrays and plain values; nothing that runs code).

Export writes what vilbert-multi-task's `convert_to_lmdb.py` writes and its
`_image_features_reader.py` reads with plain `pickle.loads`: per image the dict
``{image_id: str, image_h: int, image_w: int, num_boxes: int, boxes: float32 (N, 4),
features: float32 (N, D)}`` (that format has no labels or probability tables), then the
``keys`` list in storage order. The pickles name numpy's globals as numpy 1.x does
(`safe_pickle.legacy_dumps`), so the reference code's older numpy loads them too.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import lmdb
import numpy as np

from pipeline.errors import ConfigError
from pipeline.formats.base import (
    ReadOptions,
    ReadResult,
    Skipped,
    WriteContext,
    decode_row,
    pickle_refusal,
    record_from_dict,
)
from pipeline.records import RegionFeatures
from pipeline.safe_pickle import legacy_dumps, safe_loads
from pipeline.store.lmdb_shard import put_all, write_error

if TYPE_CHECKING:
    from pipeline.store import FeatureStore

log = logging.getLogger(__name__)
KEYS_ENTRY = b"keys"
VILBERT_FEATURE_DIM = 2048  # the reference reader reshapes features to (-1, 2048)
MAX_KEY_BYTES = 511  # LMDB's default key size limit
_PUT_BATCH = 256


def _open(path: Path) -> lmdb.Environment:
    try:
        return lmdb.open(str(path), subdir=path.is_dir(), readonly=True, lock=False, readahead=False, max_readers=1)
    except lmdb.Error as err:
        raise ConfigError(f"{path}: cannot open as an LMDB environment: {err}") from err


def read_vilbert_lmdb(paths: Sequence[Path], opts: ReadOptions) -> Iterator[ReadResult]:
    if not opts.trust_pickle:
        raise pickle_refusal("vilbert-lmdb")
    background = opts.options.cls_background
    for path in paths:
        env = _open(path)
        with env.begin(buffers=False) as txn:
            keys = _key_order(txn, path)
            for key in keys:
                where = f"{path.name} key {key!r}"
                value = txn.get(key)
                if value is None:
                    yield Skipped(where, "missing value", "listed in the keys entry but not stored")
                    continue
                default_id = key.decode("utf-8", "replace")
                yield decode_row(
                    where,
                    lambda: record_from_dict(safe_loads(value, encoding="latin1"), default_id, background=background),
                )
        env.close()


def _key_order(txn: lmdb.Transaction, path: Path) -> list[bytes]:
    """The `keys` entry's order when present and readable, else the LMDB key order."""
    raw = txn.get(KEYS_ENTRY)
    if raw is not None:
        try:
            keys = safe_loads(raw, encoding="latin1")
            if isinstance(keys, (list, tuple)):
                return [k if isinstance(k, bytes) else str(k).encode() for k in keys]
        except ValueError:  # UnsafePickleError included: fall back to the stored keys
            pass
    return [k for k, _ in txn.cursor() if k != KEYS_ENTRY]


def check_vilbert_ids(store: "FeatureStore", ctx: WriteContext) -> None:
    """Refuse ids the format cannot hold: one spelled like the ``keys`` entry, or keys
    longer than LMDB allows."""
    if KEYS_ENTRY.decode() in store:
        raise ConfigError(
            f"{store.path}: image id 'keys' would overwrite the list of keys that "
            "vilbert-lmdb stores under that name; rename it before exporting"
        )
    long = [i for i in store.ids() if len(i.encode("utf-8")) > MAX_KEY_BYTES]
    if long:
        raise ConfigError(
            f"{store.path}: {len(long)} image ids are longer than LMDB's {MAX_KEY_BYTES}-byte "
            f"key limit, e.g. {long[0][:80]!r}…"
        )


def write_vilbert_lmdb(records: Iterable[RegionFeatures], dest: Path, ctx: WriteContext) -> int:
    layout = ctx.manifest.layout
    if layout.feature_dim != VILBERT_FEATURE_DIM:
        log.warning(
            "features are %d wide; vilbert-multi-task reads them as (-1, %d)", layout.feature_dim, VILBERT_FEATURE_DIM
        )
    env = lmdb.open(str(dest), subdir=True, map_size=64 << 20, sync=False, metasync=False)
    keys: list[bytes] = []
    batch: list[tuple[bytes, bytes]] = []
    dropped: set[str] = set()
    try:
        for rec in records:
            dropped.update(
                name for name in ("objects_id", "attrs_id", "cls_prob", "attr_prob") if getattr(rec, name) is not None
            )
            key = str(rec.image_id).encode()
            item = {
                "image_id": rec.image_id,
                "image_h": int(rec.image_h),
                "image_w": int(rec.image_w),
                "num_boxes": int(rec.num_boxes),
                "boxes": np.asarray(rec.boxes, np.float32),
                "features": np.asarray(rec.features, np.float32),
            }
            batch.append((key, legacy_dumps(item)))
            keys.append(key)
            if len(batch) >= _PUT_BATCH:
                put_all(env, batch, dest)
                batch = []
        put_all(env, batch + [(KEYS_ENTRY, legacy_dumps(keys))], dest)
        try:
            env.sync(True)
        except lmdb.Error as err:
            raise write_error(dest, err) from err
    finally:
        env.close()
    if dropped:
        log.warning("vilbert-lmdb holds no %s: not exported", ", ".join(sorted(dropped)))
    return len(keys)
