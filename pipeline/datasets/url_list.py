"""Generic URL lists: .tsv / .csv (with a header row), .jsonl, .parquet, and .txt (one URL
a line, no header, blank lines skipped; as img2dataset reads them) — each .gz-able except
parquet — with configurable url / caption / id columns. Captions are whitespace-normalized
(`pipeline.sources.base.clean_text`; a blank one is no text).

Ids are the id column's value when given, else ``<file stem>-<row>`` (0-based data row).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Iterator, Sequence

from pipeline.datasets.base import Malformed, ReaderOptions, ReaderResult, url_sha1
from pipeline.download.source_item import SourceItem, Text
from pipeline.errors import ConfigError
from pipeline.sources.base import base_name, clean_text, load_json, open_text

NAME = "url_list"


def _rows(path: Path, url_col: str) -> Iterator[tuple[str, object]]:
    """(where in the file, row dict or an error string) for each data row, streamed."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        row = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            for record in batch.to_pylist():
                row += 1
                yield f"row {row}", record
        return
    with open_text(path) as f:
        if name.endswith(".txt"):
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    yield str(lineno), {url_col: line.strip()}
            return
        if name.endswith(".jsonl") or name.endswith(".json"):
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = load_json(line)
                except json.JSONDecodeError as err:
                    yield str(lineno), f"invalid JSON: {err.msg}"
                    continue
                yield str(lineno), obj if isinstance(obj, dict) else "not a JSON object"
            return
        if not (name.endswith(".tsv") or name.endswith(".csv")):
            raise ConfigError(f"{path}: url_list reads .tsv, .csv, .jsonl, .txt or .parquet files (optionally .gz)")
        csv.field_size_limit(sys.maxsize)
        reader = csv.reader(f, delimiter="\t" if name.endswith(".tsv") else ",")
        header = next(reader, None)
        if header is None:
            return
        for values in reader:
            where = str(reader.line_num)
            if len(values) != len(header):
                yield where, f"expected {len(header)} fields, found {len(values)}"
            else:
                yield where, dict(zip(header, values))


def read(paths: Sequence[Path], opts: ReaderOptions) -> Iterator[ReaderResult]:
    for path in paths:
        stem = base_name(path)
        data_row = 0
        for where, row in _rows(path, opts.url_col):
            if isinstance(row, str):
                yield Malformed(path, where, row)
                continue
            data_row += 1
            url = row.get(opts.url_col)
            if not isinstance(url, str) or not url.strip():
                yield Malformed(path, where, f"no {opts.url_col!r} value")
                continue
            if opts.id_col is not None:
                raw_id = row.get(opts.id_col)
                if raw_id is None or str(raw_id).strip() == "":
                    yield Malformed(path, where, f"no {opts.id_col!r} value")
                    continue
                image_id = str(raw_id).strip()
            else:
                image_id = f"{stem}-{data_row - 1:09d}"
            caption = row.get(opts.caption_col) if opts.caption_col else None
            caption = clean_text(str(caption)) if caption is not None else ""
            texts = (Text("caption", caption),) if caption else ()
            yield SourceItem(
                image_id=image_id,
                url=url.strip(),
                texts=texts,
                split=opts.split or "",
                source=NAME,
                extra=(("url_sha1", url_sha1(url.strip())),),
            )
