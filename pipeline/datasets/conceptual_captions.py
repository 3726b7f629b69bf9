"""Conceptual Captions (CC3M): the official TSV, no header, ``caption <TAB> url``.

Files: ``Train_GCC-training.tsv`` (3,318,333 rows) and
``Validation_GCC-1.1.0-Validation.tsv`` (15,840 rows). Ids are ``cc3m-<split>-<row>``
(0-based row of the file, 8 digits): stable and collision-free, unlike the crc32 of the
URL older tools used; the URL's sha1 prefix is kept beside as ``url_sha1``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

from pipeline.datasets.base import Malformed, ReaderOptions, ReaderResult, base_name, open_text, url_sha1
from pipeline.records import SourceItem, Text

NAME = "conceptual_captions"


def split_of(path: Path) -> str:
    name = base_name(path).lower()
    if "train" in name:
        return "train"
    if "valid" in name or name.startswith("val"):
        return "val"
    if "test" in name:
        return "test"
    return base_name(path)


def read(paths: Sequence[Path], opts: ReaderOptions) -> Iterator[ReaderResult]:
    for path in paths:
        split = opts.split or split_of(path)
        with open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip("\r\n")
                where = f"{path.name}:{lineno}"
                if not line.strip():
                    yield Malformed(where, "empty line")
                    continue
                fields = line.split("\t")
                if len(fields) != 2:
                    yield Malformed(where, f"expected 2 tab-separated fields (caption, url), found {len(fields)}")
                    continue
                caption, url = fields[0].strip(), fields[1].strip()
                if not url:
                    yield Malformed(where, "empty url")
                    continue
                yield SourceItem(
                    image_id=f"cc3m-{split}-{lineno - 1:08d}", url=url, texts=(Text("caption", caption),),
                    split=split, source=NAME, extra=(("url_sha1", url_sha1(url)),),
                )
