"""ViLBERT-style feature LMDBs (import only).

vilbert-multi-task `script/convert_to_lmdb.py` (and MMF's `lmdb_conversion.py`) store,
under the key ``str(image_id).encode()``, a pickled dict of numpy arrays
(`image_id, image_h, image_w, num_boxes, boxes, features`; MMF: `image_height,
image_width, bbox, objects, cls_prob, ...`), plus a ``b"keys"`` entry holding the pickled
list of keys. vilbert_beta's `convert_trainval_lmdb.py` pickles the raw TSV row dict
instead, with base64 strings. All are read here, only with ``trust_pickle`` and only
through the restricted unpickler (numpy arrays and plain values; nothing that runs code).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import lmdb

from pipeline.errors import ConfigError, UnsafePickleError
from pipeline.legacy.base import ReadOptions, pickle_refusal, ReadResult, RowError, Skipped, record_from_dict
from pipeline.safe_pickle import safe_loads

KEYS_ENTRY = b"keys"


def _open(path: Path) -> lmdb.Environment:
    try:
        return lmdb.open(str(path), subdir=path.is_dir(), readonly=True, lock=False, readahead=False, max_readers=1)
    except lmdb.Error as err:
        raise ConfigError(f"{path}: cannot open as an LMDB environment: {err}") from err


def read_vilbert_lmdb(paths: Sequence[Path], opts: ReadOptions) -> Iterator[ReadResult]:
    if not opts.trust_pickle:
        raise pickle_refusal("vilbert-lmdb")
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
                try:
                    obj = safe_loads(value, encoding="latin1")
                    yield record_from_dict(obj, default_id=key.decode("utf-8", "replace"))
                except UnsafePickleError as err:
                    yield Skipped(where, "refused pickle", str(err))
                except RowError as err:
                    yield Skipped(where, err.kind, err.detail)
        env.close()


def _key_order(txn: lmdb.Transaction, path: Path) -> list[bytes]:
    """The `keys` entry's order when present and readable, else the LMDB key order."""
    raw = txn.get(KEYS_ENTRY)
    if raw is not None:
        try:
            keys = safe_loads(raw, encoding="latin1")
            if isinstance(keys, (list, tuple)):
                return [k if isinstance(k, bytes) else str(k).encode() for k in keys]
        except UnsafePickleError:
            pass
    return [k for k, _ in txn.cursor() if k != KEYS_ENTRY]
