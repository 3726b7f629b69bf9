"""An item folder's files, the digests its manifest records of them, and the reader both item
formats build on (see `pipeline.items`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.errors import DataError
from pipeline.io import sha256_file, sha256_mismatch

ITEMS_FILE, ANSWERS_FILE, MANIFEST_FILE, REPORT_FILE = "items.arrow", "answers.json", "manifest.json", "report.md"
CONTENTS = "contents"  # manifest.json: {file name: {"bytes": n, "sha256": hex}} of the data files written


def content_digests(folder: Path, names: Iterable[str]) -> dict[str, dict]:
    """What a manifest records (under `CONTENTS`) of the files `names` of `folder`: each one's
    size and sha256."""
    folder = Path(folder)
    return {name: {"bytes": (folder / name).stat().st_size, "sha256": sha256_file(folder / name)} for name in names}


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

    def text_words(self) -> np.ndarray:
        """Every row's text length in whitespace-separated words (int64; at least 1): a cheap
        stand-in for its token count, computed in one vectorized pass over the mapped column
        (`vl_models.data.sampler`'s length grouping)."""
        text = pc.utf8_trim_whitespace(self.items.column("text"))
        words = pc.add(pc.count_substring_regex(text, r"\s+"), 1)
        return np.maximum(words.to_numpy(zero_copy_only=False).astype(np.int64), 1)

    def file(self, name: str) -> Path:
        """A file of the folder (``items.arrow``, ``answers.json``); DataError if it is missing."""
        path = self.path / name
        if not path.is_file():
            raise DataError(f"{path} is missing: the {self.what} is incomplete; {self.rebuild}")
        return path

    def verify_contents(self, manifest: dict) -> None:
        """Check every file `manifest` records under `CONTENTS` against its recorded size and
        sha256 (once per process while the file is unchanged): a flipped byte in ``items.arrow``
        is a DataError naming the file, before anything reads it. A folder written before the
        digests were recorded has none to check."""
        contents = manifest.get(CONTENTS)
        if contents is None:
            return
        if not isinstance(contents, dict) or not all(
            isinstance(name, str)
            and name == Path(name).name
            and name not in ("", ".", "..")
            and isinstance(entry, dict)
            and type(entry.get("bytes")) is int
            and isinstance(entry.get("sha256"), str)
            for name, entry in contents.items()
        ):
            raise DataError(
                f"{self.path / MANIFEST_FILE}: its {CONTENTS!r} is not a map of file names to their bytes and "
                f"sha256; {self.rebuild}"
            )
        for name, entry in contents.items():
            path = self.file(name)
            stat = path.stat()
            if stat.st_size != entry["bytes"]:
                state = "is truncated" if stat.st_size < entry["bytes"] else "has changed since it was written"
                raise DataError(
                    f"{path} {state}: {stat.st_size:,} bytes on disk, the manifest says {entry['bytes']:,}; "
                    f"{self.rebuild}"
                )
            digest = sha256_mismatch(path, entry["sha256"])
            if digest:
                raise DataError(
                    f"{path} is corrupt: sha256 mismatch (file {digest[:12]}…, manifest {entry['sha256'][:12]}…); "
                    f"{self.rebuild}"
                )

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
        except (pa.ArrowException, OSError) as err:
            raise DataError(f"{path}: unreadable ({err}); {self.rebuild}") from err
        missing = [name for name in self.schema.names if name not in items.column_names]
        if missing:
            raise DataError(f"{path}: no column {', '.join(missing)} (not a {self.what}'s items); {self.rebuild}")
        return items

    def __len__(self) -> int:
        return self.items.num_rows
