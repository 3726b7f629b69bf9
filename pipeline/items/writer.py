"""`ItemsWriter`: the one writer of item folders (mixtures and task datasets).

    with ItemsWriter(tmp, ITEMS_SCHEMA) as items:     # tmp: a new folder the caller swaps in
        for row in rows:
            items.add(row)                            # {column: value}, streamed in batches
    items.finish(answers={"answers": table}, report=text, manifest=manifest)

`finish` writes ``answers.json``, the format's own files (``extra``), ``report.md`` and,
last, ``manifest.json``, which records the size and sha256 of items.arrow, answers.json and
the extra files (``contents``, checked by `ItemsFolder.verify_contents`): a folder a killed
build left behind has no manifest, and the readers refuse it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

import pyarrow as pa

from pipeline.io import atomic_write_json
from pipeline.items.folder import ANSWERS_FILE, CONTENTS, ITEMS_FILE, MANIFEST_FILE, REPORT_FILE, content_digests

BATCH = 8192  # rows per Arrow record batch


class ItemsWriter:
    """Writes ``items.arrow`` of `schema` into `folder` (created if needed), row by row in
    record batches of `batch` rows, then the folder's other files (`finish`)."""

    def __init__(self, folder: Path, schema: pa.Schema, batch: int = BATCH):
        self.folder, self.schema, self.batch = Path(folder), schema, batch
        self.rows = 0
        self._columns: dict[str, list] = {name: [] for name in schema.names}
        self._sink: Optional[pa.OSFile] = None
        self._writer: Optional[pa.ipc.RecordBatchFileWriter] = None
        self._closed = False

    def __enter__(self) -> "ItemsWriter":
        self.folder.mkdir(parents=True, exist_ok=True)
        self._sink = pa.OSFile(str(self.folder / ITEMS_FILE), "wb")
        self._writer = pa.ipc.new_file(self._sink, self.schema)
        return self

    def add(self, row: Mapping[str, Any]) -> None:
        """One item: a value for every column of the schema (a missing one is a KeyError)."""
        for name, values in self._columns.items():
            values.append(row[name])
        self.rows += 1
        if len(self._columns[self.schema.names[0]]) >= self.batch:
            self._flush()

    def _flush(self) -> None:
        if self._columns[self.schema.names[0]]:
            self._writer.write_batch(pa.RecordBatch.from_pydict(self._columns, schema=self.schema))
            for values in self._columns.values():
                values.clear()

    def __exit__(self, kind, err, tb) -> None:
        try:
            if kind is None:
                self._flush()
            self._writer.close()
        finally:
            self._sink.close()
            self._closed = True

    def finish(self, *, answers: dict, report: str, manifest: dict, extra: Mapping[str, Any] = {}) -> dict:
        """Write ``answers.json`` (`answers`: at least ``{"answers": [...]}``), each of
        `extra` (file name -> JSON content), ``report.md`` and, last, ``manifest.json``:
        `manifest` with the ``contents`` of the data files (their sizes and sha256). Returns
        the manifest as written."""
        if not self._closed:
            raise RuntimeError("ItemsWriter.finish: the items are still being written (leave the with block first)")
        atomic_write_json(self.folder / ANSWERS_FILE, answers)
        for name, content in extra.items():
            atomic_write_json(self.folder / name, content)
        (self.folder / REPORT_FILE).write_text(report)
        manifest = {**manifest, CONTENTS: content_digests(self.folder, [ITEMS_FILE, ANSWERS_FILE, *extra])}
        atomic_write_json(self.folder / MANIFEST_FILE, manifest)
        return manifest
