"""An item folder's files and the reader both item formats build on (see `pipeline.items`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pyarrow as pa

from pipeline.errors import DataError

ITEMS_FILE, ANSWERS_FILE, MANIFEST_FILE, REPORT_FILE = "items.arrow", "answers.json", "manifest.json", "report.md"


def folder_manifest(folder: Path, kind: str) -> Optional[dict]:
    """The manifest.json of an item folder of format `kind` (``vlprep-mixture``,
    ``vlprep-task``), of any schema version; None if the folder is none."""
    try:
        manifest = json.loads((Path(folder) / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == kind else None


class ItemsFolder:
    """What a mixture and a task dataset share when read: a folder (`path`) with
    ``items.arrow`` (memory-mapped, its columns checked against `schema`) and
    ``answers.json`` (the answer table); `what` and `rebuild` name it in errors."""

    path: Path
    schema: pa.Schema
    what: str  # "mixture", "task dataset"
    rebuild: str  # how to make a good one again

    def file(self, name: str) -> Path:
        """A file of the folder (``items.arrow``, ``answers.json``); DataError if it is missing."""
        path = self.path / name
        if not path.is_file():
            raise DataError(f"{path} is missing: the {self.what} is incomplete; {self.rebuild}")
        return path

    def _read_answers(self) -> list[str]:
        path = self.file(ANSWERS_FILE)
        try:
            answers = json.loads(path.read_text())["answers"]
            if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
                raise TypeError("answers is not a list of strings")
        except (ValueError, KeyError, TypeError) as err:
            raise DataError(f"{path}: unreadable answer table ({type(err).__name__}: {err}); {self.rebuild}") from err
        return answers

    def _map_items(self) -> pa.Table:
        path = self.file(ITEMS_FILE)
        try:
            items = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        except (pa.ArrowInvalid, OSError) as err:
            raise DataError(f"{path}: unreadable ({err}); {self.rebuild}") from err
        missing = [name for name in self.schema.names if name not in items.column_names]
        if missing:
            raise DataError(f"{path}: no column {', '.join(missing)} (not a {self.what}'s items); {self.rebuild}")
        return items

    def __len__(self) -> int:
        return self.items.num_rows
