"""The mixture format (what `vlprep build-mixture` writes) and its one reader, `Mixture.open`.

A mixture folder holds ``manifest.json`` (``"format": "vlprep-mixture"``, the schema
version, counts, provenance), ``items.arrow`` (one row per text item, `ITEMS_SCHEMA`) and
``answers.json`` (the answer table: answer id = position); docs/mixture-format.md describes
every field. The folder's files, writer and reader base are `pipeline.items`' (shared with
task datasets); this module adds the mixture's schema and checks. `pipeline.mixture.build`
writes it with `pipeline.items.ItemsWriter`; everything that
reads a mixture (training, evaluation, the demo, benchmarks) opens it with `Mixture.open`,
like a feature store with `FeatureStore.open`:

    mix = Mixture.open(path)          # checks the manifest, maps items.arrow, reads answers.json
    rows = mix.rows("train")          # row indices of a split
    mix.store_keys[rows[0]], mix.text(rows[0]), mix.labels(rows[0]), mix.answers

Errors: a folder that is no mixture, or one of another schema version, is a ConfigError
(`check_mixture`); a missing or unreadable file of a mixture is a DataError naming it.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Optional, Union

import numpy as np
import pyarrow as pa

from pipeline.errors import ConfigError
from pipeline.items import ItemsFolder, folder_manifest

FORMAT = "vlprep-mixture"  # manifest.json's "format", and the output folder's ownership kind
MIXTURE_SCHEMA_VERSION = 2  # 2: official VQA soft scores (1: min(1, k/3))
ANSWER_SCORES = "vqa-official"  # manifest.json's "answer_scores": the soft-score rule
ITEMS_SCHEMA = pa.schema(
    [
        pa.field("uid", pa.string(), nullable=False),
        pa.field("image_id", pa.string(), nullable=False),
        pa.field("store_key", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("weight", pa.float32(), nullable=False),
        pa.field("answer_ids", pa.list_(pa.int32())),
        pa.field("answer_scores", pa.list_(pa.float32())),
    ],
    metadata={"vlprep.mixture_schema_version": str(MIXTURE_SCHEMA_VERSION)},
)
_REBUILD = "rebuild the mixture with `vlprep build-mixture`"


def mixture_manifest(folder: Path) -> Optional[dict]:
    """The manifest.json of a mixture folder (of any schema version); None if it is none."""
    return folder_manifest(folder, FORMAT)


def check_mixture(folder: Path) -> dict:
    """The manifest of a mixture folder this code reads; ConfigError when `folder` is no
    mixture, or one of another schema version (schema 1 stored min(1, k/3) soft scores)."""
    folder = Path(folder)
    manifest = mixture_manifest(folder)
    if manifest is None:
        raise ConfigError(
            f"{folder} is not a mixture (no {FORMAT} manifest.json): build one with `vlprep build-mixture`"
        )
    version = manifest.get("schema_version", 1)
    if version == MIXTURE_SCHEMA_VERSION:
        return manifest
    if isinstance(version, int) and version > MIXTURE_SCHEMA_VERSION:
        raise ConfigError(
            f"{folder}: mixture schema {version} was written by a newer vlprep (this one reads "
            f"schema {MIXTURE_SCHEMA_VERSION}); upgrade vlprep, or rebuild the mixture with "
            "`vlprep build-mixture`"
        )
    raise ConfigError(
        f"{folder}: mixture schema {version} stores the old answer scores min(1, k/3) (k annotators), "
        f"not the official VQA values (0.3/0.6/0.9/1.0 for 1/2/3/4+ of 10; schema "
        f"{MIXTURE_SCHEMA_VERSION}); rebuild it with `vlprep build-mixture --spec SPEC --out {folder}`"
    )


class Mixture(ItemsFolder):
    """A mixture folder, opened for reading.

    `manifest` (checked: `check_mixture`), `items` (``items.arrow`` as a memory-mapped Arrow
    table: DataLoader workers share the page cache; pickling reopens the folder instead of
    copying the table), `answers` (the answer table: QA label i is ``answers[i]``);
    `splits`, `rows(split)`, `store_keys` and per-row `text` / `labels` for readers."""

    schema, what, rebuild = ITEMS_SCHEMA, "mixture", _REBUILD

    def __init__(self, path: Union[str, Path]):
        self.path = Path(path)
        self.manifest = check_mixture(self.path)
        self.answers = self._read_answers()
        self.items = self._map_items()

    @classmethod
    def open(cls, path: Union[str, Path]) -> "Mixture":
        return cls(path)

    def __reduce__(self):
        return (type(self), (self.path,))

    @cached_property
    def _split(self) -> np.ndarray:
        return self.items.column("split").to_numpy(zero_copy_only=False)

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits that have items, sorted (``("train", "val")``)."""
        return tuple(sorted(set(self._split.tolist())))

    def rows(self, split: str) -> np.ndarray:
        """The row indices (int64, ascending) of the items of `split`; empty if it has none."""
        return np.nonzero(self._split == split)[0]

    @cached_property
    def store_keys(self) -> np.ndarray:
        """Every row's feature-store key (an object array of strings)."""
        return self.items.column("store_key").to_numpy(zero_copy_only=False)

    @cached_property
    def kinds(self) -> np.ndarray:
        """Every row's kind, ``caption`` or ``question`` (an object array of strings)."""
        return self.items.column("kind").to_numpy(zero_copy_only=False)

    def text(self, row: int) -> str:
        return self.items.column("text")[row].as_py()

    def labels(self, row: int) -> tuple[list[int], list[float]]:
        """A question's answer ids into `answers` and their soft scores; empty for captions
        and for questions whose answers are all outside the table."""
        ids = self.items.column("answer_ids")[row].as_py()
        scores = self.items.column("answer_scores")[row].as_py()
        return ids or [], scores or []
