"""`manifest.json`: the authority on what a store holds.

Only shards listed here exist for readers. A writer renames a finished shard into
`shards/` first and rewrites the manifest (atomically) last, so a killed writer leaves a
manifest that lists exactly the shards that were complete.
"""

from __future__ import annotations

import hashlib
import json
import re
import stat
import time
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import NamedTuple

from pipeline.errors import StoreError
from pipeline.io import atomic_write_json, loads_strict
from pipeline.records import REGION_SCHEMA_VERSION
from pipeline.store.layout import StoreLayout

MANIFEST_FILE = "manifest.json"
SHARDS_DIR = "shards"
FORMAT_NAME = "vlprep-feature-store"
# Provenance keys that say what a store's features are: every run that writes one store
# must agree on them (checked on append), and a training run's resume compares them.
IDENTITY_KEYS = ("detector", "weights_sha256", "box_policy")


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class ShardInfo(NamedTuple):
    """One shard's manifest entry (a named tuple: a manifest of 100,000 shards loads fast)."""

    name: str  # e.g. "00003.arrow" or "00003.lmdb", under shards/
    rows: int
    bytes: int
    sha256: str  # of the Arrow file, or of the LMDB shard's data.mdb
    created: str


_SHARD_FIELDS = itemgetter(*ShardInfo._fields)  # a shard entry's values, in field order (KeyError if one is missing)
# What a writer names its shards (`<number><suffix>`, the suffix of the store's backend): a
# manifest listing any other name (a path, `..`, a name of the other backend) is refused.
SHARD_NAME = re.compile(r"[0-9]{1,9}\.(arrow|lmdb)")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_shards(entries: object, backend: str) -> list[ShardInfo]:
    """The manifest's `shards` list as `ShardInfo`s, each checked: a plain shard name of the
    store's backend (never a path out of `shards/`), counts that are non-negative integers,
    a sha256 of 64 hex digits; a name listed once. ValueError names the first bad entry."""
    if not isinstance(entries, list):
        raise ValueError(f"shards is a {type(entries).__name__}, expected a list")
    shards = []
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"shard entry {position} is a {type(entry).__name__}, expected an object")
        info = ShardInfo._make(_SHARD_FIELDS(entry))
        match = SHARD_NAME.fullmatch(info.name) if isinstance(info.name, str) else None
        if match is None or match.group(1) != backend:
            raise ValueError(
                f"shard entry {position}: name {info.name!r} is not a shard name of this {backend} store "
                f"(NNNNN.{backend}, a file in {SHARDS_DIR}/)"
            )
        if not (_is_count(info.rows) and _is_count(info.bytes)):
            raise ValueError(f"shard {info.name}: rows and bytes must be non-negative integers")
        if not (isinstance(info.sha256, str) and _SHA256.fullmatch(info.sha256)) or not isinstance(info.created, str):
            raise ValueError(f"shard {info.name}: sha256 must be 64 hex digits and created a string")
        shards.append(info)
    names = [s.name for s in shards]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"shard {twice} is listed twice")
    return shards


@dataclass
class Manifest:
    layout: StoreLayout
    shards: list[ShardInfo] = field(default_factory=list)
    # producer, detector, weights_sha256, box_policy, and the creating run's config
    provenance: dict = field(default_factory=dict)
    runs: list[dict] = field(default_factory=list)  # one entry per writing session
    created: str = field(default_factory=now_iso)
    updated: str = field(default_factory=now_iso)
    schema_version: int = REGION_SCHEMA_VERSION

    @property
    def num_records(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def shard_names(self) -> list[str]:
        return [s.name for s in self.shards]

    def shards_digest(self) -> str:
        """sha256 over every shard's name, row count and checksum: what the id index is
        bound to (an index built for other shards, even of the same names, is stale)."""
        listing = [[s.name, s.rows, s.sha256] for s in self.shards]
        return hashlib.sha256(json.dumps(listing).encode()).hexdigest()

    def dtypes(self) -> dict[str, str]:
        float_dtype = self.layout.dtype
        out = {
            "boxes": "float32",
            "features": float_dtype,
            "objects_id": "int32",
            "objects_conf": "float32",
            "attrs_id": "int32",
            "attrs_conf": "float32",
        }
        for name in ("cls_prob", "attr_prob"):
            if self.layout.prob(name).mode != "none":
                out[name] = float_dtype
        return out

    def identity(self) -> dict:
        """What the records are, independent of how many there are: the layout and the
        provenance's `IDENTITY_KEYS`."""
        return {"layout": self.layout.to_json(), **{k: self.provenance.get(k) for k in IDENTITY_KEYS}}

    def to_json(self) -> dict:
        layout = self.layout
        return {
            "format": FORMAT_NAME,
            "schema_version": self.schema_version,
            "backend": layout.backend,
            "num_records": self.num_records,
            "num_shards": len(self.shards),
            "bytes": sum(s.bytes for s in self.shards),
            "dims": {"features": layout.feature_dim, "cls_prob": layout.cls_dim, "attr_prob": layout.attr_dim},
            "dtypes": self.dtypes(),
            "layout": layout.to_json(),
            "provenance": self.provenance,
            "runs": self.runs,
            "created": self.created,
            "updated": self.updated,
            "shards": [s._asdict() for s in self.shards],
        }

    def write(self, directory: Path) -> None:
        self.updated = now_iso()
        atomic_write_json(directory / MANIFEST_FILE, self.to_json())

    @classmethod
    def read(cls, directory: Path) -> "Manifest":
        """The manifest of the store at `directory`. Anything but a manifest this tool could
        have written is a `StoreError` naming the file: not JSON, a field missing or of the
        wrong type, a shard entry whose name is not a plain shard name of the store's backend
        (a path such as ``/etc/passwd`` or ``../x`` is never opened), a newer schema."""
        path = directory / MANIFEST_FILE
        if not path.exists():
            raise StoreError(f"{directory} is not a feature store: no {MANIFEST_FILE}")
        try:
            if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block the read forever
                raise ValueError("not a regular file")
            obj = loads_strict(path.read_bytes())  # strict, as written
            if not isinstance(obj, dict):
                raise ValueError(f"a {type(obj).__name__}, expected an object")
            if obj.get("format") != FORMAT_NAME:
                raise StoreError(f"{path}: format is {obj.get('format')!r}, expected {FORMAT_NAME!r}")
            if not _is_count(obj["schema_version"]):
                raise ValueError(f"schema_version {obj['schema_version']!r} is not a version number")
            if obj["schema_version"] > REGION_SCHEMA_VERSION:
                raise StoreError(
                    f"{path}: schema version {obj['schema_version']} is newer than this vlprep "
                    f"understands ({REGION_SCHEMA_VERSION}); upgrade vlprep"
                )
            if not isinstance(obj["layout"], dict):
                raise ValueError(f"layout is a {type(obj['layout']).__name__}, expected an object")
            layout = StoreLayout.from_json(obj["layout"])
            kinds = {"provenance": dict, "runs": list, "created": str, "updated": str}
            for key, kind in kinds.items():
                if key in obj and not isinstance(obj[key], kind):
                    raise ValueError(f"{key} is a {type(obj[key]).__name__}, expected a {kind.__name__}")
            return cls(
                layout=layout,
                shards=_check_shards(obj["shards"], layout.backend),
                provenance=obj.get("provenance", {}),
                runs=obj.get("runs", []),
                created=obj["created"],
                updated=obj["updated"],
                schema_version=obj["schema_version"],
            )
        except (OSError, KeyError, TypeError, ValueError, AttributeError, RecursionError) as err:
            raise StoreError(f"{path}: unreadable manifest: {type(err).__name__}: {err}") from err
