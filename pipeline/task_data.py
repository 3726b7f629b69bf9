"""The task-dataset format (what `vlprep build-task` writes for fine-tuning and evaluation on
a downstream task) and its one reader, `TaskData.open`.

A task folder holds ``manifest.json`` (``"format": "vlprep-task"``, the schema version, the
task's name, counts per split, the files read with their sha256, malformed-row counts),
``items.arrow`` (one row per question / statement / caption / expression, `ITEMS_SCHEMA`),
``answers.json`` (the answer table of classifier tasks: answer id = position; ``[]`` for
the others) and ``report.md``: an item folder (`pipeline.items`, shared with mixtures, owns
the files, the writer and the reader base). docs/task-format.md describes every field. Items
join the feature stores by ``images`` (store keys, as mixture items do); a row may belong to
several named splits (VQA's ``val`` and ``minval``), so ``splits`` is a list. A split spec
combines named splits: a comma is a union, a hyphen a set difference (``train,val-minval``:
train and the val rows not in minval, the rows ViLBERT trains VQA on). The manifest's
``named_splits`` lists the splits the build declared besides the rows' own, even empty ones
(``test_images`` without `vlprep build-task --test-images`): a spec may subtract those.

    data = TaskData.open(path)         # checks the manifest and the files' digests, maps items.arrow
    rows = data.rows("train")          # row indices of a split
    rows = data.rows("train,val-minval")  # train + (val - minval)
    data.column("text")[rows[0]], data.images(rows[0]), data.answers

Errors: a folder that is no task dataset, one of another schema version, or one of
another task than asked for is a ConfigError; a missing or unreadable file, or one whose
size or sha256 differs from what the manifest records (``contents``: checked when the folder
is opened, each file once per process), a DataError.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Optional, Union

import numpy as np
import pyarrow as pa

from pipeline.errors import ConfigError
from pipeline.items import ANSWERS_FILE, ITEMS_FILE, MANIFEST_FILE, REPORT_FILE, ItemsFolder, folder_manifest

__all__ = [
    "ANSWERS_FILE",
    "FORMAT",
    "ITEMS_FILE",
    "ITEMS_SCHEMA",
    "MANIFEST_FILE",
    "REPORT_FILE",
    "TASK_SCHEMA_VERSION",
    "TaskData",
    "task_manifest",
]
FORMAT = "vlprep-task"  # manifest.json's "format", and the output folder's ownership kind
TASK_SCHEMA_VERSION = 1
ITEMS_SCHEMA = pa.schema(
    [
        pa.field("uid", pa.string(), nullable=False),  # the official id: question id, identifier, ...
        pa.field("splits", pa.list_(pa.string()), nullable=False),  # the named splits the row is in
        pa.field("images", pa.list_(pa.string()), nullable=False),  # feature-store keys (NLVR2: left, right)
        pa.field("text", pa.string(), nullable=False),  # question, statement, caption, expression
        pa.field("choices", pa.list_(pa.string())),  # VCR: the 4 answers
        pa.field("rationales", pa.list_(pa.string())),  # VCR: the 4 rationales
        pa.field("label", pa.int32()),  # NLVR2: 1 = True; VCR: the right answer; null: unknown (test)
        pa.field("rationale_label", pa.int32()),  # VCR: the right rationale
        pa.field("answer_ids", pa.list_(pa.int32())),  # VQA / GQA: soft targets over answers.json
        pa.field("answer_scores", pa.list_(pa.float32())),
        pa.field("answers", pa.list_(pa.string())),  # the annotators' answers as given (official metrics)
        pa.field("answer_type", pa.string()),  # VQA: yes/no | number | other
        pa.field("question_type", pa.string()),
        pa.field("box", pa.list_(pa.float32())),  # RefCOCO: the referred box, x1 y1 x2 y2 in pixels
        pa.field("group", pa.string()),  # retrieval: the caption's image; RefCOCO: the ref id
    ],
    metadata={"vlprep.task_schema_version": str(TASK_SCHEMA_VERSION)},
)
_REBUILD = "rebuild it with `vlprep build-task`"


def task_manifest(folder: Path) -> Optional[dict]:
    """The manifest.json of a task folder (of any schema version); None if it is none."""
    return folder_manifest(folder, FORMAT)


class TaskData(ItemsFolder):
    """A task folder, opened for reading: `manifest`, `task` (its name), `answers` (the
    answer table), `items` (``items.arrow`` memory-mapped; pickling reopens the folder),
    `splits`, `rows(split)`, `column(name)` (a whole column as a Python list, cached) and
    `images(row)`."""

    schema, what, rebuild = ITEMS_SCHEMA, "task dataset", _REBUILD

    def __init__(self, path: Union[str, Path], task: Optional[str] = None):
        self.path = Path(path)
        manifest = task_manifest(self.path)
        if manifest is None:
            raise ConfigError(
                f"{self.path} is not a task dataset (no {FORMAT} manifest.json): build one with `vlprep build-task`"
            )
        version = manifest.get("schema_version")
        if version != TASK_SCHEMA_VERSION:
            raise ConfigError(
                f"{self.path}: task schema {version}, this vlprep reads schema {TASK_SCHEMA_VERSION}; {_REBUILD}"
            )
        if task is not None and manifest.get("task") != task:
            raise ConfigError(
                f"{self.path} holds {manifest.get('task')!r} data, not {task!r}: pass the folder "
                f"`vlprep build-task --task {task}` wrote"
            )
        self.manifest = manifest
        self.task = manifest["task"]
        self.verify_contents(manifest)
        self.answers = self._read_answers()
        self.items = self._map_items()
        self._columns: dict[str, list] = {}

    @classmethod
    def open(cls, path: Union[str, Path], task: Optional[str] = None) -> "TaskData":
        return cls(path, task)

    def __reduce__(self):
        return (type(self), (self.path, self.task))

    @cached_property
    def _splits(self) -> list[list[str]]:
        return self.items.column("splits").to_pylist()

    @property
    def splits(self) -> tuple[str, ...]:
        """The named splits that have rows, sorted."""
        return tuple(sorted({s for names in self._splits for s in names}))

    def rows(self, split: str) -> np.ndarray:
        """The row indices (int64, ascending) of the rows in `split`, a split spec: named
        splits joined by commas (a union) whose terms may subtract splits with hyphens
        (``train,val-minval``: train, and val without minval). Names are this folder's split
        names, the longest first, so a name with a hyphen stays whole (``test-dev``). Empty if
        no row is in it; ConfigError when a subtracted split is not one of this folder's (a
        misspelt ``val-minvla`` would otherwise take all of val); a split the build declared
        (the manifest's ``named_splits``) is one of this folder's even when it has no rows."""
        known = set(self.splits) | set(self.manifest.get("named_splits") or ())
        terms = [self._term(t.strip(), known) for t in split.split(",") if t.strip()]
        return np.array(
            [i for i, names in enumerate(self._splits) if any(t[0] in names and not t[1] & set(names) for t in terms)],
            np.int64,
        )

    def _term(self, term: str, known: set[str]) -> tuple[str, set[str]]:
        """A term of a split spec: (the split it starts with, the splits it subtracts)."""
        parts, names, i = term.split("-"), [], 0
        while i < len(parts):
            j = next((j for j in range(len(parts), i, -1) if "-".join(parts[i:j]) in known), i + 1)
            names.append("-".join(parts[i:j]).strip())
            i = j
        unknown = [n for n in names[1:] if n not in known]
        if unknown or not all(names):
            older = "named_splits" not in self.manifest  # built before build-task declared its splits
            raise ConfigError(
                f"split {term!r}: {', '.join(map(repr, unknown)) or 'an empty name'} is not a split of {self.path} "
                f"(its splits: {', '.join(sorted(known))}); a hyphen subtracts a split (train,val-minval)"
                + (
                    f"; a task dataset of an older vlprep lacks the splits build-task declares now (test_images): "
                    f"{_REBUILD}"
                    if older
                    else ""
                )
            )
        return names[0], set(names[1:])

    def column(self, name: str) -> list:
        """Column `name` as a Python list (read once)."""
        if name not in self._columns:
            self._columns[name] = self.items.column(name).to_pylist()
        return self._columns[name]

    def images(self, row: int) -> list[str]:
        return self.column("images")[row]

    def store_keys(self, rows: np.ndarray) -> set[str]:
        """Every image the rows name."""
        images = self.column("images")
        return {key for row in rows for key in images[int(row)]}
